/* Gradient checks of every built-in module and of the loss against finite
 * differences (see gradcheck.h for the method and tolerances). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>

#include "fsc/gpt.h"
#include "gradcheck.h"
#include "test_main.h"

/* Builds params for m (random non-trivial values, so LayerNorm weights are not all 1), runs the
 * check. */
static void check(fsc_module *m, fsc_tensor *x, int64_t y_numel, bool check_input, float train_p) {
    (void)train_p;
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 7, true, &ps), FSC_OK);
    gc_randomize(&ps);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {
        .arena = arena, .training = true, .seed = 3, .step = 5, .sample0 = 10, .keyed = true};
    float *w = malloc((size_t)y_numel * sizeof(float));
    gc_fill(w, y_numel, 99, 1.f);
    int bad = gradcheck_module(m, &ps, &ctx, x, w, y_numel, check_input, &GC_OPTS);
    assert_int_equal(bad, 0);
    free(w);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

enum { B = 2, T = 5, C = 8 };

static void test_linear(void **state) {
    (void)state;
    float *xd = gc_input(B * T * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C);
    check(fsc_linear_new("torch_layout", C, 6, true, FSC_WEIGHT_OUT_IN, 0.3f), &x, B * T * 6, true,
          0);
    check(fsc_linear_new("conv1d_layout", C, 6, true, FSC_WEIGHT_IN_OUT, 0.3f), &x, B * T * 6, true,
          0);
    check(fsc_linear_new("no_bias", C, 3, false, FSC_WEIGHT_OUT_IN, 0.3f), &x, B * T * 3, true, 0);
    free(xd);
}

static void test_layernorm(void **state) {
    (void)state;
    float *xd = gc_input(B * T * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C);
    check(fsc_layernorm_new("ln", C, 1e-5f), &x, B * T * C, true, 0);
    free(xd);
}

static void test_activations(void **state) {
    (void)state;
    float *xd = gc_input(B * T * C);
    /* keep ReLU inputs away from the kink, where finite differences are meaningless */
    for (int i = 0; i < B * T * C; i++)
        if (fabsf(xd[i]) < 0.05f) xd[i] = 0.1f;
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C);
    check(fsc_gelu_new("gelu"), &x, B * T * C, true, 0);
    check(fsc_relu_new("relu"), &x, B * T * C, true, 0);
    check(fsc_dropout_new("dropout", 0.3f, 4), &x, B * T * C, true, 0);
    free(xd);
}

static void test_embedding(void **state) {
    (void)state;
    int32_t ids[B * T] = {1, 3, 3, 0, 6, 2, 2, 5, 1, 6};
    fsc_tensor x = fsc_tensor_2d(ids, FSC_DTYPE_I32, B, T);
    check(fsc_embedding_new("emb", 7, C, 0.3f), &x, B * T * C, false, 0);
}

static void test_attention(void **state) {
    (void)state;
    float *xd = gc_input(B * T * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C);
    check(fsc_attention_new("attn", C, 2, 0.f, 1, 0.3f, 0.3f), &x, B * T * C, true, 0);
    check(fsc_attention_new("attn_dropout", C, 2, 0.25f, 1, 0.3f, 0.3f), &x, B * T * C, true, 0);
    free(xd);
}

/* Sequences longer than the attention kernel's query block (64) take the
 * blocked causal path: several blocks and a partial last one. */
static void test_attention_long_sequence(void **state) {
    (void)state;
    enum { TL = 150 };
    float *xd = gc_input(TL * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, 1, TL, C);
    check(fsc_attention_new("attn_long", C, 2, 0.f, 1, 0.3f, 0.3f), &x, TL * C, true, 0);
    free(xd);
}

static void test_containers_and_block(void **state) {
    (void)state;
    float *xd = gc_input(B * T * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C);
    check(fsc_mlp_new("mlp", C, 0.f, 2, 0.3f, 0.3f), &x, B * T * C, true, 0);
    fsc_module *parts[2] = {fsc_layernorm_new("ln", C, 1e-5f),
                            fsc_linear_new("fc", C, C, true, FSC_WEIGHT_OUT_IN, 0.3f)};
    check(fsc_residual_new("res", fsc_sequential_new("seq", 2, parts)), &x, B * T * C, true, 0);
    check(fsc_block_new("block", C, 2, 0.f, 0, 2), &x, B * T * C, true, 0);
    free(xd);
}

static void test_gpt_logits(void **state) {
    (void)state;
    fsc_gpt_config cfg = {.vocab = 11, .seq = 8, .layers = 2, .d_model = C, .heads = 2};
    int32_t ids[B * T] = {1, 3, 10, 0, 6, 2, 2, 5, 1, 9};
    fsc_tensor x = fsc_tensor_2d(ids, FSC_DTYPE_I32, B, T);
    check(fsc_gpt_new(&cfg), &x, B * T * cfg.vocab, false, 0);
}

/* The loss: gradient of mean cross-entropy w.r.t. logits, with an ignored target. */
static void test_cross_entropy(void **state) {
    (void)state;
    enum { N = 6, V = 9 };
    float logits[N * V], work[N * V], losses[N];
    gc_fill(logits, N * V, 17, 2.f);
    int32_t targets[N] = {0, 8, -100, 3, 3, 7};
    double norm = 5.0; /* non-ignored targets */
    memcpy(work, logits, sizeof work);
    int64_t bad;
    int64_t counted =
        fsc_crossentropy_fused(losses, work, targets, N, V, -100, (float)(1 / norm), &bad);
    assert_int_equal(counted, 5);
    assert_int_equal(bad, -1);
    for (int i = 0; i < N * V; i++) {
        double h = 1e-2, lp = 0, lm = 0;
        float tmp[N * V], l2[N];
        memcpy(tmp, logits, sizeof tmp);
        tmp[i] += (float)h;
        fsc_crossentropy_fused(l2, tmp, targets, N, V, -100, 1.f, NULL);
        for (int r = 0; r < N; r++) lp += l2[r];
        memcpy(tmp, logits, sizeof tmp);
        tmp[i] -= (float)h;
        fsc_crossentropy_fused(l2, tmp, targets, N, V, -100, 1.f, NULL);
        for (int r = 0; r < N; r++) lm += l2[r];
        assert_int_equal(
            gc_compare("cross_entropy", i, work[i], (lp - lm) / (2 * h) / norm, &GC_OPTS), 0);
    }
    /* an out-of-range target is reported, not read out of bounds */
    targets[1] = V;
    memcpy(work, logits, sizeof work);
    fsc_crossentropy_fused(losses, work, targets, N, V, -100, 1.f, &bad);
    assert_int_equal(bad, 1);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_linear), cmocka_unit_test(test_layernorm),
              cmocka_unit_test(test_activations), cmocka_unit_test(test_embedding),
              cmocka_unit_test(test_attention), cmocka_unit_test(test_attention_long_sequence),
              cmocka_unit_test(test_containers_and_block), cmocka_unit_test(test_gpt_logits),
              cmocka_unit_test(test_cross_entropy))
