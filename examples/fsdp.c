/* FSDP (ZeRO-3) with auto-wrap through the uniform strategy API: every
 * module reaching min_params parameters becomes a unit, whose parameters,
 * gradients and optimizer state are sharded over the ranks and gathered only
 * while it computes. FairScale:
 *
 *     model = FSDP(auto_wrap(model))  # in enable_wrap(wrapper_cls=FSDP, min_num_params=N)
 *     opt = AdamW(model.parameters())
 *     for batch in data: opt.zero_grad(); loss = model(batch).sum(); loss.backward(); opt.step()
 *
 * The loop is the same for every strategy: switching to OSS + ShardedDDP
 * (ZeRO-2) changes only the options line, to {.name = "sdp"}.
 * Run: mpiexec -n 2 build/examples/example_fsdp (exits non-zero unless the
 * final loss is below half the first: examples/common.h). */
#include "common.h"
#include "fsc/strategy.h"

int main(int argc, char **argv) {
    CHECK(fsc_dist_init(&argc, &argv, NULL));
    const int rank = fsc_dist_rank(), world = fsc_dist_size();
    double norm = (double)B * world * OUT; /* the global batch's targets */
    fsc_module *model = model_new(NULL);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 0);
    CHECK_PTR(model && arena);
    fsc_optim_config adamw = {.kind = FSC_OPTIM_ADAMW, .lr = 3e-3};
    /* each block (8352 parameters) becomes a unit; the one line to change for
     * OSS + ShardedDDP (ZeRO-2) is this one, to {.name = "sdp"} */
    fsc_strategy_options opt = {.name = "fsdp", .min_params = 5000};
    fsc_strategy *s = fsc_strategy_new(model, &adamw, &opt);
    CHECK_PTR(s);
    fsc_ctx ctx = {.arena = arena, .training = true};
    losses l = {0};
    float loss;
    for (int step = 0; step < STEPS; step++) {
        ctx.sample0 = first_sample(step, rank, world); /* this rank's rows of the global batch */
        fsc_strategy_zero_grad(s);
        CHECK(fsc_strategy_forward_backward(s, &ctx, 0, 1, B, mse_fn, &norm, &loss));
        CHECK(fsc_strategy_clip_grad_norm(s, 1.0f, NULL));
        CHECK(fsc_strategy_step(s));
        track(&l, fsc_strategy_group(s), step, loss); /* the global loss, for the check */
    }

    if (rank == 0)
        printf("%s over %d ranks (ZeRO stage %d)\n", fsc_strategy_name(s), world,
               fsc_strategy_memory_plan(s).zero_stage);
    int status = learned(fsc_strategy_name(s), &l);
    fsc_strategy_free(s);
    fsc_arena_free(arena);
    fsc_module_free(model);
    CHECK(fsc_dist_finalize());
    return status;
}
