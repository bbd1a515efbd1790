/* The strategy table and the calls every strategy answers. A strategy is a
 * row (strategy_ops); this file knows the rows only through the table, so a
 * new strategy adds a row and touches no if-chain here or in the trainer. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategy_internal.h"

static const strategy_ops *const TABLE[] = {
    &fsc_strategy_single, &fsc_strategy_dp,  &fsc_strategy_ddp,
    &fsc_strategy_oss,    &fsc_strategy_sdp, &fsc_strategy_fsdp, &fsc_strategy_slowmo,
    &fsc_strategy_hsdp,
};
enum { NROWS = sizeof TABLE / sizeof TABLE[0] };

const char *const *fsc_strategy_names(void) {
    static const char *names[NROWS + 1];
    for (int i = 0; i < NROWS; i++) names[i] = TABLE[i]->name;
    return names;
}

static const strategy_ops *find(const char *name) {
    for (int i = 0; i < NROWS; i++)
        if (!strcmp(TABLE[i]->name, name)) return TABLE[i];
    return NULL;
}

/* "single, dp, ..., sdp or fsdp" for messages. */
static const char *name_list(void) {
    static char buf[128];
    if (buf[0]) return buf;
    size_t at = 0;
    for (int i = 0; i < NROWS && at < sizeof buf; i++) {
        const char *sep = i == 0 ? "" : i + 1 < NROWS ? ", " : " or ";
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%s", sep, TABLE[i]->name);
    }
    return buf;
}

/* Each option by name, the row bit that takes it, and whether o sets it to
 * something other than its default. */
typedef struct {
    const char *name;
    unsigned bit;
    bool set;
} option_use;

static int option_uses(const fsc_strategy_options *o, option_use *out) {
    const option_use uses[] = {
        {"bucket_bytes", OPT_BUCKET, o && o->bucket_bytes != 0},
        {"partition", OPT_PARTITION, o && o->partition != FSC_PARTITION_GREEDY},
        {"share_dtype", OPT_PARTITION, o && o->share_dtype != FSC_DTYPE_F32},
        {"reduce_dtype", OPT_REDUCE, o && o->reduce_dtype != FSC_DTYPE_F32},
        {"fp32_reduce_scatter", OPT_REDUCE, o && o->fp32_reduce_scatter},
        /* bf16 is autocast under every row (the trainer's ctx); fp16 is FSDP's */
        {"compute_dtype", OPT_FSDP,
         o && o->compute_dtype != FSC_DTYPE_F32 && o->compute_dtype != FSC_DTYPE_BF16},
        {"units", OPT_FSDP, o && (o->units || o->nunits)},
        {"min_params", OPT_FSDP, o && o->min_params != 0},
        {"units_kind", OPT_FSDP, o && o->units_kind},
        {"keep_after_forward", OPT_FSDP, o && o->keep_after_forward},
        {"accum_no_sync", OPT_FSDP, o && o->accum_no_sync},
        {"threads", OPT_THREADS, o && (o->threads > 1 || o->make_replica)},
        {"grad_probe", OPT_PROBE, o && o->grad_probe},
        {"localsgd_frequency", OPT_SLOWMO, o && o->localsgd_frequency != 0},
        {"slowmo_frequency", OPT_SLOWMO, o && o->slowmo_frequency != 0},
        {"slowmo_momentum", OPT_SLOWMO, o && o->slowmo_momentum != 0},
        {"slowmo_lr", OPT_SLOWMO, o && o->slowmo_lr != 0},
        {"shard_group", OPT_HSDP, o && o->shard_group != 0},
    };
    memcpy(out, uses, sizeof uses);
    return (int)(sizeof uses / sizeof uses[0]);
}

bool fsc_strategy_takes(const char *name, const char *option) {
    const strategy_ops *ops = name && option ? find(name) : NULL;
    option_use uses[24];
    int n = option_uses(NULL, uses);
    for (int i = 0; ops && i < n; i++)
        if (!strcmp(uses[i].name, option)) return (ops->accepts & uses[i].bit) != 0;
    return false;
}

int fsc_strategy_info_get(const char *name, fsc_strategy_info *out) {
    const strategy_ops *ops = name ? find(name) : NULL;
    if (!ops || !out)
        return fsc_error(FSC_ERR_INVALID, "strategy \"%s\": expected %s", name ? name : "(null)",
                         name_list());
    *out = (fsc_strategy_info){.summary = ops->summary,
                               .spans_ranks = ops->spans_ranks,
                               .zero_stage = ops->zero_stage,
                               .pipeline = ops->pipeline,
                               .local_steps = ops->local_steps};
    return FSC_OK;
}

/* Refuses an option the row does not take, naming the rows that do. */
static int check_options(const strategy_ops *ops, const fsc_strategy_options *o) {
    option_use uses[24];
    int n = option_uses(o, uses);
    for (int i = 0; i < n; i++) {
        if (!uses[i].set || (ops->accepts & uses[i].bit)) continue;
        char rows[96] = "";
        size_t at = 0;
        for (int r = 0; r < NROWS && at < sizeof rows; r++)
            if (TABLE[r]->accepts & uses[i].bit)
                at += (size_t)snprintf(rows + at, sizeof rows - at, "%s%s", at ? ", " : "",
                                       TABLE[r]->name);
        return fsc_error(FSC_ERR_INVALID, "option %s applies to %s only, not to %s", uses[i].name,
                         rows, ops->name);
    }
    return FSC_OK;
}

/* Under a pipeline (and fsdp over TP replicas, a pipeline of one stage)
 * the named row's own options (buckets, partition policy, FSDP units...)
 * have no meaning: its ZeRO stage is applied to each stage's flat buffers
 * whole. */
static int refuse_row_options_under_pipe(const fsc_strategy_options *o, const char *name,
                                         const char *under) {
    option_use uses[24] = {{0}};
    int n = option_uses(o, uses);
    for (int i = 0; i < n; i++)
        if (uses[i].set && uses[i].bit != OPT_PROBE) /* the pipe probes its stages */
            return fsc_error(FSC_ERR_INVALID, "strategy %s: option %s does not apply %s", name,
                             uses[i].name, under);
    return FSC_OK;
}

/* The caller's mesh must be the layout the options ask for. */
static int check_mesh(const fsc_strategy_options *o, const char *name) {
    const fsc_mesh *m = o->mesh;
    const int P = o->pipe.stages > 1 ? o->pipe.stages : 1, T = o->tp.size > 1 ? o->tp.size : 1;
    if (!m) return FSC_OK;
    if (o->group)
        return fsc_error(FSC_ERR_INVALID,
                         "strategy %s: give group or mesh, not both (the mesh's parent is the "
                         "group)",
                         name);
    if (fsc_mesh_size(m, FSC_MESH_PP) != P || fsc_mesh_size(m, FSC_MESH_TP) != T)
        return fsc_error(FSC_ERR_INVALID,
                         "strategy %s: the mesh is pp %d x tp %d but the options ask for %d "
                         "stage(s) x tp %d",
                         name, fsc_mesh_size(m, FSC_MESH_PP), fsc_mesh_size(m, FSC_MESH_TP), P, T);
    return FSC_OK;
}

int strategy_mesh(fsc_strategy *s) {
    const int P = s->opt.pipe.stages > 1 ? s->opt.pipe.stages : 1;
    const int T = s->opt.tp.size > 1 ? s->opt.tp.size : 1;
    if (!s->opt.mesh) {
        int rc = fsc_mesh_new_over(s->group, (fsc_mesh_shape){.pp = P, .tp = T}, &s->own_mesh);
        if (rc) return rc;
    }
    const fsc_mesh *m = s->opt.mesh ? s->opt.mesh : s->own_mesh;
    s->pp_group = fsc_mesh_group(m, FSC_MESH_PP);
    s->dp_group = fsc_mesh_dp_cp(m); /* replicas: dp x cp hold the same parameters */
    s->tp_group = T > 1 ? fsc_mesh_group(m, FSC_MESH_TP) : NULL;
    return FSC_OK;
}

int strategy_collect_ranges(fsc_strategy *s) {
    int n = fsc_optim_num_ranges(s->optim);
    s->ranges = calloc(n > 0 ? (size_t)n : 1, sizeof *s->ranges);
    if (!s->ranges) return fsc_error(FSC_ERR_NOMEM, "strategy: out of memory");
    for (int i = 0; i < n; i++) s->ranges[i] = *fsc_optim_get_range(s->optim, i);
    s->nranges = n;
    return FSC_OK;
}

fsc_strategy *fsc_strategy_new(fsc_module *model, const fsc_optim_config *optim,
                               const fsc_strategy_options *opt) {
    static const fsc_strategy_options defaults = {0};
    if (!opt) opt = &defaults;
    const char *name = opt->name ? opt->name : "single";
    const strategy_ops *ops = find(name);
    if (!ops) {
        fsc_error(FSC_ERR_INVALID, "strategy \"%s\": expected %s", name, name_list());
        return NULL;
    }
    if (check_options(ops, opt)) {
        fsc_error_context(FSC_ERR_INVALID, "strategy %s: ", name);
        return NULL;
    }
    const bool piped = opt->pipe.stages > 1;
    if (piped && !ops->composes_with_pipe) {
        fsc_error(FSC_ERR_INVALID,
                  "strategy %s: does not run with a pipeline (ddp, oss, sdp and fsdp do)", name);
        return NULL;
    }
    if (piped && refuse_row_options_under_pipe(opt, name,
                                               "under a pipeline (each stage's parameters are "
                                               "reduced and sharded whole)"))
        return NULL;
    const int replica_zero = ops->zero_stage; /* between a pipeline's replicas */
    if (!piped && opt->pipe.make_stage) {
        fsc_error(FSC_ERR_INVALID, "strategy %s: pipeline options need pipe.stages >= 2", name);
        return NULL;
    }
    const bool tensor = opt->tp.size > 1;
    if (tensor && !piped && !ops->spans_ranks) {
        fsc_error(FSC_ERR_INVALID,
                  "strategy %s: does not run with tensor parallelism (ddp, oss, sdp and fsdp do)",
                  name);
        return NULL;
    }
    /* oss, sdp and fsdp over TP replicas: a pipeline of one stage, the whole
     * TP model, so its sharded state is saved by global name as a pipeline's */
    const bool whole = tensor && !piped && ops->zero_stage >= 1;
    if (whole && refuse_row_options_under_pipe(opt, name,
                                               "with tensor parallelism (the model's parameters "
                                               "are sharded whole, as one pipeline stage)"))
        return NULL;
    if (!tensor && (opt->tp.make_model || opt->tp.make_stage)) {
        fsc_error(FSC_ERR_INVALID, "strategy %s: tensor-parallel options need tp.size >= 2", name);
        return NULL;
    }
    if (check_mesh(opt, name)) return NULL;
    const int cp = fsc_mesh_size(opt->mesh, FSC_MESH_CP);
    if (cp > 1 && !ops->spans_ranks) {
        fsc_error(FSC_ERR_UNSUPPORTED,
                  "strategy %s: context parallelism (cp %d) runs under ddp, oss, sdp and fsdp, "
                  "with or without tensor parallelism and a pipeline",
                  name, cp);
        return NULL;
    }
    if (piped) ops = &fsc_strategy_pipe;
    if (whole) ops = &fsc_strategy_pipe_whole;
    if (!optim || (!model) != (piped || tensor)) {
        fsc_error(FSC_ERR_INVALID, "strategy %s: %s", name,
                  !optim   ? "optim is NULL"
                  : piped  ? "a pipeline builds its stages itself: pass a NULL model"
                  : tensor ? "tensor parallelism builds the model with tp.make_model: pass a "
                             "NULL model"
                           : "model is NULL");
        return NULL;
    }
    fsc_strategy *s = calloc(1, sizeof *s);
    if (!s) {
        fsc_error(FSC_ERR_NOMEM, "strategy %s: out of memory", name);
        return NULL;
    }
    s->ops = ops;
    s->opt = *opt;
    s->opt.name = ops->name;
    s->pipe_zero = piped || whole ? replica_zero : 0;
    s->model = s->module = model;
    /* a row over the ranks without a pipeline or TP reduces over the mesh's
     * dp group (all of its parent's ranks, in order); one that splits them
     * starts from the parent and narrows to dp_group in its setup */
    fsc_group *over = opt->mesh ? fsc_mesh_parent(opt->mesh) : opt->group;
    s->group = ops->spans_ranks ? (over ? over : fsc_group_world()) : fsc_group_self();
    if (opt->mesh && ops->spans_ranks && !piped && !tensor)
        s->group = fsc_mesh_dp_cp(opt->mesh); /* cp ranks see other tokens of one batch */
    s->all = s->group;
    s->rank = fsc_group_rank(s->group);
    s->world = fsc_group_size(s->group);
    /* tensor parallelism makes the model and narrows group, rank, world to
     * the replicas before the row sets up over them */
    int rc = tensor && !piped && !whole ? strategy_tp_begin(s, ops) : FSC_OK;
    if (!rc) rc = s->ops->setup(s, optim); /* a pipeline narrows them to its replicas */
    if (!rc) rc = strategy_collect_ranges(s);
    if (rc) {
        fsc_error_context(rc, "strategy %s: ", name);
        fsc_strategy_free(s);
        return NULL;
    }
    return s;
}

void fsc_strategy_free(fsc_strategy *s) {
    if (!s) return;
    s->ops->teardown(s);
    strategy_tp_end(s);
    fsc_mesh_free(s->own_mesh); /* after everything that talks over its groups */
    free(s->ranges);
    free(s);
}

const char *fsc_strategy_name(const fsc_strategy *s) {
    return s->ops->name;
}
int fsc_strategy_rank(const fsc_strategy *s) {
    return s->rank;
}
int fsc_strategy_world(const fsc_strategy *s) {
    return s->world;
}
fsc_group *fsc_strategy_group(const fsc_strategy *s) {
    return s->group;
}
fsc_group *fsc_strategy_all(const fsc_strategy *s) {
    return s->all;
}
fsc_module *fsc_strategy_module(fsc_strategy *s) {
    return s->module;
}
fsc_params *fsc_strategy_params(fsc_strategy *s) {
    return s->bound ? &s->params : NULL;
}
fsc_optim *fsc_strategy_optim(fsc_strategy *s) {
    return s->optim;
}

const fsc_optim_range *fsc_strategy_grad_ranges(fsc_strategy *s, int *n) {
    *n = s->nranges;
    return s->ranges;
}

void fsc_strategy_zero_grad(fsc_strategy *s) {
    if (s->ops->zero_grad)
        s->ops->zero_grad(s);
    else
        fsc_params_zero_grad(&s->params);
}

int fsc_strategy_forward_backward(fsc_strategy *s, const fsc_ctx *ctx, int k, int K, int rows,
                                  fsc_dp_work_fn fn, void *user, float *loss) {
    if (!ctx || !fn || !loss || K < 1 || k < 0 || k >= K || rows < 1)
        return fsc_error(FSC_ERR_INVALID,
                         "strategy %s: forward_backward needs ctx, fn, loss, 0 <= k (%d) < K (%d) "
                         "and rows (%d) >= 1",
                         s->ops->name, k, K, rows);
    if (s->ops->set_no_sync) s->ops->set_no_sync(s, k < K - 1);
    *loss = 0;
    if (s->ops->run) return s->ops->run(s, ctx, rows, fn, user, loss);
    if (!ctx->arena)
        return fsc_error(FSC_ERR_INVALID, "strategy %s: ctx->arena is NULL", s->ops->name);
    fsc_arena_reset(ctx->arena);
    return fn(s->module, ctx, 0, rows, user, loss);
}

int fsc_strategy_run_pipeline(fsc_strategy *s, const fsc_ctx *ctx, const fsc_pipe_io *io,
                              float *loss) {
    if (!s->ops->run_pipeline)
        return fsc_error(FSC_ERR_INVALID, "strategy %s has no pipeline", s->ops->name);
    return s->ops->run_pipeline(s, ctx, io, loss);
}

int fsc_strategy_write_trace(fsc_strategy *s, const char *path) {
    if (!s->ops->write_trace)
        return fsc_error(FSC_ERR_INVALID, "strategy %s has no pipeline to trace", s->ops->name);
    return s->ops->write_trace(s, path);
}

fsc_pipe *fsc_strategy_get_pipe(const fsc_strategy *s) {
    return s && s->ops->run_pipeline ? s->pipe : NULL; /* not fsdp's one stage over TP */
}

int fsc_strategy_clip_grad_norm(fsc_strategy *s, float max_norm, float *total) {
    return s->ops->clip(s, max_norm > 0 ? max_norm : FLT_MAX, total);
}

int fsc_strategy_set_lr(fsc_strategy *s, double lr) {
    /* under oss every rank's shard optimizer must learn it: fsc_oss_set_lr */
    return s->oss ? fsc_oss_set_lr(s->oss, lr) : fsc_optim_set_lr(s->optim, lr);
}

double fsc_strategy_get_lr(const fsc_strategy *s) {
    return fsc_optim_get_lr(s->optim);
}
int fsc_strategy_step(fsc_strategy *s) {
    return s->ops->step(s);
}

int fsc_strategy_save_weights(fsc_strategy *s, const char *path, int root, int n_meta,
                              const char *const *keys, const char *const *values) {
    return s->ops->save_weights(s, path, root, n_meta, keys, values);
}

int fsc_strategy_load_weights(fsc_strategy *s, const char *path, int *n_unused) {
    return s->ops->load_weights(s, path, n_unused);
}

int fsc_strategy_save_optim(fsc_strategy *s, const char *path, int root) {
    return s->ops->save_optim(s, path, root);
}

int fsc_strategy_load_optim(fsc_strategy *s, const char *path) {
    return s->ops->load_optim(s, path);
}

bool fsc_strategy_has_state(const fsc_strategy *s) {
    return s && s->ops->save_state;
}

int fsc_strategy_save_state(fsc_strategy *s, const char *path, int root) {
    if (!s->ops->save_state)
        return fsc_error(FSC_ERR_INVALID, "strategy %s keeps no state of its own", s->ops->name);
    return s->ops->save_state(s, path, root);
}

int fsc_strategy_load_state(fsc_strategy *s, const char *path) {
    return s->ops->load_state ? s->ops->load_state(s, path) : FSC_OK;
}

int fsc_strategy_save_sharded(fsc_strategy *s, const char *path, int n_meta,
                              const char *const *keys, const char *const *values) {
    if (!s->ops->save_sharded)
        return fsc_error(FSC_ERR_INVALID, "strategy %s has no sharded state dict (fsdp has)",
                         s->ops->name);
    return s->ops->save_sharded(s, path, n_meta, keys, values);
}

int fsc_strategy_load_sharded(fsc_strategy *s, const char *path) {
    if (!s->ops->load_sharded)
        return fsc_error(FSC_ERR_UNSUPPORTED, "strategy %s reads no sharded state dict (fsdp does)",
                         s->ops->name);
    return s->ops->load_sharded(s, path);
}

fsc_strategy_stats fsc_strategy_get_stats(const fsc_strategy *s) {
    fsc_strategy_stats st = {0};
    if (s->ops->stats) s->ops->stats(s, &st);
    return st;
}

static double count_params(const fsc_module *m, bool trainable_only) {
    double n = 0;
    for (int i = 0; i < m->nparams; i++)
        if (!trainable_only || !m->params[i].frozen) n += (double)m->params[i].numel;
    for (int c = 0; c < m->nchildren; c++) n += count_params(m->children[c], trainable_only);
    return n;
}

fsc_strategy_memory fsc_strategy_memory_plan(const fsc_strategy *s) {
    const int stage = s->pipe ? s->pipe_zero : s->ops->zero_stage;
    const int N = s->shard_ranks ? s->shard_ranks : s->world;
    const fsc_optim_config cfg = fsc_optim_get_config(s->optim);
    double P = s->model ? count_params(s->model, false) : 0;
    double T = s->model ? count_params(s->model, true) : 0;           /* not frozen */
    for (int c = 0; !s->model && c < fsc_pipe_chunks(s->pipe); c++) { /* this rank's stages */
        P += (double)fsc_pipe_chunk_params(s->pipe, c)->numel;
        T += (double)fsc_params_trainable_numel(fsc_pipe_chunk_params(s->pipe, c));
    }
    /* a pipeline's gradients accumulate whole over the step's micro-batches:
     * only ZeRO-3 keeps them (and the parameters) sharded between steps */
    fsc_strategy_memory m = {.zero_stage = stage,
                             .params_shards = stage >= 3 ? N : 1,
                             .grads_shards = stage >= (s->pipe ? 3 : 2) ? N : 1,
                             .optim_shards = stage >= 1 ? N : 1};
    m.params_bytes = 4 * P / m.params_shards;
    /* frozen parameters hold no optimizer state; their gradient stretch is
     * given back where the gradients are one bound buffer (ZeRO-0/1, a
     * pipeline below ZeRO-3) and carried as zeros in ZeRO-2/3's shards */
    m.grads_bytes = 4 * (m.grads_shards > 1 || stage >= 3 ? P : T) / m.grads_shards;
    m.optim_bytes = 4.0 * fsc_optim_state_count(&cfg) * T / m.optim_shards;
    m.optim_measured = fsc_optim_state_bytes(s->optim);
    return m;
}
