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

/* Initial values of this rank's shard of u, drawn exactly as the full
 * tensors would be (keyed by name and element index). */
void fsdp_init_shard(fsc_fsdp *f, fsdp_unit *u, uint64_t seed) {
    const int64_t lo = (int64_t)f->rank * u->shard, hi = lo + u->shard;
    for (int i = 0; i < u->n; i++) {
        const fsc_param *p = fsdp_member(f, u, i);
        int64_t a = u->offset[i] > lo ? u->offset[i] : lo;
        int64_t b = u->offset[i] + p->numel < hi ? u->offset[i] + p->numel : hi;
        if (b <= a) continue;
        float *dst = u->shard_data + (a - lo);
        switch (p->init) {
        case FSC_INIT_ZEROS:
            memset(dst, 0, (size_t)(b - a) * sizeof(float));
            break;
        case FSC_INIT_ONES:
            for (int64_t j = 0; j < b - a; j++) dst[j] = 1.f;
            break;
        case FSC_INIT_NORMAL:
            fsc_rng_normal_fill(dst, b - a, a - u->offset[i],
                                fsc_rng_key(seed, f->ps.entries[u->entries[i]].name), 0.f,
                                p->init_std);
            break;
        case FSC_INIT_UNIFORM:
            fsc_params_uniform_fill(dst, b - a, a - u->offset[i],
                                    fsc_rng_key(seed, f->ps.entries[u->entries[i]].name),
                                    p->init_std);
            break;
        }
    }
}

/* Rank r's piece of entry e: [*begin, *begin + *count) of the parameter. */
static bool piece(const fsc_fsdp *f, int e, int r, int64_t *begin, int64_t *count) {
    const fsdp_unit *u = &f->units[f->unit_of[e]];
    int i = 0;
    while (u->entries[i] != e) i++;
    const int64_t lo = (int64_t)r * u->shard, hi = lo + u->shard, off = u->offset[i];
    const int64_t numel = f->ps.entries[e].param->numel;
    int64_t a = off > lo ? off : lo, b = off + numel < hi ? off + numel : hi;
    if (b <= a) return false;
    *begin = a - off, *count = b - a;
    return true;
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
            int64_t begin, count;
            if (!piece(f, e, r, &begin, &count)) continue;
            p->ranges[r][p->nranges[r]++] =
                (fsc_shard_range){.entry = e, .begin = begin, .count = count};
            p->elems[r] += count;
            if (r != f->rank) continue;
            const fsdp_unit *u = &f->units[f->unit_of[e]];
            int i = 0;
            while (u->entries[i] != e) i++;
            int64_t at = u->offset[i] + begin - (int64_t)f->rank * u->shard;
            const fsc_param *prm = f->ps.entries[e].param;
            f->ranges[f->nranges++] =
                (fsc_optim_range){.param = u->shard_data + at,
                                  .grad = u->shard_grad + at,
                                  /* frozen: carried in the
                                   * shard, no state */
                                  .n = prm->frozen ? 0 : count,
                                  .decay = prm->weight_decay,
                                  .lr_scale = prm->lr_scale, /* its param group */
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
    for (int e = 0; e < f->ps.count && !rc; e++) {
        fsdp_unit *u = &f->units[f->unit_of[e]];
        u->entries[fill[u->index]] = e;
        u->offset[fill[u->index]++] = u->numel;
        u->numel += align_up(f->ps.entries[e].param->numel);
    }
    free(fill);
    for (int k = 0; k < f->nunits && !rc; k++) {
        fsdp_unit *u = &f->units[k];
        u->shard = align_up((u->numel + f->world - 1) / f->world);
        u->padded = u->shard * f->world;
        f->shard_total += u->shard;
        if (u->padded > f->stats.largest_unit) f->stats.largest_unit = u->padded;
    }
    return rc;
}
