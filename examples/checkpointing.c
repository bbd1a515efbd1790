/* Activation checkpointing: each residual block keeps only its input and
 * output in forward and recomputes the rest in backward, trading compute for
 * activation memory, here under DDP (any strategy takes it). The same model
 * is trained twice in this program, without and with checkpointing: the
 * losses are the same bit for bit, the activation high-water is lower.
 * FairScale:
 *
 *     for i, block in enumerate(model.blocks): model.blocks[i] = checkpoint_wrapper(block)
 *     model = DDP(model)
 *
 * Run: mpiexec -n 2 build/examples/example_checkpointing (exits non-zero
 * unless the final loss is below half the first, examples/common.h, and the
 * checkpointed run's fsc_mem_peak(FSC_MEM_ACTIV) is below the plain run's). */
#include <string.h>

#include "common.h"
#include "fsc/strategy.h"

/* Trains a fresh model, its blocks checkpointed or not, and returns the
 * activation memory high-water of the run. */
static size_t train(bool checkpoint, losses *l) {
    const int rank = fsc_dist_rank(), world = fsc_dist_size();
    if (rank == 0) printf("%s:\n", checkpoint ? "checkpointed blocks" : "plain");
    fsc_module *model = model_new(NULL);
    CHECK_PTR(model);
    for (int i = 0; checkpoint && i < model->nchildren; i++)
        if (!strncmp(model->children[i]->name, "block", 5))
            CHECK(fsc_checkpoint_wrap(model->children[i])); /* in place */
    fsc_optim_config adamw = {.kind = FSC_OPTIM_ADAMW, .lr = 3e-3};
    fsc_strategy *s = fsc_strategy_new(model, &adamw, &(fsc_strategy_options){.name = "ddp"});
    /* small arena blocks, so the allocator's peak follows what is in use */
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 4096);
    CHECK_PTR(s && arena);
    fsc_mem_reset_peaks();

    double norm = (double)B * world * OUT;
    fsc_ctx ctx = {.arena = arena, .training = true};
    float loss;
    for (int step = 0; step < STEPS; step++) {
        ctx.sample0 = first_sample(step, rank, world);
        fsc_strategy_zero_grad(s);
        CHECK(fsc_strategy_forward_backward(s, &ctx, 0, 1, B, mse_fn, &norm, &loss));
        CHECK(fsc_strategy_step(s));
        track(l, fsc_strategy_group(s), step, loss);
    }
    size_t peak = fsc_mem_peak(FSC_MEM_ACTIV);
    fsc_strategy_free(s);
    fsc_arena_free(arena);
    fsc_module_free(model);
    return peak;
}

int main(int argc, char **argv) {
    CHECK(fsc_dist_init(&argc, &argv, NULL));
    losses plain = {0}, ckpt = {0};
    size_t plain_peak = train(false, &plain);
    size_t ckpt_peak = train(true, &ckpt);
    bool less = ckpt_peak < plain_peak, same = ckpt.first == plain.first && ckpt.last == plain.last;
    if (fsc_dist_rank() == 0)
        printf("activation peak: %zu bytes plain, %zu checkpointed (%.0f%%); losses %s\n",
               plain_peak, ckpt_peak, 100.0 * (double)ckpt_peak / (double)plain_peak,
               same ? "identical" : "DIFFERS");
    int status = learned("ddp + checkpointing", &ckpt);
    CHECK(fsc_dist_finalize());
    return status || !less || !same;
}
