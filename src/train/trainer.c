/* The trainer: micro-batches in the documented data order, fp16 loss
 * scaling, global-norm clipping, the schedule and the update, for whichever
 * strategy the config names. Nothing here knows a strategy by name. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/io.h"
#include "fsc/profile.h"
#include "fsc/sharded_grad_scaler.h"
#include "trainer_internal.h"

static int check_config(const fsc_trainer_config *c) {
    if (c->batch < 1) return fsc_error(FSC_ERR_INVALID, "trainer: batch %d must be >= 1", c->batch);
    if (c->grad_accum < 0)
        return fsc_error(FSC_ERR_INVALID, "trainer: grad_accum %d must be >= 0", c->grad_accum);
    if (!(c->targets_per_sample >= 0))
        return fsc_error(FSC_ERR_INVALID, "trainer: targets_per_sample %g must be >= 0",
                         c->targets_per_sample);
    if (!(c->clip >= 0))
        return fsc_error(FSC_ERR_INVALID, "trainer: clip %g must be >= 0", c->clip);
    const bool piped = c->strategy.pipe.stages > 1;
    if (!piped && !c->loss) return fsc_error(FSC_ERR_INVALID, "trainer: the loss function is NULL");
    if (piped && (!c->pipe_input || !c->pipe_loss))
        return fsc_error(FSC_ERR_INVALID, "trainer: a pipeline needs pipe_input and pipe_loss");
    if (piped && c->strategy.pipe.micros &&
        c->strategy.pipe.micros != (c->grad_accum ? c->grad_accum : 1))
        return fsc_error(FSC_ERR_INVALID,
                         "trainer: the pipeline's %d micro-batches are the step's grad_accum (%d): "
                         "leave pipe.micros 0",
                         c->strategy.pipe.micros, c->grad_accum);
    if (c->strategy.threads > c->batch && fsc_strategy_takes(c->strategy.name, "threads"))
        return fsc_error(FSC_ERR_INVALID, "trainer: batch %d cannot be split across %d threads",
                         c->batch, c->strategy.threads);
    if (c->schedule.max_lr > 0) {
        int rc = fsc_lr_schedule_check(&c->schedule);
        if (rc) return fsc_error_context(rc, "trainer: schedule: ");
    }
    return FSC_OK;
}

fsc_trainer *fsc_trainer_new(fsc_module *model, const fsc_trainer_config *cfg) {
    if (!cfg) {
        fsc_error(FSC_ERR_INVALID, "trainer: config is NULL");
        return NULL;
    }
    if (check_config(cfg)) return NULL;
    fsc_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        fsc_error(FSC_ERR_NOMEM, "trainer: out of memory");
        return NULL;
    }
    t->cfg = *cfg;
    if (!t->cfg.grad_accum) t->cfg.grad_accum = 1;
    if (!(t->cfg.targets_per_sample > 0)) t->cfg.targets_per_sample = 1;
    fsc_strategy_options so = cfg->strategy;
    if (so.pipe.stages > 1 && !so.pipe.micros) so.pipe.micros = t->cfg.grad_accum;
    if (cfg->adascale && trainer_ada_begin(t, &so)) {
        fsc_trainer_free(t);
        return NULL;
    }
    t->s = fsc_strategy_new(model, &cfg->optim, &so);
    if (t->s && t->ada && trainer_ada_ready(t)) {
        fsc_trainer_free(t);
        return NULL;
    }
    bool fp16 = cfg->strategy.compute_dtype == FSC_DTYPE_F16;
    if (t->s && fp16 && !(t->scaler = fsc_grad_scaler_new(cfg->grad_scaler)))
        fsc_error_context(FSC_ERR_INVALID, "trainer: grad scaler: ");
    if (t->s && (!fp16 || t->scaler) && !(t->arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20)))
        fsc_error(FSC_ERR_NOMEM, "trainer: out of memory");
    if (!t->arena || trainer_async_begin(t)) {
        fsc_trainer_free(t);
        return NULL;
    }
    /* bf16: each weight rounded once per step where parameters stay in place
     * (under ZeRO-3, FSDP gathers them into reused buffers, in bf16 already) */
    fsc_strategy_info info;
    if (cfg->strategy.compute_dtype == FSC_DTYPE_BF16 && !fsc_strategy_info_get(so.name, &info) &&
        info.zero_stage < 3)
        fsc_bf16_weight_cache_set(true);
    return t;
}

void fsc_trainer_free(fsc_trainer *t) {
    if (!t) return;
    if (t->cfg.strategy.compute_dtype == FSC_DTYPE_BF16) fsc_bf16_weight_cache_set(false);
    trainer_async_free(t); /* before the strategy: it holds the strategy's groups */
    fsc_strategy_free(t->s);
    trainer_ada_free(t);
    fsc_grad_scaler_free(t->scaler);
    fsc_arena_free(t->arena);
    free(t);
}

fsc_strategy *fsc_trainer_strategy(fsc_trainer *t) {
    return t->s;
}
fsc_arena *fsc_trainer_arena(fsc_trainer *t) {
    return t->arena;
}
int64_t fsc_trainer_get_step(const fsc_trainer *t) {
    return t->step;
}
fsc_grad_scaler *fsc_trainer_grad_scaler(fsc_trainer *t) {
    return t->scaler;
}

double fsc_trainer_progress(const fsc_trainer *t) {
    return t->ada ? trainer_ada_progress(t) : (double)t->step;
}

double fsc_trainer_lr(const fsc_trainer *t, int64_t s) {
    return t->cfg.schedule.max_lr > 0 ? fsc_lr_schedule(&t->cfg.schedule, s) : t->cfg.optim.lr;
}

/* A dp thread (or the whole micro-batch) runs the user's loss on its rows. */
typedef struct {
    fsc_trainer *t;
    fsc_micro_batch mb;
} micro_call;

static int run_rows(fsc_module *m, const fsc_ctx *ctx, int row0, int rows, void *user,
                    float *loss) {
    micro_call *c = user;
    fsc_micro_batch mb = c->mb;
    mb.row0 = row0, mb.rows = rows;
    return c->t->cfg.loss(m, ctx, &mb, c->t->cfg.user, loss);
}

fsc_micro_batch trainer_micro_batch(const fsc_trainer *t, int64_t step, int k, double norm) {
    const int B = t->cfg.batch, K = t->cfg.grad_accum;
    const int rank = fsc_strategy_rank(t->s), world = fsc_strategy_world(t->s);
    return (fsc_micro_batch){.step = step,
                             .micro = k,
                             .micros = K,
                             .rank = rank,
                             .world = world,
                             .batch = B,
                             .rows = B,
                             .sample0 = fsc_batch_first_sample(step, k, rank, B, K, world),
                             .norm = norm};
}

/* Under a pipeline, the callbacks' view of the step. */
typedef struct {
    fsc_trainer *t;
    double norm;
} pipe_call;

static fsc_micro_batch pipe_micro(const pipe_call *c, int k) {
    return trainer_micro_batch(c->t, c->t->step, k, c->norm);
}

static int pipe_input(void *user, int k, fsc_tensor *x) {
    pipe_call *c = user;
    fsc_micro_batch mb = pipe_micro(c, k);
    int rc = c->t->cfg.load ? c->t->cfg.load(&mb, c->t->cfg.user) : FSC_OK;
    return rc ? rc : c->t->cfg.pipe_input(&mb, c->t->cfg.user, x);
}

static int pipe_loss(void *user, int k, fsc_tensor *y, fsc_arena *arena, float *loss) {
    pipe_call *c = user;
    fsc_micro_batch mb = pipe_micro(c, k);
    int rc = c->t->cfg.load ? c->t->cfg.load(&mb, c->t->cfg.user) : FSC_OK;
    return rc ? rc : c->t->cfg.pipe_loss(&mb, c->t->cfg.user, y, arena, loss);
}

static int pipe_targets(void *user, int k, fsc_head_loss *hl) {
    pipe_call *c = user;
    fsc_micro_batch mb = pipe_micro(c, k);
    int rc = c->t->cfg.load ? c->t->cfg.load(&mb, c->t->cfg.user) : FSC_OK;
    hl->norm = mb.norm;
    return rc ? rc : c->t->cfg.pipe_targets(&mb, c->t->cfg.user, &hl->targets, &hl->ignore_index);
}

static int64_t pipe_sample0(void *user, int k) {
    const pipe_call *c = user;
    fsc_micro_batch mb = pipe_micro(c, k);
    return c->t->cfg.pipe_sample0 ? c->t->cfg.pipe_sample0(&mb, c->t->cfg.user) : mb.sample0;
}

/* bf16 mixed precision is autocast under every strategy: the GEMMs in
 * bf16 with fp32 accumulation (fsc_ctx.autocast); fp16 is FSDP's alone. */
static fsc_dtype autocast(const fsc_trainer_config *c) {
    return c->strategy.compute_dtype == FSC_DTYPE_BF16 ? FSC_DTYPE_BF16 : FSC_DTYPE_F32;
}

/* The whole step through the strategy's pipeline; *loss gets this replica's. */
static int pipeline_step(fsc_trainer *t, double scale, double *loss) {
    const fsc_trainer_config *c = &t->cfg;
    const int world = fsc_strategy_world(t->s);
    pipe_call call = {
        .t = t, .norm = (double)c->batch * c->grad_accum * world * c->targets_per_sample / scale};
    fsc_pipe_io io = {.input = pipe_input,
                      .loss = pipe_loss,
                      .targets = c->pipe_targets ? pipe_targets : NULL,
                      .sample0 = pipe_sample0,
                      .user = &call};
    fsc_ctx ctx = {.training = true,
                   .seed = c->strategy.seed,
                   .step = t->step,
                   .keyed = true,
                   .autocast = autocast(c),
                   .seq = c->pipe_seq,
                   .attention = c->attention};
    float part = 0;
    int rc = fsc_strategy_run_pipeline(t->s, &ctx, &io, &part);
    *loss += part / scale;
    return rc;
}

/* Every micro-batch of the step; *loss gets this rank's share. */
static int micro_steps(fsc_trainer *t, double scale, double *loss) {
    const fsc_trainer_config *c = &t->cfg;
    const int B = c->batch, K = c->grad_accum, world = fsc_strategy_world(t->s);
    const double targets = (double)B * K * world * c->targets_per_sample;
    for (int k = 0; k < K; k++) {
        micro_call call = {.t = t, .mb = trainer_micro_batch(t, t->step, k, targets / scale)};
        FSC_PROF_BEGIN(FSC_PROF_DATA, "load batch");
        int rc = c->load ? c->load(&call.mb, c->user) : FSC_OK;
        FSC_PROF_END();
        if (rc) return rc;
        fsc_ctx ctx = {.arena = t->arena,
                       .training = true,
                       .keyed = true,
                       .seed = c->strategy.seed,
                       .step = t->step,
                       .sample0 = call.mb.sample0,
                       .autocast = autocast(c),
                   .attention = c->attention};
        float part = 0;
        if (t->ada) trainer_ada_before_micro(t);
        FSC_PROF_BEGIN(FSC_PROF_OTHER, "micro-batch");
        rc = fsc_strategy_forward_backward(t->s, &ctx, k, K, B, run_rows, &call, &part);
        FSC_PROF_END();
        if (rc) return rc;
        if (t->ada) trainer_ada_after_micro(t, k);
        *loss += part / scale;
    }
    return FSC_OK;
}

static int trainer_step(fsc_trainer *t, fsc_step_result *r);

int fsc_trainer_step(fsc_trainer *t, fsc_step_result *r) {
    if (!t || !r) return fsc_error(FSC_ERR_INVALID, "trainer: step needs a trainer and a result");
    /* a background checkpoint's progress: its failure ends training here */
    int rc = trainer_async_poll(t, false);
    if (rc) return rc;
    FSC_PROF_BEGIN(FSC_PROF_STEP, "step");
    rc = trainer_step(t, r);
    FSC_PROF_END();
    return rc;
}

static int trainer_step(fsc_trainer *t, fsc_step_result *r) {
    const fsc_trainer_config *c = &t->cfg;
    const double t0 = fsc_now(), wait0 = fsc_strategy_get_stats(t->s).wait_s;
    /* fp16: the loss (so every gradient) is multiplied by the scale, simply
     * by dividing the normaliser */
    const double scale = t->scaler ? fsc_grad_scaler_get_scale(t->scaler) : 1.0;
    fsc_group *g = fsc_strategy_group(t->s);
    double loss = 0;
    if (t->ada) trainer_ada_begin_step(t);
    /* whatever wrote parameters since the last step (averaging, a resume, a
     * user's load) has not left a stale bf16 copy behind */
    fsc_weights_changed();
    fsc_strategy_zero_grad(t->s);
    int rc =
        c->strategy.pipe.stages > 1 ? pipeline_step(t, scale, &loss) : micro_steps(t, scale, &loss);
    if (!rc && fsc_strategy_world(t->s) > 1) { /* this rank's share -> the global mean */
        float share = (float)loss;
        rc = fsc_group_allreduce(g, &share, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM);
        loss = share;
    }
    if (!rc && c->after_backward) rc = c->after_backward(t, c->user);
    if (rc) return rc;
    *r = (fsc_step_result){.loss = loss, .loss_scale = t->scaler ? scale : 0};
    bool skip = false;
    if (t->scaler) { /* unscale this rank's part; every rank learns of any inf */
        int nr;
        const fsc_optim_range *ranges = fsc_strategy_grad_ranges(t->s, &nr);
        rc = fsc_sharded_grad_scaler_unscale(t->scaler, g, ranges, nr, &skip);
        if (!rc) rc = fsc_grad_scaler_update(t->scaler, skip);
        if (rc) return rc;
    }
    float gnorm = 0;
    if (!skip && (c->clip > 0 || !c->skip_grad_norm || t->ada)) {
        FSC_PROF_BEGIN(FSC_PROF_OPTIM, "clip grad norm");
        rc = fsc_strategy_clip_grad_norm(t->s, c->clip > 0 ? c->clip : FLT_MAX, &gnorm);
        FSC_PROF_END();
    }
    if (!skip && (rc == FSC_ERR_NUMERIC || !isfinite(loss)))
        return fsc_error(FSC_ERR_NUMERIC,
                         "step %lld: loss %g, gradient norm %g: training diverged (lower the "
                         "learning rate or clip the gradient norm)",
                         (long long)t->step + 1, loss, (double)gnorm);
    if (rc) return rc;
    /* AdaScale reads the schedule at the scale-invariant step */
    r->base_lr = fsc_trainer_lr(t, t->ada ? (int64_t)floor(trainer_ada_progress(t)) : t->step);
    r->gain = 1;
    if (t->ada && !skip) {
        if ((rc = trainer_ada_update(t, gnorm, c->clip, scale, &r->gain))) return rc;
    }
    r->lr = skip ? fsc_strategy_get_lr(t->s) : r->base_lr * r->gain;
    if (!skip) {
        rc = fsc_strategy_set_lr(t->s, r->lr);
        FSC_PROF_BEGIN(FSC_PROF_OPTIM, "optimizer step");
        if (!rc) rc = fsc_strategy_step(t->s);
        FSC_PROF_END();
        if (rc) return rc;
        if (t->ada) trainer_ada_advance(t, r->gain);
    }
    t->step++;
    r->progress = fsc_trainer_progress(t);
    r->skipped = skip;
    r->grad_norm = skip ? INFINITY : gnorm;
    r->seconds = fsc_now() - t0;
    r->comm_wait_s = fsc_strategy_get_stats(t->s).wait_s - wait0;
    return FSC_OK;
}

int fsc_trainer_save_weights(fsc_trainer *t, const char *path, int n_meta, const char *const *keys,
                             const char *const *values) {
    FSC_PROF_BEGIN(FSC_PROF_CKPT, "save weights");
    int rc = fsc_strategy_save_weights(t->s, path, 0, n_meta, keys, values);
    FSC_PROF_END();
    return rc;
}
