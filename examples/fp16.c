/* fp16 mixed precision under FSDP through the trainer: parameters are
 * gathered and gradients reduce-scattered in fp16 while the shards and the
 * optimizer stay fp32, with dynamic loss scaling (FairScale's
 * ShardedGradScaler: an inf or NaN gradient on any rank makes every rank
 * skip the step and halve the scale). FairScale:
 *
 *     model = FSDP(model, mixed_precision=True); scaler = ShardedGradScaler()
 *     for batch in data:
 *         scaler.scale(loss_fn(model(x), y)).backward(); scaler.step(opt); scaler.update()
 *
 * Run: mpiexec -n 2 build/examples/example_fp16 (exits non-zero unless the
 * final loss is below half the first: examples/common.h). */
#include "common.h"
#include "fsc/trainer.h"

/* The trainer's loss function: mb->norm is the global batch's target count
 * over the loss scale, so the gradients come out scaled. */
static int loss_fn(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                   float *loss) {
    (void)user;
    return mse(m, ctx, mb->rows, mb->norm, loss);
}

int main(int argc, char **argv) {
    CHECK(fsc_dist_init(&argc, &argv, NULL));
    fsc_module *model = model_new(NULL);
    CHECK_PTR(model);
    fsc_trainer_config cfg = {
        .strategy = {.name = "fsdp", .compute_dtype = FSC_DTYPE_F16, .min_params = 5000},
        .optim = {.kind = FSC_OPTIM_ADAMW, .lr = 3e-3},
        .batch = B, /* samples per rank */
        .targets_per_sample = OUT,
        .clip = 1.0f,
        .loss = loss_fn,
        /* torch's defaults are 65536 and 2000: starting higher and growing
         * sooner shows the scale backing off (skipped steps), then growing */
        .grad_scaler = &(fsc_grad_scaler_config){.init_scale = 1 << 20, .growth_interval = 50},
    };
    fsc_trainer *t = fsc_trainer_new(model, &cfg); /* fp16 adds the grad scaler */
    CHECK_PTR(t);

    losses l = {0};
    for (int step = 0; step < STEPS; step++) {
        fsc_step_result r;
        CHECK(fsc_trainer_step(t, &r));
        track(&l, NULL, step, (float)r.loss);
        if (fsc_dist_rank() == 0 && r.skipped)
            printf("step %3d  loss scale %g: overflow, step skipped on every rank\n", step,
                   r.loss_scale);
    }
    fsc_grad_scaler_state gs = fsc_grad_scaler_get_state(fsc_trainer_grad_scaler(t));
    if (fsc_dist_rank() == 0)
        printf("loss scale %g, %lld of %d steps skipped\n", gs.scale, (long long)gs.skipped_steps,
               STEPS);

    int status = learned("fsdp fp16", &l);
    fsc_trainer_free(t);
    fsc_module_free(model);
    CHECK(fsc_dist_finalize());
    return status;
}
