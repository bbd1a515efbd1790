/* Gradient buckets in reverse forward order, and per-module parameter lists:
 * the bookkeeping DDP and ShardedDDP share. DDP's buckets close once they
 * reach the size (fewest collectives); ShardedDDP's never exceed it, since
 * its bucket size is a bound on live gradient memory. */
#include <stdlib.h>

#include "buckets.h"

int bucket_plan_make(const fsc_params *ps, size_t bucket_bytes, bucket_plan *out) {
    *out = (bucket_plan){0};
    out->begin = calloc((size_t)ps->count + 1, sizeof *out->begin);
    out->end = calloc((size_t)ps->count + 1, sizeof *out->end);
    out->bucket_of = calloc((size_t)ps->count + 1, sizeof *out->bucket_of);
    if (!out->begin || !out->end || !out->bucket_of) {
        bucket_plan_free(out);
        return fsc_error(FSC_ERR_NOMEM, "out of memory planning gradient buckets");
    }
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
    *out = (bucket_plan){0};
    out->begin = calloc((size_t)ps->count + 1, sizeof *out->begin);
    out->end = calloc((size_t)ps->count + 1, sizeof *out->end);
    out->bucket_of = calloc((size_t)ps->count + 1, sizeof *out->bucket_of);
    if (!out->begin || !out->end || !out->bucket_of) {
        bucket_plan_free(out);
        return fsc_error(FSC_ERR_NOMEM, "out of memory planning gradient buckets");
    }
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

int module_entries(const fsc_params *ps, const fsc_module *m, int **entries, int *n) {
    *n = 0;
    *entries = malloc((size_t)(m->nparams ? m->nparams : 1) * sizeof **entries);
    if (!*entries) return fsc_error(FSC_ERR_NOMEM, "out of memory listing parameters");
    for (int i = 0; i < m->nparams; i++)
        for (int e = 0; e < ps->count; e++)
            if (ps->entries[e].param == &m->params[i]) (*entries)[(*n)++] = e;
    return FSC_OK;
}

int count_param_modules(const fsc_module *m) {
    int n = m->nparams > 0;
    for (int c = 0; c < m->nchildren; c++) n += count_param_modules(m->children[c]);
    return n;
}
