/* The pipeline's optimizer state by global name, and which of its ranges
 * count in the gradient norm, for any mesh of replicas x stages x TP ranks.
 *
 * The one idea: each optimizer range of a rank is a run of one local
 * parameter (whole, or cut to this replica's slice), and a local element
 * knows its global place (tp_place; without TP the local tensor is the
 * global one). So every range becomes pieces (global entry, first element,
 * count) of the one-process state, one per run that is contiguous both
 * locally and globally, and the norm group's pieces are an fsc_partition of
 * the whole model's list in global shapes: optim_shards streams it to and
 * from the file every strategy reads, at any layout. A parameter that every
 * TP rank holds (LayerNorm, biases after a row-parallel sum, wpe) is equal
 * on all of them: it is saved and counted in the norm from TP rank 0 only. */
#include <stdlib.h>
#include <string.h>

#include "pipe_exec_internal.h"
#include "parallel/shard/sharded_internal.h"
#include "parallel/tp/tp_internal.h"

typedef struct {
    int64_t *at; /* quads: entry, begin, count, saved */
    int *map;
    int64_t *off;
    int n, cap;
    /* the range being cut into pieces */
    int range, entry;
    int64_t lo, hi; /* its local elements */
    bool saved;
} piece_list;

static int push(piece_list *l, int64_t begin, int64_t count, int64_t off) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        int64_t *at = realloc(l->at, sizeof *at * 4 * (size_t)cap);
        if (at) l->at = at;
        int *map = at ? realloc(l->map, sizeof *map * (size_t)cap) : NULL;
        if (map) l->map = map;
        int64_t *o = map ? realloc(l->off, sizeof *o * (size_t)cap) : NULL;
        if (!o) return fsc_error(FSC_ERR_NOMEM, "pipeline optimizer state: out of memory");
        l->off = o, l->cap = cap;
    }
    int64_t *q = l->at + 4 * l->n;
    q[0] = l->entry, q[1] = begin, q[2] = count, q[3] = l->saved;
    l->map[l->n] = l->range, l->off[l->n] = off;
    l->n++;
    return FSC_OK;
}

/* A run of a sharded parameter: the part inside the current range. */
static int add_run(void *user, int64_t local, int64_t global, int64_t n) {
    piece_list *l = user;
    const int64_t lo = local > l->lo ? local : l->lo;
    const int64_t hi = local + n < l->hi ? local + n : l->hi;
    if (global < 0 || hi <= lo) return FSC_OK; /* padding has no state */
    return push(l, global + (lo - local), hi - lo, lo - l->lo);
}

/* This rank's chunk and entry holding the optimizer range r. */
static int find_local(fsc_pipe *p, const fsc_optim_range *r, int *chunk, fsc_param_entry **e) {
    for (int c = 0; c < p->nchunks; c++) {
        fsc_param_entry *en = fsc_params_find(&p->params[c], r->name);
        if (en && r->param >= en->param->data &&
            r->param + r->n <= en->param->data + en->param->numel) {
            *chunk = c, *e = en;
            return FSC_OK;
        }
    }
    return fsc_error(FSC_ERR_INVALID,
                     "pipeline: optimizer range of '%s' is no parameter of rank %d", r->name,
                     p->rank);
}

/* The whole model's list in global shapes, and this rank's pieces and the
 * ranges that count in the norm. */
static int collect(fsc_pipe *p, piece_list *l) {
    pipe_pieces *st = &p->pieces;
    const int n = p->whole_ps.count;
    st->whole.entries = calloc((size_t)(n ? n : 1), sizeof *st->whole.entries);
    st->gparams = calloc((size_t)(n ? n : 1), sizeof *st->gparams);
    p->counted = calloc((size_t)(p->nranges ? p->nranges : 1), sizeof *p->counted);
    if (!st->whole.entries || !st->gparams || !p->counted)
        return fsc_error(FSC_ERR_NOMEM, "pipeline optimizer state: out of memory");
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const fsc_param *q = p->whole_ps.entries[i].param;
        tp_placement pl = tp_place(p->whole, q);
        fsc_param *gp = &st->gparams[i];
        *gp = *q;
        gp->data = gp->grad = NULL;
        memcpy(gp->shape, pl.gshape, sizeof gp->shape);
        gp->numel = pl.gnumel;
        st->whole.entries[i] = p->whole_ps.entries[i];
        st->whole.entries[i].param = gp, st->whole.entries[i].offset = at;
        at += gp->numel;
    }
    st->whole.count = n, st->whole.numel = at;
    int rc = FSC_OK;
    for (int i = 0; !rc && i < p->nranges; i++) {
        const fsc_optim_range *r = &p->ranges[i];
        int c = 0;
        fsc_param_entry *e = NULL;
        if ((rc = find_local(p, r, &c, &e))) break;
        const fsc_param_entry *w = fsc_params_find(&p->whole_ps, r->name);
        tp_placement pl = tp_place(p->chunk[c], e->param);
        l->range = i, l->entry = (int)(w - p->whole_ps.entries);
        l->lo = r->param - e->param->data, l->hi = l->lo + r->n;
        l->saved = pl.s || p->tp_rank == 0;
        if (l->saved) p->counted[p->ncounted++] = *r;
        rc = pl.s ? tp_for_each_run(&pl, e->param, add_run, l) : push(l, l->lo, r->n, 0);
    }
    return rc;
}

/* The first failing rank's status and message, on every rank of g. */
static int agree(fsc_group *g, int rc) {
    return fsc_group_agree(g, rc, "the pipeline optimizer state");
}

static int partition_alloc(fsc_partition *q, int world) {
    q->world = world, q->policy = FSC_PARTITION_EVEN;
    q->nranges = calloc((size_t)world, sizeof *q->nranges);
    q->ranges = calloc((size_t)world, sizeof *q->ranges);
    q->elems = calloc((size_t)world, sizeof *q->elems);
    return q->nranges && q->ranges && q->elems
               ? FSC_OK
               : fsc_error(FSC_ERR_NOMEM, "pipeline optimizer state: out of memory");
}

static void partition_free(fsc_partition *q) {
    for (int r = 0; q->ranges && r < q->world; r++) free(q->ranges[r]);
    free(q->ranges), free(q->nranges), free(q->elems);
    memset(q, 0, sizeof *q);
}

/* Every rank's pieces into the load partition (all) and the save one
 * (saved only); this rank's maps for both. */
static int share(fsc_pipe *p, fsc_group *g, const piece_list *l) {
    pipe_pieces *st = &p->pieces;
    const int M = fsc_group_size(g), me = fsc_group_rank(g);
    int rc = partition_alloc(&st->load, M);
    if (!rc) rc = partition_alloc(&st->save, M);
    const size_t n = (size_t)(l->n ? l->n : 1);
    st->load_map = malloc(n * sizeof *st->load_map),
    st->save_map = malloc(n * sizeof *st->save_map);
    st->load_off = malloc(n * sizeof *st->load_off),
    st->save_off = malloc(n * sizeof *st->save_off);
    int32_t n32 = l->n, *all_n = calloc((size_t)M, sizeof *all_n);
    int64_t *counts = calloc((size_t)M, sizeof *counts),
            *displs = calloc((size_t)M, sizeof *displs);
    int64_t *every = NULL, total = 0;
    if (!rc && (!st->load_map || !st->save_map || !st->load_off || !st->save_off || !all_n ||
                !counts || !displs))
        rc = fsc_error(FSC_ERR_NOMEM, "pipeline optimizer state: out of memory");
    if (!rc) {
        memcpy(st->load_map, l->map, sizeof *l->map * (size_t)l->n);
        memcpy(st->load_off, l->off, sizeof *l->off * (size_t)l->n);
    }
    rc = agree(g, rc);
    if (!rc) rc = fsc_group_allgather(g, &n32, all_n, 1, FSC_DTYPE_I32);
    for (int r = 0; !rc && r < M; r++)
        counts[r] = 4 * (int64_t)all_n[r], displs[r] = total, total += counts[r];
    if (!rc && !(every = calloc((size_t)(total ? total : 1), sizeof *every)))
        rc = fsc_error(FSC_ERR_NOMEM, "pipeline optimizer state: out of memory");
    rc = agree(g, rc);
    if (!rc) rc = fsc_group_allgatherv(g, l->at, every, counts, displs, FSC_DTYPE_I64);
    for (int r = 0; !rc && r < M; r++) {
        const size_t k = (size_t)(all_n[r] ? all_n[r] : 1);
        if (!(st->load.ranges[r] = calloc(k, sizeof **st->load.ranges)) ||
            !(st->save.ranges[r] = calloc(k, sizeof **st->save.ranges))) {
            rc = fsc_error(FSC_ERR_NOMEM, "pipeline optimizer state: out of memory");
            break;
        }
        for (int i = 0; i < all_n[r]; i++) {
            const int64_t *q = every + displs[r] + 4 * i;
            const fsc_shard_range piece = {.entry = (int)q[0], .begin = q[1], .count = q[2]};
            st->load.ranges[r][st->load.nranges[r]++] = piece;
            st->load.elems[r] += piece.count;
            if (!q[3]) continue;
            if (r == me) {
                st->save_map[st->save.nranges[r]] = l->map[i];
                st->save_off[st->save.nranges[r]] = l->off[i];
            }
            st->save.ranges[r][st->save.nranges[r]++] = piece;
            st->save.elems[r] += piece.count;
        }
    }
    free(all_n), free(counts), free(displs), free(every);
    return agree(g, rc);
}

int pipe_state_setup(fsc_pipe *p) {
    piece_list l = {0};
    int rc = collect(p, &l);
    rc = agree(pipe_dp_norm_group(p), rc);
    if (!rc) rc = share(p, pipe_dp_norm_group(p), &l);
    free(l.at), free(l.map), free(l.off);
    return rc;
}

void pipe_state_free(fsc_pipe *p) {
    pipe_pieces *st = &p->pieces;
    partition_free(&st->load), partition_free(&st->save);
    free(st->load_map), free(st->save_map), free(st->load_off), free(st->save_off);
    free(st->whole.entries), free(st->gparams);
    memset(st, 0, sizeof *st);
    free(p->counted);
    p->counted = NULL, p->ncounted = 0;
}

/* ---- the file ------------------------------------------------------------------------ */

static optim_shards view(fsc_pipe *p, bool saving, const char *who) {
    pipe_pieces *st = &p->pieces;
    return (optim_shards){.ps = &st->whole,
                          .part = saving ? &st->save : &st->load,
                          .local = p->optim,
                          .g = pipe_dp_norm_group(p),
                          .policy = "pipe",
                          .who = who,
                          .local_of_piece = saving ? st->save_map : st->load_map,
                          .offset_of_piece = saving ? st->save_off : st->load_off};
}

/* The first replica's outcome rc on every replica (an error there is named
 * on the others as `what`). Collective over dp. */
int pipe_replicas_agree(fsc_pipe *p, int rc, const char *what) {
    if (p->dp_size < 2) return rc;
    int32_t status = rc;
    if (fsc_group_broadcast(p->opt.dp, &status, 1, FSC_DTYPE_I32, 0)) return FSC_ERR_MPI;
    return status && !rc ? fsc_error(status, "pipeline: the first replica %s", what) : rc;
}

/* Replicated state (ddp between replicas): the first replica writes, the
 * others learn its outcome; sharded: the mesh writes together. */
int fsc_pipe_save_optim(fsc_pipe *p, const char *path, int root) {
    optim_shards v = view(p, true, "pipeline save_optim");
    if (v.g == p->opt.mesh && p->dp_size > 1) return optim_shards_save(&v, path, root);
    int rc = p->dp_rank == 0 ? optim_shards_save(&v, path, root) : FSC_OK;
    return pipe_replicas_agree(p, rc, "could not save its optimizer state");
}

int fsc_pipe_load_optim(fsc_pipe *p, const char *path) {
    optim_shards v = view(p, false, "pipeline load_optim");
    return optim_shards_load(&v, path);
}
