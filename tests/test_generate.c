/* Generation: the KV cache's logits equal the full forward's at every
 * position (prefilled in one go or appended token by token), its limits are
 * refused clearly, and sampling is greedy at temperature 0, reproducible by
 * (seed, index) and confined to the top k. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/gpt.h"

static const fsc_gpt_config CFG = {.vocab = 50, .seq = 16, .layers = 3, .d_model = 32, .heads = 4};

typedef struct {
    fsc_module *gpt;
    fsc_params ps;
    fsc_arena *arena;
} model;

static void model_new(model *m) {
    m->gpt = fsc_gpt_new(&CFG);
    assert_non_null(m->gpt);
    assert_int_equal(fsc_params_bind(m->gpt, 42, false, &m->ps), FSC_OK);
    /* larger weights than the init's 0.02 so attention is far from uniform */
    for (int64_t i = 0; i < m->ps.numel; i++) m->ps.data[i] *= 8.f;
    m->arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
}

static void model_free(model *m) {
    fsc_arena_free(m->arena);
    fsc_params_free(&m->ps);
    fsc_module_free(m->gpt);
}

/* logits (T,V) of the module forward on ids[0..T). */
static void full_forward(model *m, const int32_t *ids, int T, float *out) {
    fsc_arena_reset(m->arena);
    fsc_ctx ctx = {.arena = m->arena, .training = false};
    fsc_tensor x = fsc_tensor_2d((void *)ids, FSC_DTYPE_I32, 1, T), y;
    void *saved;
    assert_int_equal(fsc_module_forward(m->gpt, &ctx, &x, &y, &saved), FSC_OK);
    memcpy(out, y.data, sizeof(float) * (size_t)T * CFG.vocab);
}

static void expect_close(const float *got, const float *want, int n, const char *what, int pos) {
    double worst = 0, scale = 0;
    for (int i = 0; i < n; i++) {
        worst = fmax(worst, fabs(got[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    if (worst > 1e-4 * (1 + scale))
        fail_msg("%s, position %d: logits differ by %g (scale %g)", what, pos, worst, scale);
}

static void test_kv_matches_full_forward(void **state) {
    (void)state;
    model m;
    model_new(&m);
    enum { T = 16 };
    const int V = CFG.vocab;
    int32_t ids[T];
    for (int i = 0; i < T; i++) ids[i] = (i * 17 + 3) % V;
    float *full = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * T * V);
    full_forward(&m, ids, T, full);
    fsc_gpt_kv *kv = fsc_gpt_kv_new(m.gpt, &CFG);
    assert_non_null(kv);
    /* a prefill of 5 with every position's logits, then one token at a time */
    assert_int_equal(fsc_gpt_kv_append(kv, ids, 5, got, true), FSC_OK);
    for (int t = 0; t < 5; t++) expect_close(got + t * V, full + t * V, V, "prefill", t);
    for (int t = 5; t < T; t++) {
        assert_int_equal(fsc_gpt_kv_append(kv, ids + t, 1, got, false), FSC_OK);
        expect_close(got, full + t * V, V, "incremental", t);
    }
    assert_int_equal(fsc_gpt_kv_len(kv), T);
    /* full: one more position is refused, naming the limit */
    assert_int_equal(fsc_gpt_kv_append(kv, ids, 1, got, false), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "exceed the model's 16"));
    /* after a reset the cache gives a shorter context's logits again */
    fsc_gpt_kv_reset(kv);
    assert_int_equal(fsc_gpt_kv_append(kv, ids + 4, 7, got, false), FSC_OK);
    full_forward(&m, ids + 4, 7, full);
    expect_close(got, full + 6 * V, V, "after reset", 6);
    int32_t bad = V;
    assert_int_equal(fsc_gpt_kv_append(kv, &bad, 1, got, false), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "outside vocab"));
    fsc_gpt_kv_free(kv);
    free(full), free(got);
    model_free(&m);
}

static void test_kv_refuses_other_models(void **state) {
    (void)state;
    model m;
    model_new(&m);
    fsc_gpt_config other = CFG;
    other.d_model = 64;
    assert_null(fsc_gpt_kv_new(m.gpt, &other));
    assert_non_null(strstr(fsc_last_error(), "no bound parameter"));
    fsc_module *lin = fsc_linear_new("lin", 4, 4, true, FSC_WEIGHT_IN_OUT, 0.02f);
    assert_null(fsc_gpt_kv_new(lin, &CFG));
    assert_non_null(strstr(fsc_last_error(), "not a GPT"));
    fsc_module_free(lin);
    fsc_module *unbound = fsc_gpt_new(&CFG);
    assert_null(fsc_gpt_kv_new(unbound, &CFG));
    fsc_module_free(unbound);
    fsc_gpt_kv_free(NULL);
    model_free(&m);
}

static void test_sampling(void **state) {
    (void)state;
    enum { V = 10 };
    float logits[V] = {0.1f, 2.0f, -1.f, 1.9f, 0.f, 0.5f, 1.8f, -3.f, 0.2f, 0.3f}, work[V];
    assert_int_equal(fsc_gpt_sample(logits, V, 0.f, 0, 1, 0, work), 1); /* greedy */
    for (int i = 0; i < 50; i++) /* top_k 1 is greedy at any temperature */
        assert_int_equal(fsc_gpt_sample(logits, V, 5.f, 1, 3, i, work), 1);
    int seen[V] = {0};
    for (int i = 0; i < 2000; i++) {
        int32_t a = fsc_gpt_sample(logits, V, 1.f, 3, 7, i, work);
        assert_int_equal(a, fsc_gpt_sample(logits, V, 1.f, 3, 7, i, work)); /* (seed, index) */
        seen[a]++;
    }
    for (int i = 0; i < V; i++) /* only the top 3: ids 1, 3, 6, each drawn */
        if ((i == 1 || i == 3 || i == 6) != (seen[i] > 0))
            fail_msg("top-k 3: token %d drawn %d times", i, seen[i]);
    int differ = 0;
    for (int i = 0; i < 100; i++)
        differ += fsc_gpt_sample(logits, V, 1.f, 0, 7, i, work) !=
                  fsc_gpt_sample(logits, V, 1.f, 0, 8, i, work);
    assert_true(differ > 10); /* another seed, other draws */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_matches_full_forward),
        cmocka_unit_test(test_kv_refuses_other_models),
        cmocka_unit_test(test_sampling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
