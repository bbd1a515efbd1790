/* The trainer: one call per optimizer step under any strategy, with a
 * user-supplied model and loss.
 *
 * A step takes `grad_accum` micro-batches of `batch` samples on each
 * data-parallel rank, in the order of the data-order contract (docs/data.md)
 * (micro-step k of rank r holds global samples s*G + k*(batch*world) +
 * r*batch + [0, batch), G = batch * grad_accum * world), so every strategy
 * and world size sees the same global batch. The loss is one mean over the
 * global batch: the trainer hands the loss function the normaliser. Then
 * fp16 loss-scale checks (every rank skips together), global-norm clipping
 * over every shard, the scheduled learning rate and the update.
 *
 *     fsc_trainer_config cfg = {
 *         .strategy = {.name = argv[1]},          // "ddp", "oss", "sdp", "fsdp", ...
 *         .optim = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-3},
 *         .batch = 16, .clip = 1.0f, .load = load, .loss = loss, .user = &data};
 *     fsc_trainer *t = fsc_trainer_new(model, &cfg);
 *     for (int s = 0; s < steps; s++) fsc_trainer_step(t, &r);
 *
 * Checkpoints (fsc_trainer_save_checkpoint / fsc_trainer_resume) hold
 * weights and optimizer state by global name, so a run resumes under any
 * strategy and world size with the losses of an uninterrupted one. */
#ifndef FSC_TRAINER_H
#define FSC_TRAINER_H

#include "fsc/adascale.h"
#include "fsc/grad_scaler.h"
#include "fsc/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_trainer fsc_trainer;

/* What one call of the loss function computes. */
typedef struct fsc_micro_batch {
    int64_t step;      /* optimizer step, 0-based */
    int micro, micros; /* micro-step k of K (grad_accum) */
    int rank, world;   /* data-parallel rank and size */
    int batch;         /* samples of this micro-batch on this rank */
    int row0, rows;    /* the rows of it this call computes (dp: a thread's; else 0, batch) */
    int64_t sample0;   /* global index of the micro-batch's row 0 (data order, dropout keys) */
    /* Divide the summed per-target losses by this: the global batch's target
     * count (batch * grad_accum * world * targets_per_sample) over the fp16
     * loss scale. Gradients then add up to those of the global mean. */
    double norm;
} fsc_micro_batch;

/* Fills the inputs of micro-batch mb (all its rows) into user's buffers;
 * called once per micro-step, before the loss function. */
typedef int (*fsc_trainer_load_fn)(const fsc_micro_batch *mb, void *user);
/* Forward, loss and backward of rows [mb->row0, mb->row0 + mb->rows) on m
 * (use m, not the model: it may be a wrapper or a thread's replica), with
 * ctx (arena, training, seed, step and sample0 of row0 set). *loss gets
 * this call's share of the global mean loss (sum / mb->norm). */
typedef int (*fsc_trainer_loss_fn)(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb,
                                   void *user, float *loss);
/* Under a pipeline (strategy.pipe.stages > 1) the model is cut into stages,
 * so the loss function above cannot run it whole; these two take its place:
 * the first stage's input of micro-batch mb (all its rows; borrowed until
 * the step ends), and the last stage's loss of mb from the output y, with
 * dloss/dy written into y (as fsc_cross_entropy does), sum / mb->norm. */
typedef int (*fsc_trainer_input_fn)(const fsc_micro_batch *mb, void *user, fsc_tensor *x);
typedef int (*fsc_trainer_head_loss_fn)(const fsc_micro_batch *mb, void *user, fsc_tensor *y,
                                        fsc_arena *arena, float *loss);
/* Optional under a pipeline: mb's targets ((mb->batch, T) int32, read during
 * the call only) and the index to ignore, for a last stage that runs its head
 * fused with the loss (tensor-parallel stages: fsc_pipe_io.targets); its
 * logits then never exist whole, and pipe_loss is left for other stages. */
typedef int (*fsc_trainer_targets_fn)(const fsc_micro_batch *mb, void *user,
                                      const int32_t **targets, int *ignore_index);
/* Called after a step's last backward, before unscaling and clipping: look
 * at or change this rank's gradients (fsc_strategy_grad_ranges). */
typedef int (*fsc_trainer_hook_fn)(fsc_trainer *t, void *user);

/* Zero fields mean the documented default. */
typedef struct fsc_trainer_config {
    fsc_strategy_options strategy;
    fsc_optim_config optim;
    /* max_lr 0: optim.lr at every step. total_steps bounds a cosine. */
    fsc_lr_schedule_config schedule;
    int batch;                 /* samples per micro-batch per rank (> 0) */
    int grad_accum;            /* micro-batches per step (0: 1) */
    double targets_per_sample; /* loss targets per sample, e.g. T for a GPT (0: 1) */
    float clip;                /* global 2-norm clip (0: off) */
    bool skip_grad_norm;       /* without clipping, do not compute the norm (saves a collective) */
    fsc_attention_kind attention; /* every step's (and evaluation's) fsc_ctx.attention */
    /* fp16 (strategy.compute_dtype F16) always scales the loss dynamically;
     * grad_scaler tunes it (NULL: PyTorch's defaults). Borrowed. */
    const fsc_grad_scaler_config *grad_scaler;
    fsc_trainer_load_fn load;            /* may be NULL */
    fsc_trainer_loss_fn loss;            /* required, except under a pipeline */
    fsc_trainer_input_fn pipe_input;     /* required under a pipeline */
    fsc_trainer_head_loss_fn pipe_loss;  /* required under a pipeline */
    fsc_trainer_targets_fn pipe_targets; /* may be NULL */
    /* Under a pipeline with context parallelism (fsc/cp.h; the layout's
     * plan sets both, fsc/layout.h): the split every stage runs under
     * (fsc_ctx.seq, borrowed), and the global index of micro-batch mb's
     * first sample, which the cp ranks of a replica share (dropout keys).
     * NULL: no split, mb->sample0. */
    const fsc_seq_split *pipe_seq;
    int64_t (*pipe_sample0)(const fsc_micro_batch *mb, void *user);
    fsc_trainer_hook_fn after_backward; /* may be NULL */
    void *user;
    /* AdaScale (fsc/adascale.h): the gain r from the step's world x
     * grad_accum gradient samples (each micro-batch of each data-parallel
     * replica is one, its squared norm taken before any reduction through
     * the strategy's grad_probe), the learning rate multiplied by r, and the
     * schedule read at the scale-invariant step (the sum of the gains so
     * far), so a schedule written for one micro-batch on one rank runs
     * unchanged. A step clipped by c = clip / norm enters the estimate
     * scaled by c^2, the size it is applied at. Under single, dp, ddp, oss,
     * sdp and fsdp, and on a pipeline or tensor-parallel mesh under ddp, oss
     * or sdp; refused under slowmo (no gradient is reduced), fsdp over a
     * pipeline or tensor parallelism, and the zbh1 schedule. Costs one
     * 4-byte all-reduce per step, the global gradient norm (computed even
     * with skip_grad_norm), a pass over each bucket before it is reduced and,
     * with grad_accum > 1 (not fsdp), a copy of the gradients
     * (FSC_MEM_WORK) to tell micro-batches apart. Checkpoints hold the
     * estimator and the scale-invariant step. */
    bool adascale;
    fsc_adascale_config adascale_cfg; /* scale 0: world x grad_accum */
    /* Checkpoints written in the background: fsc_trainer_save_checkpoint
     * copies each rank's part of the files (the bytes it would write) into
     * memory and returns; a thread writes them with POSIX calls while
     * training goes on, and the checkpoint is committed (`latest` moves) only
     * once every rank reported its part written, as a synchronous save is.
     * Each fsc_trainer_step then starts with a 4-byte all-reduce while one is
     * in flight, and returns its failure (naming the rank and the file; the
     * previous checkpoint stays the newest). The next save and
     * fsc_trainer_checkpoint_wait wait for it. Off, with a one-line notice,
     * under tensor parallelism or below MPI_THREAD_FUNNELED. */
    bool async_save;
} fsc_trainer_config;

typedef struct fsc_step_result {
    double loss;        /* mean over the global batch */
    double lr;          /* used by this step (AdaScale: gain x base_lr) */
    double base_lr;     /* the schedule's (at the scale-invariant step under AdaScale) */
    double gain;        /* AdaScale's r for this step; 1 without AdaScale */
    double progress;    /* scale-invariant steps after this one (the step count without
                           AdaScale) */
    double grad_norm;   /* before clipping; 0 if not computed, inf if skipped */
    double seconds;     /* wall time of the step on this rank */
    double comm_wait_s; /* blocked on the strategy's communication during the step */
    bool skipped; /* fp16: an inf/NaN gradient on some rank, the update skipped on every rank */
    double loss_scale; /* fp16: the scale used in this step (0 without loss scaling) */
} fsc_step_result;

/* A trainer for `model` (parameters not bound; borrowed, must outlive the
 * trainer; NULL under a pipeline, whose stages cfg->strategy.pipe makes)
 * under cfg->strategy. Every rank of the group calls it alike.
 * NULL (error set, naming the field) on a bad config or a failed set-up. */
FSC_API fsc_trainer *fsc_trainer_new(fsc_module *model, const fsc_trainer_config *cfg);
/* Frees the strategy, the scaler and the step's buffers (not the model).
 * Accepts NULL. */
FSC_API void fsc_trainer_free(fsc_trainer *t);

/* Trains step fsc_trainer_get_step(t) with every micro-batch, then the
 * update, and advances the step. Collective over the data-parallel group.
 * FSC_ERR_NUMERIC (error set) when the loss or gradient norm is not finite
 * outside fp16 loss scaling; any strategy or callback status otherwise. */
FSC_API int fsc_trainer_step(fsc_trainer *t, fsc_step_result *r);

FSC_API fsc_strategy *fsc_trainer_strategy(fsc_trainer *t); /* owned by t */
/* The arena micro-steps run in (the loss function's ctx->arena outside a
 * pipeline and dp's threads, which keep their own); reset at each micro-step,
 * so a caller may reset it between steps to drop the blocks a first step
 * chained. Owned by t. */
FSC_API fsc_arena *fsc_trainer_arena(fsc_trainer *t);
FSC_API int64_t fsc_trainer_get_step(const fsc_trainer *t); /* the next step to run, 0-based */
/* fp16 loss scaling's scaler, or NULL without it. Owned by t. */
FSC_API fsc_grad_scaler *fsc_trainer_grad_scaler(fsc_trainer *t);
/* The learning rate step s gets from the schedule. */
FSC_API double fsc_trainer_lr(const fsc_trainer *t, int64_t s);
/* Scale-invariant steps so far: the sum of AdaScale's gains, or
 * fsc_trainer_get_step without AdaScale. */
FSC_API double fsc_trainer_progress(const fsc_trainer *t);

/* Weights by global name, written by rank 0 of the group with the given
 * metadata pairs. Collective; every rank returns rank 0's failure. */
FSC_API int fsc_trainer_save_weights(fsc_trainer *t, const char *path, int n_meta,
                                     const char *const *keys, const char *const *values);
/* Writes checkpoint <dir>/step-<S>/ (S = fsc_trainer_get_step) atomically:
 * weights and optimizer state by global name, the seed, who saved it, the
 * fp16 loss scale, AdaScale's estimates and scale-invariant step, and the
 * given state pairs (values are JSON). Collective;
 * every rank returns rank 0's outcome. With cfg.async_save it first waits for
 * the save in flight, then stages this one and returns: its outcome comes
 * from a later fsc_trainer_step or fsc_trainer_checkpoint_wait. */
FSC_API int fsc_trainer_save_checkpoint(fsc_trainer *t, const char *dir, int n_state,
                                        const char *const *keys, const char *const *json_values);
/* Waits for the asynchronous save in flight (cfg.async_save) and commits it;
 * FSC_OK at once when there is none. Collective; every rank returns the
 * first failing rank's error. Call it before fsc_trainer_free, which drops a
 * save still in flight. */
FSC_API int fsc_trainer_checkpoint_wait(fsc_trainer *t);
/* Continues from dir's latest checkpoint: each given state pair must equal
 * the checkpoint's (compared as JSON; the message names the key and both
 * values), the seed too; then weights, optimizer state, loss scale, AdaScale's
 * state (a checkpoint without it: fresh estimates, progress = its step) and
 * the step are restored. Nothing changes on a refusal before loading. */
FSC_API int fsc_trainer_resume(fsc_trainer *t, const char *dir, int n_expect,
                               const char *const *keys, const char *const *json_values);

/* Evaluation: the mean loss over `batches` global batches of held-out data,
 * forward only (ctx->training false: no dropout, no gradients), through
 * the strategy (fsdp gathers one unit at a time, as in training; no rank
 * holds the whole model). Batch k is laid out as training step k is (every
 * rank its micro-batches of the config's batch rows, in the data order of
 * the top of this file), so the result is the same under every strategy
 * and world size with the same global batch. */
typedef struct fsc_trainer_eval_config {
    int batches;              /* global batches to evaluate (>= 1) */
    fsc_trainer_load_fn load; /* fills micro-batch mb's inputs (mb->step is k); may be NULL */
    /* Forward and loss of rows [mb->row0, +mb->rows) on m with ctx (no
     * backward): *loss gets the summed per-target loss / mb->norm, where
     * mb->norm counts the targets of all `batches` global batches. */
    fsc_trainer_loss_fn loss;
    void *user;
} fsc_trainer_eval_config;

/* Runs cfg over every micro-batch of every batch and sums the shares over
 * the data-parallel group: *loss is the mean, identical on every rank.
 * Under a pipeline each batch goes through the stages by a forward-only
 * schedule (fsc_pipe_eval), the trainer config's pipe_input and pipe_loss
 * at its ends after cfg->load (cfg->loss is not called and may be NULL).
 * Collective over the group. Leaves weights, gradients and the step alone.
 * FSC_ERR_INVALID for bad arguments; the callbacks' status otherwise. */
FSC_API int fsc_trainer_eval(fsc_trainer *t, const fsc_trainer_eval_config *cfg, double *loss);

#ifdef __cplusplus
}
#endif
#endif
