/* Evaluation through the strategy: forward only, over held-out batches laid
 * out as training steps are, each rank its own rows, one sum at the end.
 *
 * The one idea: the module a strategy trains through is also the one to
 * evaluate through. Its forward with ctx->training false needs nothing
 * more: a DDP or ShardedDDP wrapper passes forward to the model, and FSDP's
 * hooks gather each unit for its forward and free it right after (no
 * backward follows), so a sharded model is never whole on any rank. A
 * pipeline has no whole module: each batch goes through its stages by a
 * forward-only schedule, the trainer's pipe_input and pipe_loss (or
 * pipe_targets) at its ends as in training. */
#include <stdlib.h>

#include "fsc/io.h"
#include "trainer_internal.h"

/* Batch k of an evaluation: its micro-batches as training step k lays them out. */
typedef struct {
    fsc_trainer *t;
    const fsc_trainer_eval_config *cfg;
    int64_t k;
    double norm;
} eval_call;

static fsc_micro_batch eval_micro(const eval_call *c, int j) {
    return trainer_micro_batch(c->t, c->k, j, c->norm);
}

static int eval_input(void *user, int j, fsc_tensor *x) {
    const eval_call *c = user;
    fsc_micro_batch mb = eval_micro(c, j);
    int rc = c->cfg->load ? c->cfg->load(&mb, c->cfg->user) : FSC_OK;
    return rc ? rc : c->t->cfg.pipe_input(&mb, c->t->cfg.user, x);
}

static int eval_loss(void *user, int j, fsc_tensor *y, fsc_arena *arena, float *loss) {
    const eval_call *c = user;
    fsc_micro_batch mb = eval_micro(c, j);
    int rc = c->cfg->load ? c->cfg->load(&mb, c->cfg->user) : FSC_OK;
    return rc ? rc : c->t->cfg.pipe_loss(&mb, c->t->cfg.user, y, arena, loss);
}

static int eval_targets(void *user, int j, fsc_head_loss *hl) {
    const eval_call *c = user;
    fsc_micro_batch mb = eval_micro(c, j);
    int rc = c->cfg->load ? c->cfg->load(&mb, c->cfg->user) : FSC_OK;
    hl->norm = mb.norm;
    return rc ? rc : c->t->cfg.pipe_targets(&mb, c->t->cfg.user, &hl->targets, &hl->ignore_index);
}

static int64_t eval_sample0(void *user, int j) {
    return eval_micro(user, j).sample0;
}

/* Every batch through the pipeline; *sum gets this replica's share. */
static int eval_pipeline(fsc_trainer *t, const fsc_trainer_eval_config *cfg, double norm,
                         double *sum) {
    eval_call call = {.t = t, .cfg = cfg, .norm = norm};
    const fsc_pipe_io io = {.input = eval_input,
                            .loss = eval_loss,
                            .targets = t->cfg.pipe_targets ? eval_targets : NULL,
                            .sample0 = eval_sample0,
                            .user = &call};
    int rc = FSC_OK;
    for (call.k = 0; call.k < cfg->batches && !rc; call.k++) {
        fsc_ctx ctx = {
            .training = false, .keyed = true, .seed = t->cfg.strategy.seed, .step = call.k,
            .attention = t->cfg.attention};
        float part = 0;
        rc = fsc_strategy_run_pipeline(t->s, &ctx, &io, &part);
        *sum += part;
    }
    return rc;
}

int fsc_trainer_eval(fsc_trainer *t, const fsc_trainer_eval_config *cfg, double *loss) {
    const bool piped = t && fsc_strategy_get_pipe(t->s);
    if (!t || !cfg || !loss || (!cfg->loss && !piped) || cfg->batches < 1)
        return fsc_error(FSC_ERR_INVALID,
                         "trainer eval: needs a trainer, a loss function (but under a "
                         "pipeline), batches >= 1 (%d) and a result",
                         cfg ? cfg->batches : 0);
    const int K = t->cfg.grad_accum, world = fsc_strategy_world(t->s);
    const double norm = (double)cfg->batches * t->cfg.batch * K * world * t->cfg.targets_per_sample;
    fsc_module *m = fsc_strategy_module(t->s);
    double sum = 0;
    int rc = piped ? eval_pipeline(t, cfg, norm, &sum) : FSC_OK;
    eval_call call = {.t = t, .cfg = cfg, .norm = norm};
    for (call.k = 0; call.k < cfg->batches && !rc && !piped; call.k++)
        for (int j = 0; j < K && !rc; j++) {
            fsc_micro_batch mb = eval_micro(&call, j);
            if (cfg->load && (rc = cfg->load(&mb, cfg->user))) break;
            fsc_arena_reset(t->arena);
            fsc_ctx ctx = {.arena = t->arena,
                           .training = false,
                           .keyed = true,
                           .seed = t->cfg.strategy.seed,
                           .step = call.k,
                           .sample0 = mb.sample0,
                           .attention = t->cfg.attention};
            float part = 0;
            rc = cfg->loss(m, &ctx, &mb, cfg->user, &part);
            sum += part;
        }
    fsc_arena_reset(t->arena);
    if (rc) return rc;
    if (world > 1) { /* every replica's share -> the mean over the whole held-out set */
        float total = (float)sum;
        if ((rc = fsc_group_allreduce(fsc_strategy_group(t->s), &total, 1, FSC_DTYPE_F32,
                                      FSC_REDUCE_SUM)))
            return rc;
        sum = total;
    }
    *loss = sum;
    return FSC_OK;
}
