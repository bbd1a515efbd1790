/* AdaScale under fsdp against ddp on the same ranks and data. fsdp's probe
 * sees each unit's full gradient before its reduce-scatter, ddp's each
 * bucket before its all-reduce: the same per-rank samples, so every step's
 * gain must match ddp's and, with it, the learning rate and the parameters.
 * A probe skipped or counted twice moves the sum of the samples' squared
 * norms (half or double a term of the variance estimate) and the gain with
 * it, far beyond a float sum taken in another order. With accumulation,
 * fsdp reduce-scatters every micro-step from a fresh full gradient (or,
 * under accum_no_sync, computes each apart from the kept sum), so each
 * micro-batch is measured alone where ddp takes differences of its
 * accumulated buffer. Under bf16 both probes see fp32 gradients computed
 * from bf16 weights; from bf16-exact weights the two layouts compute the
 * same gradients, so the first step's gain matches too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "trainer_test.h"

static int rank, world;
static char scratch[64];

enum { STEPS = EQ_STEPS };

typedef struct ada_run {
    const char *strategy;
    int accum;
    fsc_dtype dtype;     /* compute dtype (BF16: mixed precision) */
    bool fp32_rs;        /* fsdp: reduce-scatter in fp32 */
    bool accum_no_sync;  /* fsdp: one reduce-scatter per step */
    const char *init;    /* weights loaded before the first step (NULL: seeded) */
    int steps;           /* 0: STEPS */
    double gains[STEPS]; /* out: each step's gain */
} ada_run;

/* tt_trainer_config's trainer of c's strategy over the world, stepping SGD
 * by AdaScale. */
static fsc_trainer *ada_trainer(const ada_run *c, tt_data *d, fsc_module **m) {
    const tt_run r = {.strategy = c->strategy, .accum = c->accum};
    int dp;
    fsc_trainer_config tc = tt_trainer_config(&r, d, &dp);
    tc.strategy.compute_dtype = c->dtype;
    tc.strategy.fp32_reduce_scatter = c->fp32_rs;
    tc.strategy.accum_no_sync = c->accum_no_sync;
    tc.optim = EQ_SGD_MOMENTUM; /* AdaScale is an SGD rule */
    tc.adascale = true;
    tc.adascale_cfg = (fsc_adascale_config){.smoothing = -1}; /* each step's own estimate */
    return tt_trainer_of(&r, d, &tc, dp, m);
}

/* c's run for its steps; the final weights (the caller frees), gains in c. */
static float *ada_train(ada_run *c, int64_t *numel) {
    tt_data *d = tt_data_new();
    fsc_module *m;
    fsc_trainer *t = ada_trainer(c, d, &m);
    if (c->init && fsc_strategy_load_weights(fsc_trainer_strategy(t), c->init, NULL))
        fail_msg("rank %d: %s: %s", rank, c->init, fsc_last_error());
    for (int s = 0; s < (c->steps ? c->steps : STEPS); s++) {
        fsc_step_result r;
        if (fsc_trainer_step(t, &r))
            fail_msg("rank %d, %s: %s", rank, c->strategy, fsc_last_error());
        c->gains[s] = r.gain;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/%s.safetensors", scratch, c->strategy);
    tt_save_and_free(t, m, path);
    tt_data_free(d);
    return tt_read_weights(&EQ_MODEL, path, numel);
}

/* The gain is (var + sqr) / (var / S + sqr) with both estimates clamped at
 * >= 0: at 1 or S one of them was, and the sum of the samples' squared norms
 * did not reach it. */
static bool unclamped(double gain, int S) {
    return gain > 1.01 && gain < S - 0.01;
}

static void check_fsdp_matches_ddp(int accum, bool no_sync) {
    if (world * accum < 2) return; /* S = 1: the gain is 1 whatever the probe sees */
    ada_run ddp = {.strategy = "ddp", .accum = accum};
    ada_run fsdp = {.strategy = "fsdp", .accum = accum, .accum_no_sync = no_sync};
    int64_t n, nd;
    float *w_ddp = ada_train(&ddp, &nd), *w_fsdp = ada_train(&fsdp, &n);
    char what[64];
    snprintf(what, sizeof what, "fsdp x%d%s against ddp", accum, no_sync ? " no_sync" : "");
    tt_expect_gains(what, fsdp.gains, ddp.gains, STEPS);
    /* a gain clamped at 1 or S hides the samples' sum: some step must not be */
    bool measured = false;
    for (int s = 0; s < STEPS; s++) measured |= unclamped(ddp.gains[s], world * accum);
    assert_true(measured);
    /* the noise floor of SGD's training on this model (equivalence.h), at
     * the base lr: AdaScale's is up to S times it, and the runs use at most
     * 13% of the bound */
    int64_t nr;
    free(eq_reference_ex(&(eq_options){.optim = &EQ_SGD_MOMENTUM}, &nr));
    assert_int_equal(nr, nd);
    tt_expect_close(what, w_fsdp, n, w_ddp, nd);
    free(w_ddp), free(w_fsdp);
}

static void test_fsdp_matches_ddp(void **state) {
    (void)state;
    check_fsdp_matches_ddp(1, false);
}

static void test_fsdp_matches_ddp_accumulated(void **state) {
    (void)state;
    check_fsdp_matches_ddp(2, false);
    check_fsdp_matches_ddp(2, true);
}

/* Mixed precision: rank 0 writes weights rounded to bf16 (3 steps of fp32
 * ddp from the seed: at the seed the gain is clamped at S), both layouts
 * start from them, and the first step's gain must agree: fsdp's bf16
 * gather is then exact, so both compute the same fp32 gradients, and
 * fsdp's probe reads them before any rounding. (After the step the fp32
 * weights are no longer bf16-exact and fsdp's consumers of gathered
 * weights outside the GEMMs see them rounded where ddp's do not.) */
static void test_bf16_first_step(void **state) {
    (void)state;
    if (world < 2) skip();
    ada_run warm = {.strategy = "ddp", .accum = 1, .steps = 3};
    int64_t n;
    free(ada_train(&warm, &n)); /* its weights: scratch/ddp.safetensors */
    char init[128], warmed[128];
    snprintf(init, sizeof init, "%s/bf16_init.safetensors", scratch);
    snprintf(warmed, sizeof warmed, "%s/ddp.safetensors", scratch);
    if (rank == 0) {
        fsc_module *m = fsc_gpt_new(&EQ_MODEL);
        fsc_params ps;
        if (!m || fsc_params_bind(m, 5, false, &ps) || fsc_weights_load(warmed, &ps, NULL))
            fail_msg("weights: %s", fsc_last_error());
        fsc_tensor f = fsc_tensor_1d(ps.data, FSC_DTYPE_F32, ps.numel);
        fsc_tensor h = fsc_tensor_1d(malloc(2 * (size_t)ps.numel), FSC_DTYPE_BF16, ps.numel);
        if (!h.data || fsc_tensor_convert(&f, &h) || fsc_tensor_convert(&h, &f) ||
            fsc_weights_save(init, &ps, 0, NULL, NULL))
            fail_msg("bf16 weights: %s", fsc_last_error());
        free(h.data), fsc_params_free(&ps), fsc_module_free(m);
    }
    fsc_group_barrier(fsc_group_world());
    for (int accum = 1; accum <= 2; accum++) {
        ada_run ddp = {
            .strategy = "ddp", .accum = accum, .dtype = FSC_DTYPE_BF16, .init = init, .steps = 1};
        ada_run fsdp = ddp;
        fsdp.strategy = "fsdp", fsdp.fp32_rs = true;
        free(ada_train(&ddp, &n));
        free(ada_train(&fsdp, &n));
        char what[64];
        snprintf(what, sizeof what, "bf16 fsdp x%d, step 1, against ddp", accum);
        tt_expect_gains(what, fsdp.gains, ddp.gains, 1);
        assert_true(unclamped(ddp.gains[0], world * accum));
    }
}

TT_MAIN("fsc_adascale_fsdp", scratch, cmocka_unit_test(test_fsdp_matches_ddp),
        cmocka_unit_test(test_fsdp_matches_ddp_accumulated), cmocka_unit_test(test_bf16_first_step))
