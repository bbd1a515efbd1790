/* fsc FSDP: fully sharded data parallelism (ZeRO-3, like FairScale's
 * FullyShardedDataParallel). Parameters, gradients and optimizer state are
 * all sharded; a unit's full parameters exist only while it computes.
 *
 * Units. fsc_fsdp_new takes the model's root and a list of submodules to
 * make units of (from fsc_fsdp_auto_wrap, FairScale's auto_wrap policy, or
 * picked by hand; units may nest). Every parameter belongs to the innermost
 * unit around its module; the root is always a unit and holds what no inner
 * unit claims. Each unit flattens its parameters into one buffer (16-float
 * aligned), padded to world * shard elements; rank r keeps elements
 * [r * shard, (r + 1) * shard) of it, in FSC_MEM_PARAMS, its gradient shard in
 * FSC_MEM_GRADS, and the optimizer state of that shard in FSC_MEM_OPTIM.
 *
 * Wrapping is in place, through hooks (docs/architecture.md, decision 4): the model's own
 * modules stay where they are (parents call children through their own
 * pointers), parameter names do not change, and the caller keeps calling
 * fsc_module_forward / fsc_gpt_train_micro on the root. Per step:
 *  - before a unit's forward its full parameters are all-gathered (the next
 *    unit's gather, in the order the first forward recorded, starts while
 *    this one computes); after it they are freed when reshard_after_forward
 *    (the default; the root is never resharded between forward and backward);
 *  - before a unit's backward they are gathered again if they were freed
 *    (again prefetching the next unit in backward order) and a zeroed full
 *    gradient buffer is bound; after it that gradient is reduce-scattered
 *    (non-blocking, overlapped with the rest of backward) and added into the
 *    gradient shard, and the full buffers are freed;
 *  - when the root's backward ends every reduction is complete and only
 *    shards remain. Full parameters and gradients of units in use are
 *    FSC_MEM_GATHERED.
 * So a step with N units issues 2N-1 all-gathers with resharding (N without)
 * and N reduce-scatters; a backward under no_sync issues no reduce-scatter.
 * Between steps the parameter views of the model point nowhere (NULL): use
 * fsc_fsdp_summon_full_params to read or change the full parameters.
 *
 * Mixed precision: compute_dtype BF16/F16 gathers full parameters in that
 * dtype (half the traffic) and widens them to fp32 for the non-GEMM
 * readers (LayerNorm, biases, embeddings); under bf16 autocast
 * (fsc_ctx.autocast) the gathered bf16 buffer itself feeds the bf16 GEMMs
 * (a bf16 view, fsc_bf16_view_add, removed before the weights can change),
 * so weights are not rounded twice; the shards, their gradients and the
 * optimizer stay fp32 (the master copy). reduce_dtype BF16/F16 reduce-scatters gradients in half precision;
 * F32 is FairScale's fp32_reduce_scatter. F16 needs loss scaling: see
 * fsc/grad_scaler.h and fsc/sharded_grad_scaler.h.
 *
 * Limits: a unit must run its forward at most once per step (no weight
 * sharing across units); every rank must run the same units in the same
 * order (as with any collective); backward runs on the root (a unit's
 * backward run on its own fails with FSC_ERR_INVALID: nothing would finish
 * its reduce-scatter before the step).
 */
#ifndef FSC_FSDP_H
#define FSC_FSDP_H

#include "fsc/dist.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/parallel.h" /* fsc_grad_probe_fn */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_fsdp fsc_fsdp;

typedef struct fsc_fsdp_options {
    /* false (default) frees each non-root unit's full parameters after its
     * forward and gathers them again for backward; true keeps them until
     * backward (ZeRO-2-like: N gathers, more memory). */
    bool keep_after_forward;
    fsc_dtype compute_dtype; /* F32 (default), BF16 or F16 */
    fsc_dtype reduce_dtype;  /* F32 (default), BF16 or F16 */
    bool no_prefetch;        /* do not start the next unit's gather early */
    /* NULL: none. Sees this rank's full gradient of each unit from this
     * backward alone, after the unit's backward (just before its
     * reduce-scatter, when one follows), in fp32 (before rounding to
     * reduce_dtype), one call per parameter, at the parameter's offset in
     * fsc_params_bind's flat layout of the whole model (ddp's offsets).
     * Under no_sync it is called too, and a unit's backward then writes into
     * a separate full-size buffer that joins the kept sum after the call
     * (fsc_grad_probe_fn, fsc/parallel.h). */
    fsc_grad_probe_fn probe;
    void *probe_user;
} fsc_fsdp_options;

/* Modules to make units of, FairScale's default auto-wrap policy: walking the
 * tree depth first, children before parents, a submodule (never the root)
 * becomes a unit when the parameters under it that no unit below it claimed
 * number at least min_num_params; modules whose parameters their parent uses
 * directly (fsc_module.params_used_by_parent: GPT's tied wte, wpe) never are.
 * *units is malloc'ed (free it); *n may be 0. */
FSC_API int fsc_fsdp_auto_wrap(fsc_module *root, int64_t min_num_params, fsc_module ***units,
                               int *n);

/* Modules to make units of by kind, FairScale's config_auto_wrap_policy
 * with a module class: every submodule of root (not root itself) whose
 * fsc_module_ops.kind equals kind, outermost first (a match's own
 * submodules are its), skipping modules whose parameters their parent uses
 * (fsc_module.params_used_by_parent). "TransformerBlock" gives a GPT-2 or a
 * LLaMA one unit per decoder layer. FSC_ERR_INVALID naming the kind when
 * nothing matches. *units is malloc'ed (free it). */
FSC_API int fsc_fsdp_wrap_kind(fsc_module *root, const char *kind, fsc_module ***units, int *n);

/* Shards `root` over group g with units[0..n) (submodules of root; duplicates
 * and the root itself are refused). Shards are initialised from (seed,
 * parameter name, element) exactly as fsc_params_bind would initialise the
 * full model, so no rank ever holds the full model. The parameters of root
 * must not be bound already. The optimizer (cfg) runs over this rank's
 * shards. Collective over g only in the sense that every rank must call it
 * alike (it communicates nothing). NULL (error set) on bad arguments: NULL
 * root, g or cfg, n < 0, a NULL, duplicate or root unit, a unit whose
 * parameters its parent uses, bad options or config. root and g are
 * borrowed and must outlive f; the units array is read during the call only. */
FSC_API fsc_fsdp *fsc_fsdp_new(fsc_module *root, fsc_group *g, uint64_t seed,
                               fsc_module *const *units, int n, const fsc_optim_config *cfg,
                               const fsc_fsdp_options *opt);
/* Removes the hooks and frees shards, buffers and the optimizer (not the
 * model). Accepts NULL. */
FSC_API void fsc_fsdp_free(fsc_fsdp *f);

/* ---- training ------------------------------------------------------------------- */
/* While on, backward keeps full gradients per unit and communicates nothing
 * (FairScale's no_sync): full gradient memory for the model, one
 * reduce-scatter per unit at the next synchronised backward. Off (the
 * default), micro-steps of an accumulated batch each reduce-scatter into the
 * gradient shards: N reduce-scatters per micro-step, only shard memory kept.
 * f must not be NULL (nor for zero_grad, ranges and get_stats below). */
FSC_API void fsc_fsdp_set_no_sync(fsc_fsdp *f, bool no_sync);
/* Global gradient-norm clipping over all shards (one all-reduce), as
 * fsc_clip_grad_norm on the unsharded model; *total (may be NULL) gets the
 * pre-clip norm, identical on every rank. Collective. */
FSC_API int fsc_fsdp_clip_grad_norm(fsc_fsdp *f, float max_norm, bool inf_norm, float *total);
/* Owned by f (do not free); NULL for NULL. */
FSC_API fsc_optim *fsc_fsdp_optim(fsc_fsdp *f); /* over this rank's shards */
/* FSC_ERR_INVALID for NULL or while no_sync is on (the shards are not reduced yet). */
FSC_API int fsc_fsdp_step(fsc_fsdp *f);       /* the optimizer's step (local) */
FSC_API void fsc_fsdp_zero_grad(fsc_fsdp *f); /* zeroes the gradient shards */
/* This rank's gradient shard ranges (as the optimizer sees them), e.g. for a
 * sharded grad scaler. Owned by f. */
FSC_API const fsc_optim_range *fsc_fsdp_ranges(const fsc_fsdp *f, int *n);

/* ---- full parameters between steps ----------------------------------------------- */
/* Gathers every unit's full parameters (fp32) and binds the model's views to
 * them: FSC_MEM_GATHERED holds the whole model until release. Collective.
 * FSC_ERR_INVALID if already summoned or called during a step. */
FSC_API int fsc_fsdp_summon_full_params(fsc_fsdp *f);
/* Ends a summon; with writeback each rank copies its slice of the (possibly
 * changed) full parameters back into its shard, so changes persist.
 * FSC_ERR_INVALID if nothing is summoned. */
FSC_API int fsc_fsdp_release_full_params(fsc_fsdp *f, bool writeback);

/* ---- state dicts ------------------------------------------------------------------- */
/* Full state dict: every parameter F32 under its original name, in model
 * order, with the metadata pairs — the very bytes fsc_weights_save writes for
 * the unsharded model. With more than one rank each rank writes its own
 * shards' pieces into the file through MPI-IO (nothing gathered; at most
 * 16 MiB of staging; FSC_IO_TIMEOUT_S bounds it); with FSC_PARALLEL_IO=0
 * `root` writes it while units are gathered one at a time (never the whole
 * model on one rank). path is needed on root only. Collective; every rank
 * returns the same status. */
FSC_API int fsc_fsdp_save_weights(fsc_fsdp *f, const char *path, int root, int n_meta,
                                  const char *const *keys, const char *const *values);
/* Every rank reads its shards' slices from a full state dict (written by any
 * world size, or by fsc_weights_save). Validated first (names, shapes) on
 * every rank; nothing changes unless every rank succeeded. Collective. */
FSC_API int fsc_fsdp_load_weights(fsc_fsdp *f, const char *path);
/* Sharded (local) state dict: this rank's flat shards with the layout in the
 * metadata (fsc/flat_shards.h), one file per rank; fsc-consolidate rebuilds
 * the full state dict from them offline. Not collective. */
FSC_API int fsc_fsdp_save_sharded(fsc_fsdp *f, const char *path, int n_meta,
                                  const char *const *keys, const char *const *values);
/* Loads this rank's shard file, written at the same world size and layout.
 * Refused (FSC_ERR_INVALID) during a step or a summon, as fsc_fsdp_load_weights. */
FSC_API int fsc_fsdp_load_sharded(fsc_fsdp *f, const char *path);
/* Optimizer state by global parameter name (the format of fsc_oss_save_optim,
 * loadable at any world size, by OSS or FSDP). Collective. */
FSC_API int fsc_fsdp_save_optim(fsc_fsdp *f, const char *path, int root);
/* Reads such a file (as fsc_oss_load_optim: any world size, staged, all or
 * nothing on every rank). Collective. */
FSC_API int fsc_fsdp_load_optim(fsc_fsdp *f, const char *path);

/* ---- what it did ------------------------------------------------------------------- */
typedef struct fsc_fsdp_stats {
    int units;          /* N, the root included */
    int64_t allgathers; /* issued so far, prefetches included */
    int64_t reduce_scatters;
    /* bytes put into reduce-scatters so far (a unit's full trainable-region
     * gradient each, in the reduce dtype): frozen parameters add nothing */
    int64_t reduced_bytes;
    int64_t shard_elems;   /* this rank's shard elements, padding included */
    int64_t padding_elems; /* of which padding and alignment gaps */
    int64_t largest_unit;  /* elements of the largest unit's padded flat buffer */
    double wait_s;         /* blocked waiting for gathers and reductions */
    /* full-size and half-precision buffers allocated fresh rather than reused:
     * after the first step, each is a step mapping (and page-faulting) memory */
    int64_t buffer_allocs;
} fsc_fsdp_stats;
/* What f has done so far. */
FSC_API fsc_fsdp_stats fsc_fsdp_get_stats(const fsc_fsdp *f);
/* The unit's module path ("" for the root; owned by f) and padded flat
 * elements; either out may be NULL. FSC_ERR_INVALID for a bad unit or NULL f. */
FSC_API int fsc_fsdp_unit_info(const fsc_fsdp *f, int unit, const char **name, int64_t *numel);

#ifdef __cplusplus
}
#endif
#endif
