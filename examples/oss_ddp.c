/* OSS (ZeRO-1) + DDP: the optimizer state is sharded over the ranks (each
 * rank updates the parameters it owns, then shares them); DDP all-reduces
 * the full gradients as before. FairScale:
 *
 *     opt = OSS(model.parameters(), optim=torch.optim.AdamW, lr=3e-3)
 *     model = DDP(model)
 *     for batch in data: opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
 *
 * Run: mpiexec -n 2 build/examples/example_oss_ddp (exits non-zero unless the
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
    fsc_module *ddp = fsc_ddp_wrap(model, &params, fsc_group_world(), NULL);
    CHECK_PTR(ddp);
    fsc_optim_config cfg = {.kind = FSC_OPTIM_ADAMW, .lr = 3e-3};
    fsc_oss *oss = fsc_oss_new(&cfg, &params, fsc_group_world(), NULL);
    CHECK_PTR(oss);
    const fsc_partition *part = fsc_oss_partition(oss);
    printf("rank %d: optimizer state for %lld parameters, %zu bytes\n", rank,
           (long long)part->elems[rank], fsc_oss_state_bytes(oss));

    const double norm = (double)B * world * OUT; /* the global batch's targets */
    fsc_ctx ctx = {.arena = arena, .training = true};
    losses l = {0};
    for (int step = 0; step < STEPS; step++) {
        fsc_arena_reset(arena);
        ctx.sample0 = first_sample(step, rank, world);
        fsc_tensor x, y, dy;
        void *saved;
        float loss;
        fsc_params_zero_grad(&params);
        CHECK(batch_inputs(&ctx, B, &x));
        CHECK(fsc_module_forward(ddp, &ctx, &x, &y, &saved));
        CHECK(mse_loss(&ctx, &y, norm, &dy, &loss));
        CHECK(fsc_module_backward(ddp, &ctx, saved, &dy, NULL)); /* + all-reduce of gradients */
        CHECK(fsc_oss_step(oss)); /* update this rank's shard, then share it */
        track(&l, fsc_group_world(), step, loss);
    }

    int status = learned("oss + ddp", &l);
    fsc_oss_free(oss);
    fsc_module_free(ddp);
    fsc_params_free(&params);
    fsc_module_free(model);
    fsc_arena_free(arena);
    CHECK(fsc_dist_finalize());
    return status;
}
