/* The rows whose ranks hold the whole model: single, dp (threads), ddp, oss
 * (ZeRO-1) and sdp (ZeRO-2). Parameters are bound whole on every rank; the
 * optimizer is always an OSS, over the data-parallel group when optimizer
 * state is sharded (oss, sdp) and over this process otherwise, so optimizer
 * state is saved and loaded by global name the same way under every row and
 * world size. The rows differ only in the wrapper that reduces gradients. */
#include <stdlib.h>

#include "fsc/moe_parallel.h"
#include "fsc/weights.h"
#include "strategy_internal.h"

enum { DEFAULT_BUCKET_BYTES = 25000000 };

static size_t bucket_bytes(const fsc_strategy *s) {
    return s->opt.bucket_bytes ? s->opt.bucket_bytes : DEFAULT_BUCKET_BYTES;
}

/* Experts sharded over ranks (fsc/moe.h) need ddp over exactly their group. */
static int check_experts(fsc_strategy *s) {
    if (!fsc_moe_params_sharded(&s->params)) return FSC_OK;
    if (s->ops != &fsc_strategy_ddp)
        return fsc_error(FSC_ERR_INVALID,
                         "experts sharded over ranks (--moe-experts with more than one rank) "
                         "run under ddp only, not %s",
                         s->ops->name);
    int ep = fsc_moe_ep_size(s->model);
    if (ep != s->world)
        return fsc_error(FSC_ERR_INVALID,
                         "the experts are sharded over %d ranks but the data-parallel group has "
                         "%d: expert parallelism must span the ddp group",
                         ep, s->world);
    return FSC_OK;
}

static int bind(fsc_strategy *s) {
    int rc = strategy_bind(s, &s->params);
    s->bound = !rc;
    return rc ? rc : check_experts(s);
}

/* The OSS optimizer, over the group when `sharded`, else over this process. */
static int make_optim(fsc_strategy *s, const fsc_optim_config *optim, bool sharded) {
    fsc_oss_options oo = {.policy = s->opt.partition, .share_dtype = s->opt.share_dtype};
    s->oss = fsc_oss_new(optim, &s->params, sharded ? s->group : fsc_group_self(), &oo);
    if (!s->oss) return fsc_error_context(FSC_ERR_INVALID, "optimizer: ");
    s->optim = fsc_oss_local(s->oss);
    return FSC_OK;
}

static int bind_and_optim(fsc_strategy *s, const fsc_optim_config *optim, bool sharded) {
    int rc = bind(s);
    return rc ? rc : make_optim(s, optim, sharded);
}

static int setup_single(fsc_strategy *s, const fsc_optim_config *optim) {
    return bind_and_optim(s, optim, false);
}

static int setup_dp(fsc_strategy *s, const fsc_optim_config *optim) {
    if (!s->opt.make_replica)
        return fsc_error(FSC_ERR_INVALID,
                         "dp needs make_replica (a module with the model's layout)");
    int rc = bind_and_optim(s, optim, false);
    if (!rc)
        rc = fsc_dp_new(s->opt.make_replica, s->opt.replica_user, &s->params,
                        s->opt.threads > 0 ? s->opt.threads : 1, &s->dp);
    return rc;
}

/* DDP's wrap-time broadcast makes every replica rank 0's, before the
 * optimizer sees them. */
static int setup_ddp_like(fsc_strategy *s, const fsc_optim_config *optim, bool sharded) {
    int rc = bind(s);
    if (rc) return rc;
    fsc_ddp_options d = {.bucket_bytes = bucket_bytes(s),
                         .probe = s->opt.grad_probe,
                         .probe_user = s->opt.grad_probe_user};
    if (!(s->wrapper = fsc_ddp_wrap(s->model, &s->params, s->group, &d)))
        return FSC_ERR_INVALID; /* its message names DDP */
    s->module = s->wrapper;
    return make_optim(s, optim, sharded);
}

static int setup_ddp(fsc_strategy *s, const fsc_optim_config *optim) {
    return setup_ddp_like(s, optim, false);
}

static int setup_oss(fsc_strategy *s, const fsc_optim_config *optim) {
    return setup_ddp_like(s, optim, true);
}

static int setup_sdp(fsc_strategy *s, const fsc_optim_config *optim) {
    int rc = bind_and_optim(s, optim, true);
    if (rc) return rc;
    fsc_sdp_options so = {.bucket_bytes = bucket_bytes(s),
                          .reduce_dtype = s->opt.reduce_dtype,
                          .probe = s->opt.grad_probe,
                          .probe_user = s->opt.grad_probe_user};
    if (!(s->wrapper = fsc_sdp_wrap(s->model, &s->params, s->oss, &so)))
        return fsc_error_context(FSC_ERR_INVALID, "ShardedDDP: ");
    s->module = s->wrapper;
    return FSC_OK;
}

static void teardown(fsc_strategy *s) {
    fsc_module_free(s->wrapper); /* the wrapper only; it removes its hooks */
    fsc_dp_free(s->dp);
    fsc_oss_free(s->oss);
    if (s->bound) fsc_params_free(&s->params);
}

static void sdp_zero_grad(fsc_strategy *s) {
    fsc_sdp_zero_grad(s->wrapper); /* touching every gradient would bring them all back */
}

static void ddp_no_sync(fsc_strategy *s, bool no_sync) {
    fsc_ddp_set_no_sync(s->wrapper, no_sync);
}
static void sdp_no_sync(fsc_strategy *s, bool no_sync) {
    fsc_sdp_set_no_sync(s->wrapper, no_sync);
}

static int dp_run(fsc_strategy *s, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
                  float *loss) {
    return fsc_dp_run(s->dp, ctx, rows, fn, user, loss);
}

static int clip(fsc_strategy *s, float max_norm, float *total) {
    if (fsc_moe_params_sharded(&s->params)) /* each expert's norm counted once, on its rank */
        return fsc_moe_clip_grad_norm(&s->params, s->group, max_norm, total);
    return fsc_oss_clip_grad_norm(s->oss, max_norm, false, total);
}

static int step(fsc_strategy *s) {
    return fsc_oss_step(s->oss);
}

/* Replicas: every rank writes a share through MPI-IO, or root alone
 * (FSC_PARALLEL_IO=0, one process); the same bytes either way. */
static int save_weights(fsc_strategy *s, const char *path, int root, int n_meta,
                        const char *const *keys, const char *const *values) {
    if (fsc_moe_params_sharded(&s->params)) /* every rank's experts, by global name */
        return fsc_moe_save_weights(&s->params, s->group, path, root, n_meta, keys, values);
    return fsc_weights_save_group(s->group, root, path, &s->params, n_meta, keys, values);
}

static int load_weights(fsc_strategy *s, const char *path, int *n_unused) {
    return fsc_weights_load(path, &s->params, n_unused);
}

/* Unsharded state, alike on every rank: saved as the weights are; with
 * experts over the ranks, each expert's state by its global name. */
static int save_optim_local(fsc_strategy *s, const char *path, int root) {
    if (fsc_moe_params_sharded(&s->params))
        return fsc_moe_save_optim(&s->params, s->optim, s->group, path, root);
    return fsc_oss_save_optim_replicated(s->oss, s->group, path, root);
}

/* Sharded state: each owner writes its pieces through MPI-IO, or they
 * stream to root (FSC_PARALLEL_IO=0). Collective. */
static int save_optim_sharded(fsc_strategy *s, const char *path, int root) {
    return fsc_oss_save_optim(s->oss, path, root);
}

static int load_optim(fsc_strategy *s, const char *path) {
    if (fsc_moe_params_sharded(&s->params)) /* this rank's experts, by global name */
        return fsc_moe_load_optim(&s->params, s->optim, s->group, path);
    return fsc_oss_load_optim(s->oss, path);
}

static void ddp_stats(const fsc_strategy *s, fsc_strategy_stats *out) {
    fsc_ddp_stats st = fsc_ddp_get_stats(s->wrapper);
    out->wait_s = st.wait_s, out->reductions = st.allreduces;
}

static void sdp_stats(const fsc_strategy *s, fsc_strategy_stats *out) {
    fsc_sdp_stats st = fsc_sdp_get_stats(s->wrapper);
    out->wait_s = st.wait_s, out->reductions = st.reduces;
}

#define REPLICATED_OPS                                                                             \
    .teardown = teardown, .clip = clip, .step = step, .save_weights = save_weights,                \
    .load_weights = load_weights, .load_optim = load_optim

const strategy_ops fsc_strategy_single = {
    .name = "single",
    .summary = "one process",
    .setup = setup_single,
    .save_optim = save_optim_local,
    REPLICATED_OPS,
};

const strategy_ops fsc_strategy_dp = {
    .name = "dp",
    .summary = "threads of one process, each with a replica (split micro-batches)",
    .accepts = OPT_THREADS,
    .setup = setup_dp,
    .run = dp_run,
    .save_optim = save_optim_local,
    REPLICATED_OPS,
};

const strategy_ops fsc_strategy_ddp = {
    .name = "ddp",
    .summary = "one process per rank, gradients all-reduced in buckets during backward",
    .spans_ranks = true,
    .composes_with_pipe = true,
    .accepts = OPT_BUCKET | OPT_PROBE,
    .setup = setup_ddp,
    .set_no_sync = ddp_no_sync,
    .save_optim = save_optim_local,
    .stats = ddp_stats,
    REPLICATED_OPS,
};

const strategy_ops fsc_strategy_oss = {
    .name = "oss",
    .summary = "ddp + optimizer state sharded over the ranks (ZeRO-1)",
    .spans_ranks = true,
    .zero_stage = 1,
    .composes_with_pipe = true,
    .accepts = OPT_BUCKET | OPT_PARTITION | OPT_PROBE,
    .setup = setup_oss,
    .set_no_sync = ddp_no_sync,
    .save_optim = save_optim_sharded,
    .stats = ddp_stats,
    REPLICATED_OPS,
};

const strategy_ops fsc_strategy_sdp = {
    .name = "sdp",
    .summary = "ShardedDDP: gradients reduced to their owners, sharded too (ZeRO-2)",
    .spans_ranks = true,
    .zero_stage = 2,
    .composes_with_pipe = true,
    .accepts = OPT_BUCKET | OPT_PARTITION | OPT_REDUCE | OPT_PROBE,
    .setup = setup_sdp,
    .zero_grad = sdp_zero_grad,
    .set_no_sync = sdp_no_sync,
    .save_optim = save_optim_sharded,
    .stats = sdp_stats,
    REPLICATED_OPS,
};
