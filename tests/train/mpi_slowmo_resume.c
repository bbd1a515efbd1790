/* The slowmo row resumed from a checkpoint equals the run that was never
 * interrupted (issue 29, item 8), on 1, 2 and 4 ranks:
 *  - at the same world size, bit for bit: per-step losses and every rank's
 *    final parameters, with a checkpoint taken between two averages (each
 *    replica and local optimizer state differs), slow momentum and AdamW on;
 *    before the row saved its state this resumed with the averaging phase at
 *    0, no slow momentum and rank 0's optimizer state on every rank;
 *  - at another world size (saved by half the ranks, resumed by all, and the
 *    other way): averaging every step under SGD with momentum is DDP's step,
 *    so the resumed run must equal the one-process reference within the
 *    equivalence noise bound (tests/support/equivalence.h) — true only if
 *    every rank starts from the mean of the saved ranks' momenta (rank 0's
 *    alone is its local batch's);
 *  - a resume with other slowmo settings is refused, naming the setting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "trainer_test.h"

static int rank, world;
static fsc_tokens tk;
static char dir[64];

static int gpt_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                    float *loss) {
    (void)user;
    return tt_tokens_micro(&tk, m, ctx, mb, loss);
}

typedef struct run_cfg {
    fsc_group *g; /* the ranks that train (NULL: the world) */
    const fsc_optim_config *optim;
    int localsgd, slowmo;
    double momentum, lr;
    int steps;          /* up to this step */
    int save_at;        /* > 0: checkpoint into ckpt after this many steps and stop */
    const char *resume; /* resume from this checkpoint directory first */
    const char *ckpt;   /* NULL: the scratch directory */
} run_cfg;

/* Trains under c; per-step losses into losses[step]; returns this rank's
 * parameters (NULL when the resume was refused: *rc says why). */
static float *run(const run_cfg *c, double *losses, int *rc) {
    const int ranks = c->g ? fsc_group_size(c->g) : world;
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_trainer_config cfg = {
        .strategy = {.name = "slowmo",
                     .group = c->g,
                     .seed = 5,
                     .localsgd_frequency = c->localsgd,
                     .slowmo_frequency = c->slowmo,
                     .slowmo_momentum = c->momentum,
                     .slowmo_lr = c->lr},
        .optim = *c->optim,
        .batch = EQ_GLOBAL_BATCH / ranks,
        .targets_per_sample = EQ_MODEL.seq,
        .loss = gpt_loss,
    };
    fsc_trainer *t = fsc_trainer_new(m, &cfg);
    if (!t) fail_msg("slowmo: %s", fsc_last_error());
    *rc = c->resume ? fsc_trainer_resume(t, c->resume, 0, NULL, NULL) : FSC_OK;
    float *out = NULL;
    const int stop = c->save_at ? c->save_at : c->steps;
    while (!*rc && fsc_trainer_get_step(t) < stop) {
        fsc_step_result r;
        const int64_t s = fsc_trainer_get_step(t);
        if (fsc_trainer_step(t, &r)) fail_msg("step %lld: %s", (long long)s, fsc_last_error());
        losses[s] = r.loss;
    }
    if (!*rc && c->save_at &&
        fsc_trainer_save_checkpoint(t, c->ckpt ? c->ckpt : dir, 0, NULL, NULL))
        fail_msg("save: %s", fsc_last_error());
    if (!*rc) {
        const fsc_params *ps = fsc_strategy_params(fsc_trainer_strategy(t));
        out = malloc(sizeof(float) * (size_t)ps->numel);
        memcpy(out, ps->data, sizeof(float) * (size_t)ps->numel);
    }
    fsc_trainer_free(t);
    fsc_module_free(m);
    return out;
}

static void test_same_size_bit_for_bit(void **state) {
    (void)state;
    enum { STEPS = 8, AT = 4 }; /* 4: between averages (every 3), before the outer step at 6 */
    run_cfg c = {
        .optim = &EQ_ADAMW, .localsgd = 3, .slowmo = 6, .momentum = 0.5, .lr = 0.8, .steps = STEPS};
    double want[STEPS], got[STEPS];
    int rc;
    float *ref = run(&c, want, &rc);
    c.save_at = AT;
    free(run(&c, got, &rc));
    c.save_at = 0, c.resume = dir;
    float *res = run(&c, got, &rc);
    assert_int_equal(rc, FSC_OK);
    for (int s = AT; s < STEPS; s++)
        if (got[s] != want[s])
            fail_msg("rank %d of %d: step %d's loss %.9g after the resume, %.9g uninterrupted",
                     rank, world, s, got[s], want[s]);
    fsc_params ps;
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    assert_int_equal(fsc_params_bind(m, 5, false, &ps), FSC_OK);
    for (int64_t i = 0; i < ps.numel; i++)
        if (memcmp(&res[i], &ref[i], sizeof(float)))
            fail_msg("rank %d of %d: parameter element %lld is %.9g resumed, %.9g uninterrupted",
                     rank, world, (long long)i, res[i], ref[i]);
    fsc_params_free(&ps), fsc_module_free(m);
    free(ref), free(res);
}

/* Saved by `from`, resumed by `to` (NULL: the world), averaging every step:
 * the final parameters against one process on the global batch. */
static void resume_across(fsc_group *from, fsc_group *to, const char *sub, const char *what) {
    double losses[EQ_STEPS];
    int rc = FSC_OK;
    char ckpt[128];
    snprintf(ckpt, sizeof ckpt, "%s/%s", dir, sub);
    run_cfg c = {
        .optim = &EQ_SGD_MOMENTUM, .localsgd = 1, .steps = EQ_STEPS, .save_at = 2, .ckpt = ckpt};
    if (from) {
        c.g = from;
        free(run(&c, losses, &rc));
    }
    fsc_group_barrier(fsc_group_world());
    float *got = NULL;
    if (to) {
        c.g = to, c.save_at = 0, c.resume = ckpt;
        got = run(&c, losses, &rc);
        assert_int_equal(rc, FSC_OK);
    }
    int64_t numel;
    float *ref = eq_reference_ex(&(eq_options){.optim = &EQ_SGD_MOMENTUM}, &numel);
    char label[128];
    snprintf(label, sizeof label, "slowmo %s, rank %d of %d", what, rank, world);
    if (got) assert_int_equal(eq_compare(label, got, ref, numel), 0);
    free(ref), free(got);
}

static void test_another_size_is_one_process(void **state) {
    (void)state;
    if (world == 1) skip();
    fsc_group *half; /* the first half of the world trains, the rest wait */
    const bool in = rank < world / 2;
    assert_int_equal(fsc_group_split(fsc_group_world(), in ? 0 : 1, rank, "half", &half), FSC_OK);
    resume_across(in ? half : NULL, fsc_group_world(), "up",
                  "saved by half the ranks, resumed by all");
    resume_across(fsc_group_world(), in ? half : NULL, "down",
                  "saved by all, resumed by half the ranks");
    fsc_group_free(half);
}

static void test_other_settings_refused(void **state) {
    (void)state;
    double losses[4];
    int rc;
    run_cfg c = {.optim = &EQ_ADAMW, .localsgd = 2, .slowmo = 4, .momentum = 0.5, .steps = 4};
    c.save_at = 2;
    free(run(&c, losses, &rc));
    c.save_at = 0, c.resume = dir, c.localsgd = 4;
    float *p = run(&c, losses, &rc);
    assert_null(p);
    if (rc != FSC_ERR_INVALID || !strstr(fsc_last_error(), "localsgd_frequency 2"))
        fail_msg("expected a refusal naming localsgd_frequency 2, got %d: %s", rc,
                 fsc_last_error());
}

static int setup(void **state) {
    (void)state;
    return mpi_scratch_dir(dir, "fsc_slowmo_resume");
}

static int teardown(void **state) {
    (void)state;
    return mpi_scratch_dir_remove(dir);
}

MPI_TEST_MAIN_WITH(eq_tokens(&tk), cmocka_run_group_tests(tests, NULL, NULL), fsc_tokens_free(&tk),
                   cmocka_unit_test_setup_teardown(test_same_size_bit_for_bit, setup, teardown),
                   cmocka_unit_test_setup_teardown(test_another_size_is_one_process, setup,
                                                   teardown),
                   cmocka_unit_test_setup_teardown(test_other_settings_refused, setup, teardown))
