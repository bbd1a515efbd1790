/* fsc-bench --pp's report (bench_pipe.h). */
#include "bench_pipe.h"

#include <stdio.h>
#include <stdlib.h>

#include "fsc/dist.h"

int bench_pipe_gather(const float mine[BENCH_PIPE_FIGS], float **all) {
    *all = calloc((size_t)fsc_dist_size() * BENCH_PIPE_FIGS, sizeof **all);
    if (!*all) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    return fsc_group_allgather(fsc_group_world(), mine, *all, BENCH_PIPE_FIGS, FSC_DTYPE_F32);
}

void bench_pipe_print(const char *name, fsc_pipe_kind kind, int pp, int chunks, int virtual_stages,
                      int ranks, const float *figs, double tok_s, double single_tok_s) {
    /* the pipeline's ideal: every rank busy but for the schedule's bubble */
    int v = kind == FSC_PIPE_INTERLEAVED ? (virtual_stages ? virtual_stages : 2) : 1;
    double bubble = fsc_pipe_kind_bubble(kind, pp, v, chunks), mean = 0, uneven = 0;
    double *by_rank = calloc((size_t)ranks, sizeof *by_rank);
    for (int q = 0; by_rank && q < ranks; q++) {
        /* figs: wait, span, compute and its pipeline's slowest compute
         * per rank. The bubble no schedule removes at this cut:
         * the slowest stage's compute minus this one's */
        const float *f = figs + BENCH_PIPE_FIGS * q;
        const double slowest = f[3];
        by_rank[q] = f[1] > 0 ? f[0] / f[1] : 0;
        mean += by_rank[q] / ranks;
        uneven += f[1] > 0 ? (slowest - f[2]) / f[1] / ranks : 0;
    }
    printf("\"pp\": %d, \"chunks\": %d, \"pipe_schedule\": \"%s\", \"virtual\": %d, "
           "\"theoretical_bubble\": %.4f, \"measured_bubble\": %.4f, "
           "\"measured_bubble_by_rank\": [",
           pp, chunks, fsc_pipe_kind_name(kind), v, bubble, mean);
    for (int q = 0; by_rank && q < ranks; q++) printf("%s%.4f", q ? ", " : "", by_rank[q]);
    printf("], \"stage_imbalance_bubble\": %.4f, \"bubble_beyond_imbalance\": %.4f, "
           "\"tokens_per_s_vs_ideal\": %.3f, ",
           uneven, mean - uneven, tok_s / ((1 - bubble) * ranks * single_tok_s));
    /* the same in words, on stderr: stdout stays one JSON line per config */
    fprintf(stderr,
            "fsc-bench: %s, pipeline %s (%d ranks, %d micro-batches): measured bubble %.4f "
            "(mean over ranks of",
            name, fsc_pipe_kind_name(kind), pp, chunks, mean);
    for (int q = 0; by_rank && q < ranks; q++) fprintf(stderr, "%s %.4f", q ? "," : "", by_rank[q]);
    fprintf(stderr,
            "), of which %.4f stage imbalance and %.4f beyond it; theoretical %.4f; "
            "%.1f tokens/s\n",
            uneven, mean - uneven, bubble, tok_s);
    free(by_rank);
}
