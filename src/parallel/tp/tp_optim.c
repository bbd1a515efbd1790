/* Optimizer state of a tensor-parallel model by global name, in the one
 * file format every strategy reads (src/parallel/shard/optim_shards.c).
 *
 * The one idea: the optimizer runs over runs of the GLOBAL layout. Each
 * local sharded parameter becomes one range per run of elements that are
 * contiguous both locally and in the global tensor (tp_for_each_run), each
 * replicated parameter one range. A range is then a piece (global entry,
 * first element, count) of the one-process state, and the TP group's pieces
 * form an fsc_partition of the whole model's parameter list (global shapes),
 * which optim_shards streams to and from the file as it does OSS's shards.
 * Two partitions: for saving, replicated parameters are listed on TP rank 0
 * only (each element is written once); for loading, every rank lists all its
 * pieces. A piece's optimizer range is found by its address (local_of_piece,
 * offset_of_piece), so the saving list may skip ranges, and an optimizer over
 * whole local tensors (several pieces each, and padding) works as well. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/shard/sharded_internal.h"
#include "tp_internal.h"

/* One range of this rank: entry i's local elements [local, local + count)
 * are global elements [begin, begin + count). */
typedef struct {
    int entry;
    int64_t local, begin, count;
    bool replicated;
} piece;

typedef struct {
    piece *at;
    int n, cap;
    int entry;       /* of the runs being added */
    int64_t padding; /* elements of padding rows seen */
} piece_list;

static int push(piece_list *l, piece p) {
    if (l->n > 0) { /* merge with the previous run where both layouts continue */
        piece *q = &l->at[l->n - 1];
        if (q->entry == p.entry && !q->replicated && !p.replicated &&
            q->local + q->count == p.local && q->begin + q->count == p.begin) {
            q->count += p.count;
            return FSC_OK;
        }
    }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        piece *a = realloc(l->at, (size_t)cap * sizeof *a);
        if (!a) return fsc_error(FSC_ERR_NOMEM, "tensor-parallel optimizer: out of memory");
        l->at = a, l->cap = cap;
    }
    l->at[l->n++] = p;
    return FSC_OK;
}

static int add_run(void *user, int64_t local, int64_t global, int64_t n) {
    piece_list *l = user;
    if (global < 0) l->padding += n; /* padding has no state */
    if (global < 0 || n == 0) return FSC_OK;
    return push(l, (piece){.entry = l->entry, .local = local, .begin = global, .count = n});
}

/* This rank's pieces of every entry of ps, by entry then global element;
 * l->padding counts the padding elements. */
static int collect(fsc_module *root, const fsc_params *ps, piece_list *l) {
    int rc = FSC_OK;
    for (int i = 0; !rc && i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        tp_placement pl = tp_place(root, p);
        l->entry = i;
        if (!pl.s)
            rc = p->numel ? push(l, (piece){.entry = i, .count = p->numel, .replicated = true})
                          : FSC_OK;
        else
            rc = tp_for_each_run(&pl, p, add_run, l);
    }
    if (rc) free(l->at), memset(l, 0, sizeof *l);
    return rc;
}

int fsc_tp_optim_ranges(fsc_module *root, const fsc_params *ps, fsc_optim_range **out, int *n) {
    if (out) *out = NULL;
    if (n) *n = 0;
    if (!root || !ps || !out || !n)
        return fsc_error(FSC_ERR_INVALID, "fsc_tp_optim_ranges: NULL argument");
    for (int i = 0; i < ps->count; i++)
        if (!ps->entries[i].param->data || !ps->entries[i].param->grad)
            return fsc_error(
                FSC_ERR_INVALID, "fsc_tp_optim_ranges: %s of %s is not bound (bind with gradients)",
                ps->entries[i].param->data ? "the gradient" : "the data", ps->entries[i].name);
    piece_list l = {0};
    int rc = collect(root, ps, &l);
    if (rc) return rc;
    fsc_optim_range *r = calloc((size_t)(l.n ? l.n : 1), sizeof *r);
    if (!r) {
        free(l.at);
        return fsc_error(FSC_ERR_NOMEM, "fsc_tp_optim_ranges: out of memory");
    }
    for (int k = 0; k < l.n; k++) {
        const fsc_param_entry *e = &ps->entries[l.at[k].entry];
        r[k] = (fsc_optim_range){.param = e->param->data + l.at[k].local,
                                 .grad = e->param->grad + l.at[k].local,
                                 .n = e->param->frozen ? 0 : l.at[k].count, /* no state */
                                 .decay = e->param->weight_decay,
                                 .lr_scale = e->param->lr_scale, /* its param group */
                                 .wd_set = e->param->wd_set,
                                 .wd = e->param->wd,
                                 .name = e->name};
    }
    *out = r, *n = l.n;
    free(l.at);
    return FSC_OK;
}

/* ---- the state's view of the file ------------------------------------------------------- */
struct fsc_tp_optim_state {
    fsc_optim *optim;
    fsc_group *g;
    fsc_params whole;   /* the global parameter list: entries only */
    fsc_param *gparams; /* whole's parameter records, in global shapes */
    fsc_partition load, save;
    int *load_map, *save_map;     /* this rank's piece -> optimizer range */
    int64_t *load_off, *save_off; /* ... and its first element there */
};

static void partition_free(fsc_partition *p) {
    for (int r = 0; p->ranges && r < p->world; r++) free(p->ranges[r]);
    free(p->ranges), free(p->nranges), free(p->elems);
    memset(p, 0, sizeof *p);
}

static int partition_alloc(fsc_partition *p, int world) {
    p->world = world, p->policy = FSC_PARTITION_EVEN;
    p->nranges = calloc((size_t)world, sizeof *p->nranges);
    p->ranges = calloc((size_t)world, sizeof *p->ranges);
    p->elems = calloc((size_t)world, sizeof *p->elems);
    return p->nranges && p->ranges && p->elems ? FSC_OK : FSC_ERR_NOMEM;
}

void fsc_tp_optim_state_free(fsc_tp_optim_state *s) {
    if (!s) return;
    partition_free(&s->load), partition_free(&s->save);
    free(s->load_map), free(s->save_map), free(s->load_off), free(s->save_off);
    free(s->whole.entries), free(s->gparams);
    free(s);
}

/* The whole model's list: ps's names and order, global shapes, no storage. */
static int make_whole(fsc_tp_optim_state *s, fsc_module *root, const fsc_params *ps) {
    const size_t n = (size_t)(ps->count ? ps->count : 1);
    s->whole.entries = calloc(n, sizeof *s->whole.entries);
    s->gparams = calloc(n, sizeof *s->gparams);
    if (!s->whole.entries || !s->gparams)
        return fsc_error(FSC_ERR_NOMEM, "tensor-parallel optimizer: out of memory");
    int64_t at = 0;
    for (int i = 0; i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        tp_placement pl = tp_place(root, p);
        fsc_param *q = &s->gparams[i];
        *q = *p;
        q->data = q->grad = NULL;
        memcpy(q->shape, pl.gshape, sizeof q->shape);
        q->numel = pl.gnumel;
        fsc_param_entry *e = &s->whole.entries[i];
        memcpy(e->name, ps->entries[i].name, sizeof e->name);
        e->param = q, e->offset = at;
        at += q->numel;
    }
    s->whole.count = ps->count, s->whole.numel = at;
    return FSC_OK;
}

/* The group must be the modules' TP group (same size, same rank). */
static int check_group(fsc_module *root, const fsc_params *ps, fsc_group *g) {
    for (int i = 0; i < ps->count; i++) {
        tp_placement pl = tp_place(root, ps->entries[i].param);
        if (pl.t && (pl.t->size != fsc_group_size(g) || pl.t->rank != fsc_group_rank(g)))
            return fsc_error(FSC_ERR_INVALID,
                             "fsc_tp_optim_state_new: %s is split over a group of %d (this "
                             "rank %d), but the group given has %d ranks (this rank %d)",
                             ps->entries[i].name, pl.t->size, pl.t->rank, fsc_group_size(g),
                             fsc_group_rank(g));
    }
    return FSC_OK;
}

typedef struct {
    uintptr_t at;
    int64_t n;
    int index;
} addr;

/* by address; an empty range before a non-empty one at the same address */
static int addr_cmp(const void *a, const void *b) {
    const addr *x = a, *y = b;
    return x->at != y->at ? (x->at > y->at) - (x->at < y->at) : (x->n > y->n) - (x->n < y->n);
}

/* map[k], off[k]: the optimizer range holding piece k and where the piece
 * starts in it. The ranges must not overlap and must hold this rank's pieces
 * and padding and nothing else: the runs of fsc_tp_optim_ranges, or whole
 * local tensors (fsc_optim_ranges_from_params), in any order. */
static int map_pieces(fsc_optim *optim, const fsc_params *ps, const piece_list *l, int *map,
                      int64_t *off) {
    const int nr = fsc_optim_num_ranges(optim);
    addr *by = calloc((size_t)(nr ? nr : 1), sizeof *by);
    if (!by) return fsc_error(FSC_ERR_NOMEM, "tensor-parallel optimizer: out of memory");
    int64_t held = 0, owned = 0; /* elements in the ranges; in the pieces */
    for (int i = 0; i < nr; i++) {
        const fsc_optim_range *r = fsc_optim_get_range(optim, i);
        by[i] = (addr){(uintptr_t)r->param, r->n, i};
        held += r->n;
    }
    qsort(by, (size_t)nr, sizeof *by, addr_cmp);
    int rc = FSC_OK;
    for (int i = 1; !rc && i < nr; i++) {
        if (by[i - 1].n > 0 && by[i - 1].at + (uintptr_t)by[i - 1].n * sizeof(float) > by[i].at)
            rc = fsc_error(FSC_ERR_INVALID,
                           "fsc_tp_optim_state_new: the optimizer's ranges %d and %d overlap",
                           by[i - 1].index, by[i].index);
    }
    for (int k = 0; !rc && k < l->n; k++) {
        const piece *p = &l->at[k];
        if (ps->entries[p->entry].param->frozen) { /* no state: its range is empty */
            map[k] = -1, off[k] = 0;
            continue;
        }
        const uintptr_t at = (uintptr_t)(ps->entries[p->entry].param->data + p->local);
        int lo = 0, hi = nr; /* the last range starting at or before the piece */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (by[mid].at <= at)
                lo = mid + 1;
            else
                hi = mid;
        }
        const fsc_optim_range *r = lo ? fsc_optim_get_range(optim, by[lo - 1].index) : NULL;
        const int64_t into = r ? (int64_t)((at - by[lo - 1].at) / sizeof(float)) : 0;
        if (!r || into + p->count > r->n)
            rc = fsc_error(FSC_ERR_INVALID,
                           "fsc_tp_optim_state_new: no optimizer range holds %s's local elements "
                           "[%lld, %lld); build the optimizer over fsc_tp_optim_ranges",
                           ps->entries[p->entry].name, (long long)p->local,
                           (long long)(p->local + p->count));
        else
            map[k] = by[lo - 1].index, off[k] = into;
        owned += p->count;
    }
    /* every piece lies in a range and no two ranges overlap: what else the
     * ranges hold can only be padding rows */
    if (!rc && held > owned + l->padding)
        rc = fsc_error(FSC_ERR_INVALID,
                       "fsc_tp_optim_state_new: the optimizer's ranges hold %lld elements, this "
                       "rank's parameters %lld (%lld of them padding); build the optimizer over "
                       "fsc_tp_optim_ranges",
                       (long long)held, (long long)(owned + l->padding), (long long)l->padding);
    free(by);
    return rc;
}

/* The first failing rank's status and message, on every rank. */
static int agree(fsc_group *g, int rc) {
    return fsc_group_agree(g, rc, "fsc_tp_optim_state_new");
}

/* Every rank's pieces (entry, begin, count, replicated) into both partitions;
 * this rank's maps from mine. */
static int share_pieces(fsc_tp_optim_state *s, const piece_list *l) {
    const int t = fsc_group_size(s->g), me = fsc_group_rank(s->g);
    int rc = partition_alloc(&s->load, t);
    if (!rc) rc = partition_alloc(&s->save, t);
    int32_t n32 = l->n, *all_n = calloc((size_t)t, sizeof *all_n);
    int64_t *mine = calloc((size_t)(l->n ? l->n : 1) * 4, sizeof *mine),
            *counts = calloc((size_t)t, sizeof *counts),
            *displs = calloc((size_t)t, sizeof *displs), *every = NULL;
    if (rc || !all_n || !mine || !counts || !displs)
        rc = fsc_error(FSC_ERR_NOMEM, "tensor-parallel optimizer: out of memory");
    rc = agree(s->g, rc);
    for (int k = 0; !rc && k < l->n; k++) {
        const piece *p = &l->at[k];
        mine[4 * k] = p->entry, mine[4 * k + 1] = p->begin, mine[4 * k + 2] = p->count;
        mine[4 * k + 3] = p->replicated;
    }
    if (!rc) rc = fsc_group_allgather(s->g, &n32, all_n, 1, FSC_DTYPE_I32);
    int64_t total = 0;
    for (int r = 0; !rc && r < t; r++)
        counts[r] = 4 * (int64_t)all_n[r], displs[r] = total, total += counts[r];
    if (!rc && !(every = calloc((size_t)(total ? total : 1), sizeof *every)))
        rc = fsc_error(FSC_ERR_NOMEM, "tensor-parallel optimizer: out of memory");
    rc = agree(s->g, rc);
    if (!rc) rc = fsc_group_allgatherv(s->g, mine, every, counts, displs, FSC_DTYPE_I64);
    for (int r = 0; !rc && r < t; r++) {
        const size_t n = (size_t)(all_n[r] ? all_n[r] : 1);
        s->load.ranges[r] = calloc(n, sizeof **s->load.ranges);
        s->save.ranges[r] = calloc(n, sizeof **s->save.ranges);
        if (!s->load.ranges[r] || !s->save.ranges[r]) {
            rc = fsc_error(FSC_ERR_NOMEM, "tensor-parallel optimizer: out of memory");
            break;
        }
        for (int k = 0; k < all_n[r]; k++) {
            const int64_t *q = every + displs[r] + 4 * k;
            const fsc_shard_range piece_r = {.entry = (int)q[0], .begin = q[1], .count = q[2]};
            s->load.ranges[r][k] = piece_r;
            s->load.elems[r] += piece_r.count;
            if (q[3] && r != 0) continue; /* replicated: TP rank 0's copy is written */
            if (r == me) {
                s->save_map[s->save.nranges[r]] = s->load_map[k];
                s->save_off[s->save.nranges[r]] = s->load_off[k];
            }
            s->save.ranges[r][s->save.nranges[r]++] = piece_r;
            s->save.elems[r] += piece_r.count;
        }
        s->load.nranges[r] = all_n[r];
    }
    free(all_n), free(mine), free(counts), free(displs), free(every);
    return rc;
}

fsc_tp_optim_state *fsc_tp_optim_state_new(fsc_module *root, const fsc_params *ps, fsc_optim *optim,
                                           fsc_group *g) {
    if (!root || !ps || !optim || !g) {
        fsc_error(FSC_ERR_INVALID, "fsc_tp_optim_state_new: NULL argument");
        return NULL; /* a NULL group cannot agree with its peers */
    }
    piece_list l = {0};
    fsc_tp_optim_state *s = calloc(1, sizeof *s);
    int rc = s ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "tensor-parallel optimizer: out of memory");
    if (!rc) s->optim = optim, s->g = g;
    if (!rc) rc = check_group(root, ps, g);
    if (!rc) rc = make_whole(s, root, ps);
    if (!rc) rc = collect(root, ps, &l);
    if (!rc) {
        const size_t n = (size_t)(l.n ? l.n : 1);
        s->load_map = calloc(n, sizeof *s->load_map), s->save_map = calloc(n, sizeof *s->save_map);
        s->load_off = calloc(n, sizeof *s->load_off), s->save_off = calloc(n, sizeof *s->save_off);
        if (!s->load_map || !s->save_map || !s->load_off || !s->save_off)
            rc = fsc_error(FSC_ERR_NOMEM, "tensor-parallel optimizer: out of memory");
    }
    if (!rc) rc = map_pieces(optim, ps, &l, s->load_map, s->load_off);
    rc = agree(g, rc);
    if (!rc) rc = share_pieces(s, &l);
    rc = agree(g, rc); /* a failure after the all-gather, too */
    free(l.at);
    if (rc) {
        fsc_tp_optim_state_free(s);
        return NULL;
    }
    return s;
}

/* ---- save and load -------------------------------------------------------------------------- */
static optim_shards view(fsc_tp_optim_state *s, bool saving, const char *who) {
    return (optim_shards){.ps = &s->whole,
                          .part = saving ? &s->save : &s->load,
                          .local = s->optim,
                          .g = s->g,
                          .policy = "tp",
                          .who = who,
                          .local_of_piece = saving ? s->save_map : s->load_map,
                          .offset_of_piece = saving ? s->save_off : s->load_off};
}

int fsc_tp_save_optim(fsc_tp_optim_state *s, const char *path, int root) {
    if (!s) return fsc_error(FSC_ERR_INVALID, "fsc_tp_save_optim: s must not be NULL");
    optim_shards v = view(s, true, "tensor-parallel save_optim");
    return optim_shards_save(&v, path, root);
}

int fsc_tp_load_optim(fsc_tp_optim_state *s, const char *path) {
    if (!s) return fsc_error(FSC_ERR_INVALID, "fsc_tp_load_optim: s must not be NULL");
    optim_shards v = view(s, false, "tensor-parallel load_optim");
    return optim_shards_load(&v, path);
}
