/* Gradient buckets in reverse forward order, and the backward hooks on the
 * modules that own parameters: the bookkeeping DDP and ShardedDDP share.
 * DDP's buckets close once they reach the size (fewest collectives);
 * ShardedDDP's never exceed it, since its bucket size is a bound on live
 * gradient memory. Expert shards get buckets of their own, which DDP never
 * reduces. */
#include <stdlib.h>

#include "buckets.h"

/* An empty plan with room for a bucket per parameter. */
static int plan_alloc(const fsc_params *ps, bucket_plan *out) {
    *out = (bucket_plan){0};
    out->begin = calloc((size_t)ps->count + 1, sizeof *out->begin);
    out->end = calloc((size_t)ps->count + 1, sizeof *out->end);
    out->bucket_of = calloc((size_t)ps->count + 1, sizeof *out->bucket_of);
    if (!out->begin || !out->end || !out->bucket_of) {
        bucket_plan_free(out);
        return fsc_error(FSC_ERR_NOMEM, "out of memory planning gradient buckets");
    }
    return FSC_OK;
}

int bucket_plan_make(const fsc_params *ps, size_t bucket_bytes, bucket_plan *out) {
    int rc = plan_alloc(ps, out);
    if (rc) return rc;
    size_t limit = bucket_bytes / sizeof(float), in_bucket = 0;
    int64_t end = ps->numel, next = ps->numel; /* bucket end; start of parameter e + 1 */
    for (int e = ps->count - 1; e >= 0; e--) {
        out->bucket_of[e] = out->n;
        in_bucket += (size_t)(next - ps->entries[e].offset);
        next = ps->entries[e].offset;
        if (in_bucket < limit && e > 0) continue;
        out->begin[out->n] = ps->entries[e].offset;
        out->end[out->n] = end;
        int64_t bytes = (end - ps->entries[e].offset) * (int64_t)sizeof(float);
        if (bytes > out->max_bytes) out->max_bytes = bytes;
        out->n++;
        end = ps->entries[e].offset;
        in_bucket = 0;
    }
    return FSC_OK;
}

int bucket_plan_capped(const fsc_params *ps, size_t cap_bytes, const bool *skip, bucket_plan *out) {
    int rc = plan_alloc(ps, out);
    if (rc) return rc;
    int64_t cap = (int64_t)(cap_bytes / sizeof(float)), in_bucket = 0;
    bool open = false;
    for (int e = ps->count - 1; e >= 0; e--) {
        out->bucket_of[e] = -1;
        if (skip && skip[e]) continue;
        int64_t lo = ps->entries[e].offset,
                hi = e + 1 < ps->count ? ps->entries[e + 1].offset : ps->numel;
        if (open && in_bucket + (hi - lo) > cap) { /* close the open bucket */
            int64_t bytes = in_bucket * (int64_t)sizeof(float);
            if (bytes > out->max_bytes) out->max_bytes = bytes;
            out->n++;
            in_bucket = 0;
            open = false;
        }
        if (!open) out->end[out->n] = hi;
        open = true;
        out->begin[out->n] = lo;
        out->bucket_of[e] = out->n;
        in_bucket += hi - lo;
    }
    if (open) {
        int64_t bytes = in_bucket * (int64_t)sizeof(float);
        if (bytes > out->max_bytes) out->max_bytes = bytes;
        out->n++;
    }
    return FSC_OK;
}

void bucket_plan_free(bucket_plan *p) {
    free(p->begin);
    free(p->end);
    free(p->bucket_of);
    *p = (bucket_plan){0};
}

/* Indices (into ps->entries) of the parameters module m declares itself. */
static int module_entries(const fsc_params *ps, const fsc_module *m, int **entries, int *n) {
    *n = 0;
    *entries = malloc((size_t)(m->nparams ? m->nparams : 1) * sizeof **entries);
    if (!*entries) return fsc_error(FSC_ERR_NOMEM, "out of memory listing parameters");
    for (int i = 0; i < m->nparams; i++)
        for (int e = 0; e < ps->count; e++)
            if (ps->entries[e].param == &m->params[i]) (*entries)[(*n)++] = e;
    return FSC_OK;
}

/* Modules in the tree under m (m included) that declare parameters. */
static int count_param_modules(const fsc_module *m) {
    int n = m->nparams > 0;
    for (int c = 0; c < m->nchildren; c++) n += count_param_modules(m->children[c]);
    return n;
}

static int add_under(owner_hooks *hs, const fsc_params *ps, fsc_module *m, void *wrapper) {
    if (m->nparams) {
        owner_hook *h = &hs->hooks[hs->n++];
        h->wrapper = wrapper, h->module = m;
        int rc = module_entries(ps, m, &h->entries, &h->n);
        for (int k = 0; !rc && k < hs->nkinds; k++)
            rc = fsc_module_add_hook(m, hs->kinds[k], hs->fns[k], h);
        if (rc) return rc;
    }
    for (int c = 0; c < m->nchildren; c++) {
        int rc = add_under(hs, ps, m->children[c], wrapper);
        if (rc) return rc;
    }
    return FSC_OK;
}

int owner_hooks_add(owner_hooks *hs, const fsc_params *ps, fsc_module *child, void *wrapper,
                    int nkinds, const fsc_hook_kind *kinds, const fsc_hook_fn *fns) {
    *hs = (owner_hooks){.nkinds = nkinds};
    for (int k = 0; k < nkinds; k++) hs->kinds[k] = kinds[k], hs->fns[k] = fns[k];
    hs->hooks = calloc((size_t)count_param_modules(child) + 1, sizeof *hs->hooks);
    if (!hs->hooks) return fsc_error(FSC_ERR_NOMEM, "out of memory listing parameter owners");
    return add_under(hs, ps, child, wrapper);
}

void owner_hooks_free(owner_hooks *hs) {
    for (int i = 0; i < hs->n; i++) {
        for (int k = 0; k < hs->nkinds; k++)
            fsc_module_remove_hook(hs->hooks[i].module, hs->kinds[k], hs->fns[k], &hs->hooks[i]);
        free(hs->hooks[i].entries);
    }
    free(hs->hooks);
    *hs = (owner_hooks){0};
}

/* Not reduced: an expert shard's gradient already sums every rank's tokens
 * (fsc/moe.h); a frozen parameter has none (fine-tuning). */
static bool local_entry(const fsc_param *p) {
    return p->expert || p->frozen;
}

/* Around expert shards and frozen parameters a bucket holds such entries
 * only or none, so DDP all-reduces the others and skips these. Every rank
 * of an expert-parallel group holds the same number and shapes of experts,
 * and every rank freezes the same names, so every rank cuts the same
 * buckets and issues the same collectives. */
int bucket_plan_split_experts(const fsc_params *ps, bucket_plan *plan, bool **local) {
    *local = NULL;
    bool any = false;
    for (int e = 0; e < ps->count; e++) any |= local_entry(ps->entries[e].param);
    if (!any) return FSC_OK;
    bucket_plan out = {0};
    out.begin = calloc((size_t)ps->count + 1, sizeof *out.begin);
    out.end = calloc((size_t)ps->count + 1, sizeof *out.end);
    out.bucket_of = calloc((size_t)ps->count + 1, sizeof *out.bucket_of);
    bool *flags = calloc((size_t)ps->count + 1, sizeof *flags);
    if (!out.begin || !out.end || !out.bucket_of || !flags) {
        bucket_plan_free(&out);
        free(flags);
        return fsc_error(FSC_ERR_NOMEM, "out of memory planning gradient buckets");
    }
    /* entries from the end, as the plan's buckets run; a new bucket where the
     * old one changes or expert-ness does */
    int64_t end = ps->numel;
    for (int e = ps->count - 1; e >= 0; e--) {
        const bool expert = local_entry(ps->entries[e].param);
        if (e == ps->count - 1 || plan->bucket_of[e] != plan->bucket_of[e + 1] ||
            expert != local_entry(ps->entries[e + 1].param)) {
            if (e != ps->count - 1) out.n++;
            out.end[out.n] = end;
            flags[out.n] = expert;
        }
        out.bucket_of[e] = out.n;
        out.begin[out.n] = end = ps->entries[e].offset;
    }
    out.n++;
    for (int b = 0; b < out.n; b++) {
        int64_t bytes = (out.end[b] - out.begin[b]) * (int64_t)sizeof(float);
        if (bytes > out.max_bytes) out.max_bytes = bytes;
    }
    bucket_plan_free(plan);
    *plan = out;
    *local = flags;
    return FSC_OK;
}
