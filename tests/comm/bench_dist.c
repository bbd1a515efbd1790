/* Benchmark (not a test): fsc's collectives against MPI's own, F32, to pick
 * each algorithm from measurements on this machine. Run it by hand:
 *   mpiexec -n 2 build/tests/bench_dist           every collective, 4 B..100 MB
 *   mpiexec -n 2 build/tests/bench_dist --small [rounds]   allreduce 4 KiB..4 MiB
 *     (BENCH_FROM / BENCH_TOP: first and last size in bytes, steps of 4x)
 * The full run prints per size: milliseconds and algorithm bandwidth (buffer
 * bytes / time). "fsc ring" / "fsc mpi" is fsc_group_allreduce forced onto the
 * ring or onto MPI_Iallreduce (fsc_dist_rt.ring_min_bytes), both including
 * the watchdog's desync check; "raw" rows call MPI directly. "bf16" rows
 * reduce the same number of elements as the F32 rows above them, in BF16
 * (half the bytes on the wire; their MB and GB/s count BF16 bytes, so the
 * same speed in elements per second shows as half the GB/s).
 *
 * --small answers "is fsc's allreduce as fast as MPI_Allreduce?" on a shared
 * machine, where one timing is noise: the contenders are timed in turns,
 * round after round, and each row gives the median of the rounds and the
 * ratio of medians against MPI_Allreduce, then the fastest round of each
 * (under load, the closest to a quiet machine's figure).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/dist.h"
#include "comm/dist_internal.h"

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

static void full(int me, int P) {
    fsc_group *w = fsc_group_world();
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
}

/* --small: the contenders of one size, timed in turns: fsc's default choice;
 * the same with the signature announced beside the data rather than carried
 * by it (ann: the full check's protocol, two messages per peer on two
 * ranks); the ring with its first step sent beside the check (ring-e) and
 * after it (ring-l); recursive doubling (rd; at 2 ranks one exchange);
 * MPI_Iallreduce under the check; and MPI_Allreduce itself. */
enum { C_DEFAULT, C_ANNOUNCED, C_RING, C_RING_LATE, C_RD, C_MPI, C_RAW, NC };
static const char *const cname[NC] = {"fsc", "ann", "ring-e", "ring-l", "rd", "fsc-mpi", "MPI"};

static double once(int which, float *a, int64_t n, int k) {
    fsc_group *w = fsc_group_world();
    fsc_dist_runtime saved = fsc_dist_rt;
    if (which == C_RING || which == C_RING_LATE)
        fsc_dist_rt.ring_min_bytes = 0, fsc_dist_rt.eager_max_bytes = 0,
        fsc_dist_rt.eager_max_many_bytes = 0;
    fsc_dist_rt.early_max_bytes = which == C_RING        ? INT64_MAX
                                  : which == C_RING_LATE ? 0
                                                         : saved.early_max_bytes;
    if (which == C_RD)
        fsc_dist_rt.eager_max_bytes = INT64_MAX, fsc_dist_rt.eager_max_many_bytes = INT64_MAX;
    if (which == C_MPI)
        fsc_dist_rt.ring_min_bytes = INT64_MAX, fsc_dist_rt.eager_max_bytes = 0,
        fsc_dist_rt.eager_max_many_bytes = 0;
    fsc_dist_rt.full_check = which == C_ANNOUNCED;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < k; i++) {
        if (which == C_RAW)
            MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (fsc_group_allreduce(w, a, n, FSC_DTYPE_F32, FSC_REDUCE_SUM))
            fprintf(stderr, "bench_dist: %s\n", fsc_last_error()), exit(1);
    }
    double dt = (MPI_Wtime() - t0) / k, worst = 0;
    fsc_dist_rt.ring_min_bytes = saved.ring_min_bytes;
    fsc_dist_rt.eager_max_bytes = saved.eager_max_bytes;
    fsc_dist_rt.eager_max_many_bytes = saved.eager_max_many_bytes;
    fsc_dist_rt.early_max_bytes = saved.early_max_bytes;
    fsc_dist_rt.full_check = saved.full_check;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); /* the slowest rank's */
    return worst;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static void small(int me, int rounds) {
    if (me == 0)
        printf("allreduce F32, median us per call over %d alternated rounds (then the fastest "
               "round's); ratio: fsc / MPI_Allreduce\n%10s",
               rounds, "bytes");
    for (int c = 0; me == 0 && c < NC; c++) printf(" %9.9s", cname[c]);
    if (me == 0) printf(" %7s\n", "ratio");
    size_t top = getenv("BENCH_TOP") ? (size_t)atol(getenv("BENCH_TOP")) : (4u << 20);
    size_t from = getenv("BENCH_FROM") ? (size_t)atol(getenv("BENCH_FROM")) : 4096;
    for (size_t bytes = from; bytes <= top; bytes *= 4) {
        int64_t n = (int64_t)(bytes / 4);
        float *a = calloc((size_t)n, 4);
        int k = bytes >= (1u << 20) ? 10 : 200;
        double *t = calloc((size_t)rounds * NC, sizeof *t);
        for (int r = 0; r < rounds; r++)
            for (int j = 0; j < NC; j++) {
                int c = (r & 1) ? NC - 1 - j : j; /* alternate the order too */
                t[(size_t)c * rounds + r] = once(c, a, n, k);
            }
        double med[NC], lo[NC];
        for (int c = 0; c < NC; c++) {
            qsort(t + (size_t)c * rounds, (size_t)rounds, sizeof *t, cmp_double);
            med[c] = t[(size_t)c * rounds + rounds / 2] * 1e6;
            lo[c] = t[(size_t)c * rounds] * 1e6;
        }
        if (me == 0) {
            printf("%10zu", bytes);
            for (int c = 0; c < NC; c++) printf(" %9.1f", med[c]);
            printf(" %7.2f   min:", med[C_DEFAULT] / med[C_RAW]);
            for (int c = 0; c < NC; c++) printf(" %.1f", lo[c]);
            printf(" %.2f\n", lo[C_DEFAULT] / lo[C_RAW]);
        }
        fflush(stdout);
        free(t);
        free(a);
    }
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) return 1;
    int me = fsc_dist_rank(), P = fsc_dist_size();
    if (argc > 1 && !strcmp(argv[1], "--small"))
        small(me, argc > 2 ? atoi(argv[2]) : 15);
    else
        full(me, P);
    return fsc_dist_finalize() ? 1 : 0;
}
