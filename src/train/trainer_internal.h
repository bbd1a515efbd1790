/* The trainer's state, shared by trainer.c (steps) and trainer_checkpoint.c
 * (checkpoints and resume). Only src/train/ sees this. */
#ifndef FSC_TRAIN_TRAINER_INTERNAL_H
#define FSC_TRAIN_TRAINER_INTERNAL_H

#include "fsc/trainer.h"

struct fsc_trainer {
    fsc_trainer_config cfg;
    fsc_strategy *s;
    fsc_grad_scaler *scaler; /* fp16 only */
    fsc_arena *arena;
    int64_t step; /* next step to run, 0-based */
};

#endif
