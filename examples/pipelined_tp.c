/* A GPT pipelined over 2 stages, each stage split over 2 tensor-parallel
 * ranks, data-parallel across whatever ranks are left (ddp between the
 * replicas): the same few lines as a DDP GPT, because the layout is data.
 * The library (fsc/layout.h) makes each rank's stage of TP layers, cuts the
 * model, runs the 1F1B schedule, and supplies the GPT's loss functions;
 * the program gives the mesh, the layout and the tokens. Megatron-LM:
 *
 *     initialize_model_parallel(tensor_model_parallel_size=2,
 *                               pipeline_model_parallel_size=2)
 *     model = get_model(gpt_model_provider); train_step(...)
 *
 * Run: mpiexec -n 4 build/examples/example_pipelined_tp (a multiple of 4
 * ranks; the layout {.pp = 1, .tp = 1} is plain DDP on any number). Exits
 * non-zero unless the mean loss of the last steps is below the first's by
 * at least 0.5 nats. */
#include "common.h"

enum { GPT_STEPS = 40, GPT_T = 16 };

/* The built-in corpus in the data-order contract: every layout reads the
 * same global batch. */
static int batch_fn(const fsc_micro_batch *mb, void *tokens, int32_t *x, int32_t *y) {
    return fsc_tokens_batch(tokens, mb->step, mb->micro, mb->rank, mb->batch, mb->micros, mb->world,
                            GPT_T, x, y);
}

int main(int argc, char **argv) {
    CHECK(fsc_dist_init(&argc, &argv, NULL));
    fsc_tokens tokens;
    CHECK(fsc_tokens_load("builtin", &tokens));
    const fsc_gpt_config cfg = {.vocab = 256, .seq = GPT_T, .layers = 2, .d_model = 32, .heads = 4};
    const fsc_gpt_layout layout = {
        .strategy = "ddp", .pp = 2, .tp = 2, .batch = 2, .micro_batches = 4, .seed = 1};

    fsc_mesh *mesh; /* dp x pp x tp over the world, TP fastest */
    CHECK(fsc_mesh_new_over(NULL, (fsc_mesh_shape){.pp = layout.pp, .tp = layout.tp}, &mesh));
    fsc_gpt_plan *plan;
    CHECK(fsc_gpt_plan_new(&cfg, &layout, mesh, &plan));
    fsc_trainer_config tc = {.optim = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-2}, .clip = 1.0f};
    CHECK(fsc_gpt_plan_trainer_config(plan, batch_fn, &tokens, &tc));
    fsc_trainer *t = fsc_trainer_new(fsc_gpt_plan_model(plan), &tc);
    CHECK_PTR(t);

    double first = 0, last = 0;
    for (int step = 0; step < GPT_STEPS; step++) {
        fsc_step_result r;
        CHECK(fsc_trainer_step(t, &r)); /* r.loss: the global batch's mean, on every rank */
        if (step == 0) first = r.loss;
        if (step >= GPT_STEPS - 5) last += r.loss / 5;
    }
    const bool ok = last < first - 0.5;
    if (fsc_dist_rank() == 0)
        printf("pipelined_tp: dp %d x pp %d x tp %d: loss %.4f -> %.4f (mean of the last 5): %s\n",
               fsc_dist_size() / (layout.pp * layout.tp), layout.pp, layout.tp, first, last,
               ok ? "learned" : "did NOT learn");
    fsc_trainer_free(t);
    fsc_gpt_plan_free(plan); /* after the trainer that borrows it */
    fsc_mesh_free(mesh);     /* after everything that talks over its groups */
    fsc_tokens_free(&tokens);
    CHECK(fsc_dist_finalize());
    return ok ? 0 : 1;
}
