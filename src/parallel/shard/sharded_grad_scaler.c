/* ShardedGradScaler: a local unscale of the owned shard, then one MAX
 * all-reduce of a small status so that every rank reaches the same verdict.
 *
 * The flag carries three levels (0 clean, 1 inf or NaN, 2 a bad argument on
 * some rank), so a rank whose own call is malformed still takes part in the
 * collective and every rank learns of it, rather than its peers waiting for
 * the watchdog. */
#include <stdio.h>

#include "fsc/core.h"
#include "fsc/sharded_grad_scaler.h"

enum { FLAG_CLEAN = 0, FLAG_INF = 1, FLAG_ERROR = 2 };

int fsc_sharded_grad_scaler_unscale(fsc_grad_scaler *s, fsc_group *g, const fsc_optim_range *r,
                                    int n, bool *found_inf) {
    if (!g || !found_inf)
        return fsc_error(FSC_ERR_INVALID,
                         "sharded grad scaler unscale: group %p and found_inf %p must not be NULL",
                         (void *)g, (void *)found_inf);
    bool local_inf = false;
    int local_rc = fsc_grad_scaler_unscale(s, r, n, &local_inf);
    int32_t flag = local_rc ? FLAG_ERROR : local_inf ? FLAG_INF : FLAG_CLEAN;
    char why[512] = ""; /* kept across the collective, which may set messages */
    if (local_rc) snprintf(why, sizeof why, "%s", fsc_last_error());
    int rc = fsc_group_allreduce(g, &flag, 1, FSC_DTYPE_I32, FSC_REDUCE_MAX);
    if (rc) {
        *found_inf = true;
        return fsc_error_context(rc,
                                 "sharded grad scaler unscale on group '%s': ", fsc_group_name(g));
    }
    *found_inf = flag != FLAG_CLEAN;
    if (local_rc) return fsc_error(local_rc, "%s (sharded, group '%s')", why, fsc_group_name(g));
    if (flag == FLAG_ERROR)
        return fsc_error(FSC_ERR_INVALID,
                         "sharded grad scaler unscale on group '%s': another rank's arguments "
                         "were refused (its message says which); treat this step as overflowed",
                         fsc_group_name(g));
    return FSC_OK;
}
