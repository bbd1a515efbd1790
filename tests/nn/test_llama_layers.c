/* The LLaMA layers (RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query
 * attention): gradient checks against central differences in double
 * (gradcheck.h; the same options, and the same reasoning for them, as
 * test_gradcheck.c), and the identities that tie the new kernels to the
 * existing ones: grouped-query attention with as many key/value heads as
 * query heads is the fused multi-head kernel, and with fewer it is the
 * multi-head kernel on copies of the shared heads (Hugging Face's
 * repeat_kv), whose key/value gradients sum over each group. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>

#include "gradcheck.h"
#include "test_main.h"

/* Binds m with non-trivial values (norm weights 1 + N(0, 0.3)), checks
 * every parameter and the input, frees m. */
static void check(fsc_module *m, fsc_tensor *x, int64_t y_numel, int samples) {
    assert_non_null(m);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 7, true, &ps), FSC_OK);
    gc_randomize(&ps);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    fsc_ctx ctx = {.arena = arena, .training = true};
    float *w = malloc((size_t)y_numel * sizeof(float));
    gc_fill(w, y_numel, 99, 1.f);
    gradcheck_opts o = GC_OPTS;
    if (samples) o.samples = samples;
    gc_worst_ratio = 0;
    int bad = gradcheck_module(m, &ps, &ctx, x, w, y_numel, true, &o);
    printf("gradcheck %-14s worst |analytic - numeric| / tol %.3g\n", m->name, gc_worst_ratio);
    assert_int_equal(bad, 0);
    free(w);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

enum { B = 2, T = 5, C = 16 };

/* LLaMA-3.1's published scaling; with head_dim 16 and theta 10000 the
 * wavelengths (2 pi 10000^(i/8)) fall in all three bands: i = 7 above
 * 8192 (slowed), i = 6 between 2048 and 8192 (blended), i <= 5 below. */
static const fsc_rope_scaling LLAMA31 = {.factor = 8.f,
                                         .low_freq_factor = 1.f,
                                         .high_freq_factor = 4.f,
                                         .original_max_position_embeddings = 8192};

static void test_rmsnorm(void **state) {
    (void)state;
    float *xd = gc_input(B * T * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C);
    check(fsc_rmsnorm_new("norm", C, 1e-5f), &x, B * T * C, 0);
    check(fsc_rmsnorm_new("norm_eps", C, 0.5f), &x, B * T * C, 0); /* eps matters */
    free(xd);
}

static void test_rope(void **state) {
    (void)state;
    float *xd = gc_input(B * T * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C);
    check(fsc_rope_new("rope", 2, 8, 0.f, NULL, 0), &x, B * T * C, 0);
    check(fsc_rope_new("rope_offset", 2, 8, 500000.f, NULL, 37), &x, B * T * C, 0);
    check(fsc_rope_new("rope_llama31", 1, 16, 10000.f, &LLAMA31, 9000), &x, B * T * C, 0);
    /* refusals */
    assert_null(fsc_rope_new("odd", 2, 7, 0.f, NULL, 0));
    fsc_rope_scaling bad = LLAMA31;
    bad.high_freq_factor = 0.5f;
    assert_null(fsc_rope_new("bad_scaling", 2, 8, 0.f, &bad, 0));
    assert_null(fsc_rope_new("negative_pos", 2, 8, 0.f, NULL, -1));
    free(xd);
}

/* The scaled frequencies, band by band, against the rule written out. */
static void test_rope_scaling_bands(void **state) {
    (void)state;
    float plain[8], scaled[8];
    fsc_rope_inv_freq(plain, 16, 10000.f, NULL);
    fsc_rope_inv_freq(scaled, 16, 10000.f, &LLAMA31);
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 8; i++) {
        double wavelen = 2 * M_PI / plain[i];
        if (wavelen < 8192.0 / 4) {
            assert_true(scaled[i] == plain[i]);
            bands[0]++;
        } else if (wavelen > 8192.0) {
            assert_float_equal(scaled[i], plain[i] / 8.f, 1e-6 * plain[i]);
            bands[2]++;
        } else {
            double s = (8192.0 / wavelen - 1) / (4 - 1);
            assert_float_equal(scaled[i], (1 - s) * plain[i] / 8 + s * plain[i], 1e-6 * plain[i]);
            bands[1]++;
        }
    }
    assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);
}

static void test_swiglu(void **state) {
    (void)state;
    float *xd = gc_input(B * T * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C);
    check(fsc_swiglu_mlp_new("mlp", C, 24, 0.3f, 0.3f), &x, B * T * C, 0);
    free(xd);
}

static void check_attention(const char *name, fsc_llama_attention_config cfg, int t, int samples) {
    float *xd = gc_input((int64_t)B * t * C);
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, t, C);
    cfg.d_model = C;
    cfg.init_std = cfg.proj_std = 0.3f;
    check(fsc_llama_attention_new(name, &cfg), &x, (int64_t)B * t * C, samples);
    free(xd);
}

static void test_attention(void **state) {
    (void)state;
    check_attention("gqa", (fsc_llama_attention_config){.n_heads = 4, .n_kv_heads = 2}, T, 0);
    check_attention("mqa", (fsc_llama_attention_config){.n_heads = 4, .n_kv_heads = 1}, T, 0);
    check_attention("mha", (fsc_llama_attention_config){.n_heads = 4}, T, 0);
    check_attention("qkv_bias",
                    (fsc_llama_attention_config){.n_heads = 4, .n_kv_heads = 2, .qkv_bias = true},
                    T, 0);
    /* head_dim 6 with 2 heads: q is 12 wide, not d_model */
    check_attention("head_dim",
                    (fsc_llama_attention_config){.n_heads = 2,
                                                 .n_kv_heads = 1,
                                                 .head_dim = 6,
                                                 .rope_theta = 500000.f,
                                                 .rope_scaling = LLAMA31},
                    T, 0);
    /* longer than the kernel's query block (64): several blocks, a partial last */
    check_attention("long", (fsc_llama_attention_config){.n_heads = 4, .n_kv_heads = 2}, 150, 12);
    fsc_llama_attention_config bad = {.d_model = C, .n_heads = 4, .n_kv_heads = 3};
    assert_null(fsc_llama_attention_new("bad_kv", &bad));
    bad = (fsc_llama_attention_config){.d_model = C, .n_heads = 3};
    assert_null(fsc_llama_attention_new("bad_heads", &bad));
    assert_null(fsc_llama_attention_new("null", NULL));
}

static float max_diff(const float *a, const float *b, int64_t n) {
    float m = 0.f;
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

/* Grouped-query attention against fsc_attention_forward/backward on the
 * fused (B,T,3C) layout with each shared head copied to its query heads:
 * the same GEMMs on the same numbers, so the same results to rounding of
 * the GEMMs' blocking (measured 0 here); the key/value gradients of a
 * shared head are the sums over its group. */
static void test_gqa_is_repeated_mha(void **state) {
    (void)state;
    enum { TT = 70, NH = 4, HD = 4, CC = NH * HD };
    for (int nkv = 1; nkv <= NH; nkv *= 2) {
        int group = NH / nkv, ck = nkv * HD;
        int64_t nq = (int64_t)B * TT * CC, nk = (int64_t)B * TT * ck;
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dy = malloc(nq * 4);
        gc_fill(q, nq, 1, 1.f), gc_fill(k, nk, 2, 1.f), gc_fill(v, nk, 3, 1.f),
            gc_fill(dy, nq, 4, 1.f);
        float *qkv = malloc(nq * 3 * 4), *dqkv = malloc(nq * 3 * 4);
        for (int64_t r = 0; r < (int64_t)B * TT; r++)
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HD; d++) {
                    float *row = qkv + r * 3 * CC;
                    row[h * HD + d] = q[r * CC + h * HD + d];
                    row[CC + h * HD + d] = k[r * ck + (h / group) * HD + d];
                    row[2 * CC + h * HD + d] = v[r * ck + (h / group) * HD + d];
                }
        float *out = malloc(nq * 4), *out_ref = malloc(nq * 4);
        size_t natt = (size_t)B * NH * TT * TT * 4;
        float *att = calloc(1, natt), *att_ref = calloc(1, natt);
        fsc_attention_gqa_forward_prec(out, att, q, k, v, B, TT, NH, nkv, HD, FSC_GEMM_F32);
        fsc_attention_forward(out_ref, att_ref, qkv, B, TT, CC, NH);
        float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
        fsc_attention_gqa_backward_prec(dq, dk, dv, dy, q, k, v, att, B, TT, NH, nkv, HD,
                                        FSC_GEMM_F32);
        fsc_attention_backward(dqkv, dy, qkv, att_ref, B, TT, CC, NH);
        float *dq_ref = malloc(nq * 4), *dk_ref = calloc(nk, 4), *dv_ref = calloc(nk, 4);
        for (int64_t r = 0; r < (int64_t)B * TT; r++)
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HD; d++) {
                    const float *row = dqkv + r * 3 * CC;
                    dq_ref[r * CC + h * HD + d] = row[h * HD + d];
                    dk_ref[r * ck + (h / group) * HD + d] += row[CC + h * HD + d];
                    dv_ref[r * ck + (h / group) * HD + d] += row[2 * CC + h * HD + d];
                }
        float e_out = max_diff(out, out_ref, nq), e_dq = max_diff(dq, dq_ref, nq);
        float e_dk = max_diff(dk, dk_ref, nk), e_dv = max_diff(dv, dv_ref, nk);
        printf("gqa vs repeated mha, %d kv heads: max |diff| out %.3g dq %.3g dk %.3g dv %.3g\n",
               nkv, (double)e_out, (double)e_dq, (double)e_dk, (double)e_dv);
        /* out and dq: identical GEMMs; dk, dv: a sum of `group` terms taken in
         * the same order on both sides, but one of them through beta = 1 */
        assert_true(e_out == 0.f && e_dq == 0.f);
        assert_true(e_dk <= 1e-6f && e_dv <= 1e-6f);
        free(q), free(k), free(v), free(dy), free(qkv), free(dqkv), free(out), free(out_ref);
        free(att), free(att_ref), free(dq), free(dk), free(dv), free(dq_ref), free(dk_ref),
            free(dv_ref);
    }
}

/* Rotary backward is the transposed rotation: <R x, y> = <x, R^T y>, and R
 * keeps each pair's length. */
static void test_rope_adjoint(void **state) {
    (void)state;
    enum { TT = 9, H = 3, HD = 8 };
    int64_t n = (int64_t)B * TT * H * HD;
    float inv[HD / 2], cs[TT * HD / 2], sn[TT * HD / 2];
    fsc_rope_inv_freq(inv, HD, 10000.f, NULL);
    fsc_rope_table(cs, sn, inv, TT, HD, 100);
    float *x = malloc(n * 4), *y = malloc(n * 4), *rx = malloc(n * 4), *rty = malloc(n * 4);
    gc_fill(x, n, 1, 1.f), gc_fill(y, n, 2, 1.f);
    fsc_rope_forward(rx, x, cs, sn, B, TT, H, HD);
    fsc_rope_backward(rty, y, cs, sn, B, TT, H, HD);
    double a = 0, b = 0, nx = 0, nrx = 0;
    for (int64_t i = 0; i < n; i++)
        a += (double)rx[i] * y[i], b += (double)x[i] * rty[i], nx += (double)x[i] * x[i],
            nrx += (double)rx[i] * rx[i];
    assert_true(fabs(a - b) <= 1e-5 * sqrt(nx * n));
    assert_true(fabs(nx - nrx) <= 1e-5 * nx);
    free(x), free(y), free(rx), free(rty);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_rope),
              cmocka_unit_test(test_rope_scaling_bands), cmocka_unit_test(test_rope_adjoint),
              cmocka_unit_test(test_swiglu), cmocka_unit_test(test_attention),
              cmocka_unit_test(test_gqa_is_repeated_mha))
