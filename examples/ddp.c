/* DDP by hand: fsc_ddp_wrap around the model, an fsc optimizer over the
 * flat parameters, and the user's own loop (forward, loss and backward on
 * the wrapper, which all-reduces gradient buckets while backward runs; then
 * the step). FairScale / PyTorch:
 *
 *     model = DDP(model); opt = AdamW(model.parameters())
 *     for batch in data: opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
 *
 * Run: mpiexec -n 2 build/examples/example_ddp (exits non-zero unless the
 * final loss is below half the first: examples/common.h). */
#include "common.h"

int main(int argc, char **argv) {
    CHECK(fsc_dist_init(&argc, &argv, NULL));
    const int rank = fsc_dist_rank(), world = fsc_dist_size();
    fsc_module *model = model_new(NULL);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 0);
    CHECK_PTR(model && arena);
    fsc_params params; /* flat parameters and gradients, initialised from seed 0 */
    CHECK(fsc_params_bind(model, 0, true, &params));
    fsc_module *ddp = fsc_ddp_wrap(model, &params, fsc_group_world(), NULL);
    CHECK_PTR(ddp);
    fsc_optim_range *ranges;
    int nranges;
    CHECK(fsc_optim_ranges_from_params(&params, &ranges, &nranges));
    fsc_optim_config cfg = {.kind = FSC_OPTIM_ADAMW, .lr = 3e-3};
    fsc_optim *opt = fsc_optim_new(&cfg, ranges, nranges);
    CHECK_PTR(opt);

    const double norm = (double)B * world * OUT; /* the global batch's targets */
    fsc_ctx ctx = {.arena = arena, .training = true};
    losses l = {0};
    for (int step = 0; step < STEPS; step++) {
        fsc_arena_reset(arena); /* drops the last step's activations */
        ctx.sample0 = first_sample(step, rank, world);
        fsc_tensor x, y, dy;
        void *saved;
        float loss;
        fsc_params_zero_grad(&params);
        CHECK(batch_inputs(&ctx, B, &x));
        CHECK(fsc_module_forward(ddp, &ctx, &x, &y, &saved));
        CHECK(mse_loss(&ctx, &y, norm, &dy, &loss));
        CHECK(fsc_module_backward(ddp, &ctx, saved, &dy, NULL)); /* + all-reduce of gradients */
        CHECK(fsc_optim_step(opt));
        track(&l, fsc_group_world(), step, loss);
    }

    int status = learned("ddp", &l);
    fsc_optim_free(opt);
    fsc_optim_ranges_free(ranges);
    fsc_module_free(ddp); /* the wrapper first: it removes its hooks from the model */
    fsc_params_free(&params);
    fsc_module_free(model);
    fsc_arena_free(arena);
    CHECK(fsc_dist_finalize());
    return status;
}
