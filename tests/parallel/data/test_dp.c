/* DP (threads in one process) ends with the same parameters as one process on
 * the same global batch: 2 and 3 threads, dropout on (keyed by sample), AdamW. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/parallel.h"
#include "test_main.h"

static fsc_module *replica(void *user) {
    return fsc_gpt_new(user);
}

typedef struct {
    const int32_t *x, *y;
    double norm;
} batch;

static int work(fsc_module *m, const fsc_ctx *ctx, int row0, int rows, void *user, float *loss) {
    const batch *b = user;
    int T = EQ_MODEL.seq;
    return fsc_gpt_train_micro(m, ctx, b->x + row0 * T, b->y + row0 * T, rows, T, -1, b->norm,
                               loss);
}

static void run_dp(int threads) {
    int64_t n;
    float *ref = eq_reference(&n);
    fsc_gpt_config cfg = EQ_MODEL;
    eq_setup e;
    assert_int_equal(eq_setup_new(&e, &cfg, 5), FSC_OK);
    fsc_optim *opt = fsc_optim_new(&EQ_ADAMW, e.r, e.nr);
    fsc_dp *dp;
    assert_int_equal(fsc_dp_new(replica, &cfg, &e.ps, threads, &dp), FSC_OK);
    int B = EQ_GLOBAL_BATCH, T = EQ_MODEL.seq;
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    for (int s = 0; s < EQ_STEPS; s++) {
        fsc_params_zero_grad(&e.ps);
        fsc_tokens_batch(&e.tk, s, 0, 0, B, 1, 1, T, x, y);
        fsc_ctx ctx = {.training = true,
                       .keyed = true,
                       .seed = 5,
                       .step = s,
                       .sample0 = fsc_batch_first_sample(s, 0, 0, B, 1, 1)};
        batch b = {x, y, (double)B * T};
        float loss;
        assert_int_equal(fsc_dp_run(dp, &ctx, B, work, &b, &loss), FSC_OK);
        fsc_optim_step(opt);
    }
    char what[32];
    snprintf(what, sizeof what, "DP %d threads", threads);
    assert_int_equal(eq_compare(what, e.ps.data, ref, n), 0);
    fsc_dp_free(dp);
    fsc_optim_free(opt);
    eq_setup_free(&e);
    free(ref);
}

/* One test per thread count (FSC_TEST_ROW). */
static int thread_counts[] = {2, 3};

static void test_dp_threads(void **state) {
    run_dp(*(const int *)*state);
}

static void test_dp_bad_input(void **state) {
    (void)state;
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_module *m = fsc_gpt_new(&cfg);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, true, &ps), FSC_OK);
    fsc_dp *dp;
    assert_int_equal(fsc_dp_new(replica, &cfg, &ps, 0, &dp), FSC_ERR_INVALID);
    fsc_gpt_config other = cfg;
    other.layers = 3; /* a replica that does not match the model */
    assert_int_equal(fsc_dp_new(replica, &other, &ps, 2, &dp), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "replica"));
    fsc_params_free(&ps);
    fsc_module_free(m);
}

int main(void) {
    eq_fault_from_env();
    const struct CMUnitTest tests[] = {
        FSC_TEST_ROW("dp_2_threads", test_dp_threads, &thread_counts[0]),
        FSC_TEST_ROW("dp_3_threads", test_dp_threads, &thread_counts[1]),
        cmocka_unit_test(test_dp_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
