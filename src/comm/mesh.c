/* The device mesh: a group's ranks laid out as dp x pp x tp with tp varying
 * fastest, and one process group per dimension. Every technique takes its
 * groups from one mesh built from the layout (the strategies, the pipeline
 * and TP through them, MoE's experts, the tools), so this file is the only
 * place that turns a rank into coordinates.
 *
 * The one idea: rank = (d * pp + p) * tp + t, so a tensor-parallel group
 * (the chattiest: an allreduce per layer) is always a run of adjacent
 * ranks, which launchers place on the same node.
 */
#include <stdint.h>
#include <stdlib.h>

#include "dist_internal.h"

struct fsc_mesh {
    fsc_group *parent; /* borrowed: the world or the caller's group */
    int size[3];
    int coord[3];
    fsc_group *group[3];
    fsc_group *replica; /* pp x tp: the ranks with this rank's dp coordinate */
};

void fsc_mesh_free(fsc_mesh *m) {
    if (!m) return;
    for (int d = 0; d < 3; d++) fsc_group_free(m->group[d]);
    fsc_group_free(m->replica);
    free(m);
}

/* cp and ep: sizes 0 and 1 are the one layout anything runs today. */
static int refuse_unused(const char *fn, const fsc_mesh_shape *s) {
    if (s->cp > 1)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: context parallelism (cp %d) is not implemented yet: no layer splits "
                         "the sequence over ranks; cp must be 0 or 1",
                         fn, s->cp);
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
    const int dp = shape.dp ? shape.dp : pp > 0 && tp > 0 ? n / (pp * tp) : 0;
    if (dp < 1 || pp < 1 || tp < 1)
        return fsc_error(FSC_ERR_INVALID, "%s: mesh sizes must be >= 1 (dp %d, pp %d, tp %d)", fn,
                         dp, pp, tp);
    if ((int64_t)dp * pp * tp != n)
        return fsc_error(FSC_ERR_INVALID,
                         "%s: dp %d x pp %d x tp %d = %lld does not match the %s size %d", fn, dp,
                         pp, tp, (long long)dp * pp * tp, parent ? "group's" : "world", n);
    fsc_mesh *m = calloc(1, sizeof *m);
    if (!m) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", fn);
    m->parent = g;
    m->size[FSC_MESH_DP] = dp;
    m->size[FSC_MESH_PP] = pp;
    m->size[FSC_MESH_TP] = tp;
    int d = r / (pp * tp), p = (r / tp) % pp, t = r % tp;
    m->coord[FSC_MESH_DP] = d;
    m->coord[FSC_MESH_PP] = p;
    m->coord[FSC_MESH_TP] = t;
    /* color: the coordinates that stay fixed along the group; key: the one that varies */
    static const char *names[3] = {"dp", "pp", "tp"};
    const int color[3] = {p * tp + t, d * tp + t, d * pp + p};
    const int key[3] = {d, p, t};
    for (int k = 0; k < 3 && !rc; k++)
        rc = fsc_group_split(g, color[k], key[k], names[k], &m->group[k]);
    if (!rc) rc = fsc_group_split(g, d, p * tp + t, "replica", &m->replica);
    if (rc) {
        fsc_mesh_free(m);
        return fsc_error_context(rc, "%s(%d, %d, %d): ", fn, dp, pp, tp);
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
    return m && (unsigned)dim < 3 ? m->group[dim] : NULL;
}

int fsc_mesh_size(const fsc_mesh *m, fsc_mesh_dim dim) {
    return m && (unsigned)dim < 3 ? m->size[dim] : 0;
}

int fsc_mesh_coord(const fsc_mesh *m, fsc_mesh_dim dim) {
    return m && (unsigned)dim < 3 ? m->coord[dim] : -1;
}

fsc_group *fsc_mesh_replica(const fsc_mesh *m) {
    return m ? m->replica : NULL;
}

int fsc_mesh_subgroup(const fsc_mesh *m, fsc_mesh_dim dim, uint64_t coords, const char *name,
                      fsc_group **out) {
    static const char *fn = "fsc_mesh_subgroup";
    if (!out) return fsc_error(FSC_ERR_INVALID, "%s: out is NULL", fn);
    *out = NULL;
    if (!m || (unsigned)dim >= 3)
        return fsc_error(FSC_ERR_INVALID, "%s: %s", fn, m ? "no such dimension" : "mesh is NULL");
    if (m->size[dim] > 64)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: %d ranks along the dimension; a set of coordinates holds 64", fn,
                         m->size[dim]);
    const int c = m->coord[dim];
    int rc = fsc_group_split(m->group[dim], (coords >> c) & 1 ? 0 : -1, c, name, out);
    return rc ? fsc_error_context(rc, "%s: ", fn) : FSC_OK;
}
