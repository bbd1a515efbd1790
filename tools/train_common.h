/* What fsc-train and fsc-bench share: their flags, and a GPT trained by the
 * library's trainer (fsc/trainer.h) on token data. Flags, files and
 * printing live here; every strategy's behaviour lives in the library. */
#ifndef FSC_TOOLS_TRAIN_COMMON_H
#define FSC_TOOLS_TRAIN_COMMON_H

#include <stdio.h>

#include "fsc/dist.h"
#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/trainer.h"

typedef struct train_options {
    const char *strategy; /* a row of the strategy table (fsc_strategy_names) */
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
    const char *partition;       /* even | greedy */
    const char *share_dtype;     /* f32 | bf16 | f16 */
    int64_t min_params;          /* auto-wrap threshold (0: one unit per block) */
    int reshard_after_forward;   /* 1 (default) or 0 */
    const char *mixed_precision; /* fp32 | bf16 | fp16 */
    const char *reduce_dtype;    /* f32 | bf16 | f16 (default: the strategy's) */
    bool accum_no_sync;          /* accumulate full gradients, reduce once */
    bool checkpoint_activations; /* recompute every block in backward */
    int pp;                      /* pipeline stages (1: none) */
    int tp;                      /* tensor-parallel ranks per replica (1: none) */
    bool sequence_parallel;      /* with --tp: LayerNorm/dropout regions on sequence shards */
    const char *pipe_schedule;   /* gpipe | 1f1b | interleaved | zb1 */
    int virtual_stages;          /* interleaved: stages per rank */
    const char *balance;         /* layers per stage, "3,6" (NULL: even) */
    bool print_schedule;         /* print the pipeline's schedule grid (rank 0) */
    const char *pipe_checkpoint; /* never | always | except_last */
    const char *trace;           /* with --pp: the last step as a Chrome trace */
    int64_t save_every;          /* checkpoint every N steps (0: never) */
    const char *checkpoint_dir, *resume;
    const char *init_from, *save_init, *save, *metrics;
    const char *save_sharded; /* fsdp: directory for each rank's shard file at the end */
    int log_every;
    const char *val_data;     /* held-out tokens (NULL: *_val.bin beside the shards, or a tail) */
    double val_fraction;      /* without val shards: the tail of the data held out (0: none) */
    int64_t eval_every;       /* validation loss every N steps (0: never) */
    int eval_batches;         /* global batches per validation */
    const char *tokenizer;    /* GPT-2 BPE directory: --data text files are encoded with it */
    bool quiet;
    bool skip_grad_norm;      /* without clipping, do not compute |g| (benchmarks) */
    bool local_in_world;      /* single/dp on one rank of a larger world (bench baselines) */
    unsigned long long given; /* bit i: flag i of the table was on the command line */
} train_options;

/* Defaults of fsc-train: a small GPT on the built-in corpus. */
void train_options_default(train_options *o);
/* Parses --flag value / --flag=value. Returns 0, 1 if --help was printed, or a
 * negative status with fsc_last_error() naming the flag and the bad value. */
int train_options_parse(train_options *o, int argc, char **argv, const char *prog,
                        const char *usage_extra);
/* Whether flag `name` (without --) was on the command line. */
bool train_flag_given(const train_options *o, const char *name);
/* What can be checked before any model or data: ranges, combinations, the
 * strategy's name, output paths writable (rank 0). */
int train_options_check(const train_options *o);

typedef struct trainer {
    train_options opt;
    fsc_module *model;
    fsc_trainer *tr;
    fsc_strategy *s; /* tr's */
    int rank, world; /* data-parallel rank and size */
    fsc_tokens tokens;
    int32_t *x, *y;      /* this rank's current micro-batch */
    int32_t *px;         /* pipeline: the step's ids, by micro-batch (stage 0 keeps them) */
    int *balance;        /* parsed --balance, or NULL */
    int64_t poison_step; /* tests: this rank's gradient gets an inf at this step (1-based) */
} trainer;

/* Builds everything from the options; on error returns a status with the message set. */
int trainer_init(trainer *t, const train_options *o);
/* Trains the next step with all its micro-batches, then the optimizer update. */
int trainer_step(trainer *t, fsc_step_result *r);
int64_t trainer_next_step(const trainer *t); /* 0-based */
void trainer_free(trainer *t);
/* Saves weights with the model configuration in the metadata (collective;
 * rank 0 writes, path may be NULL elsewhere). */
int trainer_save(trainer *t, const char *path);
/* fsdp: each rank writes DIR/shard-RRRRR-of-NNNNN.safetensors (its flat shards
 * and their layout, the same metadata as trainer_save); fsc-consolidate
 * rebuilds trainer_save's file from them. */
int trainer_save_sharded(trainer *t, const char *dir);
/* Writes checkpoint trainer_next_step into --checkpoint-dir (collective). */
int trainer_checkpoint(trainer *t);

/* Prints per-tag memory figures as a JSON object body ("params": N, ...). */
void print_mem_json(FILE *f, bool peak);
/* Ranks whose memory the summary lists: the data-parallel ones, or every
 * rank under a pipeline (its stages differ). */
int mem_ranks(const trainer *t);
/* Peak bytes per tag of those ranks, gathered on all of them:
 * out[r * FSC_MEM_TAG_COUNT + tag]. out holds mem_ranks * FSC_MEM_TAG_COUNT. */
int gather_mem_peaks(const trainer *t, int64_t *out);

#endif
