/* ShardedDDP (ZeRO-2): gradients reduced to their owners during backward, and
 * given back by everyone else.
 *
 * Buckets are DDP's: contiguous ranges of the flat gradient buffer taken from
 * its end (reverse forward order), launched strictly in index order. Each
 * bucket splits into segments by owner (the OSS partition); a segment is
 * reduced to its owner with a non-blocking reduce. Non-owned segments live
 * only between the backward of their first module (a pre-backward hook
 * recommits them) and the completion of their reduce (then fsc_mem_discard
 * zeroes them and returns the pages). Gradients the root writes outside any
 * hooked module (GPT's tied wte and wpe) are found by watching which entries
 * the hooks saw: those buckets are made live when backward starts. */
#include <stdlib.h>
#include <string.h>

#include "buckets.h"
#include "fsc/zero.h"

typedef struct segment {
    int64_t begin, count; /* flat elements */
    int owner;
} segment;

typedef struct bucket {
    int64_t begin, end;
    segment *segs;
    int nsegs;
    int pending; /* parameters not yet ready in this backward */
    bool live;   /* non-owned segments counted (recommitted) */
    bool launched;
    fsc_request **reqs; /* one per segment while in flight */
} bucket;

typedef struct owner_hook {
    struct sdp *sdp;
    int n;
    int *entries;
} owner_hook;

typedef struct sdp {
    fsc_module base;
    fsc_module *child;
    fsc_params *params;
    fsc_oss *oss;
    fsc_group *g;
    int rank;
    fsc_sdp_options opt;
    bucket *buckets;
    int nbuckets, next_launch;
    int *bucket_of;
    bool *ready, *hooked, *hooked_last; /* per entry */
    owner_hook *hooks;
    int nhooks;
    bool no_sync, synced_once;
    int status;
    fsc_sdp_stats stats;
} sdp;

/* ---- memory of non-owned segments ------------------------------------------------ */

static int set_live(sdp *s, bucket *b, bool live) {
    if (b->live == live) return FSC_OK;
    for (int i = 0; i < b->nsegs; i++) {
        segment *sg = &b->segs[i];
        if (sg->owner == s->rank || !sg->count) continue;
        size_t off = (size_t)sg->begin * sizeof(float), n = (size_t)sg->count * sizeof(float);
        int rc = live ? fsc_mem_recommit(s->params->grad, off, n)
                      : fsc_mem_discard(s->params->grad, off, n);
        if (rc) return rc;
    }
    b->live = live;
    return FSC_OK;
}

/* ---- reductions ------------------------------------------------------------------ */

static int launch_ready(sdp *s) {
    while (!s->status && s->next_launch < s->nbuckets && s->buckets[s->next_launch].pending == 0) {
        bucket *b = &s->buckets[s->next_launch++];
        for (int i = 0; !s->status && i < b->nsegs; i++) {
            segment *sg = &b->segs[i];
            s->status = fsc_group_ireduce(s->g, s->params->grad + sg->begin, sg->count,
                                          FSC_DTYPE_F32, FSC_REDUCE_SUM, sg->owner, &b->reqs[i]);
            s->stats.reduces++;
        }
        b->launched = true;
    }
    return s->status;
}

/* Completes bucket b's reductions (waiting or only testing) and, once done,
 * gives its non-owned memory back. */
static int settle(sdp *s, bucket *b, bool wait) {
    if (!b->launched) return FSC_OK;
    bool all = true;
    for (int i = 0; i < b->nsegs; i++) {
        if (!b->reqs[i]) continue;
        int rc;
        if (wait) {
            rc = fsc_request_wait(&b->reqs[i]);
        } else {
            bool done = false;
            rc = fsc_request_test(&b->reqs[i], &done);
            all = all && done;
        }
        if (rc) return rc;
    }
    if (!all) return FSC_OK;
    b->launched = false;
    return set_live(s, b, false);
}

static void mark_ready(sdp *s, int e) {
    if (s->ready[e]) return;
    s->ready[e] = true;
    s->buckets[s->bucket_of[e]].pending--;
}

/* ---- hooks ----------------------------------------------------------------------- */

/* Before another bucket's memory comes into use, every reduce but the latest
 * must be done and its memory given back: at most the root-written bucket, the
 * one being computed and one in flight are held beyond what a rank owns. */
static int make_room(sdp *s) {
    if (s->no_sync) return FSC_OK;
    for (int b = 0; b + 1 < s->next_launch; b++) {
        int rc = settle(s, &s->buckets[b], true);
        if (rc) return rc;
    }
    return FSC_OK;
}

static int on_pre_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                           const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    owner_hook *h = user;
    sdp *s = h->sdp;
    for (int i = 0; i < h->n; i++) {
        s->hooked[h->entries[i]] = true;
        bucket *b = &s->buckets[s->bucket_of[h->entries[i]]];
        int rc = b->live ? FSC_OK : make_room(s);
        if (!rc) rc = set_live(s, b, true);
        if (rc) return rc;
    }
    return FSC_OK;
}

static int on_post_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                            const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    owner_hook *h = user;
    sdp *s = h->sdp;
    if (s->no_sync) return FSC_OK;
    for (int i = 0; i < h->n; i++) mark_ready(s, h->entries[i]);
    int rc = launch_ready(s);
    for (int b = 0; !rc && b < s->next_launch; b++) rc = settle(s, &s->buckets[b], false);
    return rc;
}

/* ---- the module ------------------------------------------------------------------ */

static int sdp_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    return fsc_module_forward(((sdp *)m)->child, ctx, x, y, saved);
}

static int sdp_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    sdp *s = (sdp *)m;
    fsc_params *ps = s->params;
    int rc = FSC_OK;
    /* Buckets written outside hooked modules must be live before backward:
     * all of them until one synchronised backward has shown which they are,
     * and every bucket while accumulating without communication. */
    for (int e = 0; !rc && e < ps->count; e++)
        if (s->no_sync || !s->synced_once || !s->hooked_last[e])
            rc = set_live(s, &s->buckets[s->bucket_of[e]], true);
    if (rc) return rc;
    if (!s->no_sync) {
        memset(s->ready, 0, (size_t)ps->count * sizeof *s->ready);
        memset(s->hooked, 0, (size_t)ps->count * sizeof *s->hooked);
        for (int b = 0; b < s->nbuckets; b++) s->buckets[b].pending = 0;
        for (int e = 0; e < ps->count; e++) s->buckets[s->bucket_of[e]].pending++;
        s->next_launch = 0;
        s->status = FSC_OK;
    }
    rc = fsc_module_backward(s->child, ctx, saved, dy, dx);
    if (s->no_sync) return rc;
    if (!rc) {
        for (int e = 0; e < ps->count; e++) mark_ready(s, e);
        rc = launch_ready(s);
    }
    double t0 = fsc_now();
    for (int b = 0; b < s->next_launch; b++) {
        int w = settle(s, &s->buckets[b], true);
        if (!rc) rc = w;
    }
    s->stats.last_wait_s = fsc_now() - t0;
    s->stats.wait_s += s->stats.last_wait_s;
    memcpy(s->hooked_last, s->hooked, (size_t)ps->count * sizeof *s->hooked);
    s->synced_once = true;
    return rc;
}

static void remove_hooks(sdp *s, fsc_module *m) {
    for (int i = 0; i < s->nhooks; i++) {
        fsc_module_remove_hook(m, FSC_HOOK_PRE_BACKWARD, on_pre_backward, &s->hooks[i]);
        fsc_module_remove_hook(m, FSC_HOOK_POST_BACKWARD, on_post_backward, &s->hooks[i]);
    }
    for (int c = 0; c < m->nchildren; c++) remove_hooks(s, m->children[c]);
}

static void sdp_free(fsc_module *m) {
    sdp *s = (sdp *)m;
    if (s->child && s->hooks) remove_hooks(s, s->child);
    for (int i = 0; i < s->nhooks; i++) free(s->hooks[i].entries);
    for (int b = 0; s->buckets && b < s->nbuckets; b++) {
        set_live(s, &s->buckets[b], true); /* the buffer is whole again for its owner */
        free(s->buckets[b].segs);
        free(s->buckets[b].reqs);
    }
    free(s->hooks);
    free(s->buckets);
    free(s->bucket_of);
    free(s->ready);
    free(s->hooked);
    free(s->hooked_last);
    free(s);
}

static const fsc_module_ops sdp_ops = {"ShardedDDP", sdp_forward, sdp_backward, sdp_free};

/* Appends [at, at+count) owned by `owner`, merging with the last segment. */
static int add_segment(bucket *b, int64_t at, int64_t count, int owner) {
    if (b->nsegs && b->segs[b->nsegs - 1].owner == owner) {
        b->segs[b->nsegs - 1].count += count;
        return FSC_OK;
    }
    segment *grown = realloc(b->segs, sizeof *grown * (size_t)(b->nsegs + 1));
    if (!grown) return fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    b->segs = grown;
    b->segs[b->nsegs++] = (segment){.begin = at, .count = count, .owner = owner};
    return FSC_OK;
}

/* Segments of flat range [lo, hi) (entry k and the padding after it): EVEN
 * cuts at shard boundaries; GREEDY gives it all to the entry's owner (the
 * padding's gradient is zero anyway). */
static int add_range(sdp *s, bucket *b, int k, int64_t lo, int64_t hi) {
    const fsc_partition *p = fsc_oss_partition(s->oss);
    if (p->policy != FSC_PARTITION_EVEN)
        return add_segment(b, lo, hi - lo,
                           fsc_partition_owner(p, s->params, s->params->entries[k].offset));
    while (lo < hi) {
        int owner = (int)(lo / p->shard);
        int64_t stop = (int64_t)(owner + 1) * p->shard;
        if (stop > hi) stop = hi;
        int rc = add_segment(b, lo, stop - lo, owner);
        if (rc) return rc;
        lo = stop;
    }
    return FSC_OK;
}

static int make_buckets(sdp *s) {
    fsc_params *ps = s->params;
    bucket_plan plan;
    int rc = bucket_plan_make(ps, s->opt.bucket_bytes, &plan);
    if (rc) return rc;
    s->buckets = calloc((size_t)plan.n, sizeof *s->buckets);
    s->ready = calloc((size_t)ps->count, sizeof *s->ready);
    s->hooked = calloc((size_t)ps->count, sizeof *s->hooked);
    s->hooked_last = calloc((size_t)ps->count, sizeof *s->hooked_last);
    s->bucket_of = plan.bucket_of; /* kept; the rest of the plan is copied */
    plan.bucket_of = NULL;
    s->nbuckets = plan.n;
    s->stats.buckets = plan.n;
    s->stats.max_bucket_bytes = plan.max_bytes;
    if (!s->buckets || !s->ready || !s->hooked || !s->hooked_last)
        rc = fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    /* segments by owner over every entry (and the padding after it) of each bucket */
    for (int b = 0; !rc && b < plan.n; b++) {
        bucket *bk = &s->buckets[b];
        bk->begin = plan.begin[b], bk->end = plan.end[b], bk->live = true;
        for (int k = 0; !rc && k < ps->count; k++) {
            if (ps->entries[k].offset < bk->begin || ps->entries[k].offset >= bk->end) continue;
            int64_t hi = k + 1 < ps->count ? ps->entries[k + 1].offset : ps->numel;
            rc = add_range(s, bk, k, ps->entries[k].offset, hi);
        }
        bk->reqs = rc ? NULL : calloc((size_t)bk->nsegs, sizeof *bk->reqs);
        if (!rc && !bk->reqs) rc = fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    }
    bucket_plan_free(&plan);
    return rc;
}

static int add_hooks(sdp *s, fsc_module *m) {
    if (m->nparams) {
        owner_hook *h = &s->hooks[s->nhooks++];
        h->sdp = s;
        int rc = module_entries(s->params, m, &h->entries, &h->n);
        if (!rc) rc = fsc_module_add_hook(m, FSC_HOOK_PRE_BACKWARD, on_pre_backward, h);
        if (!rc) rc = fsc_module_add_hook(m, FSC_HOOK_POST_BACKWARD, on_post_backward, h);
        if (rc) return rc;
    }
    for (int c = 0; c < m->nchildren; c++) {
        int rc = add_hooks(s, m->children[c]);
        if (rc) return rc;
    }
    return FSC_OK;
}

fsc_module *fsc_sdp_wrap(fsc_module *child, fsc_params *params, fsc_oss *oss,
                         const fsc_sdp_options *opt) {
    if (!child || !params || !params->grad || !oss) {
        fsc_error(FSC_ERR_INVALID, "ShardedDDP: needs a model, its parameters bound with "
                                   "gradients, and an OSS optimizer over them");
        return NULL;
    }
    sdp *s = calloc(1, sizeof *s);
    if (!s) {
        fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
        return NULL;
    }
    fsc_module_init(&s->base, &sdp_ops, "sdp");
    s->child = child, s->params = params, s->oss = oss, s->g = fsc_oss_group(oss);
    s->rank = fsc_group_rank(s->g);
    s->opt = opt ? *opt : (fsc_sdp_options){0};
    if (!s->opt.bucket_bytes) s->opt.bucket_bytes = (size_t)25 << 20;
    s->hooks = calloc((size_t)count_param_modules(child) + 1, sizeof *s->hooks);
    int rc = s->hooks ? make_buckets(s) : fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    if (!rc) rc = add_hooks(s, child);
    if (!rc && !s->opt.no_broadcast)
        rc = fsc_group_broadcast(s->g, params->data, params->numel, FSC_DTYPE_F32, 0);
    /* from now on a rank holds only its own gradients between backwards */
    for (int b = 0; !rc && b < s->nbuckets; b++) rc = set_live(s, &s->buckets[b], false);
    if (rc) {
        sdp_free(&s->base);
        return NULL;
    }
    return &s->base;
}

void fsc_sdp_set_no_sync(fsc_module *m, bool no_sync) {
    ((sdp *)m)->no_sync = no_sync;
}

void fsc_sdp_zero_grad(fsc_module *m) {
    sdp *s = (sdp *)m;
    for (int b = 0; b < s->nbuckets; b++) {
        bucket *bk = &s->buckets[b];
        for (int i = 0; i < bk->nsegs; i++)
            if (bk->live || bk->segs[i].owner == s->rank)
                memset(s->params->grad + bk->segs[i].begin, 0,
                       (size_t)bk->segs[i].count * sizeof(float));
    }
}

fsc_sdp_stats fsc_sdp_get_stats(const fsc_module *m) {
    return ((const sdp *)m)->stats;
}
