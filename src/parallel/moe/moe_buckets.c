/* DDP's buckets around expert shards: a bucket holds expert entries only or
 * none, so DDP can all-reduce the replicated ones and skip the experts,
 * whose gradients already sum every rank's tokens (fsc/moe.h). Every rank
 * of an expert-parallel group holds the same number and shapes of experts,
 * so every rank cuts the same buckets and issues the same collectives. */
#include <stdlib.h>

#include "moe_internal.h"

int moe_split_buckets(const fsc_params *ps, bucket_plan *plan, bool **local) {
    *local = NULL;
    bool any = false;
    for (int e = 0; e < ps->count; e++) any |= ps->entries[e].param->expert;
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
        const bool expert = ps->entries[e].param->expert;
        if (e == ps->count - 1 || plan->bucket_of[e] != plan->bucket_of[e + 1] ||
            expert != ps->entries[e + 1].param->expert) {
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
