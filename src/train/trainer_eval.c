/* Evaluation through the strategy: forward only, over held-out batches laid
 * out as training steps are, each rank its own rows, one sum at the end.
 *
 * The one idea: the module a strategy trains through is also the one to
 * evaluate through. Its forward with ctx->training false needs nothing
 * more: a DDP or ShardedDDP wrapper passes forward to the model, and FSDP's
 * hooks gather each unit for its forward and free it right after (no
 * backward follows), so a sharded model is never whole on any rank. */
#include <stdlib.h>

#include "fsc/io.h"
#include "trainer_internal.h"

int fsc_trainer_eval(fsc_trainer *t, const fsc_trainer_eval_config *cfg, double *loss) {
    if (!t || !cfg || !loss || !cfg->loss || cfg->batches < 1)
        return fsc_error(FSC_ERR_INVALID,
                         "trainer eval: needs a trainer, a loss function, batches >= 1 (%d) "
                         "and a result",
                         cfg ? cfg->batches : 0);
    if (fsc_strategy_get_pipe(t->s))
        return fsc_error(FSC_ERR_INVALID,
                         "trainer eval: strategy %s runs a pipeline, which "
                         "has no evaluation yet",
                         fsc_strategy_name(t->s));
    const int B = t->cfg.batch, K = t->cfg.grad_accum;
    const int rank = fsc_strategy_rank(t->s), world = fsc_strategy_world(t->s);
    const double norm = (double)cfg->batches * B * K * world * t->cfg.targets_per_sample;
    fsc_module *m = fsc_strategy_module(t->s);
    double sum = 0;
    int rc = FSC_OK;
    for (int k = 0; k < cfg->batches && !rc; k++)
        for (int j = 0; j < K && !rc; j++) {
            fsc_micro_batch mb = {.step = k,
                                  .micro = j,
                                  .micros = K,
                                  .rank = rank,
                                  .world = world,
                                  .batch = B,
                                  .rows = B,
                                  .sample0 = fsc_batch_first_sample(k, j, rank, B, K, world),
                                  .norm = norm};
            if (cfg->load && (rc = cfg->load(&mb, cfg->user))) break;
            fsc_arena_reset(t->arena);
            fsc_ctx ctx = {.arena = t->arena,
                           .training = false,
                           .keyed = true,
                           .seed = t->cfg.strategy.seed,
                           .step = k,
                           .sample0 = mb.sample0};
            float part = 0;
            rc = cfg->loss(m, &ctx, &mb, cfg->user, &part);
            sum += part;
        }
    fsc_arena_reset(t->arena);
    if (rc) return rc;
    if (world > 1) { /* every rank's share -> the mean over the whole held-out set */
        float total = (float)sum;
        if ((rc = fsc_group_allreduce(fsc_strategy_group(t->s), &total, 1, FSC_DTYPE_F32,
                                      FSC_REDUCE_SUM)))
            return rc;
        sum = total;
    }
    *loss = sum;
    return FSC_OK;
}
