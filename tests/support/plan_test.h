/* What the layout tests that train through a GPT plan share
 * (tests/train/mpi_cp_layout.c, mpi_cp_pipe.c): the trainer a program
 * builds from the plan, optionally resumed, stepped to `steps`, optionally
 * checkpointed, its weights saved to `weights`; then the plan and the mesh
 * freed. A failure names the rank and the library's message. And the
 * comparison of a layout's losses and parameters with one process's. */
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

/* One process's losses over 1, 2 and 4 micro-batches (alt[a]: 1 << a):
 * the first run's as losses, their largest spread per step as *loss_noise
 * (the losses' share of the legal orders' noise). */
static inline void plan_loss_noise(double alt[3][EQ_STEPS], double *losses, double *loss_noise) {
    memcpy(losses, alt[0], sizeof alt[0]);
    *loss_noise = 0;
    for (int s = 0; s < EQ_STEPS; s++)
        for (int a = 1; a < 3; a++) *loss_noise = fmax(*loss_noise, fabs(alt[a][s] - losses[s]));
}

/* A layout's run against one process's: each step's loss within EQ_NOISE_K
 * times the loss noise plus the floor, the parameters within equivalence.h's
 * bounds (eq_compare). Under a fault (FSC_TEST_EXPECT_MISMATCH=1) the losses
 * diverge by design: the parameters' comparison alone gives the verdict. */
static inline void plan_expect(const char *what, const float *got, const double *losses,
                               const float *ref, const double *ref_losses, double loss_noise,
                               int64_t n) {
    const char *faulty = getenv("FSC_TEST_EXPECT_MISMATCH");
    for (int s = 0; !(faulty && !strcmp(faulty, "1")) && s < EQ_STEPS; s++) {
        const double bound =
            EQ_NOISE_K * loss_noise + EQ_FLOOR_ULPS * FLT_EPSILON * fabs(ref_losses[s]);
        if (fabs(losses[s] - ref_losses[s]) > bound)
            fail_msg("%s: step %d loss %.9g vs one process's %.9g (bound %.2e)", what, s + 1,
                     losses[s], ref_losses[s], bound);
    }
    assert_int_equal(eq_compare(what, got, ref, n), 0);
}

#endif
