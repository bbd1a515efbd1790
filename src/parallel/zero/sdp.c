/* ShardedDDP (ZeRO-2): gradients reduced to their owners during backward, and
 * given back by everyone else.
 *
 * The one idea: bucket_bytes is a budget, the other ranks' gradient memory a
 * rank may hold at once. Buckets (runs of whole parameters from the end of
 * the flat gradient buffer, launched strictly in index order) hold at most
 * half of it, so one bucket can reduce while the next fills. Memory a rank
 * does not own is committed (fsc_mem_recommit) by a pre-backward hook just
 * before the module writes it; if that would overrun the budget, the oldest
 * reductions in flight are waited for first. Each bucket splits into
 * segments by owner (the OSS partition); a segment is reduced to its owner
 * with a non-blocking reduce, and once that is done the others give the
 * memory back (fsc_mem_discard).
 *
 * Gradients the root writes outside any hooked module (GPT's tied wte, and
 * wpe) cannot wait for a hook. The first synchronised backward keeps every
 * gradient live and watches which parameters the hooks saw; from then on the
 * others ("root-written") are planned apart: live from backward start,
 * reduced after the child's backward returns, in buckets of their own.
 *
 * With a half-precision reduce_dtype a launched bucket is rounded into one of
 * two FSC_MEM_COMM staging slots, reduced in that dtype, and widened back
 * into the owner's F32 gradient; the non-owned F32 memory is given back at
 * launch, since the staged copy is what travels.
 *
 * The hooks sit on the child's modules and fire even when a caller runs the
 * child's backward without the wrapper: nothing would then be reduced, and
 * the root-written gradients would land in given-back memory. A hook that
 * fires outside the wrapper's backward fails the call, before the module
 * writes anything. */
#include <stdlib.h>
#include <string.h>

#include "parallel/data/buckets.h"
#include "core/fault.h"
#include "fsc/kernels.h"
#include "fsc/zero.h"

typedef struct segment {
    int64_t begin, count; /* flat elements */
    int owner;
    int64_t at; /* offset in the staging slot (half reduce_dtype) */
} segment;

typedef struct bucket {
    int *entries; /* ascending flat order */
    int nentries;
    segment *segs;
    int nsegs;
    int64_t elems; /* sum of the segments' counts */
    int pending;   /* parameters not yet ready in this backward */
    bool launched;
    int slot;           /* staging slot while launched (half reduce_dtype), else -1 */
    fsc_request **reqs; /* one per segment while in flight */
} bucket;

typedef struct sdp {
    fsc_module base;
    fsc_module *child;
    fsc_params *params;
    fsc_oss *oss;
    const fsc_partition *part;
    fsc_group *g;
    int rank;
    fsc_sdp_options opt;
    bool half; /* reduce_dtype is BF16 or F16 */
    bucket *buckets;
    int nbuckets, next_launch;
    int *bucket_of;    /* per entry */
    bool *root;        /* per entry: planned as root-written */
    bool *want_root;   /* per entry: scratch for the next plan */
    bool planned;      /* the plan knows the root-written entries */
    int *owner_of;     /* per entry: its owner (GREEDY) */
    bool *live;        /* per entry: its non-owned memory is committed */
    size_t *foreign;   /* per entry: its non-owned bytes */
    size_t live_bytes; /* non-owned bytes committed, root-written entries not counted */
    bool *ready, *hooked, *hooked_last; /* per entry */
    owner_hooks hooks; /* pre- and post-backward on each module that owns parameters */
    void *slot[2];
    size_t slot_bytes;
    int slot_bucket[2]; /* the bucket staged in each slot, -1: free */
    bool no_sync, synced_once;
    bool in_backward; /* the wrapper's backward is running the child's */
    int status;
    fsc_sdp_stats stats;
} sdp;

/* ---- ownership of flat ranges ---------------------------------------------------- */

/* Entry e's span: the parameter and the alignment padding after it. */
static int64_t span_end(const fsc_params *ps, int e) {
    return e + 1 < ps->count ? ps->entries[e + 1].offset : ps->numel;
}

/* The owner of flat element lo of entry e's span [.., hi) and where its run
 * ends. EVEN cuts at shard boundaries; GREEDY gives the span (padding too,
 * whose gradient is zero) to the entry's owner. */
static int run_of(const sdp *s, int e, int64_t lo, int64_t hi, int64_t *stop) {
    const fsc_partition *p = s->part;
    if (p->policy != FSC_PARTITION_EVEN) {
        *stop = hi;
        return s->owner_of[e];
    }
    int owner = (int)(lo / p->shard);
    int64_t end = (int64_t)(owner + 1) * p->shard;
    *stop = end < hi ? end : hi;
    return owner;
}

/* Commits (zeroed) or gives back entry e's non-owned memory. Zeroing on
 * commit keeps a stray write into given-back memory from leaking into the
 * next sum. */
static int set_live(sdp *s, int e, bool live) {
    /* a frozen entry's stretch was given back at bind and stays so */
    if (s->live[e] == live || s->params->entries[e].param->frozen) return FSC_OK;
    int64_t lo = s->params->entries[e].offset, hi = span_end(s->params, e);
    while (lo < hi) {
        int64_t stop;
        int owner = run_of(s, e, lo, hi, &stop);
        if (owner != s->rank) {
            size_t off = (size_t)lo * sizeof(float), n = (size_t)(stop - lo) * sizeof(float);
            int rc = live ? fsc_mem_recommit(s->params->grad, off, n)
                          : fsc_mem_discard(s->params->grad, off, n);
            if (rc) return rc;
            if (live) memset(s->params->grad + lo, 0, n);
        }
        lo = stop;
    }
    s->live[e] = live;
    if (!s->root[e])
        s->live_bytes = live ? s->live_bytes + s->foreign[e] : s->live_bytes - s->foreign[e];
    return FSC_OK;
}

/* ---- reductions ------------------------------------------------------------------ */

static int settle(sdp *s, bucket *b, bool wait);

/* A free staging slot for bucket b; with both in use, the older reduce is
 * waited for (two buckets in flight bound the staging memory). */
static int take_slot(sdp *s, bucket *b) {
    for (;;) {
        for (int k = 0; k < 2; k++)
            if (s->slot_bucket[k] < 0) {
                s->slot_bucket[k] = (int)(b - s->buckets);
                b->slot = k;
                return FSC_OK;
            }
        int older = s->slot_bucket[0] < s->slot_bucket[1] ? 0 : 1;
        int rc = settle(s, &s->buckets[s->slot_bucket[older]], true);
        if (rc) return rc;
    }
}

/* On failure the bucket still counts as launched, so whatever was issued
 * (and its staging slot) is settled after backward. */
static int launch(sdp *s, bucket *b) {
    float *grad = s->params->grad;
    uint16_t *stage = NULL;
    if (b == s->buckets && fsc_fault_is(FSC_FAULT_DROP_GRAD) && s->rank == fsc_group_size(s->g) - 1)
        for (int i = 0; i < b->nsegs; i++)
            memset(grad + b->segs[i].begin, 0, sizeof(float) * (size_t)b->segs[i].count);
    for (int i = 0; s->opt.probe && i < b->nsegs; i++) /* this rank's own, before the sum */
        s->opt.probe(s->opt.probe_user, b->segs[i].begin, grad + b->segs[i].begin,
                     b->segs[i].count);
    if (s->half) {
        int rc = take_slot(s, b);
        if (rc) return rc;
        b->launched = true;
        stage = s->slot[b->slot];
        for (int i = 0; i < b->nsegs; i++) {
            fsc_tensor f = fsc_tensor_1d(grad + b->segs[i].begin, FSC_DTYPE_F32, b->segs[i].count);
            fsc_tensor h =
                fsc_tensor_1d(stage + b->segs[i].at, s->opt.reduce_dtype, b->segs[i].count);
            if ((rc = fsc_tensor_convert(&f, &h))) return rc;
        }
        for (int i = 0; i < b->nentries; i++) /* the staged copy is what travels */
            if ((rc = set_live(s, b->entries[i], false))) return rc;
    }
    b->launched = true;
    for (int i = 0; i < b->nsegs; i++) {
        const segment *sg = &b->segs[i];
        int rc = s->half ? fsc_group_ireduce(s->g, stage + sg->at, sg->count, s->opt.reduce_dtype,
                                             FSC_REDUCE_SUM, sg->owner, &b->reqs[i])
                         : fsc_group_ireduce(s->g, grad + sg->begin, sg->count, FSC_DTYPE_F32,
                                             FSC_REDUCE_SUM, sg->owner, &b->reqs[i]);
        if (rc) return rc;
        s->stats.reduces++;
        s->stats.reduced_bytes += sg->count * (int64_t)fsc_dtype_size(s->opt.reduce_dtype);
    }
    return FSC_OK;
}

static int launch_ready(sdp *s) {
    while (!s->status && s->next_launch < s->nbuckets && s->buckets[s->next_launch].pending == 0)
        s->status = launch(s, &s->buckets[s->next_launch++]);
    return s->status;
}

/* Completes bucket b's reductions (waiting or only testing) and, once done,
 * widens the owner's staged result or gives the non-owned memory back. */
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
    const bool twice = b == s->buckets && fsc_fault_fires(FSC_FAULT_REDUCE_TWICE);
    if (b->slot >= 0) {
        const uint16_t *stage = s->slot[b->slot];
        for (int i = 0; i < b->nsegs; i++) {
            const segment *sg = &b->segs[i];
            if (sg->owner != s->rank) continue;
            fsc_tensor h = fsc_tensor_1d((void *)(stage + sg->at), s->opt.reduce_dtype, sg->count);
            fsc_tensor f = fsc_tensor_1d(s->params->grad + sg->begin, FSC_DTYPE_F32, sg->count);
            int rc = fsc_tensor_convert(&h, &f);
            if (rc) return rc;
            if (twice && i == 0) fsc_scale(f.data, 2.f, sg->count / 2);
        }
        s->slot_bucket[b->slot] = -1;
        b->slot = -1;
        return FSC_OK;
    }
    if (twice && b->segs[0].owner == s->rank)
        fsc_scale(s->params->grad + b->segs[0].begin, 2.f, b->segs[0].count / 2);
    for (int i = 0; i < b->nentries; i++) {
        int rc = set_live(s, b->entries[i], false);
        if (rc) return rc;
    }
    return FSC_OK;
}

static void mark_ready(sdp *s, int e) {
    if (s->ready[e] || s->bucket_of[e] < 0) return; /* frozen: in no bucket */
    s->ready[e] = true;
    s->buckets[s->bucket_of[e]].pending--;
}

/* ---- hooks ----------------------------------------------------------------------- */

/* Before `need` more non-owned bytes are committed: finished reductions give
 * their memory back, then the oldest in flight are waited for while the
 * budget would be overrun. (Staged half-precision buckets gave theirs back at
 * launch: waiting for them frees nothing.) Buckets still filling cannot be
 * waited for; they hold at most two buckets' worth. */
static int make_room(sdp *s, size_t need) {
    int rc = FSC_OK;
    for (int b = 0; !rc && b < s->next_launch; b++) rc = settle(s, &s->buckets[b], false);
    for (int b = 0;
         !rc && !s->half && b < s->next_launch && s->live_bytes + need > s->opt.bucket_bytes; b++)
        rc = settle(s, &s->buckets[b], true);
    return rc;
}

static int bypassed(void) {
    return fsc_error(FSC_ERR_INVALID,
                     "ShardedDDP: the wrapped module's backward ran without the ShardedDDP "
                     "wrapper (called the inner model directly?): its gradients were never "
                     "reduced to their owners; run forward and backward on the module "
                     "fsc_sdp_wrap returned (use fsc_sdp_set_no_sync to accumulate without "
                     "communication)");
}

static int on_pre_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                           const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    owner_hook *h = user;
    sdp *s = h->wrapper;
    if (!s->in_backward) return bypassed();
    size_t need = 0;
    for (int i = 0; i < h->n; i++) {
        int e = h->entries[i];
        s->hooked[e] = true;
        if (!s->live[e] && !s->root[e]) need += s->foreign[e];
    }
    int rc = need && !s->no_sync ? make_room(s, need) : FSC_OK;
    for (int i = 0; !rc && i < h->n; i++) rc = set_live(s, h->entries[i], true);
    return rc;
}

static int on_post_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                            const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    owner_hook *h = user;
    sdp *s = h->wrapper;
    if (!s->in_backward) return bypassed();
    if (s->no_sync) return FSC_OK;
    for (int i = 0; i < h->n; i++) mark_ready(s, h->entries[i]);
    int rc = launch_ready(s);
    for (int b = 0; !rc && b < s->next_launch; b++) rc = settle(s, &s->buckets[b], false);
    return rc;
}

/* ---- the plan -------------------------------------------------------------------- */

static void free_buckets(sdp *s) {
    for (int b = 0; s->buckets && b < s->nbuckets; b++) {
        free(s->buckets[b].entries);
        free(s->buckets[b].segs);
        free(s->buckets[b].reqs);
    }
    free(s->buckets);
    s->buckets = NULL;
    s->nbuckets = 0;
}

/* Appends [at, at+count) owned by `owner`, merging with an adjacent last
 * segment of the same owner. */
static int add_segment(bucket *b, int64_t at, int64_t count, int owner) {
    segment *last = b->nsegs ? &b->segs[b->nsegs - 1] : NULL;
    if (last && last->owner == owner && last->begin + last->count == at) {
        last->count += count;
    } else {
        segment *grown = realloc(b->segs, sizeof *grown * (size_t)(b->nsegs + 1));
        if (!grown) return fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
        b->segs = grown;
        b->segs[b->nsegs++] =
            (segment){.begin = at, .count = count, .owner = owner, .at = b->elems};
    }
    b->elems += count;
    return FSC_OK;
}

static int add_entry(sdp *s, bucket *b, int e) {
    int *grown = realloc(b->entries, sizeof *grown * (size_t)(b->nentries + 1));
    if (!grown) return fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    b->entries = grown;
    b->entries[b->nentries++] = e;
    int64_t lo = s->params->entries[e].offset, hi = span_end(s->params, e);
    while (lo < hi) {
        int64_t stop;
        int owner = run_of(s, e, lo, hi, &stop);
        int rc = add_segment(b, lo, stop - lo, owner);
        if (rc) return rc;
        lo = stop;
    }
    return FSC_OK;
}

/* Buckets of at most bucket_bytes / 2: the hooked entries first (in backward
 * order), then the root-written ones (root[e]; none until known), which are
 * ready only when the child's backward returns. Called when nothing is in
 * flight; re-plans only if the root-written set changed. */
static int make_plan(sdp *s, const bool *root) {
    fsc_params *ps = s->params;
    if (s->buckets && !memcmp(root, s->root, (size_t)ps->count * sizeof *root)) return FSC_OK;
    /* skip lists: frozen entries are in no bucket (no gradient, never reduced) */
    bool *hooked = malloc(2 * (size_t)ps->count * sizeof *hooked + 1), *rooted = hooked + ps->count;
    if (!hooked) return fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    for (int e = 0; e < ps->count; e++) {
        const bool frozen = ps->entries[e].param->frozen;
        hooked[e] = !root[e] || frozen, rooted[e] = root[e] || frozen;
    }
    size_t cap = s->opt.bucket_bytes / 2;
    bucket_plan hp, rp = {0};
    int rc = bucket_plan_capped(ps, cap, rooted, &hp);
    if (!rc) rc = bucket_plan_capped(ps, cap, hooked, &rp);
    free(hooked);
    free_buckets(s);
    if (!rc) {
        s->nbuckets = hp.n + rp.n;
        s->buckets = calloc((size_t)s->nbuckets + 1, sizeof *s->buckets);
        if (!s->buckets) rc = fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    }
    int64_t max_elems = 0;
    for (int e = 0; !rc && e < ps->count; e++) {
        s->bucket_of[e] = ps->entries[e].param->frozen ? -1
                          : root[e]                    ? hp.n + rp.bucket_of[e]
                                                       : hp.bucket_of[e];
        if (s->bucket_of[e] >= 0) rc = add_entry(s, &s->buckets[s->bucket_of[e]], e);
    }
    for (int b = 0; !rc && b < s->nbuckets; b++) {
        bucket *bk = &s->buckets[b];
        bk->slot = -1;
        if (bk->elems > max_elems) max_elems = bk->elems;
        if (!(bk->reqs = calloc((size_t)bk->nsegs + 1, sizeof *bk->reqs)))
            rc = fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    }
    s->stats.buckets = s->nbuckets;
    s->stats.max_bucket_bytes = hp.max_bytes > rp.max_bytes ? hp.max_bytes : rp.max_bytes;
    bucket_plan_free(&hp);
    bucket_plan_free(&rp);
    if (rc) return rc;
    memmove(s->root, root, (size_t)ps->count * sizeof *root);
    s->live_bytes = 0;
    for (int e = 0; e < ps->count; e++)
        if (s->live[e] && !s->root[e]) s->live_bytes += s->foreign[e];
    /* two staging slots of the largest bucket in the half dtype */
    size_t want = s->half ? (size_t)max_elems * fsc_dtype_size(s->opt.reduce_dtype) : 0;
    if (want != s->slot_bytes) {
        for (int k = 0; k < 2; k++) {
            fsc_mem_free(s->slot[k]);
            s->slot[k] = want ? fsc_mem_alloc(FSC_MEM_COMM, want) : NULL;
            if (want && !s->slot[k]) return fsc_error_context(FSC_ERR_NOMEM, "ShardedDDP: ");
        }
        s->slot_bytes = want;
    }
    s->slot_bucket[0] = s->slot_bucket[1] = -1;
    return FSC_OK;
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
    if (!s->no_sync) {
        if (s->synced_once) { /* plan apart what the root wrote last time */
            for (int e = 0; e < ps->count; e++) s->want_root[e] = !s->hooked_last[e];
            rc = make_plan(s, s->want_root);
            if (rc) return rc;
            s->planned = true;
        }
        memset(s->ready, 0, (size_t)ps->count * sizeof *s->ready);
        memset(s->hooked, 0, (size_t)ps->count * sizeof *s->hooked);
        for (int b = 0; b < s->nbuckets; b++) s->buckets[b].pending = 0;
        for (int e = 0; e < ps->count; e++)
            if (s->bucket_of[e] >= 0) s->buckets[s->bucket_of[e]].pending++;
        s->next_launch = 0;
        s->status = FSC_OK;
    }
    /* Live before backward: the root-written gradients; everything while
     * accumulating without communication, or while they are not known yet. */
    bool all = s->no_sync || !s->planned;
    for (int e = 0; !rc && e < ps->count; e++)
        if (all || s->root[e]) rc = set_live(s, e, true);
    if (rc) return rc;
    s->in_backward = true;
    rc = fsc_module_backward(s->child, ctx, saved, dy, dx);
    s->in_backward = false;
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

static void sdp_free(fsc_module *m) {
    sdp *s = (sdp *)m;
    owner_hooks_free(&s->hooks);
    if (s->live && s->root && s->foreign)
        for (int e = 0; e < s->params->count; e++)
            set_live(s, e, true); /* the buffer is whole again for its owner */
    free_buckets(s);
    fsc_mem_free(s->slot[0]);
    fsc_mem_free(s->slot[1]);
    free(s->bucket_of);
    free(s->root);
    free(s->want_root);
    free(s->owner_of);
    free(s->live);
    free(s->foreign);
    free(s->ready);
    free(s->hooked);
    free(s->hooked_last);
    free(s);
}

static const fsc_module_ops sdp_ops = {"ShardedDDP", sdp_forward, sdp_backward, sdp_free};

/* Per-entry state; every gradient starts live (fsc_params_bind committed it). */
static int init_entries(sdp *s) {
    fsc_params *ps = s->params;
    size_t n = (size_t)ps->count + 1;
    s->bucket_of = calloc(n, sizeof *s->bucket_of);
    s->root = calloc(n, sizeof *s->root);
    s->want_root = calloc(n, sizeof *s->want_root);
    s->owner_of = calloc(n, sizeof *s->owner_of);
    s->live = calloc(n, sizeof *s->live);
    s->foreign = calloc(n, sizeof *s->foreign);
    s->ready = calloc(n, sizeof *s->ready);
    s->hooked = calloc(n, sizeof *s->hooked);
    s->hooked_last = calloc(n, sizeof *s->hooked_last);
    if (!s->bucket_of || !s->root || !s->want_root || !s->owner_of || !s->live || !s->foreign ||
        !s->ready || !s->hooked || !s->hooked_last)
        return fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
    for (int e = 0; e < ps->count; e++) {
        s->owner_of[e] = fsc_partition_owner(s->part, ps, ps->entries[e].offset);
        s->live[e] = true;
        int64_t lo = ps->entries[e].offset, hi = span_end(ps, e);
        while (lo < hi && !ps->entries[e].param->frozen) { /* frozen: nothing to commit */
            int64_t stop;
            if (run_of(s, e, lo, hi, &stop) != s->rank)
                s->foreign[e] += (size_t)(stop - lo) * sizeof(float);
            lo = stop;
        }
        s->live_bytes += s->foreign[e];
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
    fsc_sdp_options o = opt ? *opt : (fsc_sdp_options){0};
    if (o.reduce_dtype != FSC_DTYPE_F32 && o.reduce_dtype != FSC_DTYPE_BF16 &&
        o.reduce_dtype != FSC_DTYPE_F16) {
        fsc_error(FSC_ERR_INVALID, "ShardedDDP: reduce_dtype %s (%d) is not F32, BF16 or F16",
                  fsc_dtype_name(o.reduce_dtype), (int)o.reduce_dtype);
        return NULL;
    }
    sdp *s = calloc(1, sizeof *s);
    if (!s) {
        fsc_error(FSC_ERR_NOMEM, "ShardedDDP: out of memory");
        return NULL;
    }
    fsc_module_init(&s->base, &sdp_ops, "sdp");
    s->base.wraps = child;
    s->child = child, s->params = params, s->oss = oss, s->g = fsc_oss_group(oss);
    s->part = fsc_oss_partition(oss);
    s->rank = fsc_group_rank(s->g);
    s->opt = o;
    if (!s->opt.bucket_bytes) s->opt.bucket_bytes = (size_t)25 << 20;
    s->half = o.reduce_dtype != FSC_DTYPE_F32;
    s->slot_bucket[0] = s->slot_bucket[1] = -1;
    int rc = init_entries(s);
    if (!rc) rc = make_plan(s, s->root); /* no root-written entries known yet */
    if (!rc)
        rc = owner_hooks_add(&s->hooks, params, child, s, 2,
                             (fsc_hook_kind[]){FSC_HOOK_PRE_BACKWARD, FSC_HOOK_POST_BACKWARD},
                             (fsc_hook_fn[]){on_pre_backward, on_post_backward});
    if (!rc && !s->opt.no_broadcast)
        rc = fsc_group_broadcast(s->g, params->data, params->numel, FSC_DTYPE_F32, 0);
    /* from now on a rank holds only its own gradients between backwards */
    for (int e = 0; !rc && e < params->count; e++) rc = set_live(s, e, false);
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
    fsc_params *ps = s->params;
    for (int e = 0; e < ps->count; e++) {
        int64_t lo = ps->entries[e].offset, hi = span_end(ps, e);
        while (lo < hi && !ps->entries[e].param->frozen) {
            int64_t stop;
            int owner = run_of(s, e, lo, hi, &stop);
            if (s->live[e] || owner == s->rank)
                memset(ps->grad + lo, 0, (size_t)(stop - lo) * sizeof(float));
            lo = stop;
        }
    }
}

fsc_sdp_stats fsc_sdp_get_stats(const fsc_module *m) {
    return ((const sdp *)m)->stats;
}
