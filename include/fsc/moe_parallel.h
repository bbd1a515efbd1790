/* fsc MoE, expert parallelism (floor 7): the MoE layer's experts spread
 * over a process group. fsc/moe.h is the layer (floor 3), which sees the
 * group only as an fsc_moe_exchange of function pointers; this header makes
 * that exchange from an fsc_group and handles parameters whose experts are
 * sharded over the group (each expert on one rank, the rest replicated):
 * gradient clipping, and weights and optimizer state saved under global
 * names, so a file loads at any expert-parallel size.
 */
#ifndef FSC_MOE_PARALLEL_H
#define FSC_MOE_PARALLEL_H

#include "fsc/dist.h"
#include "fsc/moe.h"
#include "fsc/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An exchange over group g (borrowed; must outlive every layer using the
 * result): all-to-all through fsc_group_alltoall, so it runs under the
 * watchdog and the desync check like every collective. FSC_ERR_INVALID for
 * a NULL g or out. */
FSC_API int fsc_moe_ep_exchange(fsc_group *g, fsc_moe_exchange *out);
/* Whether any parameter in ps is an expert shard (fsc_param.expert). */
FSC_API bool fsc_moe_params_sharded(const fsc_params *ps);
/* Global gradient-norm clipping for parameters whose expert entries are
 * sharded over g (each expert on one rank) and the rest replicated: the
 * squared norm of the experts is summed over g, the rest counted once.
 * max_norm <= 0 or FLT_MAX: norm only. *total (may be NULL) gets the 2-norm,
 * the same on every rank. Collective over g. FSC_ERR_NUMERIC when not
 * finite. */
FSC_API int fsc_moe_clip_grad_norm(fsc_params *ps, fsc_group *g, float max_norm, float *total);

/* The one-process weights file from parameters whose expert entries
 * (named ...experts.{e}...) are sharded over g by consecutive blocks, as
 * fsc_moe_new places them: root receives every rank's experts (point to
 * point, through g) and writes all parameters under their global names with
 * fsc_weights_save, so the file loads at any expert-parallel size (each
 * rank reads its own experts by name). Collective over g; every rank returns
 * root's status. FSC_ERR_INVALID for NULL arguments or an expert name
 * without its index. */
FSC_API int fsc_moe_save_weights(fsc_params *ps, fsc_group *g, const char *path, int root,
                                 int n_meta, const char *const *keys, const char *const *values);

/* Optimizer state of parameters whose expert entries are sharded over g as
 * fsc_moe_new places them (the rest alike on every rank), by global name:
 * the file fsc_oss_save_optim writes for the one-process model, every expert
 * under its global name (h.N.mlp.experts.{e}.*), so it loads at any
 * expert-parallel size with the same experts (fsc_moe_load_optim), or into
 * one process holding every expert (fsc_oss_load_optim). optim is the
 * optimizer over this rank's ps (any ranges over its tensors, e.g.
 * fsc_oss_local of an OSS over fsc_group_self()). Saving, each rank writes
 * its experts' state and an even share of the rest through MPI-IO (with
 * FSC_PARALLEL_IO=0 the pieces stream to root, which writes); path is read
 * on root only. Loading, each rank reads the replicated state and its own
 * experts' and sets the step; the file is validated and staged on every
 * rank and committed only if every rank could (kind, state, names and
 * shapes checked as fsc_oss_load_optim does). Collective over g; every rank
 * returns the same status. FSC_ERR_INVALID for NULL arguments, a group that
 * is not the experts' (its rank r must hold experts r*El .. (r+1)*El - 1),
 * an expert name without its index, or an optimizer not over ps. */
FSC_API int fsc_moe_save_optim(fsc_params *ps, fsc_optim *optim, fsc_group *g, const char *path,
                               int root);
/* Reads what fsc_moe_save_optim or fsc_oss_save_optim wrote (see above). */
FSC_API int fsc_moe_load_optim(fsc_params *ps, fsc_optim *optim, fsc_group *g, const char *path);

#ifdef __cplusplus
}
#endif
#endif
