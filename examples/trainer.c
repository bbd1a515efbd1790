/* The trainer with the strategy named on the command line: one call per
 * optimizer step (micro-batches in the data-order contract, global-norm
 * clipping, the update), the same program for every strategy. FairScale has
 * no single equivalent; the closest is choosing the wrapper by name:
 *
 *     model = {"ddp": DDP, "sdp": ShardedDDP, "fsdp": FSDP}[name](model)
 *
 * Run: mpiexec -n 2 build/examples/example_trainer fsdp (ddp, oss, sdp, fsdp
 * span the ranks; single and dp run on one process: example_trainer dp).
 * Exits non-zero unless the final loss is below half the first
 * (examples/common.h); 2 for a missing or unknown strategy. */
#include "common.h"
#include "fsc/trainer.h"

static int loss_fn(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                   float *loss) {
    (void)user;
    return mse(m, ctx, mb->rows, mb->norm, loss);
}

int main(int argc, char **argv) {
    CHECK(fsc_dist_init(&argc, &argv, NULL));
    const char *name = argc > 1 ? argv[1] : "";
    fsc_strategy_info info;
    if (fsc_strategy_info_get(name, &info)) {
        if (fsc_dist_rank() == 0) {
            printf("usage: example_trainer STRATEGY (one of:");
            for (const char *const *n = fsc_strategy_names(); *n; n++) printf(" %s", *n);
            printf(")\n");
        }
        CHECK(fsc_dist_finalize());
        return 2;
    }
    fsc_module *model = model_new(NULL);
    CHECK_PTR(model);
    fsc_trainer_config cfg = {
        .strategy = {.name = name},
        .optim = {.kind = FSC_OPTIM_ADAMW, .lr = 3e-3},
        .batch = B, /* samples per rank */
        .targets_per_sample = OUT,
        .clip = 1.0f,
        .loss = loss_fn,
    };
    /* options only where the strategy takes them (others are refused) */
    if (fsc_strategy_takes(name, "threads"))
        cfg.strategy.threads = 2, cfg.strategy.make_replica = model_new;
    if (fsc_strategy_takes(name, "min_params")) cfg.strategy.min_params = 5000;
    fsc_trainer *t = fsc_trainer_new(model, &cfg);
    CHECK_PTR(t);
    /* single and dp (info.spans_ranks false) train on this process alone:
     * under a launcher each process would train a model of its own */
    if (fsc_dist_rank() == 0)
        printf("%s: %s; %d rank(s) of %d process(es)\n", name, info.summary,
               fsc_strategy_world(fsc_trainer_strategy(t)), fsc_dist_size());

    losses l = {0};
    for (int step = 0; step < STEPS; step++) {
        fsc_step_result r;
        CHECK(fsc_trainer_step(t, &r));
        track(&l, NULL, step, (float)r.loss); /* r.loss: the global batch's mean already */
    }

    int status = learned(name, &l);
    fsc_trainer_free(t);
    fsc_module_free(model);
    CHECK(fsc_dist_finalize());
    return status;
}
