/* --profile FILE for fsc-train and fsc-bench: every rank's spans merged into
 * one Chrome trace (a process per rank) and a summary on rank 0. */
#ifndef FSC_TOOLS_TRAIN_PROFILE_H
#define FSC_TOOLS_TRAIN_PROFILE_H

#include <stdio.h>

#include "fsc/dist.h"

/* Stops the recorder (fsc/profile.h) on every rank of g, gathers the events
 * and totals to rank 0, which writes them to path and prints the summary to
 * out: time by category (mean and max over ranks), the top 15 ops with the
 * GFLOP/s or GB/s they reached beside the peaks measured here (sgemm, bf16
 * GEMM where it runs, a memory copy), and the arena bytes per module.
 * Collective over g; every rank returns rank 0's write status. */
int train_profile_finish(const char *path, fsc_group *g, FILE *out);

#endif
