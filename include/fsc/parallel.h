/* fsc parallel: training strategies (floor 7). This header: plain data
 * parallelism — DDP over processes (like torch DistributedDataParallel) and DP
 * over threads in one process (like torch.nn.DataParallel).
 *
 * Both rely on fsc's loss convention: a micro-batch's loss is divided by the
 * number of targets in the GLOBAL batch (fsc_cross_entropy's norm), so the
 * SUM of gradients over ranks, threads and micro-batches is exactly the
 * gradient of the global-batch mean, i.e. the average over ranks of their
 * local means when every rank has the same number of targets.
 */
#ifndef FSC_PARALLEL_H
#define FSC_PARALLEL_H

#include "fsc/dist.h"
#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sees a stretch of this rank's own gradient just before the wrapper reduces
 * it over the group (AdaScale takes each rank's squared norm here): its
 * first element's offset in the flat gradient buffer, and its n values, read
 * only. Called inside backward, once per stretch per synchronised backward;
 * the reduction starts when it returns. Where one replica spans ranks (TP
 * groups, pipeline stages: fsc_strategy_options.grad_probe, fsc/pipe.h's
 * probe) each rank is shown only what it counts in the global gradient
 * norm, so the squares add up over all ranks to the replicas' norms. */
typedef void (*fsc_grad_probe_fn)(void *user, int64_t offset, const float *grad, int64_t n);

/* ---- DDP ------------------------------------------------------------------- */
typedef struct fsc_ddp_options {
    size_t bucket_bytes;     /* gradient bucket size (0: 25 MB); must not be negative */
    fsc_reduce_op reduce_op; /* FSC_REDUCE_SUM (default: fsc's global-batch losses) or
                                FSC_REDUCE_AVG (losses that are per-rank means) */
    bool no_broadcast;       /* skip broadcasting rank 0's parameters at wrap time */
    fsc_grad_probe_fn probe; /* NULL: none; sees each bucket before its all-reduce */
    void *probe_user;
} fsc_ddp_options;

typedef struct fsc_ddp_stats {
    int64_t buckets;    /* buckets per synchronised backward */
    int64_t allreduces; /* collectives issued so far */
    double wait_s;      /* time blocked waiting for reductions after backward */
    double last_wait_s; /* ... in the last synchronised backward */
} fsc_ddp_stats;

/* Wraps `child` (whose parameters are bound in `params`) for data parallelism
 * over group g. Returns a module: forward is the child's; backward runs the
 * child's backward while reducing gradient buckets (in reverse order of the
 * forward pass) as soon as each is complete, overlapped with the rest of
 * backward, and returns when every bucket is reduced. The wrapper does not own
 * child or params; fsc_module_free on it frees only the wrapper. Hooks are
 * added to the child's modules (the wrapper removes them when freed, so free
 * it before child; params must outlive it). Collective over g unless
 * no_broadcast: rank 0's parameters are broadcast. NULL (error set) on bad
 * options, a NULL child, group or params, or params without gradients.
 * Training goes through the wrapper: a backward run on the child itself
 * (which would skip every all-reduce, silently) fails with FSC_ERR_INVALID at
 * its first module that owns parameters, under no_sync too. Forward alone
 * (evaluation) may call the child directly. */
FSC_API fsc_module *fsc_ddp_wrap(fsc_module *child, fsc_params *params, fsc_group *g,
                                 const fsc_ddp_options *opt);
/* While on, backward accumulates gradients locally with no communication
 * (gradient accumulation); the next backward with it off reduces the sum.
 * ddp must be a module from fsc_ddp_wrap (not checked). */
FSC_API void fsc_ddp_set_no_sync(fsc_module *ddp, bool no_sync);
/* Counters of a module from fsc_ddp_wrap (not checked). */
FSC_API fsc_ddp_stats fsc_ddp_get_stats(const fsc_module *ddp);

/* ---- DP (threads) ---------------------------------------------------------- */
typedef struct fsc_dp fsc_dp;

/* A replica factory: builds a module tree with the same parameter layout as
 * the main model (e.g. fsc_gpt_new with the same config). */
typedef fsc_module *(*fsc_replica_fn)(void *user);
/* One worker's share of a micro-batch: rows [row0, row0 + rows) of it. The
 * worker's ctx has its own arena and sample0 already offset by row0. *loss
 * receives the worker's share of the loss. */
typedef int (*fsc_dp_work_fn)(fsc_module *replica, const fsc_ctx *ctx, int row0, int rows,
                              void *user, float *loss);

/* `threads` workers, each with a replica whose parameters are views of
 * params->data and whose gradients go to a private buffer (FSC_MEM_GRADS).
 * make is called once per worker; dp owns the replicas. params is borrowed
 * and must outlive dp. FSC_ERR_INVALID for threads < 1, params without
 * gradients, or a replica that fails or differs in layout; *out NULL then. */
FSC_API int fsc_dp_new(fsc_replica_fn make, void *make_user, fsc_params *params, int threads,
                       fsc_dp **out);
/* Frees the workers, their replicas and buffers (not params). Accepts NULL. */
FSC_API void fsc_dp_free(fsc_dp *dp);
FSC_API int fsc_dp_threads(const fsc_dp *dp); /* the worker count */
/* Splits `rows` rows across the workers (contiguous, as even as possible),
 * runs fn on each in parallel, then adds every worker's gradients into
 * params->grad (+=) and returns the sum of their losses in *loss. ctx supplies
 * training, seed, step, sample0 (of row 0) and keyed; its arena is not used.
 * FSC_ERR_INVALID if rows < threads. A failing worker's status and message
 * are returned (the lowest failing worker's); params->grad may then hold
 * the gradients of the workers before it. */
FSC_API int fsc_dp_run(fsc_dp *dp, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
                       float *loss);

#ifdef __cplusplus
}
#endif
#endif
