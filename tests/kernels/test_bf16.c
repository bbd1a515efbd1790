/* bf16 GEMMs and the layers that use them, against fp32, within bounds that
 * follow from bf16's 8-bit significand and the reduction length.
 *
 * bf16 keeps 8 significant bits, so rounding to nearest has unit roundoff
 * u = 2^-8: bf16(a) = a (1 + d), |d| <= u. A product of two rounded inputs
 * is off by at most (2u + u^2) |a b|, and fp32 accumulation of K terms adds
 * at most K * 2^-24 * sum |a b| (the standard gamma_K bound). So a bf16 GEMM
 * element differs from the exact one by at most
 *     e(K) * sum_k |a_ik| |b_kj|,   e(K) = 2u + u^2 + K * 2^-24,
 * and the fp32 GEMM it is compared with by at most that plus K * 2^-24 *
 * sum |a b| of its own (hence the factor 2 on the fp32 term below). The
 * tests compute sum |a||b| exactly as a GEMM of absolute values. The bound is
 * a worst case; a wrong transpose or a dropped scale is an O(1) error and
 * breaks it at once, which test_bound_catches_wrong_layout_and_scale shows.
 *
 * Tests that need oneDNN's bf16 path skip with a message when it is absent;
 * the fallback (FSC_BF16_GEMM=off, set for this program before anything
 * reads it) is always tested: FSC_GEMM_BF16 then computes bit for bit as fp32. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/nn.h"
#include "bf16_test.h"

#define U_BF16 (1.0 / 256) /* 2^-8 */
#define U_F32 (1.0 / 16777216)

static double e_bf16(int K) {
    return 2 * U_BF16 + U_BF16 * U_BF16 + 2.0 * K * U_F32;
}

/* Skips the calling test unless oneDNN runs bf16 here; says why. */
#define NEED_ONEDNN()                                                                              \
    do {                                                                                           \
        if (!have_bf16()) skip();                                                                  \
    } while (0)

static float *filled(size_t n, unsigned seed, float lo, float hi) {
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
    }
    return p;
}

static float *abs_copy(const float *x, size_t n) {
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = fabsf(x[i]);
    return p;
}

/* max over elements of |got - want| / (e * scale + floor): <= 1 means within bound. */
static double worst(const float *got, const float *want, const float *scale, size_t n, double e) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)got[i] - want[i]) / (e * scale[i] + 1e-30);
        if (r > w) w = r;
    }
    return w;
}

/* sum_k |op(A)_ik| |op(B)_kj| as an (M,N) matrix, with A, B dense of ld K/M, N/K. */
static float *abs_gemm(bool ta, bool tb, int M, int N, int K, const float *A, const float *B) {
    float *a = abs_copy(A, (size_t)M * K), *b = abs_copy(B, (size_t)K * N);
    float *s = calloc((size_t)M * N, sizeof *s);
    fsc_sgemm(ta, tb, M, N, K, 1.f, a, ta ? M : K, b, tb ? K : N, 0.f, s, N);
    free(a), free(b);
    return s;
}

/* Every transpose, padded leading dimensions, alpha and beta (staged through
 * a buffer; C = AB written by oneDNN; C += AB accumulated by oneDNN's sum
 * post-op): oneDNN's result is the GEMM of the ROUNDED inputs up to fp32
 * accumulation (so the rounding really happens, and only there), and within
 * e(K) of the fp32 GEMM. */
static void test_gemm_bf16_semantics(void **state) {
    (void)state;
    NEED_ONEDNN();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    const int M = 37, N = 29, K = 53;
    for (int t = 0; t < 12; t++) {
        bool ta = t & 1, tb = t & 2;
        int kind = t / 4; /* 0: alpha 0.75, beta 0.5; 1: C = AB; 2: C += AB */
        int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
        size_t na = (size_t)lda * (ta ? K : M), nb = (size_t)ldb * (tb ? N : K);
        float *A = filled(na, 1 + t, -1, 1), *B = filled(nb, 7 + t, -1, 1);
        float *C = filled((size_t)M * ldc, 9, -1, 1), *R = malloc((size_t)M * ldc * 4);
        memcpy(R, C, (size_t)M * ldc * 4);
        float alpha = kind ? 1.f : 0.75f, beta = kind == 0 ? 0.5f : kind == 1 ? 0.f : 1.f;
        fsc_gemm(FSC_GEMM_BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        double w_rounded = 0, w_exact = 0, seen_rounding = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0, sr = 0, sabs = 0;
                for (int k = 0; k < K; k++) {
                    float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                    float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                    float ra, rb;
                    fsc_round_bf16(&ra, &a, 1), fsc_round_bf16(&rb, &b, 1);
                    s += (double)a * b, sr += (double)ra * rb, sabs += fabs((double)a * b);
                }
                double c0 = R[(size_t)i * ldc + j], got = C[(size_t)i * ldc + j];
                double acc = (K + 4) * U_F32 * (fabs(alpha) * sabs + fabs(beta * c0));
                double r1 = fabs(got - (alpha * sr + beta * c0)) / acc;
                double r2 = fabs(got - (alpha * s + beta * c0)) / (e_bf16(K) * fabs(alpha) * sabs);
                w_rounded = r1 > w_rounded ? r1 : w_rounded;
                w_exact = r2 > w_exact ? r2 : w_exact;
                double d = fabs(got - (alpha * s + beta * c0)) / acc;
                seen_rounding = d > seen_rounding ? d : seen_rounding;
            }
        assert_true(w_rounded <= 1.0);
        assert_true(w_exact <= 1.0);
        assert_true(seen_rounding > 1.0); /* fp32 accuracy alone would not explain it */
        for (int i = 0; i < M; i++)       /* padding of C is never written */
            assert_memory_equal(C + (size_t)i * ldc + N, R + (size_t)i * ldc + N, 2 * 4);
        free(A), free(B), free(C), free(R);
    }
    fsc_bf16_gemm_stats st = fsc_bf16_gemm_get_stats();
    assert_true(st.calls_bf16 >= 12);
    assert_non_null(strstr(fsc_blas_describe(), "bf16 GEMM: oneDNN"));
}

/* The fallback: with the mode off, FSC_GEMM_BF16 is fsc_sgemm bit for bit,
 * and the calls count as sgemm. Runs with or without oneDNN. */
static void test_fallback_is_fp32(void **state) {
    (void)state;
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_OFF);
    assert_non_null(strstr(fsc_bf16_gemm_describe(), "sgemm for every shape"));
    const int M = 64, N = 48, K = 80;
    float *A = filled((size_t)M * K, 3, -1, 1), *B = filled((size_t)K * N, 4, -1, 1);
    float *C1 = filled((size_t)M * N, 5, -1, 1), *C2 = malloc((size_t)M * N * 4);
    memcpy(C2, C1, (size_t)M * N * 4);
    fsc_bf16_gemm_reset_stats();
    fsc_gemm(FSC_GEMM_BF16, false, true, M, N, K, 0.5f, A, K, B, K, 1.f, C1, N);
    fsc_sgemm(false, true, M, N, K, 0.5f, A, K, B, K, 1.f, C2, N);
    assert_memory_equal(C1, C2, (size_t)M * N * 4);
    fsc_bf16_gemm_stats st = fsc_bf16_gemm_get_stats();
    assert_int_equal(st.calls_bf16, 0);
    assert_int_equal(st.calls_f32, 1);
    free(A), free(B), free(C1), free(C2);
}

/* Linear under bf16 autocast, forward and backward, against the same layer
 * in fp32: y within e(C), dx within e(OC), dW within e(N), db exact (an fp32
 * sum in both). Both weight layouts. */
static void linear_check(fsc_weight_layout layout, bool expect_bf16) {
    enum { N = 48, C = 96, OC = 80 };
    fsc_module *lin = fsc_linear_new("lin", C, OC, true, layout, 0.5f);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(lin, 3, true, &ps), FSC_OK);
    float *bias = lin->params[1].data; /* not zero: a dropped or misplaced bias must show */
    for (int o = 0; o < OC; o++) bias[o] = 0.25f * (float)(o % 7) - 0.75f;
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    float *xd = filled((size_t)N * C, 11, -1, 1), *dyd = filled((size_t)N * OC, 12, -1, 1);
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, N, C),
               dy = fsc_tensor_2d(dyd, FSC_DTYPE_F32, N, OC);
    float *out[2][4]; /* [f32, bf16][y, dx, dW, db] */
    for (int p = 0; p < 2; p++) {
        fsc_ctx ctx = {
            .arena = arena, .training = true, .autocast = p ? FSC_DTYPE_BF16 : FSC_DTYPE_F32};
        fsc_params_zero_grad(&ps);
        fsc_tensor y, dx;
        void *saved;
        assert_int_equal(fsc_module_forward(lin, &ctx, &x, &y, &saved), FSC_OK);
        assert_int_equal(fsc_module_backward(lin, &ctx, saved, &dy, &dx), FSC_OK);
        const float *src[4] = {y.data, dx.data, lin->params[0].grad, lin->params[1].grad};
        size_t n[4] = {(size_t)N * OC, (size_t)N * C, (size_t)C * OC, OC};
        for (int k = 0; k < 4; k++) {
            out[p][k] = malloc(n[k] * 4);
            memcpy(out[p][k], src[k], n[k] * 4);
        }
    }
    bool in_out = layout == FSC_WEIGHT_IN_OUT;
    const float *W = lin->params[0].data;
    float *by = abs_gemm(false, !in_out, N, OC, C, xd, W);         /* x W^T */
    float *bx = abs_gemm(false, in_out, N, C, OC, dyd, W);         /* dy W */
    float *bw = in_out ? abs_gemm(true, false, C, OC, N, xd, dyd)  /* x^T dy */
                       : abs_gemm(true, false, OC, C, N, dyd, xd); /* dy^T x */
    if (expect_bf16) {
        assert_true(worst(out[1][0], out[0][0], by, (size_t)N * OC, e_bf16(C)) <= 1.0);
        assert_true(worst(out[1][1], out[0][1], bx, (size_t)N * C, e_bf16(OC)) <= 1.0);
        assert_true(worst(out[1][2], out[0][2], bw, (size_t)C * OC, e_bf16(N)) <= 1.0);
        /* and really bf16: fp32's own accuracy would be 100x tighter */
        assert_true(worst(out[1][0], out[0][0], by, (size_t)N * OC, 2 * C * U_F32) > 1.0);
    } else { /* fallback: identical */
        for (int k = 0; k < 3; k++)
            assert_memory_equal(out[1][k], out[0][k],
                                (k == 0   ? (size_t)N * OC
                                 : k == 1 ? (size_t)N * C
                                          : (size_t)C * OC) *
                                    4);
    }
    assert_memory_equal(out[1][3], out[0][3], OC * 4);
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 4; k++) free(out[p][k]);
    free(by), free(bx), free(bw), free(xd), free(dyd);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(lin);
}

static void test_linear_bf16(void **state) {
    (void)state;
    NEED_ONEDNN();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    linear_check(FSC_WEIGHT_OUT_IN, true);
    linear_check(FSC_WEIGHT_IN_OUT, true);
}

static void test_linear_fallback(void **state) {
    (void)state;
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_OFF);
    linear_check(FSC_WEIGHT_OUT_IN, false);
    linear_check(FSC_WEIGHT_IN_OUT, false);
}

/* Attention forward. Scores s = scale q k^T are off by at most
 * d_tu = e(hs) scale sum|q||k|; softmax turns a perturbation of at most
 * dmax_t = max_u d_tu into |p' - p| <= p (exp(2 dmax_t) - 1); then att v
 * (rounded p', rounded v, K = T) adds e(T) sum p'|v|. So
 *     |out' - out|_t <= [(exp(2 dmax_t) - 1) + e(T) exp(2 dmax_t)] sum_u p_tu |v_u|.
 * Returns the worst ratio to that bound of got against the fp32 attention of
 * ref_qkv (the same as qkv unless a test plants a defect there). */
static double attention_ratio(const float *got, const float *qkv, const float *ref_qkv, int T,
                              int C, int NH) {
    const int hs = C / NH;
    float *ref = calloc((size_t)T * C, 4), *att = calloc((size_t)NH * T * T, 4);
    fsc_attention_forward(ref, att, ref_qkv, 1, T, C, NH);
    double scale = 1 / sqrt(hs), w = 0;
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < T; t++) {
            const float *q = qkv + (size_t)t * 3 * C + h * hs;
            double dmax = 0;
            for (int u = 0; u <= t; u++) {
                const float *k = qkv + (size_t)u * 3 * C + C + h * hs;
                double s = 0;
                for (int c = 0; c < hs; c++) s += fabs((double)q[c] * k[c]);
                dmax = fmax(dmax, e_bf16(hs) * scale * s);
            }
            double f = expm1(2 * dmax) + e_bf16(T) * exp(2 * dmax);
            for (int c = 0; c < hs; c++) {
                double pv = 0;
                for (int u = 0; u <= t; u++)
                    pv += att[((size_t)h * T + t) * T + u] *
                          fabs((double)qkv[(size_t)u * 3 * C + 2 * C + h * hs + c]);
                double r = fabs((double)got[(size_t)t * C + h * hs + c] -
                                ref[(size_t)t * C + h * hs + c]) /
                           (f * pv + 1e-30);
                w = r > w ? r : w;
            }
        }
    free(ref), free(att);
    return w;
}

static void test_attention_forward_bf16(void **state) {
    (void)state;
    NEED_ONEDNN();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    /* T > 64: two query blocks, the second partial; B = 2: the batched
     * primitives must place every (batch, head) */
    enum { B = 2, T = 80, C = 64, NH = 2 };
    float *qkv = filled((size_t)B * T * 3 * C, 21, -1, 1);
    float *out = calloc((size_t)B * T * C, 4), *att = calloc((size_t)B * NH * T * T, 4);
    fsc_bf16_gemm_reset_stats();
    fsc_attention_forward_prec(out, att, qkv, B, T, C, NH, FSC_GEMM_BF16);
    assert_true(fsc_bf16_gemm_get_stats().calls_bf16 > 0);
    for (int b = 0; b < B; b++)
        assert_true(attention_ratio(out + (size_t)b * T * C, qkv + (size_t)b * T * 3 * C,
                                    qkv + (size_t)b * T * 3 * C, T, C, NH) <= 1.0);
    free(qkv), free(out), free(att);
}

/* Attention backward, both runs from the same probabilities p (the fp32
 * forward's), so only the four backward GEMMs differ. Per head, to first
 * order: dp = dy v^T is off by E_tu = e(hs) sum|dy_t||v_u|; ds = scale p (dp -
 * sum_w p_w dp_w) by D_tu = scale p_tu (E_tu + sum_w p_tw E_tw); then
 *     |d dq_t| <= sum_u D_tu |k_u| + e(T) sum_u |ds_tu| |k_u|,
 *     |d dk_u| <= sum_t D_tu |q_t| + e(T) sum_t |ds_tu| |q_t|,
 *     |d dv_u| <= e(T) sum_t p_tu |dy_t|  (elementwise over the head's columns). */
static void test_attention_backward_bf16(void **state) {
    (void)state;
    NEED_ONEDNN();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    enum { B = 2, T = 80, C = 64, NH = 2, hs = C / NH };
    float *qkv_all = filled((size_t)B * T * 3 * C, 41, -1, 1),
          *dy_all = filled((size_t)B * T * C, 42, -1, 1);
    float *out = calloc((size_t)B * T * C, 4), *att_all = calloc((size_t)B * NH * T * T, 4);
    float *d32_all = calloc((size_t)B * T * 3 * C, 4), *d16_all = calloc((size_t)B * T * 3 * C, 4);
    fsc_attention_forward(out, att_all, qkv_all, B, T, C, NH);
    fsc_attention_backward(d32_all, dy_all, qkv_all, att_all, B, T, C, NH);
    fsc_attention_backward_prec(d16_all, dy_all, qkv_all, att_all, B, T, C, NH, FSC_GEMM_BF16);
    double scale = 1 / sqrt(hs), w = 0, *E = calloc((size_t)T * T, 8),
           *D = calloc((size_t)T * T, 8), *ds = calloc((size_t)T * T, 8);
    for (int b = 0; b < B; b++) { /* each batch element against its own bound */
        const float *qkv = qkv_all + (size_t)b * T * 3 * C, *dy = dy_all + (size_t)b * T * C;
        const float *att = att_all + (size_t)b * NH * T * T;
        const float *d32 = d32_all + (size_t)b * T * 3 * C, *d16 = d16_all + (size_t)b * T * 3 * C;
#define Q(t, c) qkv[(size_t)(t)*3 * C + h * hs + (c)]
#define K_(t, c) qkv[(size_t)(t)*3 * C + C + h * hs + (c)]
#define V(t, c) qkv[(size_t)(t)*3 * C + 2 * C + h * hs + (c)]
#define P(t, u) att[((size_t)h * T + (t)) * T + (u)]
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                double pe = 0, pdp = 0;
                for (int u = 0; u <= t; u++) {
                    double e = 0, dp = 0;
                    for (int c = 0; c < hs; c++) {
                        e += fabs((double)dy[(size_t)t * C + h * hs + c] * V(u, c));
                        dp += (double)dy[(size_t)t * C + h * hs + c] * V(u, c);
                    }
                    E[(size_t)t * T + u] = e_bf16(hs) * e, ds[(size_t)t * T + u] = dp;
                    pe += P(t, u) * E[(size_t)t * T + u], pdp += P(t, u) * dp;
                }
                for (int u = 0; u <= t; u++) {
                    D[(size_t)t * T + u] = scale * P(t, u) * (E[(size_t)t * T + u] + pe);
                    ds[(size_t)t * T + u] = scale * P(t, u) * (ds[(size_t)t * T + u] - pdp);
                }
            }
            for (int i = 0; i < T; i++)
                for (int c = 0; c < hs; c++) {
                    double bq = 0, bk = 0, bv = 0;
                    for (int j = 0; j <= i; j++) /* query i sees keys j <= i */
                        bq += D[(size_t)i * T + j] * fabs(K_(j, c)) +
                              e_bf16(T) * fabs(ds[(size_t)i * T + j] * K_(j, c));
                    for (int j = i; j < T; j++) { /* key i is seen by queries j >= i */
                        bk += D[(size_t)j * T + i] * fabs(Q(j, c)) +
                              e_bf16(T) * fabs(ds[(size_t)j * T + i] * Q(j, c));
                        bv += e_bf16(T) * P(j, i) * fabs(dy[(size_t)j * C + h * hs + c]);
                    }
                    double bound[3] = {bq, bk, bv};
                    for (int part = 0; part < 3; part++) {
                        size_t at = (size_t)i * 3 * C + part * C + h * hs + c;
                        double r = fabs((double)d16[at] - d32[at]) / (1.01 * bound[part] + 1e-12);
                        w = r > w ? r : w;
                    }
                }
        }
    }
#undef Q
#undef K_
#undef V
#undef P
    print_message("attention backward: worst error %.2f of the bound\n", w);
    assert_true(w <= 1.0);
    assert_true(memcmp(d16_all, d32_all, (size_t)B * T * 3 * C * 4) != 0); /* bf16 really ran */
    free(qkv_all), free(dy_all), free(out), free(att_all), free(d32_all), free(d16_all);
    free(E), free(D), free(ds);
}

/* The bounds are tight enough to matter: a planted wrong transpose (Linear's
 * weight read in the other layout) or a missing 1/sqrt(hs) (attention) in
 * the reference breaks them, while bf16 rounding alone does not. Runs on the
 * fp32 path too (with the mode off the rounding is absent, and the defects
 * are still caught), so it never skips. */
static void test_bound_catches_wrong_layout_and_scale(void **state) {
    (void)state;
    enum { N = 32, C = 64, T = 48, HC = 32, NH = 2 };
    fsc_bf16_gemm_set_mode(fsc_bf16_gemm_available() ? FSC_BF16_GEMM_ON : FSC_BF16_GEMM_OFF);
    float *x = filled((size_t)N * C, 31, -1, 1), *W = filled((size_t)C * C, 32, -1, 1);
    float *y = calloc((size_t)N * C, 4), *good = calloc((size_t)N * C, 4),
          *wrong = calloc((size_t)N * C, 4);
    fsc_matmul_forward_prec(y, x, W, NULL, N, C, C, FSC_WEIGHT_OUT_IN, FSC_GEMM_BF16);
    fsc_matmul_forward(good, x, W, NULL, N, C, C, FSC_WEIGHT_OUT_IN);
    fsc_matmul_forward(wrong, x, W, NULL, N, C, C, FSC_WEIGHT_IN_OUT); /* W^T: wrong transpose */
    float *b = abs_gemm(false, true, N, C, C, x, W);
    assert_true(worst(y, good, b, (size_t)N * C, e_bf16(C)) <= 1.0);
    double caught = worst(y, wrong, b, (size_t)N * C, e_bf16(C));
    print_message("wrong transpose: %.0fx the bound\n", caught);
    assert_true(caught > 10.0);
    /* attention: the reference without the 1/sqrt(hs) scale is q scaled by sqrt(hs) */
    float *qkv = filled((size_t)T * 3 * HC, 33, -1, 1), *bad = malloc((size_t)T * 3 * HC * 4);
    memcpy(bad, qkv, (size_t)T * 3 * HC * 4);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < HC; c++) bad[(size_t)t * 3 * HC + c] *= sqrtf(HC / NH);
    float *out = calloc((size_t)T * HC, 4), *att = calloc((size_t)NH * T * T, 4);
    fsc_attention_forward_prec(out, att, qkv, 1, T, HC, NH, FSC_GEMM_BF16);
    assert_true(attention_ratio(out, qkv, qkv, T, HC, NH) <= 1.0);
    caught = attention_ratio(out, qkv, bad, T, HC, NH);
    print_message("missing attention scale: %.0fx the bound\n", caught);
    assert_true(caught > 10.0);
    free(x), free(W), free(y), free(good), free(wrong), free(b), free(qkv), free(bad), free(out),
        free(att);
}

/* The view table: what it finds, what it refuses, and that a removed view
 * is gone. Needs no oneDNN. */
static void test_bf16_views(void **state) {
    (void)state;
    float a[100] = {0}, b[10] = {0};
    uint16_t ha[100] = {0}, hb[10] = {0};
    assert_int_equal(fsc_bf16_view_add(NULL, ha, 100), FSC_ERR_INVALID);
    assert_int_equal(fsc_bf16_view_add(a, NULL, 100), FSC_ERR_INVALID);
    assert_int_equal(fsc_bf16_view_add(a, ha, 0), FSC_ERR_INVALID);
    assert_int_equal(fsc_bf16_view_add(a, ha, 100), FSC_OK);
    assert_int_equal(fsc_bf16_view_add(a + 50, hb, 10), FSC_ERR_INVALID); /* overlaps */
    assert_non_null(strstr(fsc_last_error(), "overlaps"));
    assert_int_equal(fsc_bf16_view_add(b, hb, 10), FSC_OK);
    assert_ptr_equal(fsc_bf16_view_find(a, 100), ha);
    assert_ptr_equal(fsc_bf16_view_find(a + 10, 20), ha + 10);
    assert_ptr_equal(fsc_bf16_view_find(b + 9, 1), hb + 9);
    assert_null(fsc_bf16_view_find(a + 90, 20)); /* runs past the end */
    assert_null(fsc_bf16_view_find(a, 0));
    fsc_bf16_view_remove(a);
    assert_null(fsc_bf16_view_find(a + 10, 20));
    assert_ptr_equal(fsc_bf16_view_find(b, 10), hb);
    fsc_bf16_view_remove(b);
    assert_null(fsc_bf16_view_find(b, 10));
}

/* Linear's bf16 GEMMs read a weight's registered view, and only while it is
 * registered: a view of 2W doubles y and dx (exactly: a power of two), and
 * once removed, a changed W (4W, as a load or an optimizer step would
 * change it) is what the next forward and backward use. A cache that kept
 * serving the old bf16 weight gives 2x, not 4x, and fails. Also: backward
 * rounding dy once for dx and dW gives what the two GEMMs give alone. */
static void test_linear_reads_view_never_stale(void **state) {
    (void)state;
    NEED_ONEDNN();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    enum { N = 32, C = 48, OC = 40 };
    float *x = filled((size_t)N * C, 21, -1, 1), *W = filled((size_t)C * OC, 22, -1, 1);
    float *dy = filled((size_t)N * OC, 23, -1, 1), *W2 = malloc((size_t)C * OC * 4);
    uint16_t *h2 = malloc((size_t)C * OC * 2);
    float *y[3], *dx[3], *dw[3];
    for (int k = 0; k < 3; k++) {
        y[k] = calloc((size_t)N * OC, 4), dx[k] = calloc((size_t)N * C, 4);
        dw[k] = calloc((size_t)C * OC, 4);
    }
    for (int i = 0; i < C * OC; i++) W2[i] = 2 * W[i], h2[i] = fsc_f32_to_bf16(W2[i]);
    const fsc_weight_layout L = FSC_WEIGHT_IN_OUT;
    /* 0: plain; 1: with the view of 2W; 2: after removal, W changed to 4W in place */
    fsc_matmul_forward_prec(y[0], x, W, NULL, N, C, OC, L, FSC_GEMM_BF16);
    fsc_matmul_backward_prec(dx[0], dw[0], NULL, dy, x, W, N, C, OC, L, FSC_GEMM_BF16);
    assert_int_equal(fsc_bf16_view_add(W, h2, (int64_t)C * OC), FSC_OK);
    fsc_matmul_forward_prec(y[1], x, W, NULL, N, C, OC, L, FSC_GEMM_BF16);
    fsc_matmul_backward_prec(dx[1], dw[1], NULL, dy, x, W, N, C, OC, L, FSC_GEMM_BF16);
    fsc_bf16_view_remove(W);
    for (int i = 0; i < C * OC; i++) W[i] = 2 * W2[i];
    fsc_matmul_forward_prec(y[2], x, W, NULL, N, C, OC, L, FSC_GEMM_BF16);
    fsc_matmul_backward_prec(dx[2], NULL, NULL, dy, x, W, N, C, OC, L, FSC_GEMM_BF16);
    fsc_matmul_backward_prec(NULL, dw[2], NULL, dy, x, W, N, C, OC, L, FSC_GEMM_BF16);
    for (int i = 0; i < N * OC; i++) {
        assert_float_equal(y[1][i], 2 * y[0][i], 1e-6 * fabsf(y[0][i]));
        assert_float_equal(y[2][i], 4 * y[0][i], 1e-6 * fabsf(y[0][i]));
    }
    for (int i = 0; i < N * C; i++) {
        assert_float_equal(dx[1][i], 2 * dx[0][i], 1e-6 * fabsf(dx[0][i]));
        assert_float_equal(dx[2][i], 4 * dx[0][i], 1e-6 * fabsf(dx[0][i]));
    }
    /* dW reads no weight; computed with and without the shared rounding of dy */
    assert_memory_equal(dw[1], dw[0], (size_t)C * OC * 4);
    assert_memory_equal(dw[2], dw[0], (size_t)C * OC * 4);
    for (int k = 0; k < 3; k++) free(y[k]), free(dx[k]), free(dw[k]);
    free(x), free(W), free(dy), free(W2), free(h2);
}

int main(void) {
    /* The environment variable decides the starting mode: off here. */
    setenv("FSC_BF16_GEMM", "off", 1);
    if (fsc_bf16_gemm_get_mode() != FSC_BF16_GEMM_OFF) {
        fprintf(stderr, "FSC_BF16_GEMM=off was not obeyed\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fallback_is_fp32),
        cmocka_unit_test(test_linear_fallback),
        cmocka_unit_test(test_bound_catches_wrong_layout_and_scale),
        cmocka_unit_test(test_gemm_bf16_semantics),
        cmocka_unit_test(test_linear_bf16),
        cmocka_unit_test(test_bf16_views),
        cmocka_unit_test(test_linear_reads_view_never_stale),
        cmocka_unit_test(test_attention_forward_bf16),
        cmocka_unit_test(test_attention_backward_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
