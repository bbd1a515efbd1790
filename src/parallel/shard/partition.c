/* Partitions of the flat parameter buffer among the ranks of a group, the
 * common ground of OSS (ZeRO-1) and the sharded strategies above it.
 *
 * The one idea: a partition is nothing but, per rank, a list of (entry, begin,
 * count) ranges in flat-buffer order. GREEDY (FairScale's policy) hands out
 * whole tensors, largest first, each to the rank with the smallest running
 * total (ties to the lowest rank); EVEN cuts the buffer into `world` equal
 * contiguous shards and intersects each with the parameter entries, so a
 * tensor may be split and the alignment padding between tensors belongs to
 * nobody. Both are deterministic functions of (ps layout, world, policy,
 * align), so every rank computes the same partition without talking. */
#include <stdlib.h>
#include <string.h>

#include "fsc/zero.h"

#define DEFAULT_ALIGN 16

void fsc_partition_free(fsc_partition *p) {
    if (!p) return;
    if (p->ranges)
        for (int r = 0; r < p->world; r++) free(p->ranges[r]);
    free(p->ranges);
    free(p->nranges);
    free(p->elems);
    free(p);
}

/* Appends (entry, begin, count) to rank r's list; cap[r] is its capacity. */
static int push_range(fsc_partition *p, int *cap, int r, int entry, int64_t begin, int64_t count) {
    if (p->nranges[r] == cap[r]) {
        int ncap = cap[r] ? cap[r] * 2 : 8;
        void *q = realloc(p->ranges[r], (size_t)ncap * sizeof *p->ranges[r]);
        if (!q) return fsc_error(FSC_ERR_NOMEM, "partition: out of memory for rank %d's ranges", r);
        p->ranges[r] = q;
        cap[r] = ncap;
    }
    p->ranges[r][p->nranges[r]++] =
        (fsc_shard_range){.entry = entry, .begin = begin, .count = count};
    p->elems[r] += count;
    return FSC_OK;
}

typedef struct sized {
    int64_t numel;
    int entry;
    bool frozen;
} sized;

/* Trainable tensors first, larger first; equal sizes keep entry order (a
 * deterministic sort). */
static int by_size_desc(const void *a, const void *b) {
    const sized *x = a, *y = b;
    if (x->frozen != y->frozen) return x->frozen ? 1 : -1;
    if (x->numel != y->numel) return x->numel > y->numel ? -1 : 1;
    return (x->entry > y->entry) - (x->entry < y->entry);
}

static int partition_greedy(fsc_partition *p, const fsc_params *ps, int *cap) {
    int n = ps->count;
    sized *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    int *owner = malloc((size_t)(n > 0 ? n : 1) * sizeof *owner);
    /* trainable and frozen tensors are balanced apart: a rank's optimizer
     * state and updates follow its trainable share alone (frozen ones carry
     * none; they are owned only for the state file's zeros) */
    int64_t *load = calloc(2 * (size_t)p->world, sizeof *load);
    int rc = FSC_OK;
    if (!order || !owner || !load) {
        rc = fsc_error(FSC_ERR_NOMEM, "partition: out of memory for %d entries", n);
        goto done;
    }
    for (int i = 0; i < n; i++)
        order[i] = (sized){ps->entries[i].param->numel, i, ps->entries[i].param->frozen};
    qsort(order, (size_t)n, sizeof *order, by_size_desc);
    for (int k = 0; k < n; k++) {
        int64_t *l = load + (order[k].frozen ? p->world : 0);
        int best = 0;
        for (int r = 1; r < p->world; r++)
            if (l[r] < l[best]) best = r;
        owner[order[k].entry] = best;
        l[best] += order[k].numel;
    }
    /* ranges in flat-buffer (entry) order; empty tensors need no range */
    for (int i = 0; i < n && !rc; i++)
        if (ps->entries[i].param->numel > 0)
            rc = push_range(p, cap, owner[i], i, 0, ps->entries[i].param->numel);
done:
    free(order);
    free(owner);
    free(load);
    return rc;
}

static int partition_even(fsc_partition *p, const fsc_params *ps, int64_t align, int *cap) {
    int64_t per = (ps->numel + p->world - 1) / p->world;
    p->shard = (per + align - 1) / align * align;
    p->padded_numel = p->shard * p->world;
    int rc = FSC_OK;
    for (int i = 0; i < ps->count && !rc; i++) {
        int64_t lo = ps->entries[i].offset, hi = lo + ps->entries[i].param->numel;
        while (lo < hi && !rc) { /* walk the tensor shard by shard */
            int r = (int)(lo / p->shard);
            int64_t end = (int64_t)(r + 1) * p->shard;
            if (end > hi) end = hi;
            rc = push_range(p, cap, r, i, lo - ps->entries[i].offset, end - lo);
            lo = end;
        }
    }
    return rc;
}

static int check_layout(const fsc_params *ps) {
    for (int i = 0; i < ps->count; i++) {
        const fsc_param_entry *e = &ps->entries[i];
        if (!e->param || e->param->numel < 0 || e->offset < 0 ||
            e->offset + e->param->numel > ps->numel)
            return fsc_error(FSC_ERR_INVALID,
                             "partition: parameter '%s' lies outside the flat buffer of %lld "
                             "elements",
                             e->name, (long long)ps->numel);
        if (i > 0 && e->offset < ps->entries[i - 1].offset + ps->entries[i - 1].param->numel)
            return fsc_error(FSC_ERR_INVALID,
                             "partition: parameter '%s' overlaps '%s' (entries must be in "
                             "flat-buffer order)",
                             e->name, ps->entries[i - 1].name);
    }
    return FSC_OK;
}

int fsc_partition_new(const fsc_params *ps, int world, fsc_partition_policy policy, int64_t align,
                      fsc_partition **out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "partition: out must not be NULL");
    *out = NULL;
    if (!ps || (ps->count > 0 && !ps->entries))
        return fsc_error(FSC_ERR_INVALID, "partition: ps must be a collected parameter list");
    if (world < 1) return fsc_error(FSC_ERR_INVALID, "partition: world %d must be >= 1", world);
    if (policy != FSC_PARTITION_GREEDY && policy != FSC_PARTITION_EVEN)
        return fsc_error(FSC_ERR_INVALID, "partition: policy %d is neither GREEDY nor EVEN",
                         (int)policy);
    if (align < 0)
        return fsc_error(FSC_ERR_INVALID, "partition: align %lld must be >= 0 (0: 16)",
                         (long long)align);
    if (align == 0) align = DEFAULT_ALIGN;
    int rc = check_layout(ps);
    if (rc) return rc;
    fsc_partition *p = calloc(1, sizeof *p);
    int *cap = calloc((size_t)world, sizeof *cap);
    if (p) {
        p->world = world;
        p->policy = policy;
        p->nranges = calloc((size_t)world, sizeof *p->nranges);
        p->ranges = calloc((size_t)world, sizeof *p->ranges);
        p->elems = calloc((size_t)world, sizeof *p->elems);
    }
    if (!p || !cap || !p->nranges || !p->ranges || !p->elems) {
        free(cap);
        fsc_partition_free(p);
        return fsc_error(FSC_ERR_NOMEM, "partition: out of memory for %d ranks", world);
    }
    rc = policy == FSC_PARTITION_GREEDY ? partition_greedy(p, ps, cap)
                                        : partition_even(p, ps, align, cap);
    free(cap);
    if (rc) {
        fsc_partition_free(p);
        return rc;
    }
    *out = p;
    return FSC_OK;
}

int fsc_partition_owner(const fsc_partition *p, const fsc_params *ps, int64_t flat) {
    if (!p || !ps || flat < 0 || flat >= ps->numel) return -1;
    if (p->policy == FSC_PARTITION_EVEN) return p->shard > 0 ? (int)(flat / p->shard) : -1;
    for (int r = 0; r < p->world; r++)
        for (int k = 0; k < p->nranges[r]; k++) {
            const fsc_shard_range *s = &p->ranges[r][k];
            int64_t lo = ps->entries[s->entry].offset + s->begin;
            if (flat >= lo && flat < lo + s->count) return r;
        }
    return -1;
}

int fsc_partition_ranges(const fsc_partition *p, const fsc_params *ps, int rank,
                         fsc_optim_range **out, int *n) {
    if (!out || !n)
        return fsc_error(FSC_ERR_INVALID, "partition ranges: out and n must not be NULL");
    *out = NULL;
    *n = 0;
    if (!p || !ps) return fsc_error(FSC_ERR_INVALID, "partition ranges: p and ps must not be NULL");
    if (rank < 0 || rank >= p->world)
        return fsc_error(FSC_ERR_INVALID, "partition ranges: rank %d not in [0, %d)", rank,
                         p->world);
    if (!ps->data || !ps->grad)
        return fsc_error(FSC_ERR_INVALID,
                         "partition ranges: the parameter list has no flat %s buffer (bind with "
                         "grads)",
                         ps->data ? "gradient" : "parameter");
    int m = p->nranges[rank];
    fsc_optim_range *r = calloc((size_t)(m > 0 ? m : 1), sizeof *r);
    if (!r) return fsc_error(FSC_ERR_NOMEM, "partition ranges: out of memory for %d ranges", m);
    for (int k = 0; k < m; k++) {
        const fsc_shard_range *s = &p->ranges[rank][k];
        if (s->entry < 0 || s->entry >= ps->count) {
            free(r);
            return fsc_error(FSC_ERR_INVALID,
                             "partition ranges: range %d names entry %d, but ps has %d entries "
                             "(a partition of another parameter list?)",
                             k, s->entry, ps->count);
        }
        const fsc_param_entry *e = &ps->entries[s->entry];
        int64_t at = e->offset + s->begin;
        r[k] = (fsc_optim_range){.param = ps->data + at,
                                 .grad = ps->grad + at,
                                 .n = e->param->frozen ? 0 : s->count, /* carried, no state */
                                 .decay = e->param->weight_decay,
                                 .lr_scale = e->param->lr_scale, /* its param group */
                                 .wd_set = e->param->wd_set,
                                 .wd = e->param->wd,
                                 .name = e->name};
    }
    *out = r;
    *n = m;
    return FSC_OK;
}
