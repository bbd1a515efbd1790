/* FSDP's flat layout: which unit owns each parameter, where each parameter
 * sits in its unit's flat buffer, how that buffer is split into per-rank
 * shards, the shards' initial values, and the optimizer's ranges over them.
 *
 * All of it is offset arithmetic done once, at fsc_fsdp_new, before any
 * hook or collective exists; it shares nothing with the gather and
 * reduce-scatter machinery in fsdp.c but the structs in fsdp_internal.h,
 * which is why it lives apart from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp_internal.h"

#define ALIGN 16 /* floats: every parameter and shard starts on 64 bytes */

static int64_t align_up(int64_t n) {
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static int unit_index(fsc_module *const *units, int n, const fsc_module *m) {
    for (int i = 0; i < n; i++)
        if (units[i] == m) return i + 1;
    return 0;
}

/* Walks the tree in fsc_params_collect's order, giving each entry the unit
 * of the innermost unit module around it and each unit its module path. */
int fsdp_assign(fsc_fsdp *f, fsc_module *m, const char *path, int cur, fsc_module *const *units,
                int n, int *entry, int *seen) {
    int k = m == f->root ? 0 : unit_index(units, n, m);
    if (k || m == f->root) {
        cur = k;
        f->units[k].m = m;
        snprintf(f->units[k].name, sizeof f->units[k].name, "%s", path);
        seen[k]++;
    }
    for (int i = 0; i < m->nparams; i++) f->unit_of[(*entry)++] = cur;
    for (int c = 0; c < m->nchildren; c++) {
        char sub[FSC_NAME_MAX * 2];
        int w = path[0] ? snprintf(sub, sizeof sub, "%s.%s", path, m->children[c]->name)
                        : snprintf(sub, sizeof sub, "%s", m->children[c]->name);
        if (w < 0 || (size_t)w >= sizeof sub)
            return fsc_error(FSC_ERR_INVALID, "FSDP: module path %s.%s is too long", path,
                             m->children[c]->name);
        int rc = fsdp_assign(f, m->children[c], sub, cur, units, n, entry, seen);
        if (rc) return rc;
    }
    return FSC_OK;
}

void fsdp_region(const fsc_fsdp *f, const fsdp_unit *u, int i, int r, int64_t *lo, int64_t *len,
                 int64_t *at) {
    if (!fsdp_member(f, u, i)->frozen) {
        *lo = (int64_t)r * u->gshard, *len = u->gshard, *at = 0;
        return;
    }
    const int64_t fshard = u->shard - u->gshard;
    *lo = u->gpadded + (int64_t)r * fshard, *len = fshard, *at = u->gshard;
}

void fsdp_take_shard(const fsc_fsdp *f, fsdp_unit *u) {
    const int64_t fshard = u->shard - u->gshard;
    memcpy(u->shard_data, u->full + (int64_t)f->rank * u->gshard,
           (size_t)u->gshard * sizeof(float));
    memcpy(u->shard_data + u->gshard, u->full + u->gpadded + (int64_t)f->rank * fshard,
           (size_t)fshard * sizeof(float));
}

/* Rank r's piece of member i of u: [*begin, *begin + *count) of the
 * parameter, at *at in the rank's shard. */
static bool member_piece(const fsc_fsdp *f, const fsdp_unit *u, int i, int r, int64_t *begin,
                         int64_t *count, int64_t *at) {
    int64_t lo, len, base;
    fsdp_region(f, u, i, r, &lo, &len, &base);
    const int64_t off = u->offset[i], numel = fsdp_member(f, u, i)->numel;
    int64_t a = off > lo ? off : lo, b = off + numel < lo + len ? off + numel : lo + len;
    if (b <= a) return false;
    *begin = a - off, *count = b - a, *at = base + (a - lo);
    return true;
}

/* Initial values of this rank's shard of u, drawn exactly as the full
 * tensors would be (keyed by name and element index). */
void fsdp_init_shard(fsc_fsdp *f, fsdp_unit *u, uint64_t seed) {
    for (int i = 0; i < u->n; i++) {
        const fsc_param *p = fsdp_member(f, u, i);
        int64_t begin, count, at;
        if (!member_piece(f, u, i, f->rank, &begin, &count, &at)) continue;
        const int64_t a = begin, b = begin + count;
        float *dst = u->shard_data + at;
        switch (p->init) {
        case FSC_INIT_ZEROS:
            memset(dst, 0, (size_t)(b - a) * sizeof(float));
            break;
        case FSC_INIT_ONES:
            for (int64_t j = 0; j < b - a; j++) dst[j] = 1.f;
            break;
        case FSC_INIT_NORMAL:
            fsc_rng_normal_fill(dst, b - a, a,
                                fsc_rng_key(seed, f->ps.entries[u->entries[i]].name), 0.f,
                                p->init_std);
            break;
        case FSC_INIT_UNIFORM:
            fsc_params_uniform_fill(dst, b - a, a,
                                    fsc_rng_key(seed, f->ps.entries[u->entries[i]].name),
                                    p->init_std);
            break;
        }
    }
}

/* Rank r's piece of entry e (member_piece's outputs). */
static bool piece(const fsc_fsdp *f, int e, int r, int64_t *begin, int64_t *count, int64_t *at) {
    const fsdp_unit *u = &f->units[f->unit_of[e]];
    int i = 0;
    while (u->entries[i] != e) i++;
    return member_piece(f, u, i, r, begin, count, at);
}

/* The optimizer's ranges (this rank's pieces, entry order) and every rank's
 * pieces as a partition (lists of ranges, as GREEDY's), for state by name. */
int fsdp_plan_ranges(fsc_fsdp *f) {
    fsc_partition *p = calloc(1, sizeof *p);
    f->part = p;
    f->ranges = calloc((size_t)f->ps.count + 1, sizeof *f->ranges);
    if (!p || !f->ranges) return fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
    p->world = f->world, p->policy = FSC_PARTITION_GREEDY;
    p->nranges = calloc((size_t)f->world, sizeof *p->nranges);
    p->ranges = calloc((size_t)f->world, sizeof *p->ranges);
    p->elems = calloc((size_t)f->world, sizeof *p->elems);
    if (!p->nranges || !p->ranges || !p->elems)
        return fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
    for (int r = 0; r < f->world; r++) {
        if (!(p->ranges[r] = calloc((size_t)f->ps.count + 1, sizeof *p->ranges[r])))
            return fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
        for (int e = 0; e < f->ps.count; e++) {
            int64_t begin, count, at;
            if (!piece(f, e, r, &begin, &count, &at)) continue;
            p->ranges[r][p->nranges[r]++] =
                (fsc_shard_range){.entry = e, .begin = begin, .count = count};
            p->elems[r] += count;
            if (r != f->rank) continue;
            const fsdp_unit *u = &f->units[f->unit_of[e]];
            const fsc_param *prm = f->ps.entries[e].param;
            /* frozen: a piece of the weights, no gradient (n = 0: its grad,
             * the param's address, is never read), no state */
            f->ranges[f->nranges++] = (fsc_optim_range){.param = u->shard_data + at,
                                                        .grad = prm->frozen ? u->shard_data + at
                                                                            : u->shard_grad + at,
                                                        .n = prm->frozen ? 0 : count,
                                                        .decay = prm->weight_decay,
                                                        .lr_scale = prm->lr_scale,
                                                        .wd_set = prm->wd_set,
                                                        .wd = prm->wd,
                                                        .name = f->ps.entries[e].name};
        }
    }
    return FSC_OK;
}

int fsdp_lay_out_units(fsc_fsdp *f) {
    int *fill = calloc((size_t)f->nunits, sizeof *fill);
    if (!fill) return fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
    for (int e = 0; e < f->ps.count; e++) f->units[f->unit_of[e]].n++;
    int rc = FSC_OK;
    for (int k = 0; k < f->nunits && !rc; k++) {
        fsdp_unit *u = &f->units[k];
        u->f = f, u->index = k, u->fwd_pos = -1, u->grad_zero = true;
        u->entries = calloc((size_t)u->n + 1, sizeof *u->entries);
        u->offset = calloc((size_t)u->n + 1, sizeof *u->offset);
        if (!u->entries || !u->offset) rc = fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
        if (!rc && k > 0 && u->n == 0)
            rc = fsc_error(FSC_ERR_INVALID,
                           "FSDP: unit '%s' has no parameters of its own (units under it "
                           "claim them all)",
                           u->name);
    }
    /* trainable members first in their region, frozen ones in theirs (offsets
     * from the region's start until the trainable region's size is known) */
    for (int e = 0; e < f->ps.count && !rc; e++) {
        fsdp_unit *u = &f->units[f->unit_of[e]];
        const fsc_param *p = f->ps.entries[e].param;
        int64_t *used = p->frozen ? &u->fnumel : &u->gnumel;
        u->entries[fill[u->index]] = e;
        u->offset[fill[u->index]++] = *used;
        *used += align_up(p->numel);
    }
    free(fill);
    for (int k = 0; k < f->nunits && !rc; k++) {
        fsdp_unit *u = &f->units[k];
        u->gshard = align_up((u->gnumel + f->world - 1) / f->world);
        u->gpadded = u->gshard * f->world;
        u->shard = u->gshard + align_up((u->fnumel + f->world - 1) / f->world);
        u->padded = u->shard * f->world;
        for (int i = 0; i < u->n; i++)
            if (fsdp_member(f, u, i)->frozen) u->offset[i] += u->gpadded;
        f->shard_total += u->shard;
        f->grad_total += u->gshard;
        if (u->padded > f->stats.largest_unit) f->stats.largest_unit = u->padded;
    }
    return rc;
}
