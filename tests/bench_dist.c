/* Benchmark (not a test): fsc's collectives against MPI's own, F32, to pick
 * each algorithm from measurements on this machine. Run it by hand:
 *   mpiexec -n 2 build/tests/bench_dist
 * Prints per size: milliseconds and algorithm bandwidth (buffer bytes / time).
 * "fsc ring" / "fsc mpi" is fsc_group_allreduce forced onto the ring or onto
 * MPI_Iallreduce (fsc_dist_rt.ring_min_bytes), both including the watchdog's
 * control exchange; "raw" rows call MPI directly. "bf16" rows reduce the
 * same number of elements as the F32 rows above them, in BF16 (half the
 * bytes on the wire; their MB and GB/s count BF16 bytes, so the same speed
 * in elements per second shows as half the GB/s).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "fsc/dist.h"
#include "dist/dist_internal.h"

static int reps(size_t bytes) {
    return bytes >= (50u << 20) ? 5 : bytes >= (1u << 20) ? 20 : 500;
}

#define TIME(label, bytes, code)                                                                   \
    do {                                                                                           \
        int n_ = reps(bytes);                                                                      \
        code;                                                                                      \
        MPI_Barrier(MPI_COMM_WORLD);                                                               \
        double t0_ = MPI_Wtime();                                                                  \
        for (int k_ = 0; k_ < n_; k_++) {                                                          \
            code;                                                                                  \
        }                                                                                          \
        double dt_ = (MPI_Wtime() - t0_) / n_;                                                     \
        if (me == 0)                                                                               \
            printf("%-34s %9.3f MB %10.3f ms %8.2f GB/s\n", label, (double)(bytes) / 1e6,          \
                   dt_ * 1e3, (double)(bytes) / dt_ / 1e9);                                        \
    } while (0)

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) return 1;
    fsc_group *w = fsc_group_world();
    int me = fsc_dist_rank(), P = fsc_dist_size();
    const size_t sizes[] = {4, 4096, 16384, 65536, 262144, 1u << 20, 4u << 20, 25000000, 100000000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t n = (int64_t)(sizes[s] / 4) / P * P;
        if (n == 0) n = P;
        size_t B = (size_t)n * 4;
        float *a = calloc((size_t)n, 4), *b = calloc((size_t)n, 4);
        int64_t saved = fsc_dist_rt.ring_min_bytes;
        fsc_dist_rt.ring_min_bytes = 0;
        TIME("allreduce fsc ring", B, fsc_group_allreduce(w, a, n, FSC_DTYPE_F32, FSC_REDUCE_SUM));
        fsc_dist_rt.ring_min_bytes = INT64_MAX;
        TIME("allreduce fsc mpi(Iallreduce)", B,
             fsc_group_allreduce(w, a, n, FSC_DTYPE_F32, FSC_REDUCE_SUM));
        fsc_dist_rt.ring_min_bytes = saved;
        TIME("allreduce fsc default", B,
             fsc_group_allreduce(w, a, n, FSC_DTYPE_F32, FSC_REDUCE_SUM));
        TIME("allreduce fsc default bf16", B / 2,
             fsc_group_allreduce(w, a, n, FSC_DTYPE_BF16, FSC_REDUCE_SUM));
        TIME("allreduce raw MPI_Allreduce", B,
             MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        TIME("reduce_scatter fsc ring", B,
             fsc_group_reduce_scatter(w, a, b, n / P, FSC_DTYPE_F32, FSC_REDUCE_SUM));
        TIME("reduce_scatter fsc ring bf16", B / 2,
             fsc_group_reduce_scatter(w, a, b, n / P, FSC_DTYPE_BF16, FSC_REDUCE_SUM));
        TIME("reduce_scatter raw MPI_R_S_block", B,
             MPI_Reduce_scatter_block(a, b, (int)(n / P), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        TIME("allgather fsc ring", B, fsc_group_allgather(w, b, a, n / P, FSC_DTYPE_F32));
        TIME("allgather raw MPI_Allgather", B,
             MPI_Allgather(b, (int)(n / P), MPI_FLOAT, a, (int)(n / P), MPI_FLOAT, MPI_COMM_WORLD));
        TIME("broadcast fsc", B, fsc_group_broadcast(w, a, n, FSC_DTYPE_F32, 0));
        free(a);
        free(b);
        if (me == 0) printf("\n");
    }
    return fsc_dist_finalize() ? 1 : 0;
}
