/* The device mesh: the world laid out as dp x pp x tp with tp varying
 * fastest, and one process group per dimension.
 *
 * The one idea: world rank = (d * pp + p) * tp + t, so a tensor-parallel
 * group (the chattiest: an allreduce per layer) is always a run of adjacent
 * world ranks, which launchers place on the same node.
 */
#include <stdlib.h>

#include "dist_internal.h"

struct fsc_mesh {
    int size[3];
    int coord[3];
    fsc_group *group[3];
};

void fsc_mesh_free(fsc_mesh *m) {
    if (!m) return;
    for (int d = 0; d < 3; d++) fsc_group_free(m->group[d]);
    free(m);
}

int fsc_mesh_new(int dp, int pp, int tp, fsc_mesh **out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_mesh_new: out is NULL");
    *out = NULL;
    int rc = fsc_dist_require_init("fsc_mesh_new");
    if (rc) return rc;
    if (dp < 1 || pp < 1 || tp < 1)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_mesh_new: mesh sizes must be >= 1 (dp %d, pp %d, tp %d)", dp, pp, tp);
    int world = fsc_dist_rt.size;
    if ((int64_t)dp * pp * tp != world)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_mesh_new: dp %d x pp %d x tp %d = %lld does not match "
                         "the world size %d",
                         dp, pp, tp, (long long)dp * pp * tp, world);
    fsc_mesh *m = calloc(1, sizeof *m);
    if (!m) return fsc_error(FSC_ERR_NOMEM, "fsc_mesh_new: out of memory");
    int r = fsc_dist_rt.rank;
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
    for (int k = 0; k < 3; k++) {
        rc = fsc_group_split(fsc_dist_rt.world, color[k], key[k], names[k], &m->group[k]);
        if (rc) {
            fsc_mesh_free(m);
            return fsc_error_context(rc, "fsc_mesh_new(%d, %d, %d): ", dp, pp, tp);
        }
    }
    *out = m;
    return FSC_OK;
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
