/* What fsc-train and fsc-bench share: their flags, and a GPT trained by the
 * library's trainer (fsc/trainer.h) on token data. Flags, files and
 * printing live here; every strategy's behaviour lives in the library. */
#ifndef FSC_TOOLS_TRAIN_COMMON_H
#define FSC_TOOLS_TRAIN_COMMON_H

#include <stdio.h>

#include "fsc/dist.h"
#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/layout.h"
#include "fsc/lora.h"
#include "fsc/moe_parallel.h"
#include "fsc/tokenizer.h"
#include "fsc/trainer.h"

typedef struct train_options {
    const char *strategy; /* a row of the strategy table (fsc_strategy_names) */
    fsc_gpt_config model;
    const char *data;
    const char *data_format; /* auto | llmc | nanogpt (fsc_data_format_parse) */
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
    const char *attention;       /* auto | naive | flash */
    const char *reduce_dtype;    /* f32 | bf16 | f16 (default: the strategy's) */
    bool accum_no_sync;          /* accumulate full gradients, reduce once */
    int shard_group;             /* hsdp: ranks per shard group */
    bool checkpoint_activations; /* recompute every block in backward */
    int pp;                      /* pipeline stages (1: none) */
    int tp;                      /* tensor-parallel ranks per replica (1: none) */
    int cp;                      /* context-parallel ranks per replica (1: none) */
    bool sequence_parallel;      /* with --tp: LayerNorm/dropout regions on sequence shards */
    bool recompute_attention;    /* with --tp: attention probabilities recomputed in backward */
    bool recompute_activation;   /* with --tp: the MLP's GELU output recomputed in backward */
    bool adascale;               /* AdaScale: lr x gain, --steps counts scale-invariant steps */
    int localsgd_frequency;      /* slowmo: average parameters every N steps (0: 3) */
    int slowmo_frequency;        /* slowmo: the slow-momentum update every N steps (0: 48) */
    double slowmo_momentum;      /* slowmo: its momentum (0: none) */
    double slowmo_lr;            /* slowmo: its learning rate (0: 1) */
    const char *arch;            /* gpt2 | llama (train_model_resolve) */
    int tie_embeddings;          /* llama: lm_head tied, 0 or 1 */
    int qkv_bias;                /* llama: q/k/v biases, 0 or 1 */
    int moe_experts;             /* experts per MoE MLP (0: a dense model) */
    int moe_every;               /* an MoE MLP every N blocks */
    double moe_capacity;         /* expert capacity factor */
    double moe_aux_coef;         /* weight of the load-balancing loss */
    int moe_hidden;              /* expert MLP width (0: 4 x --d-model; llama: ffn width) */
    const char *pipe_schedule;   /* gpipe | 1f1b | interleaved | zbh1 */
    int virtual_stages;          /* interleaved: stages per rank */
    const char *balance;         /* layers per stage, "3,6" (NULL: even) */
    bool print_schedule;         /* print the pipeline's schedule grid (rank 0) */
    const char *pipe_checkpoint; /* never | always | except_last */
    const char *trace;           /* with --pp: the last step as a Chrome trace */
    const char *profile;         /* every rank's spans as a Chrome trace, and a summary */
    int64_t save_every;          /* checkpoint every N steps (0: never) */
    bool async_save;             /* checkpoints written by a background thread */
    const char *checkpoint_dir, *resume;
    const char *init_from, *save_init, *save, *metrics, *metrics_csv;
    const char *save_dir; /* a Hugging Face directory at the end (train_save_dir.c) */
    const char *save_sharded; /* fsdp: directory for each rank's shard file at the end */
    const char *shard_size;   /* llama --save DIR: bytes per safetensors shard (NULL: 2 GB) */
    const char *save_dtype;   /* llama --save DIR: "fp32" (NULL) or "bf16" tensors */
    const char *freeze;       /* fine-tuning: comma-separated parameter-name globs */
    int lora_rank;            /* LoRA adapters of this rank (0: none) */
    double lora_alpha, lora_dropout;
    const char *lora_targets; /* comma-separated module names (NULL: q_proj,v_proj) */
    const char *save_adapter; /* LoRA: the adapters as a PEFT directory at the end */
    const char *lora_from;    /* LoRA: start the adapters from this PEFT directory */
    bool lora_merge;          /* LoRA: --save writes the base weights with the adapters merged */
    const char *param_group;  /* "PATTERN:lr=X,wd=Y[;PATTERN:...]": optimizer param groups */
    int log_every;
    const char *val_data;  /* held-out tokens (NULL: *_val.bin beside the shards, or a tail) */
    double val_fraction;   /* without val shards: the tail of the data held out (0: none) */
    int64_t eval_every;    /* validation loss every N steps (0: never) */
    int eval_batches;      /* global batches per validation */
    const char *tokenizer; /* GPT-2 BPE directory: --data text files are encoded with it */
    bool quiet;
    bool skip_grad_norm;      /* without clipping, do not compute |g| (benchmarks) */
    bool local_in_world;      /* single/dp on one rank of a larger world (bench baselines) */
    const char *config;       /* --config FILE.json: flags (the command line overrides) */
    bool allow_change;        /* --resume may change the global batch or the schedule */
    int keep_last;            /* keep only the last N checkpoints (0: all) */
    int keep_best;            /* and the N of lowest val loss (0: none; needs eval_every) */
    double log_seconds;       /* not on a terminal: a progress line at least this often */
    const char *progress;     /* auto (a live line on a terminal, /dev/tty under mpirun) | plain */
    const char *config_json;  /* the effective flags as JSON (set by fsc-train; checkpoints) */
    unsigned char given[128]; /* given[i]: flag i set by --config (1) or the command line (2) */
} train_options;

/* Defaults of fsc-train: a small GPT on the built-in corpus. */
void train_options_default(train_options *o);
/* Parses --flag value / --flag=value. Returns 0, 1 if --help was printed, or a
 * negative status with fsc_last_error() naming the flag and the bad value. */
int train_options_parse(train_options *o, int argc, char **argv, const char *prog,
                        const char *usage_extra);
/* Whether flag `name` (without --) was on the command line or in --config. */
bool train_flag_given(const train_options *o, const char *name);
/* The flag table, for config files: flag i's name ("d-model"; NULL past the
 * end) and its value in o as JSON text into buf (strings quoted; NULL for an
 * unset string). */
const char *train_flag_name(int i);
void train_flag_json(const train_options *o, int i, char *buf, size_t n);
/* Sets flag `name` ("d-model" or "d_model") from text (ARG_FLAG: true/false),
 * marking it given by `source` (0: not given). A string value is kept by
 * pointer. Returns the flag's index, or a negative status naming it. */
int train_flag_set(train_options *o, const char *name, const char *value, int source);
/* The i-th flag of the table, NULL past its end (train_options_check.c). */
const struct tool_flag *train_flag_at(int i);
/* train_options_check.c: flag `name`'s documented range as "[lo, hi]" (or
 * "[lo, hi)") into buf; false, buf untouched, for a flag without one. */
bool train_flag_range_text(const char *name, char *buf, size_t n);

/* train_config.c: --config, and the flags a checkpoint or weights file
 * carries. Reads FILE's flags into o, except those on the command line. */
int train_config_load(train_options *o, const char *path);
/* The effective flags as a JSON object (malloc'ed; per-run flags such as
 * --save, --resume or --quiet left out). */
char *train_config_json(const train_options *o);
/* --resume: takes the checkpoint's flags that were not given (a checkpoint
 * without them is left alone); refuses another model, and a change of the
 * global batch or the schedule unless --allow-change, naming the flag. */
int train_config_resume(train_options *o, bool verbose);
/* --init-from FILE: the model flags not given, from the file's metadata,
 * a Hugging Face config.json beside it, or its tensor shapes. */
int train_config_init_from(train_options *o, bool verbose);
/* Writes a Hugging Face config.json in the directory of `weights` (or in
 * `weights` itself when train_hf_dir_target says it is a directory). */
int train_config_write_hf(const train_options *o, const char *weights);
/* Hugging Face LLaMA directories (train_hf.c). Whether --save / --save-init
 * PATH names a directory: under --arch llama, any PATH not ending in
 * .safetensors. */
bool train_hf_dir_target(const train_options *o, const char *path);
/* --shard-size TEXT ("2GB", "500MiB", bytes; NULL: FSC_HF_SHARD_BYTES). */
int train_hf_shard_bytes(const char *text, int64_t *out);
/* --init-from of a LLaMA (directory, file with a LLaMA config.json beside
 * it, or fsc's own save): the model from its config, flags that contradict
 * it refused by name; *handled false (nothing done) for anything else. */
int train_hf_init_from(train_options *o, bool verbose, bool *handled);
/* After DIR/model.safetensors is saved (rank 0): shards past --shard-size
 * and config.json. */
int train_hf_finish(const train_options *o, const char *dir);
/* config.json's torch_dtype for --save-dtype: "bfloat16", or NULL (float32). */
const char *train_hf_torch_dtype(const train_options *o);
void train_config_free(void); /* the strings the functions above kept */
/* Turns --arch, --tie-embeddings and --qkv-bias into o->model's fields,
 * after every source of flags (command line, --config, --resume); refuses
 * LLaMA-only flags without --arch llama. */
int train_model_resolve(train_options *o);
/* What can be checked before any model or data: ranges, combinations, the
 * strategy's name, output paths writable (rank 0). */
int train_options_check(const train_options *o);
/* The FSC_* environment variables, at start-up: the library's (fsc_env_check)
 * and fsc-train's FSC_FAULT. 0, or a negative status naming the variable and
 * its range. */
int train_env_check(void);
/* train_consistency.c: compares every rank's effective flags, and the identity
 * of --data, --val-data and --init-from (size and crc32 of the first and last
 * 64 KiB of each file), in one collective over the world. On a difference
 * returns FSC_ERR_INVALID on every rank, naming each flag that differs and the
 * ranks on each side. Flags that may differ per rank are exempt (see there). */
int train_consistency_check(const train_options *o);

/* train_vocab.c: --vocab from the data or the tokenizer (docs/data.md).
 * The vocabulary size word 3 of the first --data shard's header records
 * (fsc-tokenize writes it; 0 when none), *source saying where from. */
int train_vocab_declared(const train_options *o, char *source, size_t n);
/* --vocab left out (and no --resume, --init-from or --tokenizer to give the
 * model's): the declared size or data->vocab (its largest id + 1) when
 * either passes the default; given: FSC_ERR_INVALID, naming both numbers,
 * when it is smaller than either. */
int train_vocab_resolve(train_options *o, const fsc_tokens *data, const char *declared_by,
                        int declared, bool verbose);
/* --tokenizer: its size when --vocab is left out; a smaller --vocab refused. */
int train_vocab_tokenizer(train_options *o, const fsc_bpe *bpe);

typedef struct trainer {
    train_options opt;
    fsc_module *model; /* the plan's whole GPT, or NULL (the strategy makes it) */
    fsc_trainer *tr;
    fsc_strategy *s; /* tr's */
    int rank, world; /* data-parallel rank and size */
    fsc_tokens tokens;
    /* the GPT on the layout (fsc/layout.h): the model or the stage makers,
     * the balance, the TP group of the loss under --pp */
    fsc_gpt_plan *plan;
    int64_t poison_step; /* tests: this rank's gradient gets an inf at this step (1-based) */
    fsc_moe_options moe; /* --moe-experts: opt.model.moe points here */
    /* the layout (world / (pp x tp) x --pp x --tp), built once: the strategy,
     * MoE's experts and --balance auto take their groups from it; NULL when
     * the strategy runs in this process alone */
    fsc_mesh *mesh;
    /* --freeze and --lora-targets split at their commas (pointing into the
     * texts), and the LoRA configuration the plan borrows */
    char *freeze_text, *lora_text;
    const char **freeze, **lora_targets;
    int nfreeze, nlora_targets;
    fsc_lora_config lora;
    /* --param-group parsed (patterns point into group_text) */
    char *group_text;
    fsc_gpt_param_group *groups;
    int ngroups;
    /* the val loss measured after the current step (NAN: none), stored in
     * its checkpoint for --keep-best */
    double val_loss_now;
} trainer;

/* train_moe.c: --moe-* ranges and combinations (train_options_check calls it). */
int train_moe_check(const train_options *o);
/* Fills t->moe from the flags (experts over t->mesh's dp group under ddp)
 * and points t->opt.model.moe at it; nothing without --moe-experts. */
int train_moe_setup(trainer *t);
/* One summary line: drops, mean l_aux and the all-to-all share of `seconds`. */
void train_moe_report(const trainer *t, double seconds, FILE *f);

/* Builds everything from the options; on error returns a status with the message set. */
int trainer_init(trainer *t, const train_options *o);
/* Trains the next step with all its micro-batches, then the optimizer update. */
int trainer_step(trainer *t, fsc_step_result *r);
int64_t trainer_next_step(const trainer *t); /* 0-based */
void trainer_free(trainer *t);
/* Saves weights with the model configuration in the metadata (collective;
 * rank 0 writes, path may be NULL elsewhere). */
int trainer_save(trainer *t, const char *path);

/* train_save_dir.c: --save-dir DIR, what from_pretrained reads: the weights
 * (model.safetensors, cut into shards past --shard-size under llama),
 * config.json, and the tokenizer's files copied from --tokenizer or from
 * --init-from's directory (GPT-2's encoder.json and vocab.bpe under HF's
 * names, vocab.json and merges.txt). Collective, as --save is. */
int train_save_dir(trainer *t, const char *dir);
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

/* train_lora.c. --save-adapter: the adapters as a Hugging Face PEFT
 * directory (collective: every rank calls it). */
int train_lora_save_adapter(trainer *t, const char *dir);
/* --lora-merge, rank 0: rewrites the weights file at path with B A scale
 * folded into each adapted weight and the adapters left out. */
int train_lora_merge_file(const trainer *t, const char *path);
/* --lora-from: the adapters of a PEFT directory (as --save-adapter writes
 * it) into the model, after --init-from (collective). */
int train_lora_load_adapter(trainer *t, const char *dir);
/* --init-from with --lora-rank: the base file's tensors into the model, the
 * adapters keeping their initialisation (a base has none). */
int train_lora_init_from(trainer *t, const char *base);
/* train_sharded.c: --init-from a --save-sharded directory. Whether path is
 * one (it holds shard-00000-of-N.safetensors; *world gets N, may be NULL);
 * the path of its first file (FSC_ERR_NOT_FOUND if none); and the load: each
 * rank its own file at the world size that saved them under fsdp, otherwise
 * the full state dict rebuilt beside them and loaded by global name. */
bool train_sharded_dir(const char *path, int *world);
int train_sharded_first(const char *dir, char *out, size_t size);
int train_sharded_load(trainer *t, const char *dir);

#endif
