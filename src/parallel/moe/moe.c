/* Expert parallelism (fsc/moe_parallel.h, floor 7): the layer's all-to-all over a
 * process group, and gradient clipping with every expert on one rank. DDP's
 * buckets around expert shards are moe_buckets.c's, the one-process weights
 * file moe_weights.c's. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "fsc/moe_parallel.h"
#include "fsc/optim.h"

static int group_alltoall(void *user, const float *in, float *out, int64_t n) {
    return fsc_group_alltoall(user, in, out, n, FSC_DTYPE_F32);
}

int fsc_moe_ep_exchange(fsc_group *g, fsc_moe_exchange *out) {
    if (!g || !out)
        return fsc_error(FSC_ERR_INVALID, "MoE exchange: needs a group and an output struct");
    *out = (fsc_moe_exchange){.ranks = fsc_group_size(g),
                              .rank = fsc_group_rank(g),
                              .alltoall = group_alltoall,
                              .user = g};
    return FSC_OK;
}

bool fsc_moe_params_sharded(const fsc_params *ps) {
    for (int i = 0; ps && i < ps->count; i++)
        if (ps->entries[i].param->expert) return true;
    return false;
}

/* The parameters' gradients as ranges: every one (all), else the experts
 * (expert true) or the others. */
static int ranges_of(const fsc_params *ps, bool all, bool expert, fsc_optim_range **out, int *n) {
    *n = 0;
    *out = calloc((size_t)ps->count + 1, sizeof **out);
    if (!*out) return fsc_error(FSC_ERR_NOMEM, "MoE clip: out of memory");
    for (int i = 0; i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        if (all || p->expert == expert)
            (*out)[(*n)++] = (fsc_optim_range){
                .param = p->data, .grad = p->grad, .n = p->frozen ? 0 : p->numel};
    }
    return FSC_OK;
}

int fsc_moe_clip_grad_norm(fsc_params *ps, fsc_group *g, float max_norm, float *total) {
    if (!ps || !g) return fsc_error(FSC_ERR_INVALID, "MoE clip: needs parameters and a group");
    const int P = fsc_group_size(g);
    fsc_optim_range *part = NULL;
    int n = 0;
    double *theirs = calloc((size_t)P, sizeof *theirs);
    if (!theirs) return fsc_error(FSC_ERR_NOMEM, "MoE clip: out of memory");
    int rc = ranges_of(ps, false, true, &part, &n);
    if (rc) {
        free(theirs);
        return rc;
    }
    /* Each expert lives on one rank: its squares are summed over the group,
     * gathered as bit patterns (no double dtype) and added in rank order, so
     * every rank gets the same total. */
    double mine = fsc_grad_norm_sq(part, n), experts = 0;
    free(part);
    rc = fsc_group_allgather(g, &mine, theirs, 1, FSC_DTYPE_I64);
    for (int r = 0; r < P; r++) experts += theirs[r];
    free(theirs);
    if (!rc) rc = ranges_of(ps, false, false, &part, &n);
    if (rc) return rc;
    double sq = fsc_grad_norm_sq(part, n) + experts;
    free(part);
    float norm = (float)sqrt(sq);
    if (total) *total = norm;
    if (!isfinite(norm))
        return fsc_error(FSC_ERR_NUMERIC, "MoE clip: the gradient norm is %g", (double)norm);
    if (!(max_norm > 0) || max_norm == FLT_MAX) return FSC_OK;
    if ((rc = ranges_of(ps, true, false, &part, &n))) return rc;
    rc = fsc_clip_grads_scale(part, n, max_norm, norm);
    free(part);
    return rc;
}
