/* The slowmo row's state (strategy_slowmo.c) and its checkpoint file
 * (strategy_slowmo_state.c). Only src/train/ sees this. */
#ifndef FSC_TRAIN_SLOWMO_INTERNAL_H
#define FSC_TRAIN_SLOWMO_INTERNAL_H

#include "strategy_internal.h"

struct slowmo_state {
    int localsgd_every, slowmo_every;
    double momentum, lr;       /* slow momentum beta and slow learning rate alpha */
    bool outer;                /* FairScale: slowmo_lr != 1 or slowmo_momentum != 0 */
    int64_t updates;           /* local steps taken: the averaging phase */
    bool last_micro;           /* the micro-step being run is the step's last */
    int64_t shard, begin, end; /* FairScale's world_portion_length; this rank's [begin, end) */
    float *old, *buf;          /* end - begin floats each (FSC_MEM_OPTIM) */
    int64_t averages, outer_steps;
    double wait_s;
};

/* What a checkpoint needs beyond rank 0's weights and optimizer state, by
 * global name: the local step count, the outer state (old and buf, whole
 * tensors assembled from the ranks' shards), every rank's optimizer state,
 * and every rank's replica when the step was not an averaging one. Root
 * writes path; collective over s->group. */
int slowmo_save_state(fsc_strategy *s, const char *path, int root);
/* Reads such a file after the weights and rank 0's optimizer state were
 * loaded: at the world size it was saved at each rank takes its own state
 * back (bit for bit), at another each takes the mean of the saved ranks'.
 * Validated and staged on every rank, committed only if every rank could.
 * path NULL (a checkpoint of another strategy): a warning, the state starts
 * afresh. Collective over s->group. */
int slowmo_load_state(fsc_strategy *s, const char *path);

#endif
