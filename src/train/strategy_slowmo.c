/* The slowmo row: FairScale's SlowMoDistributedDataParallel with Local SGD
 * as the base algorithm (Wang et al., ICLR 2020). Every rank holds the whole
 * model and steps on its own gradients; no gradient is ever reduced. Every
 * localsgd_frequency steps the parameters are averaged over the ranks; every
 * slowmo_frequency steps the average takes the slow-momentum outer update
 * instead, with the outer state (the parameters at the last outer step, and
 * the slow momentum) sharded over the ranks as FairScale's memory-efficient
 * mode shards it: each shard is averaged onto its owner (a reduce), updated
 * there, and broadcast back.
 *
 * The one idea: fsc's losses are normalised by the global batch, so a rank's
 * gradient is its local mean's 1/world share; the last micro-step scales it
 * by world, and the local optimizer then steps on the local mean. Averaging
 * plain SGD steps of local means every step is exactly DDP's step on the
 * global mean, which is what the tests hold it to. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/kernels.h"
#include "fsc/weights.h"
#include "slowmo_internal.h"


static int setup(fsc_strategy *s, const fsc_optim_config *optim) {
    const fsc_strategy_options *o = &s->opt;
    struct slowmo_state *st = s->slowmo = calloc(1, sizeof *st);
    if (!st) return fsc_error(FSC_ERR_NOMEM, "slowmo: out of memory");
    st->localsgd_every = o->localsgd_frequency ? o->localsgd_frequency : 3;
    st->slowmo_every = o->slowmo_frequency ? o->slowmo_frequency : 48;
    st->momentum = o->slowmo_momentum;
    st->lr = o->slowmo_lr ? o->slowmo_lr : 1.0;
    st->outer = st->lr != 1.0 || st->momentum != 0.0;
    if (st->localsgd_every < 1 || st->slowmo_every < 1 ||
        (st->outer && st->slowmo_every % st->localsgd_every))
        return fsc_error(FSC_ERR_INVALID,
                         "slowmo: localsgd_frequency %d and slowmo_frequency %d must be >= 1, the "
                         "second a multiple of the first",
                         st->localsgd_every, st->slowmo_every);
    if (!(st->momentum >= 0 && st->momentum < 1) || !(st->lr > 0) || isinf(st->lr))
        return fsc_error(FSC_ERR_INVALID,
                         "slowmo: slowmo_momentum %g must be in [0, 1) and slowmo_lr %g > 0",
                         st->momentum, st->lr);
    int rc = strategy_bind(s, &s->params);
    s->bound = !rc;
    /* every replica starts from rank 0's weights, as DDP's do */
    if (!rc && s->world > 1)
        rc = fsc_group_broadcast(s->group, s->params.data, s->params.numel, FSC_DTYPE_F32, 0);
    if (rc) return rc;
    s->oss = fsc_oss_new(optim, &s->params, fsc_group_self(), &(fsc_oss_options){0});
    if (!s->oss) return fsc_error_context(FSC_ERR_INVALID, "optimizer: ");
    s->optim = fsc_oss_local(s->oss);
    if (!st->outer) return FSC_OK;
    const int64_t P = s->params.numel;
    st->shard = (P + s->world - 1) / s->world;
    st->begin = st->shard * s->rank < P ? st->shard * s->rank : P;
    st->end = st->begin + st->shard < P ? st->begin + st->shard : P;
    const size_t bytes = sizeof(float) * (size_t)(st->end - st->begin + 1);
    st->old = fsc_mem_alloc(FSC_MEM_OPTIM, bytes);
    st->buf = fsc_mem_alloc(FSC_MEM_OPTIM, bytes);
    if (!st->old || !st->buf) return fsc_error(FSC_ERR_NOMEM, "slowmo: outer state: out of memory");
    memcpy(st->old, s->params.data + st->begin, sizeof(float) * (size_t)(st->end - st->begin));
    memset(st->buf, 0, bytes);
    return FSC_OK;
}

static void teardown(fsc_strategy *s) {
    if (s->slowmo) fsc_mem_free(s->slowmo->old), fsc_mem_free(s->slowmo->buf);
    free(s->slowmo);
    fsc_oss_free(s->oss);
    if (s->bound) fsc_params_free(&s->params);
}

static void set_no_sync(fsc_strategy *s, bool no_sync) {
    s->slowmo->last_micro = !no_sync;
}

/* fn on the model; after the step's last micro-batch the accumulated
 * gradient (1/world of the local mean, by the global normaliser) becomes
 * the local mean. */
static int run(fsc_strategy *s, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
               float *loss) {
    if (!ctx->arena) return fsc_error(FSC_ERR_INVALID, "strategy slowmo: ctx->arena is NULL");
    fsc_arena_reset(ctx->arena);
    int rc = fn(s->module, ctx, 0, rows, user, loss);
    if (!rc && s->slowmo->last_micro && s->world > 1)
        fsc_scale(s->params.grad, (float)s->world, s->params.numel);
    return rc;
}

/* Each rank clips its own gradient by its own norm; *total is the root mean
 * square of the ranks' norms (one float all-reduced, so a non-finite
 * gradient anywhere fails every rank alike). */
static int clip(fsc_strategy *s, float max_norm, float *total) {
    float local = 0;
    int rc = fsc_oss_clip_grad_norm(s->oss, max_norm, false, &local);
    if (rc && rc != FSC_ERR_NUMERIC) return rc;
    float sq = isfinite(local) ? local * local : INFINITY;
    if (s->world > 1 && fsc_group_allreduce(s->group, &sq, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM))
        return FSC_ERR_MPI;
    if (total) *total = sqrtf(sq / (float)s->world);
    if (!isfinite(sq))
        return fsc_error(FSC_ERR_NUMERIC, "slowmo: a rank's gradient norm is not finite");
    return FSC_OK;
}

/* The outer update on this rank's shard of the averaged parameters p:
 * buf = beta buf + (old - p) / lr; old -= alpha lr buf; p = old. */
static void outer_update(struct slowmo_state *st, float *p, int64_t n, double base_lr) {
    const float inv = (float)(1.0 / base_lr), step = (float)(st->lr * base_lr);
    const float beta = (float)st->momentum;
    for (int64_t i = 0; i < n; i++) {
        st->buf[i] = beta * st->buf[i] + (st->old[i] - p[i]) * inv;
        st->old[i] -= step * st->buf[i];
        p[i] = st->old[i];
    }
}

/* Each shard averaged onto its owner, updated there, broadcast back. */
static int outer_step(fsc_strategy *s) {
    struct slowmo_state *st = s->slowmo;
    const double base_lr = fsc_optim_get_lr(s->optim);
    if (!(base_lr > 0))
        return fsc_error(FSC_ERR_INVALID,
                         "slowmo: the outer update divides by the learning rate, which is %g",
                         base_lr);
    const int64_t P = s->params.numel;
    for (int r = 0; r < s->world; r++) {
        int64_t b = st->shard * r < P ? st->shard * r : P, n = b + st->shard < P ? st->shard : P - b;
        if (n > 0 && fsc_group_reduce(s->group, s->params.data + b, n, FSC_DTYPE_F32,
                                      FSC_REDUCE_AVG, r))
            return FSC_ERR_MPI;
    }
    outer_update(st, s->params.data + st->begin, st->end - st->begin, base_lr);
    for (int r = 0; r < s->world; r++) {
        int64_t b = st->shard * r < P ? st->shard * r : P, n = b + st->shard < P ? st->shard : P - b;
        if (n > 0 && fsc_group_broadcast(s->group, s->params.data + b, n, FSC_DTYPE_F32, r))
            return FSC_ERR_MPI;
    }
    st->outer_steps++;
    return FSC_OK;
}

static int step(fsc_strategy *s) {
    struct slowmo_state *st = s->slowmo;
    int rc = fsc_oss_step(s->oss);
    if (rc) return rc;
    const int64_t t = ++st->updates;
    const double t0 = fsc_now();
    if (st->outer && t % st->slowmo_every == 0) {
        rc = outer_step(s); /* its reduce is the average (FairScale skips the all-reduce) */
    } else if (t % st->localsgd_every == 0 && s->world > 1) {
        rc = fsc_group_allreduce(s->group, s->params.data, s->params.numel, FSC_DTYPE_F32,
                                 FSC_REDUCE_AVG);
        st->averages++;
    }
    st->wait_s += fsc_now() - t0;
    return rc;
}

/* Root's status of a file it wrote alone, on every rank. */
static int root_wrote(const fsc_strategy *s, int root, int32_t rc) {
    if (s->world > 1 && fsc_group_broadcast(s->group, &rc, 1, FSC_DTYPE_I32, root))
        return FSC_ERR_MPI;
    return rc && s->rank != root ? fsc_error(rc, "rank %d could not write the file", root) : rc;
}

/* Rank root's replica: the ranks' agree right after an averaging step. */
static int save_weights(fsc_strategy *s, const char *path, int root, int n_meta,
                        const char *const *keys, const char *const *values) {
    int32_t rc = s->rank == root ? fsc_weights_save(path, &s->params, n_meta, keys, values) : 0;
    return root_wrote(s, root, rc);
}

static int load_weights(fsc_strategy *s, const char *path, int *n_unused) {
    int rc = fsc_weights_load(path, &s->params, n_unused);
    struct slowmo_state *st = s->slowmo;
    if (!rc && st->old) /* the outer update starts from the loaded weights */
        memcpy(st->old, s->params.data + st->begin, sizeof(float) * (size_t)(st->end - st->begin));
    return rc;
}

/* The local optimizers' states differ between ranks: root's is saved (the
 * file any strategy resumes from), and loaded by every rank; each rank's own
 * travels in the row's state file (strategy_slowmo_state.c). */
static int save_optim(fsc_strategy *s, const char *path, int root) {
    return root_wrote(s, root, s->rank == root ? fsc_oss_save_optim(s->oss, path, 0) : 0);
}

static int load_optim(fsc_strategy *s, const char *path) {
    return fsc_oss_load_optim(s->oss, path);
}

static void stats(const fsc_strategy *s, fsc_strategy_stats *out) {
    out->wait_s = s->slowmo->wait_s;
    out->reductions = s->slowmo->averages + s->slowmo->outer_steps * s->world;
}

const strategy_ops fsc_strategy_slowmo = {
    .name = "slowmo",
    .summary = "Local SGD: ranks step alone, parameters averaged every few steps, slow momentum",
    .spans_ranks = true,
    .local_steps = true,
    .accepts = OPT_SLOWMO,
    .setup = setup,
    .teardown = teardown,
    .set_no_sync = set_no_sync,
    .run = run,
    .clip = clip,
    .step = step,
    .save_weights = save_weights,
    .load_weights = load_weights,
    .save_optim = save_optim,
    .load_optim = load_optim,
    .save_state = slowmo_save_state,
    .load_state = slowmo_load_state,
    .stats = stats,
};
