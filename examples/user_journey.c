/* A user's own program, start to finish: a module of the user's own (SiLU,
 * examples/silu.h) inside a Sequential, trained by the trainer under fsdp on
 * every rank, a checkpoint half-way, and the run continued from it under the
 * strategy named on the command line. The continued run must give the
 * uninterrupted run's losses: checkpoints hold weights and optimizer state
 * by global name, so they resume under any strategy and world size.
 *
 * Run: mpiexec -n 2 build/examples/example_user_journey sdp (or ddp, fsdp).
 * Exits non-zero unless every resumed loss is within 1e-5 relative of the
 * uninterrupted one (the strategies sum the ranks' gradients in other
 * orders, a few float roundings apart) and the model learned. */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */
#include <ftw.h>
#include <stdio.h>

#include "common.h"
#include "fsc/trainer.h"
#include "silu.h"

enum { TOTAL = 60, HALF = 30 };

static fsc_module *user_model(void) {
    fsc_module *layers[] = {fsc_linear_new("fc1", IN, 4 * H, true, FSC_WEIGHT_OUT_IN, 0.3f),
                            silu_new("act"),
                            fsc_linear_new("fc2", 4 * H, OUT, true, FSC_WEIGHT_OUT_IN, 0.1f)};
    return fsc_sequential_new("net", 3, layers);
}

static int loss_fn(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                   float *loss) {
    (void)user;
    return mse(m, ctx, mb->rows, mb->norm, loss); /* examples/common.h: the data and the loss */
}

/* Trains steps [from, to) of `model` under `strategy`, resuming from dir
 * first when from > 0 and saving there at HALF; losses[s] gets step s's. */
static void train(const char *strategy, const char *dir, int from, int to, double *losses) {
    fsc_module *model = user_model();
    CHECK_PTR(model);
    fsc_trainer *t =
        fsc_trainer_new(model, &(fsc_trainer_config){.strategy = {.name = strategy},
                                                     .optim = {.kind = FSC_OPTIM_ADAMW, .lr = 3e-3},
                                                     .batch = B,
                                                     .targets_per_sample = OUT,
                                                     .loss = loss_fn});
    CHECK_PTR(t);
    if (from > 0) CHECK(fsc_trainer_resume(t, dir, 0, NULL, NULL));
    for (int s = from; s < to; s++) {
        fsc_step_result r;
        CHECK(fsc_trainer_step(t, &r));
        losses[s] = r.loss; /* the global batch's mean, the same on every rank */
        if (s + 1 == HALF) CHECK(fsc_trainer_save_checkpoint(t, dir, 0, NULL, NULL));
    }
    fsc_trainer_free(t);
    fsc_module_free(model);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int main(int argc, char **argv) {
    CHECK(fsc_dist_init(&argc, &argv, NULL));
    const char *resume_as = argc > 1 ? argv[1] : "sdp";
    char dir[64] = "/tmp/fsc-user-journey-XXXXXX"; /* rank 0's, told to the others */
    if (fsc_dist_rank() == 0 && !mkdtemp(dir)) return fprintf(stderr, "mkdtemp failed\n"), 1;
    CHECK(fsc_group_broadcast(fsc_group_world(), dir, sizeof dir / 4, FSC_DTYPE_I32, 0));

    double whole[TOTAL], resumed[TOTAL];
    train("fsdp", dir, 0, TOTAL, whole);         /* uninterrupted; saves at HALF */
    train(resume_as, dir, HALF, TOTAL, resumed); /* continued from that checkpoint */

    double worst = 0;
    for (int s = HALF; s < TOTAL; s++)
        worst = fmax(worst, fabs(resumed[s] - whole[s]) / fabs(whole[s]));
    const bool same = worst <= 1e-5, learned = whole[TOTAL - 1] < 0.5 * whole[0];
    if (fsc_dist_rank() == 0) {
        printf("fsdp -> checkpoint at step %d -> %s: loss %.5f -> %.5f; resumed steps within "
               "%.2g relative of the uninterrupted run (%s)\n",
               HALF, resume_as, whole[0], resumed[TOTAL - 1], worst,
               same && learned ? "ok" : "FAILED");
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); /* the checkpoint is done with */
    }
    CHECK(fsc_dist_finalize());
    return same && learned ? 0 : 1;
}
