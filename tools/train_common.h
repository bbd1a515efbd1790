/* The training loop shared by fsc-train and fsc-bench: options, flag parsing,
 * model + data + optimizer set-up, one optimizer step, and the summary. */
#ifndef FSC_TOOLS_TRAIN_COMMON_H
#define FSC_TOOLS_TRAIN_COMMON_H

#include <stdio.h>

#include "fsc/checkpoint.h"
#include "fsc/dist.h"
#include "fsc/fsdp.h"
#include "fsc/grad_scaler.h"
#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/optim.h"
#include "fsc/parallel.h"
#include "fsc/zero.h"

typedef struct train_options {
    const char *strategy; /* single | dp | ddp | oss | sdp | fsdp */
    fsc_gpt_config model;
    const char *data;
    int batch, grad_accum;
    int64_t steps;
    double lr, min_lr_ratio, weight_decay, beta1, beta2, eps, momentum, clip;
    int64_t warmup;
    const char *schedule;  /* cosine | constant | warmup-constant */
    const char *optimizer; /* adamw | adam | sgd */
    uint64_t seed;
    int threads;
    double bucket_mb;
    const char *partition;       /* oss: even | greedy */
    const char *share_dtype;     /* oss: f32 | bf16 | f16 */
    int64_t min_params;          /* fsdp: auto-wrap threshold (0: one unit per block) */
    int reshard_after_forward;   /* fsdp: 1 (default) or 0 */
    const char *mixed_precision; /* fsdp: fp32 | bf16 | fp16 */
    const char *reduce_dtype;    /* fsdp: f32 | bf16 | f16 (default: the compute dtype) */
    bool accum_no_sync;          /* fsdp: accumulate full gradients, reduce once */
    bool checkpoint_activations; /* recompute every block in backward */
    int64_t save_every;          /* checkpoint every N steps (0: never) */
    const char *checkpoint_dir, *resume;
    const char *init_from, *save_init, *save, *metrics;
    const char *save_sharded; /* fsdp: directory for each rank's shard file at the end */
    int log_every;
    bool quiet;
    bool skip_grad_norm; /* without clipping, do not compute |g| (benchmarks) */
    bool local_in_world; /* single/dp on one rank of a larger world (bench baselines) */
} train_options;

/* Defaults of fsc-train: a small GPT on the built-in corpus. */
void train_options_default(train_options *o);
/* Parses --flag value / --flag=value. Returns 0, 1 if --help was printed, or a
 * negative status with fsc_last_error() naming the flag and the bad value. */
int train_options_parse(train_options *o, int argc, char **argv, const char *prog,
                        const char *usage_extra);

typedef enum {
    STRATEGY_SINGLE,
    STRATEGY_DP,
    STRATEGY_DDP,
    STRATEGY_OSS,
    STRATEGY_SDP,
    STRATEGY_FSDP
} strategy_kind;

typedef struct trainer {
    train_options opt;
    strategy_kind strategy;
    int rank, world; /* data-parallel rank and size (1 unless ddp) */
    fsc_module *model;
    fsc_module *ddp;         /* the DDP wrapper around model (ddp and oss), or NULL */
    fsc_module *sdp;         /* the ShardedDDP wrapper (sdp), or NULL */
    fsc_dp *dp;              /* the thread workers, or NULL */
    fsc_fsdp *fsdp;          /* fsdp: the sharded model and its optimizer (params unbound) */
    fsc_grad_scaler *scaler; /* fp16: dynamic loss scaling, or NULL */
    int64_t poison_step;     /* tests: this rank's gradient gets an inf at this step (1-based) */
    fsc_params params;
    /* The optimizer, always an OSS: over the world for --strategy oss, over this
     * process alone otherwise, so optimizer state is saved and loaded by
     * global name the same way under every strategy and world size. NULL
     * under fsdp, whose optimizer runs over its shards (same file format). */
    fsc_oss *oss;
    fsc_lr_schedule_config sched;
    fsc_tokens tokens;
    fsc_arena *arena;
    int32_t *x, *y;
    int64_t step; /* next step to run, 0-based */
} trainer;

typedef struct step_result {
    double loss, lr, grad_norm, seconds;
    double comm_wait_s; /* DDP: blocked on gradient reductions after backward */
    bool skipped;       /* fp16: an inf/NaN gradient, the update skipped on every rank */
    double loss_scale;  /* fp16: the scale used in this step */
} step_result;

/* Builds everything from the options; on error returns a status with the message set. */
int trainer_init(trainer *t, const train_options *o);
/* Trains step t->step with all its micro-batches, then the optimizer update. */
int trainer_step(trainer *t, step_result *r);
void trainer_free(trainer *t);
/* Saves weights with the model configuration in the metadata; rank 0 writes
 * (path may be NULL elsewhere). Collective under fsdp (units are gathered one
 * at a time), rank 0 alone otherwise. */
int trainer_save(trainer *t, const char *path);
/* fsdp: each rank writes DIR/shard-RRRRR-of-NNNNN.safetensors (its flat shards
 * and their layout, the same metadata as trainer_save); fsc-consolidate
 * rebuilds trainer_save's file from them. */
int trainer_save_sharded(trainer *t, const char *dir);
/* The optimizer over this rank's part (OSS's local one, or FSDP's). */
fsc_optim *trainer_optim(const trainer *t);
/* Writes checkpoint t->step into --checkpoint-dir (collective). */
int trainer_checkpoint(trainer *t);

/* Prints per-tag memory figures as a JSON object body ("params": N, ...). */
void print_mem_json(FILE *f, bool peak);
/* Peak bytes per tag of every data-parallel rank, gathered on all ranks:
 * out[r * FSC_MEM_TAG_COUNT + tag]. out holds world * FSC_MEM_TAG_COUNT. */
int gather_mem_peaks(const trainer *t, int64_t *out);

#endif
