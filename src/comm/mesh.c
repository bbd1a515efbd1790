/* The device mesh: a group's ranks laid out as dp x pp x cp x tp with tp
 * varying fastest, then cp, and one process group per dimension. Every
 * technique takes its groups from one mesh built from the layout (the
 * strategies, the pipeline, TP and context parallelism through them, MoE's
 * experts, the tools), so this file is the only place that turns a rank
 * into coordinates.
 *
 * The one idea: rank = ((d * pp + p) * cp + c) * tp + t, so a tensor-parallel
 * group (the chattiest: an allreduce per layer) is always a run of adjacent
 * ranks, which launchers place on the same node, and a context-parallel
 * ring (a K/V block per layer and ring step) the next closest.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist_internal.h"

struct fsc_mesh {
    fsc_group *parent; /* borrowed: the world or the caller's group */
    int size[FSC_MESH_DIMS];
    int coord[FSC_MESH_DIMS];
    fsc_group *group[FSC_MESH_DIMS];
    fsc_group *replica; /* pp x tp: the ranks with this rank's dp and cp coordinates */
    fsc_group *dp_cp;   /* dp x cp: the ranks a replicated gradient is summed over */
};

void fsc_mesh_free(fsc_mesh *m) {
    if (!m) return;
    for (int d = 0; d < FSC_MESH_DIMS; d++) fsc_group_free(m->group[d]);
    fsc_group_free(m->replica);
    fsc_group_free(m->dp_cp);
    free(m);
}

/* ep: sizes 0 and 1 are the one layout anything runs today. */
static int refuse_unused(const char *fn, const fsc_mesh_shape *s) {
    if (s->ep > 1)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: an expert dimension of its own (ep %d) is not implemented yet: "
                         "MoE's experts spread over the dp group; ep must be 0 or 1",
                         fn, s->ep);
    if (s->cp < 0 || s->ep < 0)
        return fsc_error(FSC_ERR_INVALID, "%s: mesh sizes must be >= 0 (cp %d, ep %d)", fn, s->cp,
                         s->ep);
    return FSC_OK;
}

int fsc_mesh_new_over(fsc_group *parent, fsc_mesh_shape shape, fsc_mesh **out) {
    static const char *fn = "fsc_mesh_new";
    if (!out) return fsc_error(FSC_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    int rc = fsc_dist_require_init(fn);
    if (!rc) rc = refuse_unused(fn, &shape);
    if (rc) return rc;
    fsc_group *g = parent ? parent : fsc_dist_rt.world;
    const int n = fsc_group_size(g), r = fsc_group_rank(g);
    const int pp = shape.pp ? shape.pp : 1, tp = shape.tp ? shape.tp : 1;
    const int cp = shape.cp ? shape.cp : 1;
    const int dp = shape.dp ? shape.dp : pp > 0 && tp > 0 && cp > 0 ? n / (pp * tp * cp) : 0;
    if (dp < 1 || pp < 1 || tp < 1 || cp < 1)
        return fsc_error(FSC_ERR_INVALID,
                         "%s: mesh sizes must be >= 1 (dp %d, pp %d, tp %d, cp %d)", fn, dp, pp, tp,
                         cp);
    if ((int64_t)dp * pp * tp * cp != n) {
        char cps[24] = "";
        if (cp > 1) snprintf(cps, sizeof cps, " x cp %d", cp);
        return fsc_error(
            FSC_ERR_INVALID, "%s: dp %d x pp %d x tp %d%s = %lld does not match the %s size %d", fn,
            dp, pp, tp, cps, (long long)dp * pp * tp * cp, parent ? "group's" : "world", n);
    }
    fsc_mesh *m = calloc(1, sizeof *m);
    if (!m) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", fn);
    m->parent = g;
    m->size[FSC_MESH_DP] = dp;
    m->size[FSC_MESH_PP] = pp;
    m->size[FSC_MESH_TP] = tp;
    m->size[FSC_MESH_CP] = cp;
    const int t = r % tp, c = (r / tp) % cp, p = (r / (tp * cp)) % pp, d = r / (tp * cp * pp);
    m->coord[FSC_MESH_DP] = d;
    m->coord[FSC_MESH_PP] = p;
    m->coord[FSC_MESH_TP] = t;
    m->coord[FSC_MESH_CP] = c;
    /* color: the coordinates that stay fixed along the group; key: the one that varies */
    static const char *names[FSC_MESH_DIMS] = {"dp", "pp", "tp", "cp"};
    const int color[FSC_MESH_DIMS] = {(p * cp + c) * tp + t, (d * cp + c) * tp + t,
                                      (d * pp + p) * cp + c, (d * pp + p) * tp + t};
    const int key[FSC_MESH_DIMS] = {d, p, t, c};
    for (int k = 0; k < FSC_MESH_DIMS && !rc; k++)
        rc = fsc_group_split(g, color[k], key[k], names[k], &m->group[k]);
    if (!rc) rc = fsc_group_split(g, d * cp + c, p * tp + t, "replica", &m->replica);
    if (!rc && cp > 1) rc = fsc_group_split(g, p * tp + t, d * cp + c, "dp_cp", &m->dp_cp);
    if (rc) {
        fsc_mesh_free(m);
        return fsc_error_context(rc, "%s(%d, %d, %d, %d): ", fn, dp, pp, tp, cp);
    }
    *out = m;
    return FSC_OK;
}

int fsc_mesh_new(int dp, int pp, int tp, fsc_mesh **out) {
    if (out && (dp < 1 || pp < 1 || tp < 1)) { /* here 0 is no size, not "the default" */
        *out = NULL;
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_mesh_new: mesh sizes must be >= 1 (dp %d, pp %d, tp %d)", dp, pp, tp);
    }
    return fsc_mesh_new_over(NULL, (fsc_mesh_shape){.dp = dp, .pp = pp, .tp = tp}, out);
}

fsc_group *fsc_mesh_parent(const fsc_mesh *m) {
    return m ? m->parent : NULL;
}

fsc_group *fsc_mesh_group(const fsc_mesh *m, fsc_mesh_dim dim) {
    return m && (unsigned)dim < FSC_MESH_DIMS ? m->group[dim] : NULL;
}

int fsc_mesh_size(const fsc_mesh *m, fsc_mesh_dim dim) {
    return m && (unsigned)dim < FSC_MESH_DIMS ? m->size[dim] : 0;
}

int fsc_mesh_coord(const fsc_mesh *m, fsc_mesh_dim dim) {
    return m && (unsigned)dim < FSC_MESH_DIMS ? m->coord[dim] : -1;
}

fsc_group *fsc_mesh_replica(const fsc_mesh *m) {
    return m ? m->replica : NULL;
}

fsc_group *fsc_mesh_dp_cp(const fsc_mesh *m) {
    return !m ? NULL : m->dp_cp ? m->dp_cp : m->group[FSC_MESH_DP];
}

int fsc_mesh_subgroup(const fsc_mesh *m, fsc_mesh_dim dim, uint64_t coords, const char *name,
                      fsc_group **out) {
    static const char *fn = "fsc_mesh_subgroup";
    if (!out) return fsc_error(FSC_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m || (unsigned)dim >= FSC_MESH_DIMS)
        return fsc_error(FSC_ERR_INVALID, "%s: %s", fn, m ? "no such dimension" : "mesh is NULL");
    if (m->size[dim] > 64)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: %d ranks along the dimension; a set of coordinates holds 64", fn,
                         m->size[dim]);
    const int c = m->coord[dim];
    int rc = fsc_group_split(m->group[dim], (coords >> c) & 1 ? 0 : -1, c, name, out);
    return rc ? fsc_error_context(rc, "%s: ", fn) : FSC_OK;
}
