/* The tensor-parallel dimension of ddp (fsc_strategy_options.tp): groups of
 * tp.size consecutive ranks each hold one replica of a model made of
 * fsc/tp.h's layers, and ddp runs unchanged over the ranks that share a TP
 * rank. (oss, sdp and fsdp run the TP model as one pipeline stage instead,
 * strategy_pipe.c, whose files already hold sharded state by global name.)
 * What the TP layout changes is taken over here, in a copy of the row's
 * operations: binding (shards initialised as slices of the one-process
 * tensors), the gradient norm (each parameter counted once over the mesh),
 * and files (weights and optimizer state by global name: the one-process
 * files). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strategy_internal.h"

/* Each optimizer range counts in the norm on one TP rank: sharded ones
 * everywhere (each holds its slice), replicated ones on TP rank 0. */
static int mark_counted(fsc_strategy *s) {
    free(s->tp_counted);
    s->tp_counted = calloc((size_t)(s->nranges ? s->nranges : 1), sizeof *s->tp_counted);
    if (!s->tp_counted) return fsc_error(FSC_ERR_NOMEM, "tensor parallel: out of memory");
    const int tp_rank = fsc_group_rank(s->tp_group);
    for (int i = 0; i < s->nranges; i++) {
        int e = 0;
        while (e < s->params.count && strcmp(s->params.entries[e].name, s->ranges[i].name)) e++;
        if (e == s->params.count)
            return fsc_error(FSC_ERR_INVALID, "tensor parallel: no parameter '%s'",
                             s->ranges[i].name);
        s->tp_counted[i] = tp_rank == 0 || fsc_tp_param_is_sharded(s->model, &s->params, e);
    }
    return FSC_OK;
}

/* The sum of every rank's figure over g, added in rank order so that every
 * rank gets the same bits (the dist layer moves doubles as int64 words). */
static int sum_in_rank_order(fsc_group *g, double local, double *out) {
    const int n = fsc_group_size(g);
    int64_t bits, *all = malloc(sizeof *all * (size_t)n);
    if (!all) return fsc_error(FSC_ERR_NOMEM, "tensor parallel: out of memory");
    memcpy(&bits, &local, sizeof bits);
    int rc = fsc_group_allgather(g, &bits, all, 1, FSC_DTYPE_I64);
    double acc = 0;
    for (int r = 0; !rc && r < n; r++) {
        double v;
        memcpy(&v, &all[r], sizeof v);
        acc += v;
    }
    free(all);
    *out = acc;
    return rc;
}

/* Replicas hold equal gradients (ddp): the norm of one replica's TP group. */
static int tp_clip(fsc_strategy *s, float max_norm, float *total) {
    if (!s->tp_counted) {
        int rc = mark_counted(s);
        if (rc) return rc;
    }
    double local = 0;
    for (int i = 0; i < s->nranges; i++)
        if (s->tp_counted[i]) local += fsc_grad_norm_sq(&s->ranges[i], 1);
    double sq;
    int rc = sum_in_rank_order(s->tp_group, local, &sq);
    if (rc) return fsc_error_context(rc, "tensor-parallel clip: ");
    const float norm = (float)sqrt(sq);
    if (total) *total = norm;
    return fsc_clip_grads_scale(s->ranges, s->nranges, max_norm, norm);
}

/* ---- the gradient probe (AdaScale's samples) ---------------------------------------------- */
/* ddp's probe sees buckets of this rank's flat gradient; passed on is what
 * counts here in tp_clip's norm (a parameter every TP rank holds: on TP
 * rank 0), so the squares add up over the mesh to each replica's norm of
 * the whole model. A micro-step that reduces nothing (no_sync) is shown
 * whole after it has run. The caller's probe and the row's entries the
 * filter wraps live in s->opt.grad_probe_user. */
typedef struct tp_probe {
    fsc_strategy *s;
    fsc_grad_probe_fn fn;
    void *user;
    int (*row_run)(fsc_strategy *s, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
                   float *loss);
    void (*row_set_no_sync)(fsc_strategy *s, bool no_sync);
    bool no_sync;
} tp_probe;

static void filter_probe(void *user, int64_t offset, const float *grad, int64_t n) {
    tp_probe *pr = user;
    fsc_strategy *s = pr->s;
    if (!s->tp_counted && mark_counted(s)) return; /* out of memory: nothing counts */
    for (int i = 0; i < s->nranges; i++) {
        if (!s->tp_counted[i]) continue;
        const int64_t at = s->ranges[i].grad - s->params.grad;
        const int64_t lo = at > offset ? at : offset;
        const int64_t hi = at + s->ranges[i].n < offset + n ? at + s->ranges[i].n : offset + n;
        if (hi > lo) pr->fn(pr->user, lo, grad + (lo - offset), hi - lo);
    }
}

static void probe_set_no_sync(fsc_strategy *s, bool no_sync) {
    tp_probe *pr = s->opt.grad_probe_user;
    pr->no_sync = no_sync;
    if (pr->row_set_no_sync) pr->row_set_no_sync(s, no_sync);
}

static int probe_run(fsc_strategy *s, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
                     float *loss) {
    tp_probe *pr = s->opt.grad_probe_user;
    int rc;
    if (pr->row_run) {
        rc = pr->row_run(s, ctx, rows, fn, user, loss);
    } else if (!ctx->arena) {
        rc = fsc_error(FSC_ERR_INVALID, "strategy %s: ctx->arena is NULL", s->ops->name);
    } else {
        fsc_arena_reset(ctx->arena);
        rc = fn(s->module, ctx, 0, rows, user, loss);
    }
    if (!rc && pr->no_sync) filter_probe(pr, 0, s->params.grad, s->params.numel);
    return rc;
}

/* Before the row's setup hands the probe to its wrapper. */
static int wrap_probe(fsc_strategy *s, const strategy_ops *row) {
    if (!s->opt.grad_probe) return FSC_OK;
    tp_probe *pr = malloc(sizeof *pr);
    if (!pr) return fsc_error(FSC_ERR_NOMEM, "tensor parallel: out of memory");
    *pr = (tp_probe){.s = s,
                     .fn = s->opt.grad_probe,
                     .user = s->opt.grad_probe_user,
                     .row_run = row->run,
                     .row_set_no_sync = row->set_no_sync};
    s->opt.grad_probe = filter_probe, s->opt.grad_probe_user = pr;
    s->tp_ops.run = probe_run, s->tp_ops.set_no_sync = probe_set_no_sync;
    return FSC_OK;
}

/* Root's path on every rank of its TP group (callers pass it on root only). */
static int share_path(fsc_strategy *s, const char *path, char *buf, size_t size) {
    int32_t n = path ? (int32_t)strlen(path) : -1;
    if (fsc_group_rank(s->tp_group) == 0 && (!path || (size_t)n >= size))
        n = -1;
    int rc = fsc_group_broadcast(s->tp_group, &n, 1, FSC_DTYPE_I32, 0);
    if (!rc && n < 0) return fsc_error(FSC_ERR_INVALID, "tensor parallel: no path (or too long)");
    if (!rc && fsc_group_rank(s->tp_group) == 0) memcpy(buf, path, (size_t)n + 1);
    if (!rc) rc = fsc_group_broadcast(s->tp_group, buf, (n + 4) / 4, FSC_DTYPE_I32, 0); /* words */
    return rc;
}

/* The first replica's TP group writes the one-process file, each rank its
 * slices in place (a file system the TP group shares: adjacent ranks). */
static int tp_save_weights(fsc_strategy *s, const char *path, int root, int n_meta,
                           const char *const *keys, const char *const *values) {
    if (root != 0)
        return fsc_error(FSC_ERR_INVALID, "tensor parallel: weights are written by rank 0 (not %d)",
                         root);
    char where[4096]; /* a multiple of 4 bytes: it travels as int32 words */
    int rc = s->rank == 0 ? share_path(s, path, where, sizeof where) : FSC_OK;
    if (!rc && s->rank == 0)
        rc = fsc_tp_save_weights(where, s->model, &s->params, s->tp_group, n_meta, keys, values);
    int32_t status = rc;
    if (s->world > 1 && fsc_group_broadcast(s->group, &status, 1, FSC_DTYPE_I32, 0))
        return FSC_ERR_MPI;
    return status && !rc ? fsc_error(status, "tensor parallel: replica 0 could not save") : rc;
}

static int tp_load_weights(fsc_strategy *s, const char *path, int *n_unused) {
    return fsc_tp_load_weights(path, s->model, &s->params, n_unused);
}

/* The optimizer's pieces by global name over the TP group, made at first
 * use (collective over it); every replica holds the same ones (ddp). */
static int optim_state(fsc_strategy *s) {
    if (!s->tp_state &&
        !(s->tp_state = fsc_tp_optim_state_new(s->model, &s->params, s->optim, s->tp_group)))
        return fsc_error_context(FSC_ERR_INVALID, "tensor-parallel optimizer state: ");
    return FSC_OK;
}

/* Replicas hold the same state: the first one's TP group writes. */
static int tp_save_optim(fsc_strategy *s, const char *path, int root) {
    if (root != 0)
        return fsc_error(FSC_ERR_INVALID, "tensor parallel: state is written by rank 0 (not %d)",
                         root);
    int rc = optim_state(s);
    if (!rc && s->rank == 0) rc = fsc_tp_save_optim(s->tp_state, path, 0);
    int32_t status = rc;
    if (s->world > 1 && fsc_group_broadcast(s->group, &status, 1, FSC_DTYPE_I32, 0))
        return FSC_ERR_MPI;
    return status && !rc ? fsc_error(status, "tensor parallel: replica 0 could not save") : rc;
}

static int tp_load_optim(fsc_strategy *s, const char *path) {
    int rc = optim_state(s);
    return rc ? rc : fsc_tp_load_optim(s->tp_state, path);
}

/* The row's figures, and the TP group's time blocked in its collectives. */
static void tp_stats(const fsc_strategy *s, fsc_strategy_stats *out) {
    if (s->tp_row_stats) s->tp_row_stats(s, out);
    out->tp_wait_s = fsc_group_get_stats(s->tp_group).wait_s;
}

int strategy_tp_begin(fsc_strategy *s, const strategy_ops *row) {
    const fsc_tp_strategy_options *o = &s->opt.tp;
    const int T = o->size, N = s->world;
    if (!o->make_model)
        return fsc_error(FSC_ERR_INVALID, "tensor parallel: tp.make_model is NULL");
    if (N % T)
        return fsc_error(FSC_ERR_INVALID, "%d ranks cannot form tensor-parallel groups of %d", N,
                         T);
    /* the mesh's groups (TP fastest: T adjacent ranks share a replica) */
    int rc = strategy_mesh(s);
    if (rc) return rc;
    s->tp_options = (fsc_tp_options){.group = s->tp_group,
                                     .sequence_parallel = o->sequence_parallel,
                                     .recompute_attention = o->recompute_attention,
                                     .recompute_activation = o->recompute_activation};
    if (!(s->model = s->module = o->make_model(o->user, &s->tp_options)))
        return fsc_error_context(FSC_ERR_INVALID, "tensor parallel: the model: ");
    s->group = s->dp_group;
    s->rank = fsc_group_rank(s->group);
    s->world = fsc_group_size(s->group);
    s->tp_ops = *row;
    s->tp_ops.clip = tp_clip;
    s->tp_ops.save_weights = tp_save_weights;
    s->tp_ops.load_weights = tp_load_weights;
    s->tp_ops.save_optim = tp_save_optim;
    s->tp_ops.load_optim = tp_load_optim;
    s->tp_row_stats = row->stats;
    s->tp_ops.stats = tp_stats;
    s->ops = &s->tp_ops;
    return wrap_probe(s, row);
}

void strategy_tp_end(fsc_strategy *s) {
    if (s->opt.grad_probe == filter_probe) free(s->opt.grad_probe_user);
    fsc_tp_optim_state_free(s->tp_state);
    fsc_module_free(s->tp_group ? s->model : NULL);
    free(s->tp_counted); /* the groups are the mesh's */
}

int strategy_bind(fsc_strategy *s, fsc_params *out) {
    return s->tp_group ? fsc_tp_params_bind(s->model, s->opt.seed, true, out)
                       : fsc_params_bind(s->model, s->opt.seed, true, out);
}
