/* Data-parallel replicas of a pipeline: the ranks that run the same stages
 * in other replicas reduce their gradients after the schedule, and with a
 * sharded mode each keeps, steps and (SHARD_PARAMS) stores only its slice of
 * every chunk's flat buffers. A slice is the rank's equal part of the flat
 * buffer, so reductions and gathers are one collective per chunk; the
 * optimizer's ranges are the parameters this pipeline rank owns cut to the
 * slice (pipe_state.c writes the optimizer-state file from them, by global
 * name, in the format every strategy reads). */
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "pipe_exec_internal.h"

enum {
    SLICE_ALIGN = 16, /* elements: slices start on 64-byte boundaries */
    SEGMENT = 1 << 20 /* floats per rank per collective: bounds the rings' scratch */
};

static bool sharded(const fsc_pipe *p) {
    return p->dp_size > 1 && p->opt.sharding != FSC_PIPE_REPLICATED;
}

fsc_group *pipe_dp_norm_group(fsc_pipe *p) {
    return sharded(p) ? p->opt.mesh : p->replica;
}

/* Counts and displacements of chunk c's slices, per dp rank. */
static void slice_layout(const fsc_pipe *p, int c, int64_t *counts, int64_t *displs) {
    const pipe_slice *s = &p->slice[c];
    for (int d = 0; d < p->dp_size; d++) {
        int64_t lo = (int64_t)d * s->shard, hi = lo + s->shard;
        lo = lo < s->numel ? lo : s->numel, hi = hi < s->numel ? hi : s->numel;
        counts[d] = hi - lo, displs[d] = lo;
    }
}

/* The chunk and flat offset of this rank's parameter `name`. */
static int locate(const fsc_pipe *p, const char *name, int *chunk, int64_t *offset) {
    for (int c = 0; c < p->nchunks; c++)
        for (int e = 0; e < p->params[c].count; e++)
            if (!strcmp(p->params[c].entries[e].name, name)) {
                *chunk = c, *offset = p->params[c].entries[e].offset;
                return FSC_OK;
            }
    return fsc_error(FSC_ERR_INVALID, "pipeline: parameter '%s' not on rank %d", name, p->rank);
}

/* The owned ranges cut to this rank's slices (pipe_state.c lists them as
 * the state file's pieces). */
static int cut_ranges(fsc_pipe *p) {
    const int own = p->part.nranges[p->rank];
    int k = 0, rc = FSC_OK;
    for (int i = 0; !rc && i < own; i++) {
        const fsc_shard_range *w = &p->part.ranges[p->rank][i];
        fsc_optim_range r = p->ranges[i];
        int c = 0;
        int64_t off = 0;
        if ((rc = locate(p, p->whole_ps.entries[w->entry].name, &c, &off))) break;
        const int64_t lo = p->slice[c].lo > off ? p->slice[c].lo : off;
        const int64_t hi = p->slice[c].hi < off + r.n ? p->slice[c].hi : off + r.n;
        if (hi <= lo) continue;
        r.param += lo - off, r.grad += lo - off, r.n = hi - lo;
        p->ranges[k++] = r;
    }
    p->nranges = k;
    return rc;
}

/* The layout's groups: the caller's mesh, or one laid out here once over
 * the options' mesh group (else g) as replicas x g's ranks x TP ranks. Every
 * group the pipe uses beyond the options' comes from it (the replica here,
 * the shared parameters' in pipe_params.c), and this rank must sit where
 * the options' groups say: its dp, pipeline and TP ranks are its mesh
 * coordinates. */
int pipe_mesh_setup(fsc_pipe *p) {
    const fsc_mesh *given = p->opt.layout;
    if (given && !p->opt.dp && fsc_group_size(fsc_mesh_dp_cp(given)) > 1)
        p->opt.dp = fsc_mesh_dp_cp(given);
    if (given && !p->opt.tp && fsc_mesh_size(given, FSC_MESH_TP) > 1)
        p->opt.tp = fsc_mesh_group(given, FSC_MESH_TP);
    fsc_group *dp = p->opt.dp, *all = p->opt.mesh;
    p->dp_size = dp ? fsc_group_size(dp) : 1;
    p->dp_rank = dp ? fsc_group_rank(dp) : 0;
    p->tp_size = p->opt.tp ? fsc_group_size(p->opt.tp) : 1;
    p->tp_rank = p->opt.tp ? fsc_group_rank(p->opt.tp) : 0;
    if ((dp || p->opt.tp) && !all && !p->opt.layout)
        return fsc_error(FSC_ERR_INVALID, "pipeline: %s need the mesh group too",
                         dp ? "replicas (dp)" : "tensor-parallel stages (tp)");
    p->layout = p->opt.layout;
    if (p->layout && !all) p->opt.mesh = fsc_mesh_parent(p->layout);
    if (!p->layout) {
        const fsc_mesh_shape shape = {.dp = p->dp_size, .pp = p->cfg.ranks, .tp = p->tp_size};
        int rc = fsc_mesh_new_over(all ? all : p->g, shape, &p->own_mesh);
        if (rc) return fsc_error_context(rc, "pipeline: ");
        p->layout = p->own_mesh;
    }
    const fsc_mesh *m = p->layout;
    const int size[3] = {p->dp_size, p->cfg.ranks, p->tp_size};
    const int coord[3] = {p->dp_rank, p->rank, p->tp_rank};
    /* a stage's replicas are its dp x cp ranks (fsc_mesh_dp_cp, ranked d * cp + c):
     * the cp ranks of a replica hold the same parameters and see other positions */
    const int cp = fsc_mesh_size(m, FSC_MESH_CP);
    const int msize[3] = {fsc_mesh_size(m, FSC_MESH_DP) * cp, fsc_mesh_size(m, FSC_MESH_PP),
                          fsc_mesh_size(m, FSC_MESH_TP)};
    const int mcoord[3] = {fsc_mesh_coord(m, FSC_MESH_DP) * cp + fsc_mesh_coord(m, FSC_MESH_CP),
                           fsc_mesh_coord(m, FSC_MESH_PP), fsc_mesh_coord(m, FSC_MESH_TP)};
    for (int d = 0; d < 3; d++)
        if (msize[d] != size[d] || mcoord[d] != coord[d])
            return fsc_error(FSC_ERR_INVALID,
                             "pipeline: the groups place this rank at replica %d of %d, pipeline "
                             "rank %d of %d, TP rank %d of %d; the mesh at %d of %d (dp x cp), "
                             "%d of %d, %d of %d",
                             coord[0], size[0], coord[1], size[1], coord[2], size[2], mcoord[0],
                             msize[0], mcoord[1], msize[1], mcoord[2], msize[2]);
    p->replica = fsc_mesh_replica(m);
    return FSC_OK;
}

int pipe_dp_setup(fsc_pipe *p) {
    p->gathered = true;
    if ((unsigned)p->opt.sharding > FSC_PIPE_SHARD_PARAMS)
        return fsc_error(FSC_ERR_INVALID, "pipeline: unknown sharding %d", (int)p->opt.sharding);
    int rc;
    if (!(p->slice = calloc((size_t)p->nchunks, sizeof *p->slice)))
        return fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    for (int c = 0; c < p->nchunks; c++) {
        pipe_slice *s = &p->slice[c];
        s->numel = p->params[c].numel;
        s->shard = (s->numel + p->dp_size - 1) / p->dp_size;
        s->shard = (s->shard + SLICE_ALIGN - 1) / SLICE_ALIGN * SLICE_ALIGN;
        s->lo = (int64_t)p->dp_rank * s->shard;
        s->lo = s->lo < s->numel ? s->lo : s->numel;
        s->hi = s->lo + s->shard < s->numel ? s->lo + s->shard : s->numel;
    }
    if ((rc = pipe_probe_setup(p)) || !sharded(p)) return rc;
    rc = cut_ranges(p);
    if (!rc && p->opt.sharding == FSC_PIPE_SHARD_PARAMS) rc = pipe_dp_release(p);
    return rc;
}

void pipe_dp_free(fsc_pipe *p) {
    pipe_probe_free(p);
    free(p->slice);
    p->slice = NULL;
}

void pipe_mesh_free(fsc_pipe *p) {
    fsc_mesh_free(p->own_mesh);
    p->own_mesh = NULL, p->layout = NULL, p->replica = NULL;
}

/* The bytes of chunk c outside this rank's slice: [0, lo) and [hi, numel). */
static int outside(const fsc_pipe *p, int c, int (*fn)(void *, size_t, size_t), float *buf) {
    const pipe_slice *s = &p->slice[c];
    int rc = s->lo > 0 ? fn(buf, 0, (size_t)s->lo * 4) : FSC_OK;
    if (!rc && s->hi < s->numel) rc = fn(buf, (size_t)s->hi * 4, (size_t)(s->numel - s->hi) * 4);
    return rc;
}

int pipe_dp_release(fsc_pipe *p) {
    if (!sharded(p) || p->opt.sharding != FSC_PIPE_SHARD_PARAMS || !p->gathered) return FSC_OK;
    int rc = FSC_OK;
    for (int c = 0; !rc && c < p->nchunks; c++) {
        rc = outside(p, c, fsc_mem_discard, p->params[c].data);
        if (!rc) rc = outside(p, c, fsc_mem_discard, p->params[c].grad);
    }
    if (!rc) p->gathered = false;
    return rc ? fsc_error_context(rc, "pipeline: giving back gathered parameters: ") : FSC_OK;
}

/* Every chunk's parameters whole from the replicas' slices (in place: the
 * ring's all-gather needs no scratch). */
static int gather_params(fsc_pipe *p) {
    const int D = p->dp_size;
    int64_t *counts = calloc((size_t)D * 2, sizeof *counts), *displs = counts + D;
    if (!counts) return fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    int rc = FSC_OK;
    for (int c = 0; !rc && c < p->nchunks; c++) {
        slice_layout(p, c, counts, displs);
        float *data = p->params[c].data;
        rc = fsc_group_allgatherv(p->opt.dp, data + p->slice[c].lo, data, counts, displs,
                                  FSC_DTYPE_F32);
    }
    free(counts);
    return rc ? fsc_error_context(rc, "pipeline: gathering parameters over the replicas: ") : rc;
}

int pipe_dp_commit(fsc_pipe *p) {
    if (p->gathered) return FSC_OK;
    int c = 0, rc = FSC_OK;
    for (; !rc && c < p->nchunks; c++) {
        rc = outside(p, c, fsc_mem_recommit, p->params[c].data);
        if (!rc && (rc = outside(p, c, fsc_mem_recommit, p->params[c].grad)))
            outside(p, c, fsc_mem_discard, p->params[c].data);
    }
    if (!rc) {
        p->gathered = true;
        return FSC_OK;
    }
    for (int k = 0; k < c - 1; k++) /* past the budget: the chunks before go back too */
        outside(p, k, fsc_mem_discard, p->params[k].data),
            outside(p, k, fsc_mem_discard, p->params[k].grad);
    return fsc_error_context(rc, "pipeline: making room for a whole stage: ");
}

int pipe_dp_gather(fsc_pipe *p) {
    if (!sharded(p) || p->opt.sharding != FSC_PIPE_SHARD_PARAMS || p->gathered) return FSC_OK;
    const double t0 = fsc_now();
    int rc = pipe_dp_commit(p);
    if (!rc) rc = gather_params(p);
    if (!rc) rc = pipe_share_updates(p); /* copies of shared parameters from their owners */
    p->stats.replica_s += fsc_now() - t0;
    return rc;
}

/* Chunk c's gradients reduce-scattered: this rank's slice holds the sum.
 * Segment by segment of every slice, so the ring's scratch (twice its
 * largest piece) and the landing buffer stay at SEGMENT floats whatever
 * the stage's size. */
static int reduce_scatter_grads(fsc_pipe *p, int c, int64_t *counts, int64_t *displs) {
    const pipe_slice *s = &p->slice[c];
    float *landing = fsc_mem_alloc(FSC_MEM_COMM, SEGMENT * sizeof(float));
    if (!landing) return fsc_error_context(FSC_ERR_NOMEM, "pipeline: reducing a stage: ");
    int64_t *whole = malloc(sizeof *whole * 2 * (size_t)p->dp_size);
    int rc = whole ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    if (!rc) slice_layout(p, c, whole, whole + p->dp_size);
    for (int64_t at = 0; !rc && at < s->shard; at += SEGMENT) {
        for (int d = 0; d < p->dp_size; d++) {
            int64_t left = whole[d] - at;
            counts[d] = left <= 0 ? 0 : left < SEGMENT ? left : SEGMENT;
            displs[d] = whole[p->dp_size + d] + (left <= 0 ? 0 : at);
        }
        rc = fsc_group_reduce_scatterv(p->opt.dp, p->params[c].grad, landing, counts, displs,
                                       FSC_DTYPE_F32, FSC_REDUCE_SUM);
        if (!rc && counts[p->dp_rank])
            memcpy(p->params[c].grad + s->lo + at, landing,
                   (size_t)counts[p->dp_rank] * sizeof(float));
    }
    free(whole);
    fsc_mem_free(landing);
    return rc;
}

/* In place, SEGMENT floats per rank at a time (the ring's scratch: twice that). */
static int allreduce_grads(fsc_pipe *p, int c) {
    const int64_t n = p->params[c].numel, step = SEGMENT * (int64_t)p->dp_size;
    int rc = FSC_OK;
    for (int64_t at = 0; !rc && at < n; at += step)
        rc = fsc_group_allreduce(p->opt.dp, p->params[c].grad + at, n - at < step ? n - at : step,
                                 FSC_DTYPE_F32, FSC_REDUCE_SUM);
    return rc;
}

int pipe_dp_reduce(fsc_pipe *p) {
    int rc = pipe_probe_flush(p); /* each rank's own gradient, before it is summed away */
    if (rc || p->dp_size < 2) return rc;
    /* test-only: the replicas' gradients never meet, the memory kept as ever */
    if (fsc_fault_is(FSC_FAULT_DROP_GRAD)) return pipe_dp_release(p);
    const double t0 = fsc_now();
    const int D = p->dp_size;
    int64_t *counts = calloc((size_t)D * 2, sizeof *counts), *displs = counts + D;
    rc = counts ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    const bool scatter =
        p->opt.sharding == FSC_PIPE_SHARD_GRADS || p->opt.sharding == FSC_PIPE_SHARD_PARAMS;
    for (int c = 0; !rc && c < p->nchunks; c++)
        rc = scatter ? reduce_scatter_grads(p, c, counts, displs) : allreduce_grads(p, c);
    free(counts);
    if (!rc) rc = pipe_dp_release(p); /* SHARD_PARAMS: only the slices from here to the next run */
    p->stats.replica_s += fsc_now() - t0;
    return rc ? fsc_error_context(rc, "pipeline: reducing gradients over the replicas: ") : rc;
}

int pipe_dp_share_update(fsc_pipe *p) {
    if (!sharded(p) || p->opt.sharding == FSC_PIPE_SHARD_PARAMS) return FSC_OK;
    const double t0 = fsc_now();
    int rc = gather_params(p);
    p->stats.replica_s += fsc_now() - t0;
    return rc;
}

void pipe_dp_zero_grad(fsc_pipe *p) {
    pipe_probe_zero(p);
    for (int c = 0; c < p->nchunks; c++) {
        if (p->gathered || !p->slice) {
            fsc_params_zero_grad(&p->params[c]);
        } else { /* the rest is given back and reads as zero: leave its pages alone */
            const pipe_slice *s = &p->slice[c];
            memset(p->params[c].grad + s->lo, 0, (size_t)(s->hi - s->lo) * 4);
        }
    }
}

/* ---- one stage run outside a schedule (fsc/pipe.h) ---------------------------------- */

int fsc_pipe_unshard(fsc_pipe *p) {
    return pipe_dp_gather(p);
}

int fsc_pipe_reshard(fsc_pipe *p) {
    return pipe_dp_release(p);
}

int fsc_pipe_reduce_grads(fsc_pipe *p) {
    int rc = pipe_sum_shared(p);
    return rc ? rc : pipe_dp_reduce(p);
}
