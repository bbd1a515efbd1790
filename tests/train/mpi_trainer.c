/* The trainer (fsc/trainer.h) over 1, 2 and 4 ranks with a model of the
 * user's own (a residual MLP with dropout, not the GPT): every strategy of
 * the table ends with the parameters of one process on the same global batch
 * (with accumulation and global-norm clipping), within the measured noise
 * floor of tests/support/equivalence.h; a checkpoint written under ddp resumes under
 * fsdp with the losses of an uninterrupted run; bad configurations are
 * refused with messages that name what is wrong. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>
#include <unistd.h>

#include "fsc/weights.h"
#include "mse_test.h"
#include "trainer_test.h"

static int rank, world;
static char dir[64]; /* rank 0's scratch directory, known to every rank */

enum { IN = 12, H = 32, OUT = 4, G = 16, STEPS = 5 };

static fsc_module *resmlp_new(void *unused) {
    (void)unused;
    fsc_module *inner[2] = {fsc_linear_new("fc", H, H, true, FSC_WEIGHT_OUT_IN, 0.2f),
                            fsc_gelu_new("act")};
    fsc_module *parts[5] = {
        fsc_linear_new("fc_in", IN, H, true, FSC_WEIGHT_OUT_IN, 0.3f),
        fsc_gelu_new("act"),
        fsc_residual_new("res", fsc_sequential_new("inner", 2, inner)),
        fsc_dropout_new("drop", 0.1f, 1),
        fsc_linear_new("head", H, OUT, true, FSC_WEIGHT_OUT_IN, 0.2f),
    };
    return fsc_sequential_new("resmlp", 5, parts);
}

/* Inputs and targets are functions of the global sample index. */
static float input(int64_t sample, int j) {
    return (float)((sample * 7 + j * 5) % 13 - 6) / 6.f;
}
static float target(int64_t sample, int k) {
    return (float)((sample * 3 + k) % 5 - 2) / 2.f;
}

/* Half the squared error over the global count of targets (mse_test.h). */
static mse_data DATA = {IN, OUT, input, target};

static const char *ckpt_dir(void) {
    static char path[96];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    return path;
}

typedef struct run_cfg {
    const char *strategy;
    int accum;              /* micro-batches per step (0: 1) */
    bool local;             /* the whole global batch on this process (single, dp, references) */
    float clip;             /* 0: off */
    int threads;            /* dp */
    int save_at;            /* > 0: checkpoint after this many steps, then stop */
    const char *resume_dir; /* resume from here first */
} run_cfg;

static fsc_trainer_config trainer_config(const run_cfg *c) {
    int accum = c->accum ? c->accum : 1, ranks = c->local ? 1 : world;
    fsc_trainer_config cfg = {
        .strategy = {.name = c->strategy, .seed = 5},
        .optim = EQ_ADAMW,
        .batch = G / (ranks * accum),
        .grad_accum = accum,
        .targets_per_sample = OUT,
        .clip = c->clip,
        .loss = mse_loss,
        .user = &DATA,
    };
    /* hsdp: two groups where there are 4 ranks, else replicas of one rank */
    if (fsc_strategy_takes(c->strategy, "shard_group"))
        cfg.strategy.shard_group = world >= 4 ? world / 2 : 1;
    if (fsc_strategy_takes(c->strategy, "threads")) {
        cfg.strategy.threads = c->threads;
        cfg.strategy.make_replica = resmlp_new;
    }
    return cfg;
}

/* Trains under c; returns the final parameters in the model's flat layout
 * (read back from the weights the trainer saves: every strategy's path), and
 * the per-step losses in losses[]. */
static float *run(const run_cfg *c, double *losses) {
    fsc_module *m = resmlp_new(NULL);
    fsc_trainer_config cfg = trainer_config(c);
    fsc_trainer *t = fsc_trainer_new(m, &cfg);
    if (!t) fail_msg("%s: %s", c->strategy, fsc_last_error());
    double norms[STEPS];
    const int64_t first = tt_train(t, &(tt_run){.steps = STEPS,
                                                .resume = c->resume_dir,
                                                .save_at = c->save_at,
                                                .ckpt = ckpt_dir(),
                                                .losses = losses,
                                                .norms = norms});
    if (c->clip > 0 && first == 0) assert_true(norms[0] > c->clip); /* clipping bites */
    /* local runs: every process writes its own file; otherwise rank 0 does
     * and the others read it once the collective save returns */
    char path[128];
    snprintf(path, sizeof path, "%s/%s-%d.safetensors", dir, c->strategy, c->local ? rank : -1);
    tt_save_and_free(t, m, path);
    /* a fresh layout of the same model reads them back */
    fsc_module *fresh = resmlp_new(NULL);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(fresh, 99, false, &ps), FSC_OK);
    assert_int_equal(fsc_weights_load(path, &ps, NULL), FSC_OK);
    float *out = malloc(sizeof(float) * (size_t)ps.numel);
    memcpy(out, ps.data, sizeof(float) * (size_t)ps.numel);
    fsc_params_free(&ps);
    fsc_module_free(fresh);
    return out;
}

/* One process, the global batch as one micro-batch: the reference, its
 * losses, and eq_noise from two other summation orders (2 and 4 micro-batches). */
static float *reference(float clip, double *losses, double *loss_noise) {
    const fsc_fault fault = fsc_fault_active; /* references never run with a fault */
    fsc_fault_active = FSC_FAULT_NONE;
    double alt_losses[2][STEPS];
    float *alt[2];
    alt[0] = run(&(run_cfg){.strategy = "single", .local = true, .accum = 2, .clip = clip},
                 alt_losses[0]);
    alt[1] = run(&(run_cfg){.strategy = "single", .local = true, .accum = 4, .clip = clip},
                 alt_losses[1]);
    float *ref = run(&(run_cfg){.strategy = "single", .local = true, .clip = clip}, losses);
    *loss_noise = eq_noise_of_two(resmlp_new(NULL), ref, alt, losses, alt_losses[0], STEPS);
    fsc_fault_active = fault;
    return ref;
}

static int64_t numel(void) {
    fsc_module *m = resmlp_new(NULL);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, false, &ps), FSC_OK);
    int64_t n = ps.numel;
    fsc_params_free(&ps);
    fsc_module_free(m);
    return n;
}

/* Each step's loss is the reference's within its noise (two other
 * summation orders) and some ulps of it. */
static void expect_losses(const char *label, const double *losses, const double *ref_losses,
                          double loss_noise) {
    for (int s = 0; s < STEPS; s++) {
        double bound = EQ_NOISE_K * loss_noise + EQ_FLOOR_ULPS * FLT_EPSILON * fabs(ref_losses[s]);
        if (fabs(losses[s] - ref_losses[s]) > bound)
            fail_msg("%s: step %d loss %.9g vs reference %.9g (bound %.2e)", label, s + 1,
                     losses[s], ref_losses[s], bound);
    }
}

/* c's parameters and losses equal the reference's within the noise floor. */
static void expect_reference(const run_cfg *c) {
    if (!c->local && G % (world * (c->accum ? c->accum : 1))) skip();
    double ref_losses[STEPS], losses[STEPS], loss_noise;
    float *ref = reference(c->clip, ref_losses, &loss_noise);
    float *got = run(c, losses);
    char label[128];
    snprintf(label, sizeof label, "trainer %s, %d micro-batch(es), clip %g, %d ranks, rank %d",
             c->strategy, c->accum ? c->accum : 1, c->clip, c->local ? 1 : world, rank);
    assert_int_equal(eq_compare(label, got, ref, numel()), 0);
    /* under a fault switch the parameters' comparison is what is proven */
    if (fsc_fault_active == FSC_FAULT_NONE) expect_losses(label, losses, ref_losses, loss_noise);
    free(ref), free(got);
}

/* Every row of the strategy table under variant v (accumulation, clipping)
 * equals one process; under a fault switch, the rows that span ranks. */
static void every_strategy(run_cfg v) {
    const fsc_fault fault = fsc_fault_active;
    for (const char *const *n = fsc_strategy_names(); *n; n++) {
        fsc_strategy_info info;
        assert_int_equal(fsc_strategy_info_get(*n, &info), FSC_OK);
        if (fault != FSC_FAULT_NONE && (!info.spans_ranks || world == 1)) continue;
        if (info.local_steps && world > 1) continue; /* Local SGD: tests/train/mpi_slowmo.c */
        v.strategy = *n, v.local = !info.spans_ranks, v.threads = 2;
        expect_reference(&v);
    }
}

static void test_every_strategy(void **state) {
    (void)state;
    every_strategy((run_cfg){0});
}

static void test_accumulation_and_clipping(void **state) {
    (void)state;
    every_strategy((run_cfg){.accum = 2, .clip = 0.05f});
}

/* Two steps under ddp, a checkpoint; three more under fsdp from it: the
 * uninterrupted run's parameters and losses. */
static void test_resume_across_strategies(void **state) {
    (void)state;
    if (fsc_fault_active != FSC_FAULT_NONE) skip();
    double ref_losses[STEPS], losses[STEPS] = {0}, loss_noise;
    float *ref = reference(0, ref_losses, &loss_noise);
    free(run(&(run_cfg){.strategy = "ddp", .save_at = 2}, losses));
    float *got = run(&(run_cfg){.strategy = "fsdp", .resume_dir = ckpt_dir()}, losses);
    char label[96];
    snprintf(label, sizeof label, "trainer ddp -> checkpoint -> fsdp, %d ranks, rank %d", world,
             rank);
    assert_int_equal(eq_compare(label, got, ref, numel()), 0);
    expect_losses(label, losses, ref_losses, loss_noise);
    free(ref), free(got);
}

static void expect_refused(const fsc_trainer_config *cfg, const char *what) {
    fsc_module *m = resmlp_new(NULL);
    fsc_trainer *t = fsc_trainer_new(m, cfg);
    if (t || !strstr(fsc_last_error(), what))
        fail_msg("expected a refusal mentioning \"%s\", got %s: %s", what, t ? "a trainer" : "",
                 fsc_last_error());
    fsc_module_free(m);
}

static void test_bad_configs(void **state) {
    (void)state;
    fsc_trainer_config ok = trainer_config(&(run_cfg){.strategy = "ddp"});
    fsc_trainer_config c = ok;
    c.strategy.name = "zero9";
    expect_refused(&c, "expected single, dp, ddp, oss, sdp, fsdp, slowmo or hsdp");
    c = ok, c.strategy.min_params = 100;
    expect_refused(&c, "option min_params applies to fsdp, hsdp only, not to ddp");
    c = ok, c.strategy.partition = FSC_PARTITION_EVEN;
    expect_refused(&c, "option partition applies to oss, sdp only");
    c = ok, c.strategy.name = "dp";
    expect_refused(&c, "dp needs make_replica");
    c = ok, c.strategy.name = "dp", c.strategy.make_replica = resmlp_new, c.strategy.threads = 64;
    expect_refused(&c, "cannot be split across 64 threads");
    c = ok, c.loss = NULL;
    expect_refused(&c, "loss function is NULL");
    c = ok, c.batch = 0;
    expect_refused(&c, "batch 0 must be >= 1");
    c = ok, c.clip = -1;
    expect_refused(&c, "clip -1 must be >= 0");
    assert_false(fsc_strategy_takes("ddp", "min_params"));
    assert_true(fsc_strategy_takes("fsdp", "min_params"));
    assert_false(fsc_strategy_takes("nope", "min_params"));
    /* a model already bound belongs to someone else's storage */
    fsc_module *m = resmlp_new(NULL);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, true, &ps), FSC_OK);
    c = ok, c.strategy.name = "fsdp";
    assert_null(fsc_trainer_new(m, &c));
    fsc_params_free(&ps);
    fsc_module_free(m);
}

TT_MAIN("fsc_trainer", dir, cmocka_unit_test(test_every_strategy),
        cmocka_unit_test(test_accumulation_and_clipping),
        cmocka_unit_test(test_resume_across_strategies), cmocka_unit_test(test_bad_configs))
