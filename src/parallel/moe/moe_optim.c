/* Optimizer state of a model whose experts are sharded over an
 * expert-parallel group (fsc/moe_parallel.h), by global name, in the one file format
 * every strategy reads (optim_shards.c).
 *
 * The one idea: the one-process model's parameter list is a pure function of
 * this rank's. Rank r holds experts [r*El, (r+1)*El) of every MoE layer, as
 * one run of entries in each layer; in the one-process list that run stands
 * for the P ranks' runs in rank order, renamed to their global indices. So
 * every rank builds the whole list, and two partitions of it, without
 * talking: for saving, each expert with its owner and each replicated tensor
 * split evenly over the ranks (every element written once, the writing
 * shared); for loading, each rank all of the replicated tensors and its own
 * experts. optim_shards then writes (MPI-IO, or streamed to the root) and
 * reads the pieces as it does OSS's shards, and the file is the one a
 * single process with every expert writes and reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_internal.h"
#include "parallel/shard/sharded_internal.h"

typedef struct {
    fsc_params whole;   /* the one-process list: entries only, no storage */
    fsc_param *gparams; /* its parameter records */
    int *src, *owner;   /* per whole entry: this rank's entry, the expert's rank (-1: all) */
    fsc_partition part; /* this call's (saving or loading) */
    int *map;           /* this rank's piece -> optimizer range */
    int64_t *off;       /* ... and its first element there */
} layout;

static void layout_free(layout *l) {
    for (int r = 0; l->part.ranges && r < l->part.world; r++) free(l->part.ranges[r]);
    free(l->part.ranges), free(l->part.nranges), free(l->part.elems);
    free(l->whole.entries), free(l->gparams), free(l->src), free(l->owner);
    free(l->map), free(l->off);
    memset(l, 0, sizeof *l);
}

/* El (experts per layer here) from this rank's expert names, checked against
 * consecutive blocks: rank `me` must hold [me*El, (me+1)*El). */
static int experts_here(const fsc_params *ps, int me, int *el, int *nexp) {
    int lo = -1, hi = -1;
    *nexp = 0;
    for (int i = 0; i < ps->count; i++) {
        if (!ps->entries[i].param->expert) continue;
        const char *at, *after;
        const int e = moe_expert_index(ps->entries[i].name, &at, &after);
        if (e < 0)
            return fsc_error(FSC_ERR_INVALID, "expert parameter %s has no index in its name",
                             ps->entries[i].name);
        if (lo < 0 || e < lo) lo = e;
        if (e > hi) hi = e;
        ++*nexp;
    }
    *el = hi - lo + 1;
    if (*nexp && lo != me * *el)
        return fsc_error(FSC_ERR_INVALID,
                         "rank %d of the group holds experts %d..%d, not %d..%d: the group is not "
                         "the experts' expert-parallel group",
                         me, lo, hi, me * *el, (me + 1) * *el - 1);
    return FSC_OK;
}

/* Adds this rank's entry i as whole entry n, owned by `owner`; an expert's
 * index moves by (owner - me) * El. */
static int add_entry(layout *l, const fsc_params *ps, int i, int owner, int me, int el) {
    const int n = l->whole.count++;
    fsc_param_entry *d = &l->whole.entries[n];
    const char *name = ps->entries[i].name;
    int w;
    if (owner < 0) {
        w = snprintf(d->name, sizeof d->name, "%s", name);
    } else {
        const char *at, *after;
        const int e = moe_expert_index(name, &at, &after) + (owner - me) * el;
        w = snprintf(d->name, sizeof d->name, "%.*s%d%s", (int)(at - name), name, e, after);
    }
    if (w < 0 || (size_t)w >= sizeof d->name)
        return fsc_error(FSC_ERR_INVALID, "the global name of %s is too long", name);
    l->gparams[n] = *ps->entries[i].param;
    l->gparams[n].data = l->gparams[n].grad = NULL;
    d->param = &l->gparams[n];
    d->offset = l->whole.numel;
    l->whole.numel += d->param->numel;
    l->src[n] = i, l->owner[n] = owner;
    return FSC_OK;
}

/* The one-process list: replicated entries as they are, each run of expert
 * entries once per rank, in rank order. */
static int make_whole(layout *l, const fsc_params *ps, int P, int me) {
    int el = 0, nexp = 0;
    int rc = experts_here(ps, me, &el, &nexp);
    if (rc) return rc;
    const size_t n = (size_t)ps->count + (size_t)nexp * (size_t)(P - 1) + 1;
    l->whole.entries = calloc(n, sizeof *l->whole.entries);
    l->gparams = calloc(n, sizeof *l->gparams);
    l->src = calloc(n, sizeof *l->src), l->owner = calloc(n, sizeof *l->owner);
    if (!l->whole.entries || !l->gparams || !l->src || !l->owner)
        return fsc_error(FSC_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ps->count && !rc;) {
        if (!ps->entries[i].param->expert) {
            rc = add_entry(l, ps, i++, -1, me, el);
            continue;
        }
        int end = i;
        while (end < ps->count && ps->entries[end].param->expert) end++;
        for (int p = 0; p < P && !rc; p++)
            for (int k = i; k < end && !rc; k++) rc = add_entry(l, ps, k, p, me, el);
        i = end;
    }
    return rc;
}

static int push(fsc_partition *p, int r, fsc_shard_range s) {
    if (s.count == 0) return FSC_OK;
    fsc_shard_range *a = realloc(p->ranges[r], (size_t)(p->nranges[r] + 1) * sizeof *a);
    if (!a) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    p->ranges[r] = a;
    a[p->nranges[r]++] = s;
    p->elems[r] += s.count;
    return FSC_OK;
}

/* Every rank's pieces, in entry order (optim_shards walks them so). */
static int make_partition(layout *l, int P, bool saving) {
    fsc_partition *p = &l->part;
    p->world = P, p->policy = FSC_PARTITION_EVEN;
    p->nranges = calloc((size_t)P, sizeof *p->nranges);
    p->ranges = calloc((size_t)P, sizeof *p->ranges);
    p->elems = calloc((size_t)P, sizeof *p->elems);
    if (!p->nranges || !p->ranges || !p->elems) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    int rc = FSC_OK;
    for (int w = 0; w < l->whole.count && !rc; w++) {
        const int64_t n = l->whole.entries[w].param->numel;
        if (l->owner[w] >= 0) rc = push(p, l->owner[w], (fsc_shard_range){.entry = w, .count = n});
        for (int r = 0; l->owner[w] < 0 && r < P && !rc; r++) {
            const int64_t b = saving ? n * r / P : 0, e = saving ? n * (r + 1) / P : n;
            rc = push(p, r, (fsc_shard_range){.entry = w, .begin = b, .count = e - b});
        }
    }
    return rc;
}

/* map, off: the optimizer range holding each of this rank's pieces, found by
 * address, so any ranges over the local tensors serve. */
static int map_pieces(layout *l, const fsc_params *ps, fsc_optim *optim, int me) {
    const int np = l->part.nranges[me], nr = fsc_optim_num_ranges(optim);
    l->map = calloc((size_t)np + 1, sizeof *l->map);
    l->off = calloc((size_t)np + 1, sizeof *l->off);
    if (!l->map || !l->off) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    for (int k = 0, hint = 0; k < np; k++) {
        const fsc_shard_range *s = &l->part.ranges[me][k];
        const fsc_param_entry *e = &ps->entries[l->src[s->entry]];
        const float *at = e->param->data + s->begin;
        int found = -1;
        for (int j = 0; j < nr && found < 0; j++) { /* ranges follow the entries: start near */
            const int i = (hint + j) % nr;
            const fsc_optim_range *r = fsc_optim_get_range(optim, i);
            if (r->param && at >= r->param && at + s->count <= r->param + r->n) found = i;
        }
        if (found < 0)
            return fsc_error(FSC_ERR_INVALID,
                             "no optimizer range holds %s's elements [%lld, %lld): the optimizer "
                             "is not over these parameters",
                             e->name, (long long)s->begin, (long long)(s->begin + s->count));
        l->map[k] = hint = found;
        l->off[k] = at - fsc_optim_get_range(optim, found)->param;
    }
    return FSC_OK;
}

/* Builds the layout, and makes every rank agree it could before any
 * transfer (a refused rank must not leave its peers waiting). */
static int build(layout *l, fsc_params *ps, fsc_optim *optim, fsc_group *g, bool saving,
                 const char *who) {
    memset(l, 0, sizeof *l);
    const int P = fsc_group_size(g), me = fsc_group_rank(g);
    int rc = make_whole(l, ps, P, me);
    if (!rc) rc = make_partition(l, P, saving);
    if (!rc) rc = map_pieces(l, ps, optim, me);
    if (rc) fsc_error_context(rc, "%s (rank %d): ", who, me);
    rc = fsc_group_agree(g, rc, who);
    if (rc) layout_free(l);
    return rc;
}

/* Saving and loading differ in two things only: the partition (saving shares
 * each replicated tensor out over the ranks, loading gives every rank all of
 * it) and the one optim_shards call; root is saving's. */
static int transfer(fsc_params *ps, fsc_optim *optim, fsc_group *g, const char *path, int root,
                    bool saving) {
    const char *who = saving ? "MoE save_optim" : "MoE load_optim";
    if (!ps || !optim || !g)
        return fsc_error(FSC_ERR_INVALID, "%s: needs parameters, optimizer and group", who);
    layout l;
    int rc = build(&l, ps, optim, g, saving, who);
    if (rc) return rc;
    optim_shards v = {.ps = &l.whole,
                      .part = &l.part,
                      .local = optim,
                      .g = g,
                      .policy = "experts",
                      .who = who,
                      .local_of_piece = l.map,
                      .offset_of_piece = l.off,
                      .io = g};
    rc = saving ? optim_shards_save(&v, path, root) : optim_shards_load(&v, path);
    layout_free(&l);
    return rc;
}

int fsc_moe_save_optim(fsc_params *ps, fsc_optim *optim, fsc_group *g, const char *path, int root) {
    return transfer(ps, optim, g, path, root, true);
}

int fsc_moe_load_optim(fsc_params *ps, fsc_optim *optim, fsc_group *g, const char *path) {
    return transfer(ps, optim, g, path, 0, false);
}
