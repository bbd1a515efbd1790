/* fsc-bench --pp: what the pipeline's schedule left idle on every rank,
 * beside the schedule's theoretical bubble: the measured bubble (waits over
 * the span of the rank's actions), the part of it that the stages' uneven
 * compute explains, and tokens/s against the ideal of every rank busy but
 * for the bubble. */
#ifndef FSC_TOOLS_BENCH_PIPE_H
#define FSC_TOOLS_BENCH_PIPE_H

#include "fsc/pipe.h"

/* per rank, summed over the timed steps: wait s, span s, compute s, and
 * the largest compute s among the stages of its pipeline */
enum { BENCH_PIPE_FIGS = 4 };

/* Every rank's figures (world x BENCH_PIPE_FIGS, *all malloc'ed, the
 * caller frees) from this rank's. Collective over the world. */
int bench_pipe_gather(const float mine[BENCH_PIPE_FIGS], float **all);
/* JSON fields for fsc-bench's line (each followed by ", ") from every
 * rank's figures, beside the one-process baseline's tokens/s, and the same
 * in words on stderr. */
void bench_pipe_print(const char *name, fsc_pipe_kind kind, int pp, int chunks, int virtual_stages,
                      int ranks, const float *figs, double tok_s, double single_tok_s);

#endif
