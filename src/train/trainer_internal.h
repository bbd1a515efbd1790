/* The trainer's state, shared by trainer.c (steps), trainer_eval.c
 * (evaluation), trainer_checkpoint.c (checkpoints and resume) and
 * trainer_adascale.c. Only src/train/ sees this. */
#ifndef FSC_TRAIN_TRAINER_INTERNAL_H
#define FSC_TRAIN_TRAINER_INTERNAL_H

#include "fsc/checkpoint.h"
#include "fsc/trainer.h"

struct fsc_trainer {
    fsc_trainer_config cfg;
    fsc_strategy *s;
    fsc_grad_scaler *scaler; /* fp16 only */
    fsc_arena *arena;
    int64_t step;                 /* next step to run, 0-based */
    struct trainer_adascale *ada; /* AdaScale (cfg.adascale), else NULL */
    struct trainer_async *async;  /* cfg.async_save where it can run, else NULL */
};

/* Micro-batch k of step `step` as the callbacks see it (rows: all of it):
 * training runs its current step, evaluation batch k laid out as step k. */
fsc_micro_batch trainer_micro_batch(const fsc_trainer *t, int64_t step, int k, double norm);

/* trainer_adascale.c. Begin: refuses what AdaScale cannot see into and
 * wires its gradient probe into so; ready: after the strategy exists. */
int trainer_ada_begin(fsc_trainer *t, fsc_strategy_options *so);
int trainer_ada_ready(fsc_trainer *t);
void trainer_ada_begin_step(fsc_trainer *t);
void trainer_ada_before_micro(fsc_trainer *t);
void trainer_ada_after_micro(fsc_trainer *t, int k); /* micro-step k has run */
/* The step's samples against the averaged gradient's norm: *gain. Collective. */
int trainer_ada_update(fsc_trainer *t, double grad_norm, double clip, double loss_scale,
                       double *gain);
void trainer_ada_advance(fsc_trainer *t, double gain); /* after the update */
double trainer_ada_progress(const fsc_trainer *t);     /* scale-invariant steps so far */
/* Checkpoints: the estimates and the progress as a JSON object (state.json's
 * "adascale"), and back. Load with json NULL (a checkpoint saved without
 * AdaScale): fresh estimates, progress = step. A different S rescales the
 * variance estimate. FSC_ERR_FORMAT naming a missing or bad field. */
int trainer_ada_state_json(const fsc_trainer *t, char *buf, size_t n);
int trainer_ada_load_json(fsc_trainer *t, const char *json, int64_t step);
void trainer_ada_free(fsc_trainer *t);

/* trainer_async.c: asynchronous checkpoints. Begin (after the strategy
 * exists): turns cfg.async_save off, with a one-line notice, where it cannot
 * run. Start: hands the captured save (w: the root's, else NULL) to the
 * background writer; with rc set, drops it and returns rc. Poll (collective,
 * at step boundaries): advances the save in flight, waiting for it to end
 * when wait; its failure, agreed on every rank. Stage: an empty stage for
 * the next capture, the last save's recycled (its buffers already touched)
 * when there is one; NULL (error set) when out of memory. */
typedef struct trainer_async trainer_async;
struct ckpt_stage;
int trainer_async_begin(fsc_trainer *t);
struct ckpt_stage *trainer_async_stage(fsc_trainer *t);
int trainer_async_start(fsc_trainer *t, fsc_ckpt_writer *w, struct ckpt_stage *stage, int rc);
int trainer_async_poll(fsc_trainer *t, bool wait);
bool trainer_async_busy(const fsc_trainer *t);
void trainer_async_free(fsc_trainer *t);

#endif
