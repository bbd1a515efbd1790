/* The pipeline row: pipe.stages consecutive ranks of the group run one
 * pipeline (fsc/pipe.h) over the model's layers, and the size / stages
 * replicas of it are data-parallel: after the schedule, each stage's
 * gradients are reduced over the ranks that run the same stage, and the
 * named row's ZeRO stage says what those ranks shard (ddp: nothing; oss:
 * optimizer state; sdp: and gradients; fsdp: and parameters between
 * steps), after the pipeline rather than overlapped with it. The
 * strategy's group, rank and world are then the data-parallel ones, which
 * is what the trainer's data order and loss normaliser need. With
 * tp.size > 1 each stage is itself split over a TP group of adjacent ranks
 * (the full dp x pp x tp mesh): one pipeline per TP rank of a replica.
 * fsdp with tp.size > 1 and no pipeline is this row with one stage, the
 * whole TP model (fsc_strategy_pipe_whole, at the end). */
#include <stdlib.h>

#include "strategy_internal.h"

/* With TP stages: the user's stage over this rank's TP group; one stage
 * (no pipeline: fsc_strategy_pipe_whole) is the user's whole model. */
static fsc_module *tp_stage(void *user, int first, int end) {
    fsc_strategy *s = user;
    if (s->opt.pipe.stages < 2) return s->opt.tp.make_model(s->opt.tp.user, &s->tp_options);
    return s->opt.tp.make_stage(s->opt.tp.user, first, end, &s->tp_options);
}

/* With TP stages the pipe's stage_user is the strategy; the shape at a cut
 * is still the user's to say (a cut inside a block's MLP is wider). */
static void tp_act_shape(void *user, int layer, int64_t shape[FSC_MAX_DIMS]) {
    const fsc_strategy *s = user;
    s->opt.pipe.act_shape_at(s->opt.pipe.stage_user, layer, shape);
}

/* The TP options: tp.make_stage in place of pipe.make_stage and make_model;
 * without a pipeline tp.make_model, as under ddp. */
static int check_tp(const fsc_strategy *s) {
    const fsc_tp_strategy_options *o = &s->opt.tp;
    if (s->opt.pipe.stages < 2)
        return o->make_model && !o->make_stage
                   ? FSC_OK
                   : fsc_error(FSC_ERR_INVALID,
                               "tensor parallelism without a pipeline: give tp.make_model, not "
                               "tp.make_stage (%s)",
                               o->make_model ? "tp.make_stage is set" : "tp.make_model is NULL");
    if (!o->make_stage || o->make_model || s->opt.pipe.make_stage)
        return fsc_error(FSC_ERR_INVALID,
                         "tensor-parallel stages: give tp.make_stage, and neither tp.make_model "
                         "nor pipe.make_stage (%s)",
                         !o->make_stage  ? "tp.make_stage is NULL"
                         : o->make_model ? "tp.make_model is set"
                                         : "pipe.make_stage is set");
    return FSC_OK;
}

static int setup(fsc_strategy *s, const fsc_optim_config *optim) {
    const int P = s->opt.pipe.stages > 1 ? s->opt.pipe.stages : 1, N = s->world;
    const int T = s->opt.tp.size > 1 ? s->opt.tp.size : 1, PT = P * T;
    if (N % PT)
        return fsc_error(FSC_ERR_INVALID,
                         T > 1 ? "%d ranks cannot form pipelines of %d stages x %d tensor-parallel "
                                 "ranks"
                               : "%d ranks cannot form pipelines of %d stages",
                         N, P, T);
    int rc = T > 1 ? check_tp(s) : FSC_OK;
    if (rc) return rc;
    fsc_group *all = s->group;
    /* the mesh's groups (src/comm/mesh.c: TP fastest, then the stages): a
     * pipeline joins the ranks of one replica with the same TP rank */
    if ((rc = strategy_mesh(s))) return rc;
    s->tp_options = (fsc_tp_options){.group = s->tp_group,
                                     .sequence_parallel = s->opt.tp.sequence_parallel,
                                     .recompute_attention = s->opt.tp.recompute_attention,
                                     .recompute_activation = s->opt.tp.recompute_activation};
    const fsc_pipe_kind kind = P > 1 ? s->opt.pipe.schedule : FSC_PIPE_GPIPE;
    const int chunks =
        kind == FSC_PIPE_INTERLEAVED ? (s->opt.pipe.chunks ? s->opt.pipe.chunks : 2) : 1;
    const int micros = s->opt.pipe.micros > 0 ? s->opt.pipe.micros : 1;
    if ((rc = fsc_pipe_schedule_make(kind, P, chunks, micros, &s->sched))) return rc;
    /* one stage: the whole model is its one layer, and no activation crosses */
    fsc_pipe_options po = {.layers = P > 1 ? s->opt.pipe.layers : 1,
                           .make_stage = T > 1 ? tp_stage : s->opt.pipe.make_stage,
                           .stage_user = T > 1 ? (void *)s : s->opt.pipe.stage_user,
                           .balance = s->opt.pipe.balance,
                           .act_ndim = P > 1 ? s->opt.pipe.act_ndim : 1,
                           .act_shape_at = P > 1 ? s->opt.pipe.act_shape_at : NULL,
                           .seed = s->opt.seed,
                           .checkpoint = s->opt.pipe.checkpoint,
                           .dp = N > PT ? s->dp_group : NULL,
                           .mesh = all,
                           .sharding = (fsc_pipe_sharding)s->pipe_zero,
                           .tp = s->tp_group,
                           .layout = s->opt.mesh ? s->opt.mesh : s->own_mesh,
                           .probe = s->opt.grad_probe,
                           .probe_user = s->opt.grad_probe_user};
    for (int d = 0; d < FSC_MAX_DIMS; d++) po.act_shape[d] = P > 1 ? s->opt.pipe.act_shape[d] : 1;
    if (T > 1 && po.act_shape_at) po.act_shape_at = tp_act_shape; /* stage_user is s */
    if (!(s->pipe = fsc_pipe_new(s->pp_group, s->sched, optim, &po))) return FSC_ERR_INVALID;
    s->optim = fsc_pipe_optim(s->pipe);
    s->group = s->dp_group;
    s->rank = fsc_group_rank(s->dp_group);
    s->world = fsc_group_size(s->dp_group);
    return FSC_OK;
}

static void teardown(fsc_strategy *s) {
    fsc_pipe_free(s->pipe);
    fsc_pipe_schedule_free(s->sched); /* the groups are the mesh's */
}

static void zero_grad(fsc_strategy *s) {
    fsc_pipe_zero_grad(s->pipe);
}

static int run_pipeline(fsc_strategy *s, const fsc_ctx *ctx, const fsc_pipe_io *io, float *loss) {
    if (ctx && !ctx->training) /* evaluation: forward only, not a step (no figures) */
        return fsc_pipe_eval(s->pipe, ctx, io, loss);
    int rc = fsc_pipe_run(s->pipe, ctx, io, loss);
    const fsc_pipe_run_stats st = fsc_pipe_get_stats(s->pipe);
    s->pipe_wait_s += st.wait_s + st.replica_s;
    s->pipe_messages += st.messages;
    if (s->world > 1) s->dp_allreduces += fsc_pipe_chunks(s->pipe);
    return rc;
}

/* Over one replica, or over the mesh when the replicas shard (fsc/pipe.h). */
static int clip(fsc_strategy *s, float max_norm, float *total) {
    return fsc_pipe_clip_grad_norm(s->pipe, max_norm, total);
}

static int step(fsc_strategy *s) {
    return fsc_pipe_step(s->pipe);
}

/* Every rank takes part (sharded replicas gather); the first replica writes. */
static int save_weights(fsc_strategy *s, const char *path, int root, int n_meta,
                        const char *const *keys, const char *const *values) {
    if (root != 0)
        return fsc_error(FSC_ERR_INVALID, "pipeline: weights are written by rank 0 (not %d)", root);
    return fsc_pipe_save_weights(s->pipe, path, 0, n_meta, keys, values);
}

static int load_weights(fsc_strategy *s, const char *path, int *n_unused) {
    if (n_unused) *n_unused = 0; /* each stage reads its tensors by name */
    return fsc_pipe_load_weights(s->pipe, path);
}

static int save_optim(fsc_strategy *s, const char *path, int root) {
    if (root != 0)
        return fsc_error(FSC_ERR_INVALID, "pipeline: state is written by rank 0 (not %d)", root);
    return fsc_pipe_save_optim(s->pipe, path, 0);
}

static int load_optim(fsc_strategy *s, const char *path) {
    return fsc_pipe_load_optim(s->pipe, path);
}

/* Replica 0's pipeline (of TP rank 0): the others have the same schedule;
 * the outcome goes over the TP group, then over the replicas. */
static int write_trace(fsc_strategy *s, const char *path) {
    const int tp_rank = s->tp_group ? fsc_group_rank(s->tp_group) : 0;
    int rc = s->rank == 0 && tp_rank == 0 ? fsc_pipe_write_trace(s->pipe, path) : FSC_OK;
    int32_t status = rc;
    if (s->tp_group && fsc_group_broadcast(s->tp_group, &status, 1, FSC_DTYPE_I32, 0))
        return FSC_ERR_MPI;
    if (s->world > 1 && fsc_group_broadcast(s->dp_group, &status, 1, FSC_DTYPE_I32, 0))
        return FSC_ERR_MPI;
    return status && !rc ? fsc_error(status, "pipeline: replica 0 could not write %s", path) : rc;
}

static void stats(const fsc_strategy *s, fsc_strategy_stats *out) {
    out->wait_s = s->pipe_wait_s;
    out->reductions = s->dp_allreduces;
    out->messages = s->pipe_messages;
    if (s->tp_group) out->tp_wait_s = fsc_group_get_stats(s->tp_group).wait_s;
}

/* Both rows below step, clip, save and load through the pipe alike. */
#define PIPE_OPS                                                                                   \
    .zero_grad = zero_grad, .clip = clip, .step = step, .save_weights = save_weights,              \
    .load_weights = load_weights, .save_optim = save_optim, .load_optim = load_optim,              \
    .stats = stats

const strategy_ops fsc_strategy_pipe = {
    .name = "pipe",
    .summary = "pipeline stages over consecutive ranks, data-parallel (ZeRO) replicas of them",
    .spans_ranks = true,
    .pipeline = true,
    .setup = setup,
    .teardown = teardown,
    .run_pipeline = run_pipeline,
    .write_trace = write_trace,
    PIPE_OPS,
};

/* ---- fsdp over tensor-parallel replicas, without a pipeline ------------------------------ */
/* The pipeline of one stage: the whole TP model (tp.make_model), kept as
 * this rank's 1/dp slices between steps as a stage is under fsdp x pp. The
 * trainer runs it micro-step by micro-step like any row's module: a hook
 * makes it whole before its forward (evaluating, gives the rest back after
 * it), and the step's last micro-batch reduce-scatters the gradients. */

static int whole_hook(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx, const fsc_tensor *t,
                      void *user) {
    (void)m, (void)t;
    if (kind == FSC_HOOK_PRE_FORWARD) return fsc_pipe_unshard(user);
    return ctx->training ? FSC_OK : fsc_pipe_reshard(user); /* evaluating: no backward follows */
}

static int whole_setup(fsc_strategy *s, const fsc_optim_config *optim) {
    int rc = setup(s, optim);
    if (rc) return rc;
    s->model = s->module = fsc_pipe_chunk_module(s->pipe, 0);
    rc = fsc_module_add_hook(s->module, FSC_HOOK_PRE_FORWARD, whole_hook, s->pipe);
    return rc ? rc : fsc_module_add_hook(s->module, FSC_HOOK_POST_FORWARD, whole_hook, s->pipe);
}

static void whole_teardown(fsc_strategy *s) {
    teardown(s);
    s->model = s->module = NULL; /* the pipe's, freed with it */
}

static void whole_set_no_sync(fsc_strategy *s, bool no_sync) {
    s->pipe_no_sync = no_sync;
}

/* Gradients accumulate whole over the micro-batches; the last reduces them. */
static int whole_run(fsc_strategy *s, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
                     float *loss) {
    if (!ctx->arena) return fsc_error(FSC_ERR_INVALID, "strategy fsdp: ctx->arena is NULL");
    fsc_arena_reset(ctx->arena);
    int rc = fn(s->module, ctx, 0, rows, user, loss);
    if (rc || s->pipe_no_sync) return rc;
    rc = fsc_pipe_reduce_grads(s->pipe);
    s->pipe_wait_s = fsc_pipe_get_stats(s->pipe).replica_s; /* gathers and reductions so far */
    if (s->world > 1) s->dp_allreduces++;
    return rc;
}

/* fsc-consolidate reads FSDP's flat shards; these are TP slices cut by dp. */
static int whole_save_sharded(fsc_strategy *s, const char *path, int n_meta,
                              const char *const *keys, const char *const *values) {
    (void)s, (void)n_meta, (void)keys, (void)values;
    return fsc_error(FSC_ERR_UNSUPPORTED,
                     "%s: fsdp with tensor parallelism writes no shard files; save the weights "
                     "(the one-process file) or a checkpoint instead",
                     path ? path : "(no path)");
}

const strategy_ops fsc_strategy_pipe_whole = {
    .name = "fsdp",
    .summary = "ZeRO-3 over the replicas of a tensor-parallel model: one pipeline stage each",
    .spans_ranks = true,
    .zero_stage = 3,
    .setup = whole_setup,
    .teardown = whole_teardown,
    .set_no_sync = whole_set_no_sync,
    .run = whole_run,
    .save_sharded = whole_save_sharded,
    PIPE_OPS,
};
