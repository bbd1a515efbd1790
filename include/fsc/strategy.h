/* Strategies: every way of spreading a training step over ranks behind one
 * interface, as PyTorch's optimizer interface is the same with or without
 * FairScale.
 *
 * A strategy takes a model whose parameters are not bound yet, binds or
 * shards them, wraps the model as it needs (DDP, ShardedDDP, FSDP, threads)
 * and owns the optimizer over what this rank updates. The loop is then the
 * same for every strategy:
 *
 *     fsc_strategy *s = fsc_strategy_new(model, &adamw, &(fsc_strategy_options){.name = "fsdp"});
 *     for each step:
 *         fsc_strategy_zero_grad(s);
 *         for k in 0..K-1: fsc_strategy_forward_backward(s, &ctx, k, K, rows, fn, user, &loss);
 *         fsc_strategy_clip_grad_norm(s, 1.0f, &norm);
 *         fsc_strategy_set_lr(s, lr);
 *         fsc_strategy_step(s);
 *
 * Switching strategy changes `.name` (and that strategy's own options). The
 * strategies are rows of one table (src/train/strategy.c); fsc_trainer
 * (fsc/trainer.h) drives any of them with accumulation, loss scaling,
 * clipping, schedules and checkpoints. */
#ifndef FSC_STRATEGY_H
#define FSC_STRATEGY_H

#include "fsc/dist.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/parallel.h"
#include "fsc/pipe.h"
#include "fsc/tp.h"
#include "fsc/zero.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_strategy fsc_strategy;

/* A pipeline dimension (see fsc_strategy_options.pipe). */
typedef struct fsc_pipe_strategy_options {
    int stages;
    fsc_pipe_kind schedule; /* GPIPE (default), 1F1B, INTERLEAVED (chunks >= 2), ZB_H1 */
    int chunks;             /* stages per rank under INTERLEAVED (0: 2) */
    int micros;             /* micro-batches per step (the trainer sets its grad_accum) */
    const int *balance;     /* layers per stage (stages x chunks), NULL: even; borrowed */
    int layers;             /* of the model */
    fsc_pipe_stage_fn make_stage;
    void *stage_user;
    fsc_pipe_checkpoint checkpoint; /* recompute activations in backward */
    int act_ndim;                   /* the activation between stages, per micro-batch */
    int64_t act_shape[FSC_MAX_DIMS];
    /* cuts that pass another shape (fsc_pipe_options.act_shape_at), called
     * with stage_user, also with tp.make_stage's stages; NULL: none */
    void (*act_shape_at)(void *user, int layer, int64_t shape[FSC_MAX_DIMS]);
} fsc_pipe_strategy_options;

/* A tensor-parallel dimension (see fsc_strategy_options.tp). */
typedef struct fsc_tp_strategy_options {
    int size;               /* ranks per tensor-parallel group; > 1 turns the dimension on */
    bool sequence_parallel; /* fsc_tp_options.sequence_parallel */
    bool recompute_attention; /* fsc_tp_options.recompute_attention */
    bool recompute_activation; /* fsc_tp_options.recompute_activation */
    /* Makes the model over the TP group it is given (fsc_tp_gpt_new for the
     * GPT; the options are valid while the strategy lives); fsc_strategy_new's
     * model is then NULL and the strategy owns what this returns. */
    fsc_module *(*make_model)(void *user, const fsc_tp_options *tp);
    /* With a pipeline (pipe.stages > 1) instead of make_model and
     * pipe.make_stage (both NULL then): layers [first, end) of the model
     * over the TP group it is given (fsc_tp_gpt_stage_new for the GPT). */
    fsc_module *(*make_stage)(void *user, int first, int end, const fsc_tp_options *tp);
    void *user;
} fsc_tp_strategy_options;

/* Zero fields mean the documented default. */
typedef struct fsc_strategy_options {
    /* "single" (default), "dp" (threads), "ddp", "oss" (ZeRO-1), "sdp"
     * (ShardedDDP, ZeRO-2), "fsdp" (ZeRO-3), "slowmo" or "hsdp" (hybrid
     * sharding, see shard_group); fsc_strategy_names lists them. */
    const char *name;
    /* The data-parallel group of ddp, oss, sdp and fsdp (NULL: the world);
     * single and dp always run on this process alone. Borrowed. */
    fsc_group *group;
    uint64_t seed; /* initial weights by (seed, parameter name, element) */
    /* ddp, oss: gradient bucket bytes (0: 25 MB); sdp: the other ranks'
     * gradient memory held at once (0: 25 MB). */
    size_t bucket_bytes;
    fsc_partition_policy partition; /* oss, sdp: GREEDY (default) or EVEN */
    fsc_dtype share_dtype;          /* oss, sdp: updated parameters travel as F32|BF16|F16 */
    /* BF16, every row: autocast (the trainer runs the GEMMs in bf16 with fp32
     * accumulation, fsc_ctx.autocast), and fsdp also gathers parameters in
     * bf16; F16: fsdp only (gathers in fp16, computes in fp32, loss scaling);
     * F32: the default. */
    fsc_dtype compute_dtype;
    /* sdp, fsdp: gradient reduction dtype (F32 for sdp; fsdp: compute_dtype,
     * unless fp32_reduce_scatter, FairScale's flag, asks for F32). */
    fsc_dtype reduce_dtype;
    bool fp32_reduce_scatter;
    /* fsdp units: by hand (borrowed; submodules of the model), else every
     * module reaching min_params parameters (auto-wrap), else each child of
     * the model that holds parameters the model does not use directly. */
    fsc_module *const *units;
    int nunits;
    int64_t min_params;
    /* fsdp units by module kind (fsc_fsdp_wrap_kind: FairScale's
     * config_auto_wrap_policy with a module class), e.g. "TransformerBlock"
     * for one unit per GPT-2 or LLaMA decoder layer; before min_params.
     * Borrowed. */
    const char *units_kind;
    bool keep_after_forward; /* fsdp: keep gathered units until backward */
    /* fsdp: accumulate full gradients over micro-steps and reduce once (more
     * memory, less traffic) instead of reduce-scattering every micro-step. */
    bool accum_no_sync;
    /* hsdp (required there): ranks per shard group. The group's ranks form
     * size / shard_group groups of shard_group consecutive ranks; each runs
     * fsdp over itself (fsdp's options apply within it) and the groups are
     * replicas: gradients are reduce-scattered within a group, then the
     * shards all-reduced over the ranks that own the same shard in every
     * group. Must divide the group's size; no pipeline or tensor parallelism. */
    int shard_group;
    /* dp: worker threads (0: 1), each with a replica made by make_replica
     * (same parameter layout as the model). */
    int threads;
    fsc_replica_fn make_replica;
    void *replica_user;
    /* A pipeline dimension (pipe.stages > 1): the group's ranks form
     * size / stages data-parallel replicas of `stages` consecutive ranks
     * each, one pipeline per replica; the model is given as layers
     * (make_stage; fsc_strategy_new's model is then NULL), and the step runs
     * through fsc_strategy_run_pipeline. Composes with ddp, oss, sdp and
     * fsdp: their ZeRO stage applies to each stage's parameters over the
     * ranks that run it (fsc_pipe_sharding); their own options (buckets,
     * partition, units...) are refused; single and dp refuse a pipeline. */
    fsc_pipe_strategy_options pipe;
    /* A tensor-parallel dimension (tp.size > 1): groups of tp.size
     * consecutive ranks (TP fastest in the rank layout) each hold one
     * replica of the model split by fsc/tp.h's layers, made by
     * tp.make_model; the size / tp.size replicas are data-parallel under
     * ddp, oss or sdp (the named row over the ranks with the same TP rank).
     * The strategy's group, rank and world are then the data-parallel
     * ones. Gradient clipping counts every parameter once over the whole
     * mesh; weights are saved and loaded by global name (the one-process
     * file). With a pipeline (the dp x pp x tp mesh: TP fastest in the
     * rank layout, then the stages, then the replicas) under ddp, oss, sdp
     * or fsdp, each stage is split over its TP group (tp.make_stage); the
     * last stage's logits are then this TP rank's vocabulary rows, for
     * fsc_tp_cross_entropy over that group, or with the targets given
     * (fsc_pipe_io.targets) its head runs fused with the loss. fsdp without a pipeline runs
     * the tp.make_model model as one pipeline stage whose parameters and
     * gradients each rank keeps 1/dp of between steps (gathered before the
     * first forward of a step, reduce-scattered after its last backward;
     * fsdp's own options are refused); optimizer state by global name.
     * Not with single or dp (refused). */
    fsc_tp_strategy_options tp;
    /* ddp, oss, sdp, fsdp: sees each stretch of this rank's own gradient
     * just before it is reduced over the group (fsc_grad_probe_fn; AdaScale's
     * per-rank squared norms); fsdp's sees each unit's full gradient of the
     * micro-step alone, before its reduce-scatter and under accum_no_sync
     * too (fsc_fsdp_options.probe). With tp.size > 1 each rank sees what
     * it counts in the global norm (a parameter every TP rank holds: on TP
     * rank 0); a pipeline's ranks (and oss, sdp, fsdp over TP replicas, a
     * pipeline of one stage) see each micro-batch's own gradient after its
     * backward (fsc_pipe_options.probe), not with zbh1. */
    fsc_grad_probe_fn grad_probe;
    void *grad_probe_user;
    /* slowmo (FairScale's SlowMoDistributedDataParallel with Local SGD):
     * every rank steps on its own gradients; the parameters are averaged
     * every localsgd_frequency steps (0: 3); every slowmo_frequency steps
     * (0: 48; a multiple of localsgd_frequency) the averaged parameters take
     * the slow-momentum outer update, buf = slowmo_momentum * buf + (old - p)
     * / lr, old -= slowmo_lr * lr * buf, p = old, with old and buf sharded
     * over the ranks (FairScale's memory-efficient mode: a reduce to each
     * shard's owner, the update there, a broadcast back). slowmo_momentum in
     * [0, 1) (0: none, plain Local SGD; FairScale's default is 0.5),
     * slowmo_lr > 0 (0: 1). */
    int localsgd_frequency, slowmo_frequency;
    double slowmo_momentum, slowmo_lr;
    /* The layout's process groups (fsc/dist.h's mesh; borrowed, outliving
     * the strategy). NULL: the strategy builds one over `group` when
     * pipe.stages or tp.size > 1. Given, `group` must be NULL (the mesh's
     * parent takes its place), its pp and tp sizes must be pipe.stages and
     * tp.size (1 when off), and a row over the ranks takes every group from
     * it: ddp, oss, sdp and fsdp reduce over its dp group, a pipeline's
     * stages talk over its pp group, TP layers over its tp group. single
     * and dp run on this process alone and do not use it. */
    fsc_mesh *mesh;
} fsc_strategy_options;

/* Communication of the strategy so far (on this rank). */
typedef struct fsc_strategy_stats {
    double wait_s;      /* blocked on gradient or parameter communication */
    int64_t reductions; /* gradient collectives issued (all-reduce, reduce, reduce-scatter) */
    int64_t gathers;    /* parameter all-gathers issued (fsdp) */
    int units;          /* fsdp units, 0 otherwise */
    int64_t messages;   /* point-to-point messages sent (a pipeline's activations, gradients) */
    double tp_wait_s;   /* blocked in tensor-parallel collectives (activations, inside
                           forward and backward; not in wait_s) */
} fsc_strategy_stats;

/* What model state a rank holds, by ZeRO's arithmetic: P parameters, K bytes
 * of optimizer state per parameter, sharded over the degrees below. */
typedef struct fsc_strategy_memory {
    int zero_stage; /* 0: replicated, 1: optimizer, 2: + gradients, 3: + parameters */
    int params_shards, grads_shards, optim_shards; /* ranks each is divided over */
    double params_bytes, grads_bytes, optim_bytes; /* per rank, excluding buffers in use */
    size_t optim_measured; /* this rank's optimizer state, by the allocator */
} fsc_strategy_memory;

/* The strategies' names in table order, NULL-terminated. Static storage. */
FSC_API const char *const *fsc_strategy_names(void);

/* What a strategy is, before making one. */
typedef struct fsc_strategy_info {
    const char *summary; /* one line; static storage */
    bool spans_ranks;    /* runs over the group's ranks (false: this process alone) */
    int zero_stage;      /* 0..3: what is sharded over the group */
    bool pipeline;       /* steps through fsc_strategy_run_pipeline (no named row does;
                          * a row made with pipe.stages > 1 becomes one) */
    /* Each rank steps on its own gradients (slowmo): the replicas agree only
     * after an averaging step, and training is not one process's on the
     * global batch (except at one rank). */
    bool local_steps;
} fsc_strategy_info;
/* FSC_OK and *out for a known name; FSC_ERR_INVALID (error lists the names)
 * otherwise. */
FSC_API int fsc_strategy_info_get(const char *name, fsc_strategy_info *out);
/* Whether strategy `name` takes option `option` (a field name of
 * fsc_strategy_options: "bucket_bytes", "partition", "threads", ...); false
 * for unknown names. Tools set defaults only where they apply with it; a
 * non-default option the strategy does not take is refused by
 * fsc_strategy_new. */
FSC_API bool fsc_strategy_takes(const char *name, const char *option);

/* Sets up strategy opt->name for `model` (parameters not bound yet; the
 * strategy binds or shards them, initialised from opt->seed) with an
 * optimizer of config `optim` over what this rank updates. Borrows model and
 * opt->group (both must outlive the strategy). Every rank of the group calls
 * it alike. NULL (error set, naming the option) for an unknown name, a model
 * already bound, options another strategy owns (e.g. min_params under ddp)
 * or a failed set-up. */
FSC_API fsc_strategy *fsc_strategy_new(fsc_module *model, const fsc_optim_config *optim,
                                       const fsc_strategy_options *opt);
/* Removes wrappers and hooks, frees parameters, gradients and optimizer
 * state (not the model). Accepts NULL. */
FSC_API void fsc_strategy_free(fsc_strategy *s);

FSC_API const char *fsc_strategy_name(const fsc_strategy *s); /* "ddp", ...; static storage */
/* This rank's index and the size of the data-parallel group (0 and 1 for
 * single and dp). */
FSC_API int fsc_strategy_rank(const fsc_strategy *s);
FSC_API int fsc_strategy_world(const fsc_strategy *s); /* the group's size */
/* The data-parallel group (the self group for single and dp). Owned by the
 * caller or the runtime, never by s. */
FSC_API fsc_group *fsc_strategy_group(const fsc_strategy *s);
/* The pipeline (owned by s) of a strategy made with pipe.stages > 1, else NULL. */
FSC_API fsc_pipe *fsc_strategy_get_pipe(const fsc_strategy *s);
/* Every rank of the strategy: the data-parallel group, or under a pipeline
 * the replicas x stages. Its rank 0 is the one that writes files. Not owned
 * by s. */
FSC_API fsc_group *fsc_strategy_all(const fsc_strategy *s);
/* The module to run forward and backward on: the wrapper (ddp, oss, sdp) or
 * the model itself (single, dp, fsdp: hooks). Owned by s or the caller; do
 * not free. Calling the model directly under ddp/oss/sdp skips the
 * gradient reduction (detected at the next step). */
FSC_API fsc_module *fsc_strategy_module(fsc_strategy *s);
/* The unsharded parameter list, or NULL under fsdp (no rank holds it). */
FSC_API fsc_params *fsc_strategy_params(fsc_strategy *s);

/* Zeroes the gradients this rank holds, before a step's first micro-batch. */
FSC_API void fsc_strategy_zero_grad(fsc_strategy *s);
/* Micro-step k of K (0 <= k < K): gradients of all but the last accumulate
 * without communication where the strategy allows it (no_sync); runs fn once
 * with fsc_strategy_module (or, under dp, over the threads, each with its own
 * rows of `rows`, arena and replica) and returns in *loss the sum of what fn
 * returned. ctx->arena is reset first (not used under dp). FSC_ERR_INVALID on
 * bad arguments; fn's status otherwise. */
FSC_API int fsc_strategy_forward_backward(fsc_strategy *s, const fsc_ctx *ctx, int k, int K,
                                          int rows, fsc_dp_work_fn fn, void *user, float *loss);
/* A pipeline strategy's whole step (every micro-batch through the
 * schedule, io giving stage 0's input and the last stage's loss), then the
 * gradients all-reduced over the data-parallel replicas. *loss gets this
 * replica's loss. With ctx->training false, an evaluation pass instead
 * (fsc_pipe_eval: forward only, gradients and statistics untouched).
 * FSC_ERR_INVALID for a strategy without a pipeline. */
FSC_API int fsc_strategy_run_pipeline(fsc_strategy *s, const fsc_ctx *ctx, const fsc_pipe_io *io,
                                      float *loss);
/* Global gradient-norm clipping over every rank's gradients, each parameter
 * counted once (max_norm <= 0 or FLT_MAX: norm only); *total (may be NULL)
 * gets the pre-clip 2-norm, identical on every rank. Collective over the
 * group. FSC_ERR_NUMERIC (error set) when the norm is not finite. */
FSC_API int fsc_strategy_clip_grad_norm(fsc_strategy *s, float max_norm, float *total);
/* The gradient ranges this rank's optimizer steps on (e.g. for a sharded
 * grad scaler). Owned by s; valid until fsc_strategy_free. */
FSC_API const fsc_optim_range *fsc_strategy_grad_ranges(fsc_strategy *s, int *n);
FSC_API int fsc_strategy_set_lr(fsc_strategy *s, double lr); /* lr >= 0, on every shard */
FSC_API double fsc_strategy_get_lr(const fsc_strategy *s);   /* the optimizer's current lr */
/* The optimizer update of this rank's part, then whatever sharing the
 * strategy needs (oss, sdp: updated parameters to every rank). Collective
 * under oss and sdp. */
FSC_API int fsc_strategy_step(fsc_strategy *s);
/* The optimizer over this rank's part (for its config and state). Owned by s. */
FSC_API fsc_optim *fsc_strategy_optim(fsc_strategy *s);

/* Weights by global name, the bytes fsc_weights_save writes for the
 * unsharded model, written by `root` (path needed there only). Collective
 * over the group; every rank returns root's failure. */
FSC_API int fsc_strategy_save_weights(fsc_strategy *s, const char *path, int root, int n_meta,
                                      const char *const *keys, const char *const *values);
/* Loads weights by global name (any strategy or world size wrote them);
 * validated before anything changes. *n_unused (may be NULL) gets the number
 * of tensors in the file the model does not have. Collective under fsdp. */
FSC_API int fsc_strategy_load_weights(fsc_strategy *s, const char *path, int *n_unused);
/* Optimizer state by global name, written by `root`; loadable by any
 * strategy at any world size. Collective over the group. */
FSC_API int fsc_strategy_save_optim(fsc_strategy *s, const char *path, int root);
/* Reads such a file (written by any strategy, at any world size) into this
 * rank's part of the optimizer state. Collective over the group. */
FSC_API int fsc_strategy_load_optim(fsc_strategy *s, const char *path);
/* Whether the strategy keeps state of its own beyond weights and optimizer
 * state (slowmo: the local step count, the slow momentum, every rank's
 * optimizer state and, between averages, every rank's replica), which a
 * checkpoint then carries in a file of its own. */
FSC_API bool fsc_strategy_has_state(const fsc_strategy *s);
/* Writes that state by global name to `path` (needed on root only).
 * Collective over the group; every rank returns the same status.
 * FSC_ERR_INVALID for a strategy without one. */
FSC_API int fsc_strategy_save_state(fsc_strategy *s, const char *path, int root);
/* Reads such a file after fsc_strategy_load_weights and _load_optim: at the
 * world size it was written at each rank takes its own state back, at
 * another each takes the mean of the saved ranks'. Settings that differ
 * (frequencies, slow momentum, optimizer kind) are refused by name; nothing
 * changes unless every rank could load. path NULL: the checkpoint has none
 * (another strategy's), the state starts afresh with a warning. FSC_OK for a
 * strategy without state. Collective over the group. */
FSC_API int fsc_strategy_load_state(fsc_strategy *s, const char *path);
/* Each rank writes its own shards and their layout to `path` (sharded
 * strategies only: fsdp; fsc-consolidate rebuilds the full state dict from
 * the files). FSC_ERR_INVALID for a strategy without a sharded state dict. */
FSC_API int fsc_strategy_save_sharded(fsc_strategy *s, const char *path, int n_meta,
                                      const char *const *keys, const char *const *values);
/* Each rank reads its own such file (fsc_fsdp_load_sharded: the same world
 * size and layout, any difference refused by name). A refusal on any rank is
 * one on every rank; ranks whose own file was good have loaded it by then,
 * so the model is not to be trained on after a refusal. Collective.
 * FSC_ERR_UNSUPPORTED (nothing read) for a strategy that reads no sharded
 * state dict: rebuild the full one (fsc_flat_consolidate) and load that. */
FSC_API int fsc_strategy_load_sharded(fsc_strategy *s, const char *path);

/* This rank's communication so far (all zero for a strategy with none). */
FSC_API fsc_strategy_stats fsc_strategy_get_stats(const fsc_strategy *s);
/* A pipeline's last step as a Chrome trace (fsc_pipe_write_trace), written
 * by rank 0; collective over fsc_strategy_all. FSC_ERR_INVALID for a
 * strategy without a pipeline. */
FSC_API int fsc_strategy_write_trace(fsc_strategy *s, const char *path);
/* The model-state plan of this rank (K from the optimizer's config). */
FSC_API fsc_strategy_memory fsc_strategy_memory_plan(const fsc_strategy *s);

#ifdef __cplusplus
}
#endif
#endif
