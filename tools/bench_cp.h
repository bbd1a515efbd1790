/* fsc-bench --cp: what context parallelism's ring did on every rank, beside
 * the one-process baseline the same run measured first: the speed-up, the
 * activation bytes per rank against one process's, and the time each rank
 * waited on the ring's messages against its time in attention tiles
 * (fsc_cp_stats), so the figures come from one command. */
#ifndef FSC_TOOLS_BENCH_CP_H
#define FSC_TOOLS_BENCH_CP_H

#include <stdint.h>

#include "fsc/cp.h"

/* per rank: ring wait s, tiles s, MB sent, timed s, steady activation MiB,
 * CPU s of the process in the timed steps */
enum { BENCH_CP_FIGS = 6 };

/* A run's timed steps: tokens/s, their seconds, this process's CPU
 * seconds in them, and the steady peak of the activation tag. */
typedef struct {
    double tok_s, elapsed, cpu;
    int64_t activ_bytes;
} bench_cp_run;

/* Every rank's figures over the timed steps (world x BENCH_CP_FIGS, *all
 * malloc'ed, the caller frees) from this rank's ring and run. Collective
 * over the world. */
int bench_cp_gather(const fsc_cp_stats *ring, const bench_cp_run *run, float **all);
/* JSON fields for print_result's line (each followed by ", ") from every
 * rank's figures (ranks x BENCH_CP_FIGS) beside the one-process baseline,
 * and the same in words on stderr. The CPU seconds per token, summed over
 * the ranks, against one process's say what the split costs in work
 * whatever else loads the machine (a rank waiting on the ring polls, so
 * its waits count): cp / that ratio is the speed-up on free cores. */
void bench_cp_print(const char *name, int cp, int ranks, const float *figs, double tok_s,
                    const bench_cp_run *single);

#endif
