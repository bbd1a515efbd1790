/* AdaScale through the trainer (fsc_trainer_config.adascale) on 1, 2 and 4
 * ranks, under single, ddp, oss and sdp, with and without accumulation. The
 * gradient samples are constructed so the gain has a closed form: a linear
 * loss w.x whose gradient is the batch mean of x, with x = m + sigma z per
 * global sample (z Gaussian, a function of the sample index). A micro-batch
 * of B samples is then one gradient sample of variance D sigma^2 / B around
 * mu = m, and the gain is (D sigma^2/B + D m^2) / (D sigma^2/(B S) + D m^2).
 * Identical micro-batches give 1; m = 0 gives S. Then a least-squares
 * problem trained at S = world reaches the one-rank run's error at the same
 * scale-invariant step, and at one rank AdaScale is exactly the optimizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "fsc/trainer.h"
#include "mpi_test.h"

static int world;

enum { D = 1024, B = 2 };

typedef struct problem {
    double m, sigma; /* x = m + sigma z */
    bool same_rows;  /* every micro-batch holds the same B samples */
    bool regression; /* loss 0.5 (w.x - w*.x)^2 instead of w.x */
} problem;

static double gauss(uint64_t key) {
    uint64_t a = key * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL, b;
    a ^= a >> 31, a *= 0xBF58476D1CE4E5B9ULL, a ^= a >> 29;
    b = a * 0x94D049BB133111EBULL, b ^= b >> 32;
    double u = ((a >> 11) + 0.5) / 9007199254740992.0, v = ((b >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static float x_of(const problem *p, int64_t sample, int d) {
    if (p->same_rows) sample %= B;
    return (float)(p->m + p->sigma * gauss((uint64_t)sample * D + (uint64_t)d));
}

static float w_star(int d) {
    return (float)(0.5 * gauss(0xABCDEF00ULL + (uint64_t)d));
}

static int loss_fn(fsc_module *mod, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                   float *loss) {
    const problem *p = user;
    fsc_tensor x = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 2, (int64_t[]){mb->rows, D});
    fsc_tensor dy = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 2, (int64_t[]){mb->rows, 1}), y;
    if (!x.data || !dy.data) return FSC_ERR_NOMEM;
    float *xd = x.data, *dyd = dy.data;
    const int64_t s0 = mb->sample0 + mb->row0;
    for (int r = 0; r < mb->rows; r++)
        for (int d = 0; d < D; d++) xd[r * D + d] = x_of(p, s0 + r, d);
    void *saved;
    int rc = fsc_module_forward(mod, ctx, &x, &y, &saved);
    if (rc) return rc;
    double sum = 0;
    for (int r = 0; r < mb->rows; r++) {
        double out = ((const float *)y.data)[r];
        if (p->regression) {
            double t = 0;
            for (int d = 0; d < D; d++) t += (double)w_star(d) * xd[r * D + d];
            sum += 0.5 * (out - t) * (out - t);
            dyd[r] = (float)((out - t) / mb->norm);
        } else {
            sum += out;
            dyd[r] = (float)(1.0 / mb->norm);
        }
    }
    *loss = (float)(sum / mb->norm);
    return fsc_module_backward(mod, ctx, saved, &dy, NULL);
}

static fsc_module *model_new(void) {
    fsc_module *m = fsc_linear_new("fc", D, 1, false, FSC_WEIGHT_OUT_IN, 0.02f);
    if (!m) fail_msg("model: %s", fsc_last_error());
    return m;
}

typedef struct run_cfg {
    const char *strategy;
    int accum;
    bool adascale, local;
    double lr, smoothing;
    int steps;          /* steps to run, or with until > 0 ... */
    double until;       /* > 0: run until the scale-invariant step reaches it */
    problem p;
} run_cfg;

typedef struct run_out {
    double gain, progress, err; /* last gain, scale-invariant steps, ||w - w*||^2 */
    int steps;
    float *w; /* final weights (caller frees) */
} run_out;

static run_out run(const run_cfg *c) {
    fsc_module *m = model_new();
    problem p = c->p;
    fsc_trainer_config cfg = {
        .strategy = {.name = c->strategy, .seed = 3},
        .optim = {.kind = FSC_OPTIM_SGD, .lr = c->lr},
        .batch = B,
        .grad_accum = c->accum,
        .loss = loss_fn,
        .user = &p,
        .adascale = c->adascale,
        .adascale_cfg = {.smoothing = c->smoothing},
    };
    fsc_trainer *t = fsc_trainer_new(m, &cfg);
    if (!t) fail_msg("%s: %s", c->strategy, fsc_last_error());
    run_out o = {.gain = 1};
    fsc_step_result r;
    while (c->until > 0 ? fsc_trainer_progress(t) < c->until : o.steps < c->steps) {
        if (fsc_trainer_step(t, &r)) fail_msg("%s: %s", c->strategy, fsc_last_error());
        assert_true(r.gain >= 1 && r.gain <= (c->accum ? c->accum : 1) * world + 1e-9);
        assert_true(fabs(r.lr - r.gain * r.base_lr) <= 1e-12 * r.lr);
        o.gain = r.gain, o.progress = r.progress, o.steps++;
    }
    const fsc_params *ps = fsc_strategy_params(fsc_trainer_strategy(t));
    o.w = malloc(sizeof(float) * D);
    memcpy(o.w, ps->data, sizeof(float) * D);
    for (int d = 0; d < D; d++) o.err += ((double)o.w[d] - w_star(d)) * (o.w[d] - w_star(d));
    fsc_trainer_free(t);
    fsc_module_free(m);
    return o;
}

static const char *const RANKED[] = {"ddp", "oss", "sdp"};

/* The layouts giving S >= 2 samples: at one rank, 4 micro-batches
 * (single); else the ranked rows with 1 and 2 micro-batches. */
static void each_layout(void (*check)(const char *name, int accum, bool local)) {
    if (world == 1) {
        check("single", 4, true);
        check("ddp", 2, false);
        return;
    }
    for (int i = 0; i < 3; i++) check(RANKED[i], 1, false);
    check("ddp", 2, false);
    check("sdp", 2, false);
}

static void check_known_variance(const char *name, int accum, bool local) {
    const problem p = {.m = 0.05, .sigma = 0.5};
    const int S = accum * (local ? 1 : world);
    run_out o = run(&(run_cfg){.strategy = name, .accum = accum, .adascale = true, .lr = 1e-3, .smoothing = 0.98,
                               .steps = 300, .p = p});
    const double var = D * p.sigma * p.sigma / B, sqr = D * p.m * p.m;
    const double expect = (var + sqr) / (var / S + sqr);
    if (fsc_dist_rank() == 0)
        print_message("%s x%d (S = %d): gain %.3f, closed form %.3f\n", name, accum, S, o.gain,
                      expect);
    /* 300 steps at smoothing 0.98: the estimate's spread, measured ~3%, x3 */
    if (fabs(o.gain - expect) > 0.1 * expect)
        fail_msg("%s x%d: gain %g, closed form %g", name, accum, o.gain, expect);
    free(o.w);
}

static void check_identical(const char *name, int accum, bool local) {
    (void)local;
    run_out o = run(&(run_cfg){.strategy = name, .accum = accum, .adascale = true, .lr = 1e-3, .steps = 5,
                               .p = {.m = 0.1, .sigma = 0.5, .same_rows = true}});
    /* variance 0 up to float rounding of the sums (~1e-7 relative) */
    if (o.gain - 1 > 1e-4) fail_msg("%s x%d: identical samples, gain %.9g", name, accum, o.gain);
    free(o.w);
}

static void check_noise(const char *name, int accum, bool local) {
    const int S = accum * (local ? 1 : world);
    run_out o = run(&(run_cfg){.strategy = name, .accum = accum, .adascale = true, .lr = 1e-3, .smoothing = 0.98,
                               .steps = 100, .p = {.sigma = 0.5}});
    /* mu = 0: r -> S; clamping each step's mu^2 estimate at 0 biases it up by
     * ~0.4 sqrt(2/D) sigma^2/S, a few percent of S at D = 1024 */
    if (o.gain < 0.9 * S) fail_msg("%s x%d: pure noise, gain %g, S %d", name, accum, o.gain, S);
    free(o.w);
}

static void test_gain_known_variance(void **state) {
    (void)state;
    each_layout(check_known_variance);
}
static void test_gain_identical_is_one(void **state) {
    (void)state;
    each_layout(check_identical);
}
static void test_gain_noise_is_s(void **state) {
    (void)state;
    each_layout(check_noise);
}

/* One rank, one micro-batch: S = 1, gain 1, the optimizer's very steps. */
static void test_one_rank_is_the_optimizer(void **state) {
    (void)state;
    const problem p = {.m = 0.1, .sigma = 0.5, .regression = true};
    run_out a = run(&(run_cfg){.strategy = "single", .lr = 0.01, .steps = 10, .p = p});
    run_out b =
        run(&(run_cfg){.strategy = "single", .lr = 0.01, .steps = 10, .adascale = true, .p = p});
    assert_memory_equal(a.w, b.w, sizeof(float) * D);
    assert_true(b.gain == 1.0 && b.progress == 10.0);
    free(a.w), free(b.w);
}

/* Least squares: one rank, B samples a step, T steps; at S = world the
 * AdaScale run reaches the same error at the same scale-invariant step in
 * fewer steps, where plain ddp with the one-rank lr for those steps does
 * worse. */
static void test_training_matches_one_rank(void **state) {
    (void)state;
    if (world == 1) skip();
    enum { T = 150 };
    const problem p = {.sigma = 1.0, .regression = true};
    const double lr = 1e-3;
    run_out one = run(&(run_cfg){.strategy = "single", .lr = lr, .steps = T, .p = p});
    run_out ada = run(&(run_cfg){.strategy = "ddp", .lr = lr, .adascale = true, .until = T, .p = p});
    run_out ddp = run(&(run_cfg){.strategy = "ddp", .lr = lr, .steps = ada.steps, .p = p});
    if (fsc_dist_rank() == 0)
        print_message("||w - w*||^2 after %d scale-invariant steps: one rank %.4f (%d steps), "
                      "adascale x%d %.4f (%d steps, last gain %.3f), ddp %.4f (%d steps)\n",
                      T, one.err, one.steps, world, ada.err, ada.steps, ada.gain, ddp.err,
                      ddp.steps);
    /* measured: within 0.3% (2 ranks) and 0.9% (4 ranks); plain ddp is 10%
     * and 17% worse. Bound: 3% of the one-rank error. */
    if (fabs(ada.err - one.err) > 0.03 * one.err)
        fail_msg("adascale error %g vs one rank %g", ada.err, one.err);
    assert_true(ada.steps < T);
    assert_true(ddp.err > ada.err);
    free(one.w), free(ada.w), free(ddp.w);
}

static void test_refusals(void **state) {
    (void)state;
    const char *names[2] = {"fsdp", "slowmo"};
    for (int i = 0; i < 2; i++) {
        fsc_module *m = model_new();
        problem p = {0};
        fsc_trainer_config cfg = {.strategy = {.name = names[i]},
                                  .optim = {.kind = FSC_OPTIM_SGD, .lr = 0.1},
                                  .batch = B,
                                  .loss = loss_fn,
                                  .user = &p,
                                  .adascale = true};
        fsc_trainer *t = fsc_trainer_new(m, &cfg);
        assert_null(t);
        assert_non_null(strstr(fsc_last_error(), "AdaScale needs each rank's gradient"));
        fsc_module_free(m);
    }
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) return 1;
    world = fsc_dist_size();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gain_known_variance),
        cmocka_unit_test(test_gain_identical_is_one),
        cmocka_unit_test(test_gain_noise_is_s),
        cmocka_unit_test(test_one_rank_is_the_optimizer),
        cmocka_unit_test(test_training_matches_one_rank),
        cmocka_unit_test(test_refusals),
    };
    return mpi_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
