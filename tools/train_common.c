/* A GPT on token data trained by the library's trainer, for fsc-train and
 * fsc-bench: model, data, files and printing; every strategy's behaviour is
 * the library's, and this file knows none by name (flags: train_options.c). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsc/checkpoint.h"
#include "fsc/weights.h"
#include "train_common.h"

/* A flag reaches the strategy when the user gave it (the strategy refuses
 * what it does not take) or when the strategy takes it (the default). */
/* A row option is passed when its flag was given (the library refuses it
 * where it does not apply) or the row takes it, except under --pp, where
 * the rows' own options do not apply (only a given flag goes on, to be
 * refused by name). */
static bool applies(const train_options *o, const char *flag, const char *option) {
    /* Under --pp, and under --tp for the sharded rows (oss, sdp, fsdp run the
     * TP model as one pipeline stage), a row's own option is only what the
     * user gives (and is then refused by name). */
    const bool piped = o->pp > 1 || (o->tp > 1 && !fsc_strategy_all_reduces(o->strategy));
    return train_flag_given(o, flag) || (!piped && fsc_strategy_takes(o->strategy, option));
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

static int schedule_config(const train_options *o, fsc_lr_schedule_config *s) {
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

/* The strategy's options from the flags; the GPT's layout (model or
 * stage makers, pipeline, TP) is the plan's (fsc/layout.h). */
static int strategy_options(const trainer *t, fsc_strategy_options *so) {
    const train_options *o = &t->opt;
    *so = (fsc_strategy_options){0};
    int rc = FSC_OK;
    if (applies(o, "bucket-mb", "bucket_bytes")) so->bucket_bytes = (size_t)(o->bucket_mb * 1e6);
    if (applies(o, "partition", "partition")) {
        if (!strcmp(o->partition, "greedy"))
            so->partition = FSC_PARTITION_GREEDY;
        else if (!strcmp(o->partition, "even"))
            so->partition = FSC_PARTITION_EVEN;
        else
            return fsc_error(FSC_ERR_INVALID, "--partition \"%s\": expected even or greedy",
                             o->partition);
    }
    if (applies(o, "share-dtype", "share_dtype"))
        rc = parse_dtype("--share-dtype", o->share_dtype, false, &so->share_dtype);
    if (!rc &&
        (applies(o, "mixed-precision", "compute_dtype") || strcmp(o->mixed_precision, "fp32")))
        rc = parse_dtype("--mixed-precision", o->mixed_precision, true, &so->compute_dtype);
    if (!rc && o->reduce_dtype) {
        fsc_dtype dt = FSC_DTYPE_F32;
        rc = parse_dtype("--reduce-dtype", o->reduce_dtype, false, &dt);
        if (rc) return rc;
        if (dt == FSC_DTYPE_F32)
            so->fp32_reduce_scatter = true;
        else
            so->reduce_dtype = dt;
    }
    if (rc) return rc;
    so->min_params = o->min_params;
    so->keep_after_forward = !o->reshard_after_forward;
    so->accum_no_sync = o->accum_no_sync;
    so->shard_group = o->shard_group; /* the row refuses it by name unless it is hsdp */
    /* the row refuses them by name unless it is slowmo */
    so->localsgd_frequency = o->localsgd_frequency, so->slowmo_frequency = o->slowmo_frequency;
    so->slowmo_momentum = o->slowmo_momentum, so->slowmo_lr = o->slowmo_lr;
    return FSC_OK;
}

/* The tokens of micro-batch mb; the plan's trainer config (fsc/layout.h)
 * calls this with the replica's micro-batch under --cp and keeps them for
 * its loss functions. */
static int batch_tokens(const fsc_micro_batch *mb, void *user, int32_t *x, int32_t *y) {
    const trainer *t = user;
    return fsc_tokens_batch(&t->tokens, mb->step, mb->micro, mb->rank, mb->batch, mb->micros,
                            mb->world, t->opt.model.seq, x, y);
}

/* Tests (FSC_FAULT=inf@R:S): an overflow in this rank's gradients alone. */
static int poison(fsc_trainer *tr, void *plan) {
    const trainer *t = fsc_gpt_plan_user(plan);
    if (t->poison_step != fsc_trainer_get_step(tr) + 1) return FSC_OK;
    int n;
    const fsc_optim_range *r = fsc_strategy_grad_ranges(fsc_trainer_strategy(tr), &n);
    if (n && r[0].n) r[0].grad[0] = INFINITY;
    return FSC_OK;
}

static void model_json(const fsc_gpt_config *m, char *buf, size_t n) {
    int k = snprintf(buf, n,
                     "{\"vocab_size\": %d, \"n_positions\": %d, \"n_layer\": %d, "
                     "\"n_embd\": %d, \"n_head\": %d",
                     m->vocab, m->seq, m->layers, m->d_model, m->heads);
    if (m->arch == FSC_ARCH_LLAMA && k > 0 && (size_t)k < n) /* GPT-2's text stays as it was */
        k += snprintf(buf + k, n - (size_t)k,
                      ", \"model_type\": \"llama\", \"num_key_value_heads\": %d, "
                      "\"intermediate_size\": %d, \"rope_theta\": %.9g, \"rms_norm_eps\": %.9g, "
                      "\"tie_word_embeddings\": %s, \"attention_bias\": %s",
                      m->kv_heads ? m->kv_heads : m->heads, fsc_gpt_ffn_hidden(m),
                      (double)(m->rope_theta > 0 ? m->rope_theta : 10000.f),
                      (double)(m->norm_eps > 0 ? m->norm_eps : 1e-5f),
                      m->tie_embeddings ? "true" : "false", m->qkv_bias ? "true" : "false");
    if (k > 0 && (size_t)k + 1 < n) snprintf(buf + k, n - (size_t)k, "}");
}

static int make_trainer(trainer *t) {
    const train_options *o = &t->opt;
    fsc_trainer_config cfg = {.clip = (float)o->clip,
                              .skip_grad_norm = o->skip_grad_norm,
                              .after_backward = poison,
                              .adascale = o->adascale,
                              .async_save = o->async_save};
    int rc = fsc_attention_kind_parse(o->attention, &cfg.attention);
    if (rc) rc = fsc_error_context(rc, "--attention: ");
    if (!rc && o->cp > 1 && cfg.attention == FSC_ATTENTION_NAIVE)
        rc = fsc_error(FSC_ERR_INVALID,
                       "--attention naive with --cp %d: the ring attends with flash tiles (each "
                       "block keeps a log-sum-exp per row, never the T x T probabilities); use "
                       "--attention flash or auto",
                       o->cp);
    if (!rc) rc = optim_config(o, &cfg.optim);
    if (!rc) rc = schedule_config(o, &cfg.schedule);
    if (!rc) rc = strategy_options(t, &cfg.strategy);
    /* batch, grad_accum, the data and loss functions (cfg.user: the plan) */
    if (!rc) rc = fsc_gpt_plan_trainer_config(t->plan, batch_tokens, t, &cfg);
    if (!rc && !(t->tr = fsc_trainer_new(t->model, &cfg)))
        rc = fsc_error_context(FSC_ERR_INVALID, "--strategy %s: ", o->strategy);
    if (rc) return rc;
    t->s = fsc_trainer_strategy(t->tr);
    t->rank = fsc_strategy_rank(t->s);
    t->world = fsc_strategy_world(t->s);
    return FSC_OK;
}

/* The layout's groups, once, for every rank a strategy over the ranks
 * spans: replicas x --pp x --tp, TP fastest (src/comm/mesh.c). */
static int layout_mesh(trainer *t) {
    const train_options *o = &t->opt;
    fsc_strategy_info info;
    if (fsc_strategy_info_get(o->strategy, &info) || !info.spans_ranks) return FSC_OK;
    int rc =
        fsc_mesh_new_over(NULL, (fsc_mesh_shape){.pp = o->pp, .tp = o->tp, .cp = o->cp}, &t->mesh);
    return rc ? fsc_error_context(rc, "--pp %d x --tp %d x --cp %d on %d ranks: ", o->pp, o->tp,
                                  o->cp, fsc_dist_size())
              : FSC_OK;
}

/* flag's text "a<sep>b" into *items {"a", "b"} pointing into *text (both
 * malloc'ed); an empty item is refused. */
static int split_list_at(char sep, const char *flag, const char *s, char **text,
                         const char ***items, int *n) {
    size_t len = strlen(s);
    int most = 1;
    for (size_t i = 0; i < len; i++) most += s[i] == sep;
    *text = malloc(len + 1);
    *items = malloc((size_t)most * sizeof **items);
    if (!*text || !*items) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    memcpy(*text, s, len + 1);
    for (char *tok = *text, *next; tok; tok = next) {
        next = strchr(tok, sep);
        if (next) *next++ = '\0';
        if (!*tok) return fsc_error(FSC_ERR_INVALID, "%s '%s': an empty item", flag, s);
        (*items)[(*n)++] = tok;
    }
    return FSC_OK;
}

/* One "PATTERN:lr=X,wd=Y" of --param-group (text is modified). */
static int parse_group(const train_options *o, char *text, fsc_gpt_param_group *g) {
    char *colon = strrchr(text, ':');
    if (!colon || colon == text)
        return fsc_error(FSC_ERR_INVALID, "--param-group '%s': expected PATTERN:lr=X,wd=Y", text);
    *colon = '\0';
    *g = (fsc_gpt_param_group){.pattern = text, .lr_scale = 1, .weight_decay = -1};
    for (char *kv = strtok(colon + 1, ","); kv; kv = strtok(NULL, ",")) {
        char *end = NULL;
        double v = -1;
        bool lr = !strncmp(kv, "lr=", 3), wd = !strncmp(kv, "wd=", 3);
        if (lr || wd) v = strtod(kv + 3, &end);
        if ((!lr && !wd) || end == kv + 3 || *end || !(v >= 0) || isinf(v))
            return fsc_error(FSC_ERR_INVALID,
                             "--param-group '%s': '%s' is not lr=X or wd=Y with X, Y >= 0", text,
                             kv);
        if (lr && (v <= 0 || o->lr <= 0))
            return fsc_error(FSC_ERR_INVALID,
                             "--param-group '%s': lr=%g needs lr > 0 and --lr > 0 (its lr is "
                             "--lr's schedule scaled by X / --lr)",
                             text, v);
        if (lr) g->lr_scale = v / o->lr;
        if (wd) g->weight_decay = v;
    }
    return FSC_OK;
}

static int split_list(const char *flag, const char *s, char **text, const char ***items, int *n) {
    return split_list_at(',', flag, s, text, items, n);
}

/* --freeze, --lora-* and --param-group into the layout's fine-tuning fields. */
static int finetune_layout(trainer *t, fsc_gpt_layout *l) {
    const train_options *o = &t->opt;
    int rc = FSC_OK;
    if (o->freeze &&
        (rc = split_list("--freeze", o->freeze, &t->freeze_text, &t->freeze, &t->nfreeze)))
        return rc;
    l->freeze = t->freeze, l->nfreeze = t->nfreeze;
    const char **groups = NULL;
    if (o->param_group && (rc = split_list_at(';', "--param-group", o->param_group, &t->group_text,
                                              &groups, &t->ngroups)))
        return rc;
    if (t->ngroups && !(t->groups = calloc((size_t)t->ngroups, sizeof *t->groups)))
        rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
    for (int g = 0; !rc && g < t->ngroups; g++)
        rc = parse_group(o, (char *)groups[g], &t->groups[g]);
    free(groups);
    if (rc) return rc;
    l->groups = t->groups, l->ngroups = t->ngroups;
    if (!o->lora_rank) {
        if (o->lora_targets || o->lora_alpha || o->lora_dropout || o->save_adapter ||
            o->lora_merge || o->lora_from)
            return fsc_error(FSC_ERR_INVALID, "--lora-targets, --lora-alpha, --lora-dropout, "
                                              "--save-adapter, --lora-from and --lora-merge need "
                                              "--lora-rank");
        return FSC_OK;
    }
    const char *targets = o->lora_targets ? o->lora_targets : "q_proj,v_proj";
    if ((rc = split_list("--lora-targets", targets, &t->lora_text, &t->lora_targets,
                         &t->nlora_targets)))
        return rc;
    t->lora = (fsc_lora_config){.rank = o->lora_rank,
                                .alpha = (float)o->lora_alpha,
                                .dropout = (float)o->lora_dropout,
                                .targets = t->lora_targets,
                                .ntargets = t->nlora_targets};
    l->lora = &t->lora;
    return FSC_OK;
}

static int resume(trainer *t) {
    char model[512]; /* model_json: LLaMA's fields make ~270 characters */
    model_json(&t->opt.model, model, sizeof model);
    const char *keys[] = {"model"}, *values[] = {model};
    return fsc_trainer_resume(t->tr, t->opt.resume, 1, keys, values);
}

int trainer_init(trainer *t, const train_options *o) {
    memset(t, 0, sizeof *t);
    t->opt = *o;
    int rc = train_options_check(o);
    if (rc) return rc;
    /* a strategy of threads runs one BLAS thread per worker; elsewhere
     * --threads is the BLAS/OpenMP count */
    int inner = fsc_strategy_takes(o->strategy, "threads") ? 1 : o->threads;
    fsc_set_num_threads(inner);
    if ((rc = fsc_blas_init(inner))) return rc;

    fsc_data_format format = FSC_DATA_AUTO; /* checked by train_options_check */
    if ((rc = fsc_data_format_parse(o->data_format, &format)) ||
        (rc = fsc_tokens_load_as(o->data, format, &t->tokens)))
        return fsc_error_context(rc, "--data %s: ", o->data);
    /* --vocab left out: the shards' header or the largest id; given: checked */
    char declared_by[4200];
    const int declared = train_vocab_declared(o, declared_by, sizeof declared_by);
    if ((rc = train_vocab_resolve(&t->opt, &t->tokens, declared_by, declared, !o->quiet)))
        return rc;
    if (t->tokens.count < (int64_t)o->model.seq + 1)
        return fsc_error(FSC_ERR_INVALID, "--data %s has %" PRId64 " tokens, fewer than --seq + 1",
                         o->data, t->tokens.count);

    if (o->pp < 1) return fsc_error(FSC_ERR_INVALID, "--pp %d must be >= 1", o->pp);
    if ((rc = layout_mesh(t))) return rc;
    /* under --pp each rank builds only its stages, under --tp the strategy its slices */
    if ((rc = train_moe_setup(t))) return rc; /* t->opt.model gets its MoE layers */
    fsc_gpt_layout layout = {.strategy = o->strategy,
                             .pp = o->pp,
                             .balance = o->balance,
                             .tp = o->tp,
                             .cp = o->cp,
                             .sequence_parallel = o->sequence_parallel,
                             .recompute_attention = o->recompute_attention,
                             .recompute_activation = o->recompute_activation,
                             .pipe_schedule = o->pipe_schedule,
                             .virtual_stages = o->virtual_stages,
                             .pipe_checkpoint = o->pipe_checkpoint,
                             .checkpoint_activations = o->checkpoint_activations,
                             .batch = o->batch,
                             .micro_batches = o->grad_accum,
                             .threads = o->threads,
                             .seed = o->seed,
                             .schedule_out = o->print_schedule ? stderr : NULL,
                             .balance_out = o->quiet ? NULL : stderr};
    if ((rc = finetune_layout(t, &layout))) return rc;
    if ((rc = fsc_gpt_plan_new(&t->opt.model, &layout, t->mesh, &t->plan))) return rc;
    t->model = fsc_gpt_plan_model(t->plan);
    if ((rc = make_trainer(t))) return rc;
    if (o->init_from) {
        int unused = 0;
        if (o->lora_rank)
            rc = train_lora_init_from(t, o->init_from);
        else if (train_sharded_dir(o->init_from, NULL)) /* a --save-sharded directory */
            rc = train_sharded_load(t, o->init_from);
        else
            rc = fsc_strategy_load_weights(t->s, o->init_from, &unused);
        if (rc) return fsc_error_context(rc, "--init-from: ");
        if (unused)
            fsc_log(FSC_LOG_INFO, "--init-from: %d tensors in the file were not used", unused);
    }
    if (o->lora_from && !o->resume && (rc = train_lora_load_adapter(t, o->lora_from)))
        return fsc_error_context(rc, "--lora-from %s: ", o->lora_from);
    if (o->resume && (rc = resume(t))) return fsc_error_context(rc, "--resume %s: ", o->resume);
    if (o->save_init && (rc = trainer_save(t, o->save_init)))
        return fsc_error_context(rc, "--save-init: ");
    return FSC_OK;
}

int trainer_step(trainer *t, fsc_step_result *r) {
    return fsc_trainer_step(t->tr, r);
}
int64_t trainer_next_step(const trainer *t) {
    return t->tr ? fsc_trainer_get_step(t->tr) : 0;
}

/* The metadata every weights file carries. */
typedef struct {
    char cfg[512], step[32]; /* model_json's text */
    const char *keys[3], *values[3];
} weights_meta;

static void make_meta(const trainer *t, weights_meta *m) {
    model_json(&t->opt.model, m->cfg, sizeof m->cfg);
    snprintf(m->step, sizeof m->step, "%" PRId64, trainer_next_step(t));
    const char *keys[] = {"format", "fsc.gpt_config", "fsc.step"};
    const char *values[] = {"pt", m->cfg, m->step};
    memcpy(m->keys, keys, sizeof keys);
    memcpy(m->values, values, sizeof values);
}

int trainer_save_sharded(trainer *t, const char *dir) {
    if (mkdir(dir, 0777) && errno != EEXIST)
        return fsc_error(FSC_ERR_IO, "--save-sharded %s: cannot create it (%s)", dir,
                         strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", dir, t->rank, t->world);
    weights_meta m;
    make_meta(t, &m);
    return fsc_strategy_save_sharded(t->s, path, 3, m.keys, m.values);
}

int trainer_save(trainer *t, const char *path) {
    weights_meta m;
    make_meta(t, &m);
    char file[4096];
    const bool dir = train_hf_dir_target(&t->opt, path); /* a Hugging Face directory */
    if (dir) {
        if (fsc_dist_rank() == 0 && mkdir(path, 0777) && errno != EEXIST)
            fsc_log(FSC_LOG_WARN, "%s: cannot create it (%s)", path, strerror(errno));
        snprintf(file, sizeof file, "%s/model.safetensors", path); /* every strategy's one file */
    }
    int rc = fsc_trainer_save_weights(t->tr, t->rank == 0 ? (dir ? file : path) : NULL, 3, m.keys,
                                      m.values);
    if (!rc && t->opt.lora_merge && fsc_dist_rank() == 0)
        rc = train_lora_merge_file(t, dir ? file : path);
    /* world rank 0 writes (t->rank is the replica rank: 0 on every stage of a pipeline) */
    if (!rc && dir && fsc_dist_rank() == 0) rc = train_hf_finish(&t->opt, path);
    return rc;
}

int trainer_checkpoint(trainer *t) {
    char model[512], global_batch[32];
    model_json(&t->opt.model, model, sizeof model);
    snprintf(global_batch, sizeof global_batch, "%lld",
             (long long)t->opt.batch * t->opt.grad_accum * t->world);
    /* the effective flags too: --resume takes them (train_config.c) */
    char val[32]; /* --keep-best reads it back from each checkpoint's state */
    snprintf(val, sizeof val, "%.9g", t->val_loss_now);
    const char *keys[4] = {"model", "global_batch", "config", "val_loss"};
    const char *values[4] = {model, global_batch, t->opt.config_json, val};
    int n = t->opt.config_json ? 3 : 2;
    if (isfinite(t->val_loss_now)) keys[n] = keys[3], values[n] = values[3], n++;
    int rc = fsc_trainer_save_checkpoint(t->tr, t->opt.checkpoint_dir, n, keys, values);
    /* --keep-last, --keep-best: rank 0 prunes; a failure there loses nothing, so it warns */
    if (!rc && (t->opt.keep_last > 0 || t->opt.keep_best > 0) && fsc_dist_rank() == 0 &&
        fsc_ckpt_prune_best(t->opt.checkpoint_dir, t->opt.keep_last, t->opt.keep_best, "val_loss"))
        fprintf(stderr, "fsc-train: --keep-last %d --keep-best %d: %s\n", t->opt.keep_last,
                t->opt.keep_best, fsc_last_error());
    return rc;
}

void trainer_free(trainer *t) {
    fsc_trainer_free(t->tr);    /* the strategy removes its wrappers and hooks */
    fsc_gpt_plan_free(t->plan); /* and the model it made */
    fsc_mesh_free(t->mesh);     /* after everything that talks over its groups */
    fsc_tokens_free(&t->tokens);
    free(t->freeze_text);
    free(t->freeze);
    free(t->lora_text);
    free(t->lora_targets);
    free(t->group_text);
    free(t->groups);
    memset(t, 0, sizeof *t);
}

void print_mem_json(FILE *f, bool peak) {
    for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
        fprintf(f, "%s\"%s\": %zu", tag ? ", " : "", fsc_mem_tag_name((fsc_mem_tag)tag),
                peak ? fsc_mem_peak((fsc_mem_tag)tag) : fsc_mem_current((fsc_mem_tag)tag));
}

int mem_ranks(const trainer *t) {
    return t->opt.pp > 1 || t->opt.tp > 1 ? fsc_dist_size() : t->world;
}

int gather_mem_peaks(const trainer *t, int64_t *out) {
    int64_t mine[FSC_MEM_TAG_COUNT];
    for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
        mine[tag] = (int64_t)fsc_mem_peak((fsc_mem_tag)tag);
    if (mem_ranks(t) == 1) {
        memcpy(out, mine, sizeof mine);
        return FSC_OK;
    }
    /* a pipeline's stages and TP's slices differ: every rank of the world */
    fsc_group *g = mem_ranks(t) == fsc_dist_size() ? fsc_group_world() : fsc_strategy_group(t->s);
    return fsc_group_allgather(g, mine, out, FSC_MEM_TAG_COUNT, FSC_DTYPE_I64);
}
