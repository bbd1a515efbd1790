/* The training loop behind fsc-train and fsc-bench.
 *
 * One step = grad_accum micro-batches taken in the documented data order
 * (fsc_tokens_batch), each adding its share of the global-batch mean loss to
 * the gradients, then optional clipping, the scheduled lr, and the update. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsc/checkpoint_wrapper.h"
#include "fsc/sharded_grad_scaler.h"
#include "fsc/weights.h"
#include "train_common.h"

void train_options_default(train_options *o) {
    memset(o, 0, sizeof *o);
    o->strategy = "single";
    o->model = (fsc_gpt_config){.vocab = 256, .seq = 128, .layers = 4, .d_model = 256, .heads = 4};
    o->data = "builtin";
    o->batch = 8;
    o->grad_accum = 1;
    o->steps = 200;
    o->lr = 1e-3;
    o->min_lr_ratio = 0.1;
    o->warmup = 20;
    o->schedule = "cosine";
    o->optimizer = "adamw";
    o->weight_decay = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->clip = 1.0;
    o->seed = 1337;
    o->threads = 1;
    o->bucket_mb = 25;
    o->partition = "even";
    o->share_dtype = "f32";
    o->reshard_after_forward = 1;
    o->mixed_precision = "fp32";
    o->log_every = 10;
}

typedef enum { ARG_INT, ARG_I64, ARG_U64, ARG_DOUBLE, ARG_FLOAT, ARG_STR, ARG_FLAG } arg_kind;

typedef struct {
    const char *name;
    arg_kind kind;
    size_t offset;
    const char *help;
} flag;

#define F(name, kind, field, help)                                                                 \
    { name, kind, offsetof(train_options, field), help }
static const flag flags[] = {
    F("strategy", ARG_STR, strategy,
      "single | dp (threads in one process) | ddp (one process per rank, under mpirun) | "
      "oss (ddp + optimizer state sharded over the ranks: ZeRO-1) | "
      "sdp (ShardedDDP: gradients sharded too: ZeRO-2) | "
      "fsdp (parameters sharded too, gathered per unit: ZeRO-3)"),
    F("layers", ARG_INT, model.layers, "transformer blocks (L)"),
    F("d-model", ARG_INT, model.d_model, "model width (C)"),
    F("heads", ARG_INT, model.heads, "attention heads (must divide --d-model)"),
    F("seq", ARG_INT, model.seq, "sequence length (T)"),
    F("vocab", ARG_INT, model.vocab, "vocabulary size (256 for bytes; 50257 for GPT-2 shards)"),
    F("dropout", ARG_FLOAT, model.dropout, "embedding and residual dropout"),
    F("data", ARG_STR, data,
      "builtin[:SEED[:BYTES]] | shard.bin[,more.bin] | 'dir/*.bin' | text file (bytes)"),
    F("batch", ARG_INT, batch, "sequences per micro-batch per rank"),
    F("grad-accum", ARG_INT, grad_accum, "micro-batches per optimizer step"),
    F("steps", ARG_I64, steps, "optimizer steps"),
    F("lr", ARG_DOUBLE, lr, "peak learning rate"),
    F("min-lr-ratio", ARG_DOUBLE, min_lr_ratio, "cosine floor as a fraction of --lr"),
    F("warmup", ARG_I64, warmup, "linear warm-up steps"),
    F("schedule", ARG_STR, schedule, "cosine | constant | warmup-constant"),
    F("optimizer", ARG_STR, optimizer, "adamw | adam | sgd"),
    F("weight-decay", ARG_DOUBLE, weight_decay, "weight decay (AdamW: on >= 2-dim params)"),
    F("beta1", ARG_DOUBLE, beta1, "Adam beta1"),
    F("beta2", ARG_DOUBLE, beta2, "Adam beta2"),
    F("eps", ARG_DOUBLE, eps, "Adam epsilon"),
    F("momentum", ARG_DOUBLE, momentum, "SGD momentum"),
    F("clip", ARG_DOUBLE, clip, "global grad-norm clip (0 = off)"),
    F("seed", ARG_U64, seed, "seed for initial weights and dropout"),
    F("threads", ARG_INT, threads, "BLAS and OpenMP threads; with --strategy dp, worker threads"),
    F("bucket-mb", ARG_DOUBLE, bucket_mb,
      "DDP gradient bucket size in MB; sdp: the other ranks' gradient memory held at once"),
    F("partition", ARG_STR, partition, "oss: even (flat, balanced) | greedy (whole tensors)"),
    F("share-dtype", ARG_STR, share_dtype, "oss: dtype updated parameters travel in: f32|bf16|f16"),
    F("min-params", ARG_I64, min_params,
      "fsdp: auto-wrap every module reaching N parameters (0: one unit per block)"),
    F("reshard-after-forward", ARG_INT, reshard_after_forward,
      "fsdp: 1 frees a unit's parameters after forward (gathers again in backward), 0 keeps them"),
    F("mixed-precision", ARG_STR, mixed_precision,
      "fsdp: fp32 | bf16 | fp16 (parameters gathered and rounded; fp16 adds loss scaling)"),
    F("reduce-dtype", ARG_STR, reduce_dtype,
      "fsdp, sdp: f32 | bf16 | f16 gradient reduction (fsdp default: the compute dtype)"),
    F("accum-no-sync", ARG_FLAG, accum_no_sync,
      "fsdp: with --grad-accum, keep full gradients and reduce once (more memory, less traffic)"),
    F("checkpoint-activations", ARG_FLAG, checkpoint_activations,
      "recompute each block's activations in backward (less memory, ~1/3 more compute)"),
    F("save-every", ARG_I64, save_every,
      "write a checkpoint every N steps (needs --checkpoint-dir)"),
    F("checkpoint-dir", ARG_STR, checkpoint_dir, "directory of checkpoints (step-N/, latest)"),
    F("resume", ARG_STR, resume, "resume from this checkpoint directory's latest checkpoint"),
    F("save-sharded", ARG_STR, save_sharded,
      "fsdp: at the end, each rank writes its shard file into this directory"),
    F("init-from", ARG_STR, init_from, "start from these weights (safetensors)"),
    F("save-init", ARG_STR, save_init, "save the weights before step 1"),
    F("save", ARG_STR, save, "save the weights at the end"),
    F("metrics", ARG_STR, metrics, "write one JSON object per step to this file"),
    F("log-every", ARG_INT, log_every, "progress lines every N steps when not on a terminal"),
    F("quiet", ARG_FLAG, quiet, "no progress output"),
};
#undef F

static void usage(const char *prog, const char *extra) {
    printf("usage: %s [flags]\n%s\n", prog, extra ? extra : "");
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        printf("  --%-14s %s\n", flags[i].name, flags[i].help);
}

static int parse_value(const flag *f, const char *v, void *dst) {
    char *end = NULL;
    errno = 0;
    switch (f->kind) {
    case ARG_INT: {
        long x = strtol(v, &end, 10);
        if (x < INT32_MIN || x > INT32_MAX) errno = ERANGE;
        *(int *)dst = (int)x;
        break;
    }
    case ARG_I64:
        *(int64_t *)dst = strtoll(v, &end, 10);
        break;
    case ARG_U64:
        *(uint64_t *)dst = strtoull(v, &end, 10);
        break;
    case ARG_DOUBLE:
        *(double *)dst = strtod(v, &end);
        break;
    case ARG_FLOAT:
        *(float *)dst = strtof(v, &end);
        break;
    case ARG_STR:
        *(const char **)dst = v;
        return FSC_OK;
    case ARG_FLAG:
        *(bool *)dst = true;
        return FSC_OK;
    }
    if (errno || end == v || *end)
        return fsc_error(FSC_ERR_INVALID, "--%s: \"%s\" is not a valid %s", f->name, v,
                         f->kind == ARG_DOUBLE || f->kind == ARG_FLOAT ? "number" : "integer");
    return FSC_OK;
}

int train_options_parse(train_options *o, int argc, char **argv, const char *prog,
                        const char *extra) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(prog, extra);
            return 1;
        }
        if (strncmp(a, "--", 2))
            return fsc_error(FSC_ERR_INVALID, "unexpected argument \"%s\" (flags start with --)",
                             a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const flag *f = NULL;
        for (size_t k = 0; k < sizeof flags / sizeof *flags; k++)
            if (strlen(flags[k].name) == len && !strncmp(flags[k].name, name, len)) f = &flags[k];
        if (!f) return fsc_error(FSC_ERR_INVALID, "unknown flag \"%s\" (see --help)", a);
        const char *v = eq ? eq + 1 : NULL;
        if (!v && f->kind != ARG_FLAG) {
            if (i + 1 >= argc) return fsc_error(FSC_ERR_INVALID, "--%s needs a value", f->name);
            v = argv[++i];
        }
        int rc = parse_value(f, v ? v : "", (char *)o + f->offset);
        if (rc) return rc;
    }
    return FSC_OK;
}

/* Fails early, before any training, if `path` could not be written later. */
static int check_writable(const char *flag, const char *path) {
    if (!path || fsc_dist_rank() != 0) return FSC_OK; /* rank 0 writes */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (access(dir, W_OK) != 0)
        return fsc_error(FSC_ERR_IO, "%s %s: directory %s is not writable (%s)", flag, path, dir,
                         strerror(errno));
    return FSC_OK;
}

static int check_options(const train_options *o) {
    int rc = fsc_gpt_config_check(&o->model);
    if (rc) return fsc_error_context(rc, "bad model: ");
    if (o->batch < 1) return fsc_error(FSC_ERR_INVALID, "--batch %d must be positive", o->batch);
    if (o->grad_accum < 1)
        return fsc_error(FSC_ERR_INVALID, "--grad-accum %d must be positive", o->grad_accum);
    if (o->steps < 0) return fsc_error(FSC_ERR_INVALID, "--steps must be >= 0");
    if (o->threads < 1) return fsc_error(FSC_ERR_INVALID, "--threads must be >= 1");
    if (!(o->bucket_mb > 0))
        return fsc_error(FSC_ERR_INVALID, "--bucket-mb %g must be positive", o->bucket_mb);
    if (o->clip < 0) return fsc_error(FSC_ERR_INVALID, "--clip %g must be >= 0", o->clip);
    if (o->save_every < 0) return fsc_error(FSC_ERR_INVALID, "--save-every must be >= 0");
    if (o->save_every > 0 && !o->checkpoint_dir)
        return fsc_error(FSC_ERR_INVALID, "--save-every needs --checkpoint-dir");
    if (o->reshard_after_forward != 0 && o->reshard_after_forward != 1)
        return fsc_error(FSC_ERR_INVALID, "--reshard-after-forward %d: expected 0 or 1",
                         o->reshard_after_forward);
    bool fsdp = !strcmp(o->strategy, "fsdp");
    if (o->reduce_dtype && !fsdp && strcmp(o->strategy, "sdp"))
        return fsc_error(FSC_ERR_INVALID, "--reduce-dtype applies to --strategy fsdp and sdp only");
    if (!fsdp && (strcmp(o->mixed_precision, "fp32") || o->min_params || o->accum_no_sync ||
                  !o->reshard_after_forward))
        return fsc_error(FSC_ERR_INVALID, "--mixed-precision, --min-params, --accum-no-sync and "
                                          "--reshard-after-forward apply to --strategy fsdp only");
    if (o->save_sharded && !fsdp)
        return fsc_error(FSC_ERR_INVALID, "--save-sharded applies to --strategy fsdp only");
    if (o->min_params < 0)
        return fsc_error(FSC_ERR_INVALID, "--min-params %lld must be >= 0",
                         (long long)o->min_params);
    int rc2 = check_writable("--save", o->save);
    if (!rc2) rc2 = check_writable("--save-init", o->save_init);
    if (!rc2) rc2 = check_writable("--metrics", o->metrics);
    return rc2;
}

static int optim_config(const train_options *o, fsc_optim_config *out) {
    fsc_optim_config cfg = {.lr = o->lr,
                            .weight_decay = o->weight_decay,
                            .beta1 = o->beta1,
                            .beta2 = o->beta2,
                            .eps = o->eps,
                            .momentum = o->momentum};
    if (!strcmp(o->optimizer, "adamw"))
        cfg.kind = FSC_OPTIM_ADAMW;
    else if (!strcmp(o->optimizer, "adam"))
        cfg.kind = FSC_OPTIM_ADAM;
    else if (!strcmp(o->optimizer, "sgd"))
        cfg.kind = FSC_OPTIM_SGD;
    else
        return fsc_error(FSC_ERR_INVALID, "--optimizer \"%s\": expected adamw, adam or sgd",
                         o->optimizer);
    *out = cfg;
    return FSC_OK;
}

static int parse_dtype(const char *flag, const char *v, bool fp_names, fsc_dtype *out) {
    const char *half = fp_names ? "fp16" : "f16", *full = fp_names ? "fp32" : "f32";
    if (!strcmp(v, "bf16"))
        *out = FSC_DTYPE_BF16;
    else if (!strcmp(v, half))
        *out = FSC_DTYPE_F16;
    else if (!strcmp(v, full))
        *out = FSC_DTYPE_F32;
    else
        return fsc_error(FSC_ERR_INVALID, "%s \"%s\": expected %s, bf16 or %s", flag, v, full,
                         half);
    return FSC_OK;
}

/* The blocks of the GPT ("h.0", "h.1", ...): FSDP's default units and what
 * --checkpoint-activations recomputes. */
static fsc_module **gpt_blocks(fsc_module *gpt, int *n) {
    fsc_module **b = calloc((size_t)gpt->nchildren, sizeof *b);
    *n = 0;
    for (int c = 0; b && c < gpt->nchildren; c++)
        if (!strncmp(gpt->children[c]->name, "h.", 2)) b[(*n)++] = gpt->children[c];
    return b;
}

/* FSDP over the world: units, shards initialised from the seed, the
 * optimizer over them, fp16 loss scaling. */
static int make_fsdp(trainer *t, const fsc_optim_config *cfg) {
    const train_options *o = &t->opt;
    fsc_fsdp_options fo = {.keep_after_forward = !o->reshard_after_forward};
    int rc = parse_dtype("--mixed-precision", o->mixed_precision, true, &fo.compute_dtype);
    fo.reduce_dtype = fo.compute_dtype;
    if (!rc && o->reduce_dtype)
        rc = parse_dtype("--reduce-dtype", o->reduce_dtype, false, &fo.reduce_dtype);
    if (rc) return rc;
    fsc_module **units = NULL;
    int n = 0;
    if (o->min_params > 0)
        rc = fsc_fsdp_auto_wrap(t->model, o->min_params, &units, &n);
    else if (!(units = gpt_blocks(t->model, &n)))
        rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
    if (!rc && !(t->fsdp = fsc_fsdp_new(t->model, fsc_group_world(), o->seed, units, n, cfg, &fo)))
        rc = fsc_error_context(FSC_ERR_INVALID, "FSDP: ");
    free(units);
    if (!rc && fo.compute_dtype == FSC_DTYPE_F16 && !(t->scaler = fsc_grad_scaler_new(NULL)))
        rc = fsc_error_context(FSC_ERR_INVALID, "grad scaler: ");
    return rc;
}

static int make_oss(trainer *t, const fsc_optim_config *cfg) {
    const train_options *o = &t->opt;
    fsc_oss_options oo = {.policy = FSC_PARTITION_EVEN, .share_dtype = FSC_DTYPE_F32};
    if (!strcmp(o->partition, "greedy"))
        oo.policy = FSC_PARTITION_GREEDY;
    else if (strcmp(o->partition, "even"))
        return fsc_error(FSC_ERR_INVALID, "--partition \"%s\": expected even or greedy",
                         o->partition);
    if (!strcmp(o->share_dtype, "bf16"))
        oo.share_dtype = FSC_DTYPE_BF16;
    else if (!strcmp(o->share_dtype, "f16"))
        oo.share_dtype = FSC_DTYPE_F16;
    else if (strcmp(o->share_dtype, "f32"))
        return fsc_error(FSC_ERR_INVALID, "--share-dtype \"%s\": expected f32, bf16 or f16",
                         o->share_dtype);
    bool sharded = t->strategy == STRATEGY_OSS || t->strategy == STRATEGY_SDP;
    fsc_group *g = sharded ? fsc_group_world() : fsc_group_self();
    t->oss = fsc_oss_new(cfg, &t->params, g, &oo);
    if (!t->oss) return fsc_error_context(FSC_ERR_INVALID, "optimizer: ");
    return FSC_OK;
}

static int make_schedule(trainer *t) {
    const train_options *o = &t->opt;
    fsc_lr_schedule_config *s = &t->sched;
    *s = (fsc_lr_schedule_config){.max_lr = (float)o->lr,
                                  .warmup_steps = o->warmup,
                                  .total_steps = o->steps,
                                  .min_lr_ratio = (float)o->min_lr_ratio};
    if (!strcmp(o->schedule, "cosine"))
        s->kind = FSC_LR_WARMUP_COSINE;
    else if (!strcmp(o->schedule, "constant"))
        s->kind = FSC_LR_CONSTANT, s->warmup_steps = 0;
    else if (!strcmp(o->schedule, "warmup-constant"))
        s->kind = FSC_LR_WARMUP_CONSTANT;
    else
        return fsc_error(FSC_ERR_INVALID,
                         "--schedule \"%s\": expected cosine, constant or warmup-constant",
                         o->schedule);
    if (s->kind == FSC_LR_WARMUP_COSINE && s->total_steps < s->warmup_steps)
        s->total_steps = s->warmup_steps;
    int rc = fsc_lr_schedule_check(s);
    return rc ? fsc_error_context(rc, "schedule: ") : FSC_OK;
}

static int make_optimizer(trainer *t) {
    const train_options *o = &t->opt;
    fsc_optim_config cfg;
    int rc = optim_config(o, &cfg);
    if (rc) return rc;
    if (t->strategy == STRATEGY_FSDP) {
        if ((rc = make_fsdp(t, &cfg))) return rc;
    } else if ((rc = make_oss(t, &cfg))) {
        return rc;
    }
    return make_schedule(t);
}

static int parse_strategy(trainer *t) {
    const char *s = t->opt.strategy;
    if (!strcmp(s, "single"))
        t->strategy = STRATEGY_SINGLE;
    else if (!strcmp(s, "dp"))
        t->strategy = STRATEGY_DP;
    else if (!strcmp(s, "ddp"))
        t->strategy = STRATEGY_DDP;
    else if (!strcmp(s, "oss"))
        t->strategy = STRATEGY_OSS;
    else if (!strcmp(s, "sdp"))
        t->strategy = STRATEGY_SDP;
    else if (!strcmp(s, "fsdp"))
        t->strategy = STRATEGY_FSDP;
    else
        return fsc_error(FSC_ERR_INVALID,
                         "--strategy \"%s\": expected single, dp, ddp, oss, sdp or fsdp", s);
    bool ranks = t->strategy >= STRATEGY_DDP;
    int world = fsc_dist_size();
    if (!ranks && world > 1 && !t->opt.local_in_world)
        return fsc_error(FSC_ERR_INVALID,
                         "--strategy %s runs in one process but %d were launched; "
                         "use --strategy ddp under mpirun",
                         s, world);
    t->rank = ranks ? fsc_dist_rank() : 0;
    t->world = ranks ? world : 1;
    if (t->strategy == STRATEGY_DP && t->opt.batch < t->opt.threads)
        return fsc_error(FSC_ERR_INVALID, "--batch %d cannot be split across --threads %d",
                         t->opt.batch, t->opt.threads);
    return FSC_OK;
}

static int checkpoint_blocks(fsc_module *gpt) {
    int n, rc = FSC_OK;
    fsc_module **blocks = gpt_blocks(gpt, &n);
    if (!blocks) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) rc = fsc_checkpoint_wrap(blocks[i]);
    free(blocks);
    return rc ? fsc_error_context(rc, "--checkpoint-activations: ") : FSC_OK;
}

static fsc_module *make_replica(void *user) {
    return fsc_gpt_new(user);
}

static void model_json(const fsc_gpt_config *m, char *buf, size_t n) {
    snprintf(buf, n,
             "{\"vocab_size\": %d, \"n_positions\": %d, \"n_layer\": %d, \"n_embd\": %d, "
             "\"n_head\": %d}",
             m->vocab, m->seq, m->layers, m->d_model, m->heads);
}

static int load_weights(trainer *t, const char *path) {
    return t->fsdp ? fsc_fsdp_load_full(t->fsdp, path) : fsc_weights_load(path, &t->params, NULL);
}

/* The loss scale travels in the checkpoint as "scale tracker skipped". */
static int load_scaler(trainer *t, const char *v) {
    fsc_grad_scaler_state st;
    long long tracker, skipped;
    if (!v || sscanf(v, "%lg %lld %lld", &st.scale, &tracker, &skipped) != 3)
        return fsc_error(FSC_ERR_FORMAT, "the checkpoint has no valid grad_scaler entry (\"%s\")",
                         v ? v : "none");
    st.growth_tracker = tracker, st.skipped_steps = skipped;
    return fsc_grad_scaler_set_state(t->scaler, &st);
}

/* Weights, optimizer state and position from --resume. The data order and
 * the dropout masks are functions of (seed, step), so the step is the whole
 * data position; the seed must match. Any world size and strategy. */
static int resume(trainer *t) {
    fsc_ckpt *c;
    int rc = fsc_ckpt_open(t->opt.resume, &c);
    if (rc) return rc;
    char want[256], seed[32];
    model_json(&t->opt.model, want, sizeof want);
    snprintf(seed, sizeof seed, "%" PRIu64, t->opt.seed);
    const char *model = fsc_ckpt_get(c, "model"), *ckseed = fsc_ckpt_get(c, "seed");
    cJSON *a = cJSON_Parse(want), *b = model ? cJSON_Parse(model) : NULL;
    bool same = a && b && cJSON_Compare(a, b, true);
    cJSON_Delete(a), cJSON_Delete(b);
    if (!same)
        rc = fsc_error(FSC_ERR_INVALID,
                       "the checkpoint is of another model (%s); the flags "
                       "describe %s",
                       model ? model : "none", want);
    else if (!ckseed || strcmp(ckseed, seed))
        rc = fsc_error(FSC_ERR_INVALID, "the checkpoint was trained with --seed %s, not %s",
                       ckseed ? ckseed : "?", seed);
    const char *weights = fsc_ckpt_path(c, "model.safetensors");
    const char *optim = fsc_ckpt_path(c, "optim.safetensors");
    if (!rc && (!weights || !optim))
        rc = fsc_error(FSC_ERR_FORMAT,
                       "the checkpoint lacks model.safetensors or optim.safetensors");
    if (!rc) rc = load_weights(t, weights);
    if (!rc)
        rc =
            t->fsdp ? fsc_fsdp_load_optim_state(t->fsdp, optim) : fsc_oss_load_state(t->oss, optim);
    /* a run without fp16 loss scaling may continue one that had it, and back */
    if (!rc && t->scaler && fsc_ckpt_get(c, "grad_scaler"))
        rc = load_scaler(t, fsc_ckpt_get(c, "grad_scaler"));
    if (!rc) t->step = fsc_ckpt_step(c);
    fsc_ckpt_close(c);
    return rc;
}

int trainer_init(trainer *t, const train_options *o) {
    memset(t, 0, sizeof *t);
    t->opt = *o;
    int rc = check_options(o);
    if (!rc) rc = parse_strategy(t);
    if (rc) return rc;
    /* DP workers each run one BLAS thread; elsewhere --threads is the BLAS/OpenMP count. */
    int inner = t->strategy == STRATEGY_DP ? 1 : o->threads;
    fsc_set_num_threads(inner);
    if ((rc = fsc_blas_init(inner))) return rc;

    if ((rc = fsc_tokens_load(o->data, &t->tokens)))
        return fsc_error_context(rc, "--data %s: ", o->data);
    if (t->tokens.vocab > o->model.vocab)
        return fsc_error(FSC_ERR_INVALID,
                         "--data %s has token ids up to %d but --vocab is %d; raise --vocab",
                         o->data, t->tokens.vocab - 1, o->model.vocab);
    if (t->tokens.count < (int64_t)o->model.seq + 1)
        return fsc_error(FSC_ERR_INVALID, "--data %s has %" PRId64 " tokens, fewer than --seq + 1",
                         o->data, t->tokens.count);

    t->model = fsc_gpt_new(&o->model);
    if (!t->model) return FSC_ERR_INVALID;
    if (o->checkpoint_activations && (rc = checkpoint_blocks(t->model))) return rc;
    if (t->strategy == STRATEGY_FSDP) { /* shards only: the parameters are never bound whole */
        if ((rc = make_optimizer(t))) return rc;
        if (o->init_from && (rc = fsc_fsdp_load_full(t->fsdp, o->init_from)))
            return fsc_error_context(rc, "--init-from: ");
    } else if ((rc = fsc_params_bind(t->model, o->seed, true, &t->params))) {
        return rc;
    }
    if (!t->fsdp && o->init_from) {
        int unused = 0;
        if ((rc = fsc_weights_load(o->init_from, &t->params, &unused)))
            return fsc_error_context(rc, "--init-from: ");
        if (unused)
            fsc_log(FSC_LOG_INFO, "--init-from: %d tensors in the file were not used", unused);
    }
    if (t->strategy == STRATEGY_DDP || t->strategy == STRATEGY_OSS) {
        fsc_ddp_options d = {.bucket_bytes = (size_t)(o->bucket_mb * 1e6)};
        t->ddp = fsc_ddp_wrap(t->model, &t->params, fsc_group_world(), &d);
        if (!t->ddp) return fsc_error_context(FSC_ERR_INVALID, "DDP: ");
    } else if (t->strategy == STRATEGY_DP) {
        if ((rc = fsc_dp_new(make_replica, &t->opt.model, &t->params, o->threads, &t->dp)))
            return rc;
    }
    if (!t->fsdp && (rc = make_optimizer(t))) return rc;
    if (t->strategy == STRATEGY_SDP) {
        fsc_sdp_options so = {.bucket_bytes = (size_t)(o->bucket_mb * 1e6)};
        if (o->reduce_dtype &&
            (rc = parse_dtype("--reduce-dtype", o->reduce_dtype, false, &so.reduce_dtype)))
            return rc;
        t->sdp = fsc_sdp_wrap(t->model, &t->params, t->oss, &so);
        if (!t->sdp) return fsc_error_context(FSC_ERR_INVALID, "ShardedDDP: ");
    }
    if (o->resume && (rc = resume(t))) return fsc_error_context(rc, "--resume %s: ", o->resume);
    t->arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    size_t n = (size_t)o->batch * o->model.seq;
    t->x = malloc(n * sizeof *t->x);
    t->y = malloc(n * sizeof *t->y);
    if (!t->arena || !t->x || !t->y) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    if (o->save_init && (rc = trainer_save(t, o->save_init)))
        return fsc_error_context(rc, "--save-init: ");
    return FSC_OK;
}

typedef struct {
    const trainer *t;
    double norm;
} dp_work;

/* A DP worker's rows of the current micro-batch. */
static int dp_micro(fsc_module *replica, const fsc_ctx *ctx, int row0, int rows, void *user,
                    float *loss) {
    const dp_work *w = user;
    int T = w->t->opt.model.seq;
    return fsc_gpt_train_micro(replica, ctx, w->t->x + (size_t)row0 * T, w->t->y + (size_t)row0 * T,
                               rows, T, -1, w->norm, loss);
}

int trainer_step(trainer *t, step_result *r) {
    const train_options *o = &t->opt;
    int B = o->batch, T = o->model.seq, K = o->grad_accum;
    double t0 = fsc_now(), loss = 0, comm = 0;
    /* targets in the global batch: every rank's micro-batches of this step */
    double norm = (double)B * T * K * t->world;
    /* fp16: the loss (and so every gradient) is multiplied by the scale,
     * simply by dividing the normaliser */
    const double scale = t->scaler ? fsc_grad_scaler_get_scale(t->scaler) : 1.0;
    const double fsdp_wait0 = t->fsdp ? fsc_fsdp_get_stats(t->fsdp).wait_s : 0;
    if (t->fsdp)
        fsc_fsdp_zero_grad(t->fsdp);
    else if (t->sdp)
        fsc_sdp_zero_grad(t->sdp); /* touching all gradients would bring them all back */
    else
        fsc_params_zero_grad(&t->params);
    for (int k = 0; k < K; k++) {
        int rc = fsc_tokens_batch(&t->tokens, t->step, k, t->rank, B, K, t->world, T, t->x, t->y);
        if (rc) return rc;
        fsc_ctx ctx = {.arena = t->arena,
                       .training = true,
                       .seed = o->seed,
                       .step = t->step,
                       .sample0 = fsc_batch_first_sample(t->step, k, t->rank, B, K, t->world)};
        float part = 0;
        if (t->dp) {
            dp_work w = {t, norm};
            rc = fsc_dp_run(t->dp, &ctx, B, dp_micro, &w, &part);
        } else {
            fsc_arena_reset(t->arena);
            fsc_module *m = t->ddp ? t->ddp : t->sdp ? t->sdp : t->model;
            if (t->ddp) fsc_ddp_set_no_sync(t->ddp, k < K - 1); /* reduce once, after the last */
            if (t->sdp) fsc_sdp_set_no_sync(t->sdp, k < K - 1);
            if (t->fsdp) fsc_fsdp_set_no_sync(t->fsdp, o->accum_no_sync && k < K - 1);
            rc = fsc_gpt_train_micro(m, &ctx, t->x, t->y, B, T, -1, norm / scale, &part);
            part = (float)(part / scale);
            if (t->ddp && k == K - 1) comm = fsc_ddp_get_stats(t->ddp).last_wait_s;
            if (t->sdp && k == K - 1) comm = fsc_sdp_get_stats(t->sdp).last_wait_s;
            if (t->fsdp) comm = fsc_fsdp_get_stats(t->fsdp).wait_s - fsdp_wait0;
        }
        if (rc) return rc;
        loss += part;
    }
    if (t->world > 1) { /* this rank's share -> the global-batch loss, for reporting */
        float share = (float)loss;
        int rc = fsc_group_allreduce(fsc_group_world(), &share, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM);
        if (rc) return rc;
        loss = share;
    }
    int rc = FSC_OK, nr = 0;
    const fsc_optim_range *ranges = t->fsdp ? fsc_fsdp_ranges(t->fsdp, &nr) : NULL;
    if (t->poison_step == t->step + 1) { /* tests: an overflow on this rank alone */
        float *g = t->fsdp ? (nr ? ranges[0].grad : NULL) : t->params.grad;
        if (g) g[0] = INFINITY;
    }
    bool skip = false;
    if (t->scaler) { /* unscale this rank's shards; every rank learns of any inf */
        rc = fsc_sharded_grad_scaler_unscale(t->scaler, fsc_group_world(), ranges, nr, &skip);
        if (!rc) rc = fsc_grad_scaler_update(t->scaler, skip);
        if (rc) return rc;
    }
    if (skip) { /* every rank skips this update together */
        t->step++;
        *r = (step_result){.loss = loss,
                           .lr = fsc_optim_get_lr(trainer_optim(t)),
                           .grad_norm = INFINITY,
                           .seconds = fsc_now() - t0,
                           .comm_wait_s = comm,
                           .skipped = true,
                           .loss_scale = t->scaler ? scale : 0};
        return FSC_OK;
    }
    /* the global gradient norm (over every shard when sharded); clip when asked */
    float gnorm = 0;
    if (o->clip > 0 || !o->skip_grad_norm) {
        float max = o->clip > 0 ? (float)o->clip : FLT_MAX;
        rc = t->fsdp ? fsc_fsdp_clip_grad_norm(t->fsdp, max, false, &gnorm)
                     : fsc_oss_clip_grad_norm(t->oss, max, false, &gnorm);
    }
    if (rc == FSC_ERR_NUMERIC || !isfinite(loss))
        return fsc_error(FSC_ERR_NUMERIC,
                         "step %" PRId64 ": loss %g, gradient norm %g: training "
                         "diverged (lower --lr or use --clip)",
                         t->step + 1, loss, (double)gnorm);
    if (rc) return rc;
    double lr = fsc_lr_schedule(&t->sched, t->step);
    if (t->fsdp) {
        rc = fsc_optim_set_lr(fsc_fsdp_optim(t->fsdp), lr);
        if (!rc) rc = fsc_fsdp_step(t->fsdp);
    } else {
        rc = fsc_oss_set_lr(t->oss, lr);
        if (!rc) rc = fsc_oss_step(t->oss);
    }
    if (rc) return rc;
    t->step++;
    *r = (step_result){.loss = loss,
                       .lr = lr,
                       .grad_norm = gnorm,
                       .seconds = fsc_now() - t0,
                       .comm_wait_s = comm,
                       .loss_scale = t->scaler ? scale : 0};
    return FSC_OK;
}

/* The metadata every weights file carries. */
typedef struct {
    char cfg[256], step[32];
    const char *keys[3], *values[3];
} weights_meta;

static void make_meta(const trainer *t, weights_meta *m) {
    model_json(&t->opt.model, m->cfg, sizeof m->cfg);
    snprintf(m->step, sizeof m->step, "%" PRId64, t->step);
    const char *keys[] = {"format", "fsc.gpt_config", "fsc.step"};
    const char *values[] = {"pt", m->cfg, m->step};
    memcpy(m->keys, keys, sizeof keys);
    memcpy(m->values, values, sizeof values);
}

int trainer_save_sharded(trainer *t, const char *dir) {
    if (!t->fsdp) return fsc_error(FSC_ERR_INVALID, "--save-sharded needs --strategy fsdp");
    if (mkdir(dir, 0777) && errno != EEXIST)
        return fsc_error(FSC_ERR_IO, "--save-sharded %s: cannot create it (%s)", dir,
                         strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", dir, t->rank, t->world);
    weights_meta m;
    make_meta(t, &m);
    return fsc_fsdp_save_sharded(t->fsdp, path, 3, m.keys, m.values);
}

int trainer_save(trainer *t, const char *path) {
    weights_meta m;
    make_meta(t, &m);
    const char *const *keys = m.keys, *const *values = m.values;
    if (t->fsdp) return fsc_fsdp_save_full(t->fsdp, t->rank == 0 ? path : NULL, 0, 3, keys, values);
    return t->rank == 0 ? fsc_weights_save(path, &t->params, 3, keys, values) : FSC_OK;
}

fsc_optim *trainer_optim(const trainer *t) {
    return t->fsdp ? fsc_fsdp_optim(t->fsdp) : fsc_oss_local(t->oss);
}

void trainer_free(trainer *t) {
    fsc_module_free(t->ddp); /* the wrapper only; it removes its hooks from the model */
    fsc_module_free(t->sdp);
    fsc_dp_free(t->dp);
    fsc_fsdp_free(t->fsdp); /* removes its hooks; the model is freed below */
    fsc_grad_scaler_free(t->scaler);
    fsc_oss_free(t->oss);
    fsc_params_free(&t->params);
    fsc_module_free(t->model);
    fsc_tokens_free(&t->tokens);
    fsc_arena_free(t->arena);
    free(t->x);
    free(t->y);
    memset(t, 0, sizeof *t);
}

void print_mem_json(FILE *f, bool peak) {
    for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
        fprintf(f, "%s\"%s\": %zu", tag ? ", " : "", fsc_mem_tag_name((fsc_mem_tag)tag),
                peak ? fsc_mem_peak((fsc_mem_tag)tag) : fsc_mem_current((fsc_mem_tag)tag));
}

int gather_mem_peaks(const trainer *t, int64_t *out) {
    int64_t mine[FSC_MEM_TAG_COUNT];
    for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
        mine[tag] = (int64_t)fsc_mem_peak((fsc_mem_tag)tag);
    if (t->world == 1) {
        memcpy(out, mine, sizeof mine);
        return FSC_OK;
    }
    return fsc_group_allgather(fsc_group_world(), mine, out, FSC_MEM_TAG_COUNT, FSC_DTYPE_I64);
}

/* Rank 0 writes the weights and the checkpoint directory; the optimizer state
 * streams to rank 0 from its owners (every rank under oss, rank 0's own copy
 * otherwise). Every rank learns rank 0's outcome. */
int trainer_checkpoint(trainer *t) {
    fsc_group *world = fsc_group_world();
    bool sharded = t->strategy == STRATEGY_OSS || t->strategy == STRATEGY_SDP;
    fsc_ckpt_writer *w = NULL;
    int rc = t->rank == 0 ? fsc_ckpt_begin(t->opt.checkpoint_dir, t->step, &w) : FSC_OK;
    int32_t status = rc;
    if (t->world > 1 && fsc_group_broadcast(world, &status, 1, FSC_DTYPE_I32, 0))
        return FSC_ERR_MPI;
    if (status) return t->rank == 0 ? rc : fsc_error(status, "rank 0 could not start a checkpoint");
    char optim_path[4096] = "";
    if (t->rank == 0)
        snprintf(optim_path, sizeof optim_path, "%s", fsc_ckpt_member(w, "optim.safetensors"));
    if (t->fsdp || t->rank == 0) /* collective under fsdp */
        rc = trainer_save(t, t->rank == 0 ? fsc_ckpt_member(w, "model.safetensors") : NULL);
    if (t->fsdp) {
        int orc = fsc_fsdp_save_optim_state(t->fsdp, optim_path, 0);
        if (!rc) rc = orc;
    } else if (sharded || t->rank == 0) {
        int orc = fsc_oss_save_state(t->oss, optim_path, 0);
        if (!rc) rc = orc;
    }
    if (t->rank == 0) {
        char model[256], v[4200];
        model_json(&t->opt.model, model, sizeof model);
        if (!rc) rc = fsc_ckpt_set(w, "model", model);
        snprintf(v, sizeof v, "%" PRIu64, t->opt.seed);
        if (!rc) rc = fsc_ckpt_set(w, "seed", v);
        snprintf(v, sizeof v,
                 "{\"strategy\": \"%s\", \"ranks\": %d, \"batch\": %d, "
                 "\"grad_accum\": %d}",
                 t->opt.strategy, t->world, t->opt.batch, t->opt.grad_accum);
        if (!rc) rc = fsc_ckpt_set(w, "saved_by", v);
        if (!rc && t->scaler) {
            fsc_grad_scaler_state st = fsc_grad_scaler_get_state(t->scaler);
            snprintf(v, sizeof v, "%.17g %lld %lld", st.scale, (long long)st.growth_tracker,
                     (long long)st.skipped_steps);
            rc = fsc_ckpt_set(w, "grad_scaler", v);
        }
        if (!rc)
            rc = fsc_ckpt_commit(w);
        else
            fsc_ckpt_abort(w);
    }
    status = rc;
    if (t->world > 1 && fsc_group_broadcast(world, &status, 1, FSC_DTYPE_I32, 0))
        return FSC_ERR_MPI;
    if (status && t->rank != 0) return fsc_error(status, "rank 0 could not write the checkpoint");
    return rc;
}
