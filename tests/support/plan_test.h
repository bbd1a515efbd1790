/* What the layout tests that train through a GPT plan share
 * (tests/train/mpi_cp_layout.c, mpi_cp_pipe.c): the trainer a program
 * builds from the plan, optionally resumed, stepped to `steps`, optionally
 * checkpointed, its weights saved to `weights`; then the plan and the mesh
 * freed. A failure names the rank and the library's message. */
#ifndef FSC_TEST_PLAN_TEST_H
#define FSC_TEST_PLAN_TEST_H

#include "equivalence.h"
#include "fsc/layout.h"
#include "fsc/trainer.h"

typedef struct {
    const char *resume; /* checkpoint directory to resume from, or NULL */
    int steps;          /* train until this step (0: EQ_STEPS) */
    const char *ckpt;   /* checkpoint directory to save at the end, or NULL */
    const char *weights;
} plan_run;

/* losses[s] receives step s's loss for the steps this run takes. */
static inline void plan_train(fsc_gpt_plan *plan, fsc_mesh *mesh, fsc_gpt_batch_fn batch,
                              void *user, const plan_run *r, double *losses, int rank) {
    fsc_trainer_config tc = {.optim = EQ_ADAMW};
    if (fsc_gpt_plan_trainer_config(plan, batch, user, &tc))
        fail_msg("rank %d: trainer config: %s", rank, fsc_last_error());
    fsc_trainer *t = fsc_trainer_new(fsc_gpt_plan_model(plan), &tc);
    if (!t) fail_msg("rank %d: %s", rank, fsc_last_error());
    if (r->resume && fsc_trainer_resume(t, r->resume, 0, NULL, NULL))
        fail_msg("rank %d: resume: %s", rank, fsc_last_error());
    const int steps = r->steps ? r->steps : EQ_STEPS;
    for (int64_t s = fsc_trainer_get_step(t); s < steps; s++) {
        fsc_step_result res;
        if (fsc_trainer_step(t, &res)) fail_msg("rank %d: %s", rank, fsc_last_error());
        losses[s] = res.loss;
    }
    if (r->ckpt && fsc_trainer_save_checkpoint(t, r->ckpt, 0, NULL, NULL))
        fail_msg("rank %d: checkpoint: %s", rank, fsc_last_error());
    if (fsc_trainer_save_weights(t, r->weights, 0, NULL, NULL))
        fail_msg("rank %d: %s: %s", rank, r->weights, fsc_last_error());
    fsc_trainer_free(t);
    fsc_gpt_plan_free(plan);
    fsc_mesh_free(mesh);
}

#endif
