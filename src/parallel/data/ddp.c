/* DDP: data parallelism over processes, with gradient buckets reduced during
 * backward.
 *
 * Parameters sit in declaration (forward) order in one flat gradient buffer,
 * so "buckets in reverse order of the forward pass" are contiguous ranges
 * taken from the end of that buffer. A post-backward hook on every module that
 * owns parameters marks them ready; a bucket whose parameters are all ready is
 * reduced in place with a non-blocking all-reduce. Buckets are launched
 * strictly in index order, so every rank issues the same collectives in the
 * same order even if readiness differs; the hooks also drive MPI progress,
 * which is what makes the overlap real. Parameters that backward never
 * reached (unused, or tied ones the root computes last) are marked ready when
 * the child's backward returns.
 *
 * The hooks live on the child's modules, so they fire even when a caller runs
 * the child's backward without the wrapper (the inner model, by mistake):
 * then nothing would be reduced and the replicas would drift apart without a
 * word. A hook that fires outside the wrapper's backward fails the call
 * instead, with no_sync on or off: under no_sync the wrapper's backward is the
 * place too, and the rule is simpler without an exception.
 *
 * Expert shards (fsc_param.expert, fsc/moe.h) differ per rank and their
 * gradients already sum every rank's tokens: buckets are cut so none mixes
 * them with replicated parameters (bucket_plan_split_experts), and their buckets are
 * neither reduced nor broadcast. */
#include <stdlib.h>
#include <string.h>

#include "buckets.h"
#include "core/fault.h"
#include "fsc/kernels.h"
#include "fsc/parallel.h"

typedef struct bucket {
    int64_t begin, end; /* element range of the flat gradient buffer */
    int pending;        /* parameters not yet ready in this synchronised backward */
    bool local;         /* expert shards (fsc/moe.h): never reduced or broadcast */
    fsc_request *req;
} bucket;

typedef struct ddp {
    fsc_module base;
    fsc_module *child;
    fsc_params *params;
    fsc_group *group;
    fsc_ddp_options opt;
    bucket *buckets;
    int nbuckets, next_launch;
    int *bucket_of;    /* entry index -> bucket */
    bool *ready;       /* per entry */
    owner_hooks hooks; /* a post-backward hook per module that owns parameters */
    bool no_sync;
    bool in_backward; /* the wrapper's backward is running the child's */
    int status;       /* first communication error of this backward */
    fsc_ddp_stats stats;
} ddp;

static int launch_ready(ddp *d) {
    while (!d->status && d->next_launch < d->nbuckets && d->buckets[d->next_launch].pending == 0) {
        bucket *b = &d->buckets[d->next_launch++];
        if (b->local) continue;
        if (b == d->buckets && fsc_fault_is(FSC_FAULT_DROP_GRAD) &&
            fsc_group_rank(d->group) == fsc_group_size(d->group) - 1)
            memset(d->params->grad + b->begin, 0, sizeof(float) * (size_t)(b->end - b->begin));
        if (d->opt.probe) /* this rank's own gradient, a moment before it is summed away */
            d->opt.probe(d->opt.probe_user, b->begin, d->params->grad + b->begin,
                         b->end - b->begin);
        d->status = fsc_group_iallreduce(d->group, d->params->grad + b->begin, b->end - b->begin,
                                         FSC_DTYPE_F32, d->opt.reduce_op, &b->req);
        d->stats.allreduces++;
    }
    return d->status;
}

static void mark_ready(ddp *d, int entry) {
    if (d->ready[entry]) return;
    d->ready[entry] = true;
    d->buckets[d->bucket_of[entry]].pending--;
}

static int on_post_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                            const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    owner_hook *h = user;
    ddp *d = h->wrapper;
    if (!d->in_backward)
        return fsc_error(FSC_ERR_INVALID,
                         "DDP: the wrapped module's backward ran without the DDP wrapper (called "
                         "the inner model directly?): its gradients were never all-reduced; run "
                         "forward and backward on the module fsc_ddp_wrap returned (use "
                         "fsc_ddp_set_no_sync to accumulate without communication)");
    if (d->no_sync) return FSC_OK;
    for (int i = 0; i < h->n; i++) mark_ready(d, h->entries[i]);
    int rc = launch_ready(d);
    fsc_group_progress(d->group); /* non-blocking collectives move only when polled */
    return rc;
}

static void reset_readiness(ddp *d) {
    memset(d->ready, 0, (size_t)d->params->count * sizeof *d->ready);
    for (int b = 0; b < d->nbuckets; b++) d->buckets[b].pending = 0;
    for (int e = 0; e < d->params->count; e++) d->buckets[d->bucket_of[e]].pending++;
    d->next_launch = 0;
    d->status = FSC_OK;
}

static int ddp_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    return fsc_module_forward(((ddp *)m)->child, ctx, x, y, saved);
}

static int ddp_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    ddp *d = (ddp *)m;
    if (!d->no_sync) reset_readiness(d);
    d->in_backward = true;
    int rc = fsc_module_backward(d->child, ctx, saved, dy, dx);
    d->in_backward = false;
    if (d->no_sync) return rc;
    if (!rc) {
        for (int e = 0; e < d->params->count; e++) mark_ready(d, e);
        rc = launch_ready(d);
    }
    /* Wait for every launched bucket, even after an error, so no request is left behind. */
    double t0 = fsc_now();
    for (int b = 0; b < d->next_launch; b++) {
        int w = d->buckets[b].req ? fsc_request_wait(&d->buckets[b].req) : FSC_OK;
        if (!rc) rc = w;
    }
    if (!rc && fsc_fault_fires(FSC_FAULT_REDUCE_TWICE))
        fsc_scale(d->params->grad + d->buckets->begin, 2.f,
                  (d->buckets->end - d->buckets->begin) / 2);
    d->stats.last_wait_s = fsc_now() - t0;
    d->stats.wait_s += d->stats.last_wait_s;
    return rc;
}

/* Frees the wrapper only (not the child): the child's hooks go with it. */
static void ddp_free(fsc_module *m) {
    ddp *d = (ddp *)m;
    owner_hooks_free(&d->hooks);
    free(d->buckets);
    free(d->bucket_of);
    free(d->ready);
    free(d);
}

static const fsc_module_ops ddp_ops = {"DDP", ddp_forward, ddp_backward, ddp_free};

static int make_buckets(ddp *d) {
    fsc_params *ps = d->params;
    bucket_plan plan;
    bool *local = NULL;
    int rc = bucket_plan_make(ps, d->opt.bucket_bytes, &plan);
    if (!rc) rc = bucket_plan_split_experts(ps, &plan, &local);
    if (rc) {
        bucket_plan_free(&plan);
        return rc;
    }
    d->buckets = calloc((size_t)plan.n, sizeof *d->buckets);
    d->ready = calloc((size_t)ps->count, sizeof *d->ready);
    if (!d->buckets || !d->ready) {
        bucket_plan_free(&plan);
        free(local);
        return fsc_error(FSC_ERR_NOMEM, "DDP: out of memory");
    }
    for (int b = 0; b < plan.n; b++)
        d->buckets[b] =
            (bucket){.begin = plan.begin[b], .end = plan.end[b], .local = local && local[b]};
    free(local);
    d->nbuckets = plan.n;
    d->bucket_of = plan.bucket_of; /* kept; the rest of the plan is copied */
    plan.bucket_of = NULL;
    bucket_plan_free(&plan);
    d->stats.buckets = d->nbuckets;
    return FSC_OK;
}

/* Rank 0's parameters to every rank: the whole buffer, or with expert
 * shards (each rank's own experts) the replicated buckets one by one. */
static int broadcast_replicated(ddp *d) {
    bool any_local = false;
    for (int b = 0; b < d->nbuckets; b++) any_local |= d->buckets[b].local;
    if (!any_local)
        return fsc_group_broadcast(d->group, d->params->data, d->params->numel, FSC_DTYPE_F32, 0);
    int rc = FSC_OK;
    for (int b = 0; !rc && b < d->nbuckets; b++)
        if (!d->buckets[b].local)
            rc = fsc_group_broadcast(d->group, d->params->data + d->buckets[b].begin,
                                     d->buckets[b].end - d->buckets[b].begin, FSC_DTYPE_F32, 0);
    return rc;
}

fsc_module *fsc_ddp_wrap(fsc_module *child, fsc_params *params, fsc_group *g,
                         const fsc_ddp_options *opt) {
    fsc_ddp_options o = opt ? *opt : (fsc_ddp_options){0};
    if (child && params && params->grad && !g) {
        fsc_error(FSC_ERR_INVALID, "DDP: no process group (call fsc_dist_init first, or pass "
                                   "a group)");
        return NULL;
    }
    if (!child || !params || !params->grad) {
        fsc_error(FSC_ERR_INVALID, "DDP: needs a model and its bound parameters with "
                                   "gradients");
        return NULL;
    }
    if (o.bucket_bytes == 0) o.bucket_bytes = (size_t)25 << 20;
    if (o.reduce_op != FSC_REDUCE_SUM && o.reduce_op != FSC_REDUCE_AVG) {
        fsc_error(FSC_ERR_INVALID, "DDP: reduce_op must be SUM or AVG");
        return NULL;
    }
    ddp *d = calloc(1, sizeof *d);
    if (!d) {
        fsc_error(FSC_ERR_NOMEM, "DDP: out of memory");
        return NULL;
    }
    fsc_module_init(&d->base, &ddp_ops, "ddp");
    d->child = child, d->params = params, d->group = g, d->opt = o;
    d->base.wraps = child;
    int rc = make_buckets(d);
    if (!rc)
        rc = owner_hooks_add(&d->hooks, params, child, d, 1,
                             (fsc_hook_kind[]){FSC_HOOK_POST_BACKWARD},
                             (fsc_hook_fn[]){on_post_backward});
    /* Every rank starts from rank 0's weights. */
    if (!rc && !o.no_broadcast) rc = broadcast_replicated(d);
    if (rc) {
        ddp_free(&d->base);
        return NULL;
    }
    return &d->base;
}

void fsc_ddp_set_no_sync(fsc_module *m, bool no_sync) {
    ((ddp *)m)->no_sync = no_sync;
}

fsc_ddp_stats fsc_ddp_get_stats(const fsc_module *m) {
    return ((const ddp *)m)->stats;
}
