/* OSS + ShardedDDP (ZeRO-2): the optimizer state is sharded as with OSS, and
 * each gradient bucket is reduced during backward only to the rank that owns
 * it; the others give that memory back. FairScale:
 *
 *     opt = OSS(model.parameters(), optim=torch.optim.AdamW, lr=3e-3)
 *     model = ShardedDDP(model, opt)
 *     for batch in data: model.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
 *
 * Run: mpiexec -n 2 build/examples/example_oss_sdp (exits non-zero unless the
 * final loss is below half the first: examples/common.h). */
#include "common.h"

int main(int argc, char **argv) {
    CHECK(fsc_dist_init(&argc, &argv, NULL));
    const int rank = fsc_dist_rank(), world = fsc_dist_size();
    fsc_module *model = model_new(NULL);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 0);
    CHECK_PTR(model && arena);
    fsc_params params;
    CHECK(fsc_params_bind(model, 0, true, &params));
    fsc_optim_config cfg = {.kind = FSC_OPTIM_ADAMW, .lr = 3e-3};
    fsc_oss *oss = fsc_oss_new(&cfg, &params, fsc_group_world(), NULL);
    CHECK_PTR(oss);
    fsc_module *sdp = fsc_sdp_wrap(model, &params, oss, NULL);
    CHECK_PTR(sdp);

    const double norm = (double)B * world * OUT; /* the global batch's targets */
    fsc_ctx ctx = {.arena = arena, .training = true};
    losses l = {0};
    for (int step = 0; step < STEPS; step++) {
        fsc_arena_reset(arena);
        ctx.sample0 = first_sample(step, rank, world);
        fsc_tensor x, y, dy;
        void *saved;
        float loss;
        fsc_sdp_zero_grad(sdp); /* only the gradients this rank owns exist */
        CHECK(batch_inputs(&ctx, B, &x));
        CHECK(fsc_module_forward(sdp, &ctx, &x, &y, &saved));
        CHECK(mse_loss(&ctx, &y, norm, &dy, &loss));
        CHECK(fsc_module_backward(sdp, &ctx, saved, &dy, NULL)); /* + reduce to the owners */
        CHECK(fsc_oss_step(oss));
        track(&l, fsc_group_world(), step, loss);
    }
    printf("rank %d: holds %zu bytes of gradients between steps (the model's: %zu)\n", rank,
           fsc_mem_current(FSC_MEM_GRADS), sizeof(float) * (size_t)params.numel);

    int status = learned("oss + sdp", &l);
    fsc_module_free(sdp);
    fsc_oss_free(oss);
    fsc_params_free(&params);
    fsc_module_free(model);
    fsc_arena_free(arena);
    CHECK(fsc_dist_finalize());
    return status;
}
