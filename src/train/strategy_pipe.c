/* The pipeline row: pipe.stages consecutive ranks of the group run one
 * pipeline (fsc/pipe.h) over the model's layers, and the size / stages
 * replicas of it are data-parallel: after the schedule, each stage's
 * gradients are reduced over the ranks that run the same stage, and the
 * named row's ZeRO stage says what those ranks shard (ddp: nothing; oss:
 * optimizer state; sdp: and gradients; fsdp: and parameters between
 * steps), after the pipeline rather than overlapped with it. The
 * strategy's group, rank and world are then the data-parallel ones, which
 * is what the trainer's data order and loss normaliser need. */
#include <stdlib.h>

#include "strategy_internal.h"

static int setup(fsc_strategy *s, const fsc_optim_config *optim) {
    const int P = s->opt.pipe.stages, N = s->world, r = s->rank;
    if (N % P)
        return fsc_error(FSC_ERR_INVALID, "%d ranks cannot form pipelines of %d stages", N, P);
    fsc_group *all = s->group;
    /* replica r / P holds ranks [P * (r / P), P * (r / P) + P): stage ranks adjacent */
    int rc = fsc_group_split(all, r / P, r % P, "pipe", &s->pp_group);
    if (!rc) rc = fsc_group_split(all, r % P, r / P, "pipe-dp", &s->dp_group);
    if (rc) return rc;
    const fsc_pipe_kind kind = s->opt.pipe.schedule;
    const int chunks =
        kind == FSC_PIPE_INTERLEAVED ? (s->opt.pipe.chunks ? s->opt.pipe.chunks : 2) : 1;
    const int micros = s->opt.pipe.micros > 0 ? s->opt.pipe.micros : 1;
    if ((rc = fsc_pipe_schedule_make(kind, P, chunks, micros, &s->sched))) return rc;
    fsc_pipe_options po = {.layers = s->opt.pipe.layers,
                           .make_stage = s->opt.pipe.make_stage,
                           .stage_user = s->opt.pipe.stage_user,
                           .balance = s->opt.pipe.balance,
                           .act_ndim = s->opt.pipe.act_ndim,
                           .seed = s->opt.seed,
                           .checkpoint = s->opt.pipe.checkpoint,
                           .dp = N > P ? s->dp_group : NULL,
                           .mesh = all,
                           .sharding = (fsc_pipe_sharding)s->pipe_zero};
    for (int d = 0; d < FSC_MAX_DIMS; d++) po.act_shape[d] = s->opt.pipe.act_shape[d];
    if (!(s->pipe = fsc_pipe_new(s->pp_group, s->sched, optim, &po))) return FSC_ERR_INVALID;
    s->optim = fsc_pipe_optim(s->pipe);
    s->group = s->dp_group;
    s->rank = fsc_group_rank(s->dp_group);
    s->world = fsc_group_size(s->dp_group);
    return FSC_OK;
}

static void teardown(fsc_strategy *s) {
    fsc_pipe_free(s->pipe);
    fsc_pipe_schedule_free(s->sched);
    fsc_group_free(s->pp_group);
    fsc_group_free(s->dp_group);
}

static void zero_grad(fsc_strategy *s) {
    fsc_pipe_zero_grad(s->pipe);
}

static int run_pipeline(fsc_strategy *s, const fsc_ctx *ctx, const fsc_pipe_io *io, float *loss) {
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

/* Replica 0's pipeline: the others have the same schedule. */
static int write_trace(fsc_strategy *s, const char *path) {
    int rc = s->rank == 0 ? fsc_pipe_write_trace(s->pipe, path) : FSC_OK;
    int32_t status = rc;
    if (s->world > 1 && fsc_group_broadcast(s->dp_group, &status, 1, FSC_DTYPE_I32, 0))
        return FSC_ERR_MPI;
    return status && !rc ? fsc_error(status, "pipeline: replica 0 could not write %s", path) : rc;
}

static void stats(const fsc_strategy *s, fsc_strategy_stats *out) {
    out->wait_s = s->pipe_wait_s;
    out->reductions = s->dp_allreduces;
    out->messages = s->pipe_messages;
}

const strategy_ops fsc_strategy_pipe = {
    .name = "pipe",
    .summary = "pipeline stages over consecutive ranks, data-parallel (ZeRO) replicas of them",
    .spans_ranks = true,
    .pipeline = true,
    .setup = setup,
    .teardown = teardown,
    .zero_grad = zero_grad,
    .run_pipeline = run_pipeline,
    .clip = clip,
    .step = step,
    .save_weights = save_weights,
    .load_weights = load_weights,
    .save_optim = save_optim,
    .load_optim = load_optim,
    .stats = stats,
    .write_trace = write_trace,
};
