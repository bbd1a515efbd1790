/* fsc sharded grad scaler: dynamic loss scaling when each rank holds only a
 * shard of the gradients (OSS, ShardedDDP, FSDP), like FairScale's
 * fairscale.optim.grad_scaler.ShardedGradScaler.
 *
 * Floor 7 of the house (src/parallel/). A rank that unscales only its own
 * shard sees only its own overflows; if the ranks then decided alone, one
 * would skip the step while the others took it and the replicas would drift
 * apart for good. So
 * the found-inf flag is all-reduced (MAX) over the group: one tiny collective,
 * and every rank skips or steps together, and every rank's scale follows the
 * same trajectory.
 *
 *     fsc_optim_range *owned; int nowned;   // this rank's shard of the gradients
 *     fsc_partition_ranges(fsc_oss_partition(oss), &ps, rank, &owned, &nowned);
 *     bool inf;
 *     fsc_sharded_grad_scaler_unscale(gs, fsc_oss_group(oss), owned, nowned, &inf);
 *     if (!inf) fsc_oss_step(oss);       // every rank takes the same branch
 *     fsc_grad_scaler_update(gs, inf);   // and keeps the same scale
 */
#ifndef FSC_SHARDED_GRAD_SCALER_H
#define FSC_SHARDED_GRAD_SCALER_H

#include "fsc/dist.h"
#include "fsc/grad_scaler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Unscales this rank's ranges (fsc_grad_scaler_unscale), then one all-reduce
 * (MAX) of the flag over g: *found_inf is true on every rank if any rank found
 * an inf or NaN. Collective over g; every rank must hold a scaler with the
 * same scale.
 *
 * A bad argument on one rank (NULL scaler, a bad range) does not leave its
 * peers waiting: that rank still joins the all-reduce, and then EVERY rank
 * returns FSC_ERR_INVALID with *found_inf = true (so a caller that ignores the
 * status still skips the step); the failing rank's gradients are untouched.
 * Only g == NULL or found_inf == NULL fail at once, before any communication.
 * A failure of the collective itself (timeout, desync) is returned as is. */
FSC_API int fsc_sharded_grad_scaler_unscale(fsc_grad_scaler *s, fsc_group *g,
                                            const fsc_optim_range *r, int n, bool *found_inf);

#ifdef __cplusplus
}
#endif
#endif
