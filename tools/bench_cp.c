/* fsc-bench --cp's report (bench_cp.h). */
#include "bench_cp.h"

#include <stdio.h>
#include <stdlib.h>

#include "fsc/dist.h"

static const double MIB = 1024.0 * 1024.0;

int bench_cp_gather(const fsc_cp_stats *ring, const bench_cp_run *run, float **all) {
    const float mine[BENCH_CP_FIGS] = {(float)ring->wait_s,
                                       (float)ring->compute_s,
                                       (float)((double)ring->bytes / 1e6),
                                       (float)run->elapsed,
                                       (float)((double)run->activ_bytes / MIB),
                                       (float)run->cpu};
    *all = calloc((size_t)fsc_dist_size() * BENCH_CP_FIGS, sizeof **all);
    if (!*all) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    return fsc_group_allgather(fsc_group_world(), mine, *all, BENCH_CP_FIGS, FSC_DTYPE_F32);
}

static void array(const char *key, int ranks, const float *figs, int col) {
    printf("\"%s\": [", key);
    for (int q = 0; q < ranks; q++) printf("%s%.4g", q ? ", " : "", figs[q * BENCH_CP_FIGS + col]);
    printf("], ");
}

void bench_cp_print(const char *name, int cp, int ranks, const float *figs, double tok_s,
                    const bench_cp_run *single) {
    const double single_mib = (double)single->activ_bytes / MIB;
    double worst = 0, cpu = 0, elapsed = 0; /* worst: the largest rank's activations */
    for (int q = 0; q < ranks; q++) {
        const float *f = figs + q * BENCH_CP_FIGS;
        const double a = single_mib > 0 ? f[4] / single_mib : 0;
        if (a > worst) worst = a;
        cpu += f[5];
        if (f[3] > elapsed) elapsed = f[3];
    }
    const double speedup = single->tok_s > 0 ? tok_s / single->tok_s : 0;
    /* CPU seconds per token: all ranks' against the one process's */
    const double tokens = tok_s * elapsed, single_tokens = single->tok_s * single->elapsed;
    const double cost = tokens > 0 && single->cpu > 0 && single_tokens > 0
                            ? (cpu / tokens) / (single->cpu / single_tokens)
                            : 0;
    printf("\"cp\": %d, \"cp_speedup_vs_single\": %.3f, \"cpu_per_token_vs_single\": %.3f, "
           "\"single_activ_mib\": %.1f, \"activ_vs_single_max_rank\": %.3f, ",
           cp, speedup, cost, single_mib, worst);
    array("activ_mib_by_rank", ranks, figs, 4);
    array("ring_wait_s_by_rank", ranks, figs, 0);
    array("ring_tiles_s_by_rank", ranks, figs, 1);
    array("ring_mb_sent_by_rank", ranks, figs, 2);
    array("cpu_s_by_rank", ranks, figs, 5);
    printf("\"ring_wait_share_by_rank\": [");
    for (int q = 0; q < ranks; q++) {
        const float *f = figs + q * BENCH_CP_FIGS;
        printf("%s%.4f", q ? ", " : "", f[3] > 0 ? f[0] / f[3] : 0);
    }
    printf("], ");
    fprintf(stderr,
            "fsc-bench: %s, --cp %d: %.2fx one process's tokens/s (%.1f against %.1f), at %.2fx "
            "its CPU seconds per token (%.2fx on %d free cores); activations %.2fx one "
            "process's on the largest rank (%.1f MiB against %.1f)\n",
            name, cp, speedup, tok_s, single->tok_s, cost, cost > 0 ? ranks / cost : 0, ranks,
            worst, worst * single_mib, single_mib);
    for (int q = 0; q < ranks; q++) {
        const float *f = figs + q * BENCH_CP_FIGS;
        fprintf(stderr,
                "fsc-bench: rank %d waited %.2f s on the ring beside %.2f s in attention tiles "
                "(%.1f%% of its %.2f s of timed steps), %.0f MB sent\n",
                q, f[0], f[1], f[3] > 0 ? 100 * f[0] / f[3] : 0, f[3], f[2]);
    }
}
