/* Gradient-norm clipping over shards: the result of unsharded clipping with
 * one collective. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sharded_internal.h"

int sharded_clip_grad_norm(fsc_group *g, const fsc_optim_range *r, int n, float max_norm,
                           bool inf_norm, float *total, const char *who) {
    if (!(max_norm >= 0.0f))
        return fsc_error(FSC_ERR_INVALID, "%s: max_norm %g must be >= 0", who, (double)max_norm);
    /* Every rank's local figure travels as the bits of a double (allgather
     * moves bits; the dist layer reduces no F64), then each rank combines
     * them in rank order: the same total everywhere, summed in double. */
    const int world = fsc_group_size(g);
    double local = inf_norm ? (double)fsc_grad_max_abs(r, n) : fsc_grad_norm_sq(r, n);
    int64_t bits, *all = malloc((size_t)world * sizeof *all);
    if (!all) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", who);
    memcpy(&bits, &local, sizeof bits);
    int rc = fsc_group_allgather(g, &bits, all, 1, FSC_DTYPE_I64);
    double acc = 0.0;
    for (int k = 0; k < world && !rc; k++) {
        double v;
        memcpy(&v, &all[k], sizeof v);
        if (inf_norm)
            acc = (isnan(v) || isnan(acc)) ? NAN : v > acc ? v : acc;
        else
            acc += v;
    }
    free(all);
    if (rc) return fsc_error_context(rc, "%s: ", who);
    const float norm = inf_norm ? (float)acc : (float)sqrt(acc);
    if (total) *total = norm;
    return fsc_clip_grads_scale(r, n, max_norm, norm);
}
