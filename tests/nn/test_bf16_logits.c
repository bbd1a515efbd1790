/* The LM head's logits kept in bf16 under bf16 autocast (issue 27), read by
 * the loss, which writes their gradient back in bf16:
 *  - the loss and gradient from bf16 logits stay within what rounding the
 *    logits can move them by: each logit moves by d <= 2^-9 of itself, so
 *    the row's log-sum-exp and the target logit by d_max each (the loss by
 *    at most 2 d_max), and each probability by a factor within e^(+-2 d_max);
 *    the gradient is then rounded once more (2^-9 of itself). On the bf16
 *    values themselves the fp32 arithmetic is the fp32 kernel's;
 *  - the head's GEMMs writing bf16 logits compute the bf16 GEMM's fp32
 *    product rounded once, and its backward from a bf16 gradient what the
 *    fp32-gradient path computes from its widening (by blocks of rows when
 *    the logits are large: the weight gradient then sums the blocks);
 *  - a GPT-2 (tied) and a LLaMA (untied) head keep exactly N*V*2 bytes
 *    fewer under bf16 autocast than with the bf16 GEMMs forced off, output
 *    bf16 logits, and train through the loss and backward. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/gpt.h"
#include "fsc/nn.h"
#include "bf16_test.h"
#include "frand.h"

enum { CN = 48, CV = 777, IGNORED_ROW = 5 };

static void test_loss_from_bf16_logits_within_rounding(void **state) {
    (void)state;
    static float x[CN * CV], gf[CN * CV], gw[CN * CV];
    static uint16_t h[CN * CV];
    int32_t y[CN];
    uint64_t seed = 3;
    for (int i = 0; i < CN; i++) {
        const float spread = i % 3 == 0 ? 24.f : 6.f; /* some rows sharply peaked */
        for (int v = 0; v < CV; v++) x[i * CV + v] = spread * frand(&seed);
        y[i] = (int32_t)((seed >> 33) % CV);
    }
    y[IGNORED_ROW] = -100;
    fsc_narrow_bf16(h, x, CN * CV);
    for (int i = 0; i < CN * CV; i++) gw[i] = fsc_bf16_to_f32(h[i]);
    memcpy(gf, x, sizeof x);
    const float scale = 1.f / 40;
    float lf[CN], lh[CN], lw[CN];
    int64_t bad_f, bad_h, bad_w;
    assert_int_equal(fsc_crossentropy_fused(lf, gf, y, CN, CV, -100, scale, &bad_f), CN - 1);
    assert_int_equal(fsc_crossentropy_fused(lw, gw, y, CN, CV, -100, scale, &bad_w), CN - 1);
    assert_int_equal(fsc_crossentropy_fused_bf16(lh, h, y, CN, CV, -100, scale, &bad_h), CN - 1);
    assert_true(bad_f == -1 && bad_h == -1 && bad_w == -1);
    double worst_loss = 0, worst_grad = 0;
    for (int i = 0; i < CN; i++) {
        const float *xi = x + (size_t)i * CV, *gi = gf + (size_t)i * CV, *wi = gw + (size_t)i * CV;
        const uint16_t *hi = h + (size_t)i * CV;
        if (i == IGNORED_ROW) {
            assert_true(lh[i] == 0.f);
            for (int v = 0; v < CV; v++) assert_int_equal(hi[v], 0);
            continue;
        }
        double d = 0; /* how far rounding moved this row's logits */
        for (int v = 0; v < CV; v++) d = fmax(d, fabs((double)xi[v] - fsc_bf16_to_f32(hi[v])));
        /* on the rounded logits the arithmetic is the fp32 kernel's */
        assert_true(fabs(lh[i] - lw[i]) <= 1e-6 * (1 + fabs(lw[i])));
        /* against the unrounded logits: at most 2 d (plus fp32's own slack) */
        const double dl = fabs((double)lh[i] - lf[i]);
        assert_true(dl <= 2 * d + 1e-6 * (1 + fabs(lf[i])));
        worst_loss = fmax(worst_loss, dl / (2 * d));
        const double grow = expm1(2 * d);
        for (int v = 0; v < CV; v++) {
            const double g = fsc_bf16_to_f32(hi[v]);
            /* the rounded values' gradient, rounded once */
            assert_true(fabs(g - wi[v]) <= 0x1p-8 * fabs(wi[v]) + 1e-7 * scale);
            const double p = gi[v] / scale + (v == y[i]); /* fp32's softmax */
            const double moved = scale * p * grow;
            const double bound = moved + 0x1p-9 * (fabs(gi[v]) + moved) + 1e-6 * scale;
            const double dg = fabs(g - gi[v]);
            assert_true(dg <= bound);
            worst_grad = fmax(worst_grad, dg / bound);
        }
    }
    print_message("bf16 logits: loss moved up to %.3g of its bound 2 d_max, gradient %.3g of its\n",
                  worst_loss, worst_grad);
    /* an out-of-range target is reported at its first row */
    y[7] = CV + 3, y[9] = -7;
    fsc_narrow_bf16(h, x, CN * CV);
    fsc_crossentropy_fused_bf16(lh, h, y, CN, CV, -100, scale, &bad_h);
    assert_int_equal(bad_h, 7);
}

/* fsc_cross_entropy takes bf16 logits, refuses other half types by name */
static void test_cross_entropy_accepts_bf16(void **state) {
    (void)state;
    enum { N = 6, V = 50 };
    float x[N * V], xf[N * V];
    uint16_t h[N * V];
    int32_t y[N] = {1, 4, 49, 0, 7, 3};
    uint64_t seed = 5;
    for (int i = 0; i < N * V; i++) x[i] = 4 * frand(&seed);
    fsc_narrow_bf16(h, x, N * V);
    for (int i = 0; i < N * V; i++) xf[i] = fsc_bf16_to_f32(h[i]);
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    assert_non_null(a);
    fsc_tensor lh = fsc_tensor_2d(h, FSC_DTYPE_BF16, N, V),
               lf = fsc_tensor_2d(xf, FSC_DTYPE_F32, N, V);
    fsc_tensor t = fsc_tensor_2d(y, FSC_DTYPE_I32, N, 1);
    float loss_h, loss_f;
    assert_int_equal(fsc_cross_entropy(&loss_h, &lh, &t, -1, N, a), FSC_OK);
    assert_int_equal(fsc_cross_entropy(&loss_f, &lf, &t, -1, N, a), FSC_OK);
    assert_true(fabsf(loss_h - loss_f) <= 1e-6f * loss_f);
    fsc_tensor l16 = fsc_tensor_2d(h, FSC_DTYPE_F16, N, V);
    assert_int_equal(fsc_cross_entropy(&loss_h, &l16, &t, -1, N, a), FSC_ERR_SHAPE);
    assert_non_null(strstr(fsc_last_error(), "f32 or bf16"));
    y[2] = V;
    assert_int_equal(fsc_cross_entropy(&loss_h, &lh, &t, -1, N, a), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "position 2"));
    fsc_arena_free(a);
}

/* The head's GEMMs with bf16 logits against the bf16 GEMM with fp32 ones,
 * for N rows of V logits (several blocks of rows when V is large). */
static void head_gemm_case(int N, int C, int V, bool one_block) {
    uint64_t seed = (uint64_t)N * 131 + (uint64_t)V;
    float *x = malloc(sizeof(float) * (size_t)N * C), *w = malloc(sizeof(float) * (size_t)V * C);
    float *yf = malloc(sizeof(float) * (size_t)N * V), *dyw = malloc(sizeof(float) * (size_t)N * V);
    uint16_t *yh = malloc(2 * (size_t)N * V), *dyh = malloc(2 * (size_t)N * V);
    float *dx1 = malloc(sizeof(float) * (size_t)N * C),
          *dx2 = malloc(sizeof(float) * (size_t)N * C);
    float *dw1 = calloc((size_t)V * C, sizeof(float)), *dw2 = calloc((size_t)V * C, sizeof(float));
    assert_true(x && w && yf && dyw && yh && dyh && dx1 && dx2 && dw1 && dw2);
    for (int i = 0; i < N * C; i++) x[i] = frand(&seed);
    for (int i = 0; i < V * C; i++) w[i] = 0.1f * frand(&seed);
    fsc_matmul_forward_prec(yf, x, w, NULL, N, C, V, FSC_WEIGHT_OUT_IN, FSC_GEMM_BF16);
    assert_int_equal(fsc_matmul_forward_bf16_out(yh, x, w, N, C, V, FSC_WEIGHT_OUT_IN), FSC_OK);
    int off = 0; /* logits one bf16 step from the fp32 product's rounding */
    for (int64_t i = 0; i < (int64_t)N * V; i++) {
        const int d = abs((int)yh[i] - (int)fsc_f32_to_bf16(yf[i]));
        assert_true(d <= (one_block ? 0 : 1));
        off += d;
    }
    for (int64_t i = 0; i < (int64_t)N * V; i++) {
        dyh[i] = fsc_f32_to_bf16(1e-3f * frand(&seed));
        dyw[i] = fsc_bf16_to_f32(dyh[i]);
    }
    fsc_matmul_backward_prec(dx1, dw1, NULL, dyw, x, w, N, C, V, FSC_WEIGHT_OUT_IN, FSC_GEMM_BF16);
    assert_int_equal(fsc_matmul_backward_bf16_dout(dx2, dw2, dyh, x, w, N, C, V, FSC_WEIGHT_OUT_IN),
                     FSC_OK);
    if (one_block) {
        assert_memory_equal(dx1, dx2, sizeof(float) * (size_t)N * C);
        assert_memory_equal(dw1, dw2, sizeof(float) * (size_t)V * C);
    } else { /* dx's rows the same products; dW summed by blocks in fp32 */
        double m = 0, d = 0;
        for (int64_t i = 0; i < (int64_t)V * C; i++)
            m = fmax(m, fabs(dw1[i])), d = fmax(d, fabs((double)dw1[i] - dw2[i]));
        assert_true(d <= 1e-5 * m);
        for (int64_t i = 0; i < (int64_t)N * C; i++)
            assert_true(fabs((double)dx1[i] - dx2[i]) <= 1e-6 * (1 + fabs(dx1[i])));
    }
    print_message("head GEMMs, N %d V %d: %d logits one bf16 step off\n", N, V, off);
    free(x), free(w), free(yf), free(dyw), free(yh), free(dyh);
    free(dx1), free(dx2), free(dw1), free(dw2);
}

static void test_head_gemms_write_and_read_bf16(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    head_gemm_case(64, 64, 300, true);
    head_gemm_case(200, 32, 32768, false); /* 64-row blocks of 8 MiB */
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_AUTO);
}

enum { B = 2, T = 16, N = B * T };

/* The head alone (the last part of cfg's model) under autocast bf16: the
 * bytes its forward keeps, the logits' dtype; then loss and backward. */
static size_t head_run(fsc_module *head, const fsc_gpt_config *cfg, const float *xv,
                       const int32_t *y, fsc_dtype *dt, float *loss, float *dx) {
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    assert_non_null(a);
    fsc_ctx ctx = {.arena = a, .training = true, .autocast = FSC_DTYPE_BF16};
    fsc_tensor x = fsc_tensor_3d((void *)xv, FSC_DTYPE_F32, B, T, cfg->d_model), out, din;
    void *saved;
    assert_int_equal(fsc_module_forward(head, &ctx, &x, &out, &saved), FSC_OK);
    const size_t kept = fsc_arena_used(a);
    *dt = out.dtype;
    assert_int_equal(out.ndim, 3);
    assert_int_equal(out.shape[2], cfg->vocab);
    fsc_tensor t = fsc_tensor_2d((void *)y, FSC_DTYPE_I32, B, T);
    assert_int_equal(fsc_cross_entropy(loss, &out, &t, -1, N, a), FSC_OK);
    assert_int_equal(fsc_module_backward(head, &ctx, saved, &out, &din), FSC_OK);
    memcpy(dx, din.data, fsc_tensor_nbytes(&din));
    fsc_arena_free(a);
    return kept;
}

static void head_case(const fsc_gpt_config *cfg) {
    const int n = fsc_gpt_num_parts(cfg), C = cfg->d_model;
    fsc_module *head = fsc_gpt_stage_parts_new(cfg, n - 1, n);
    assert_non_null(head);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(head, 7, true, &ps), FSC_OK);
    uint64_t seed = 17;
    float *xv = malloc(sizeof(float) * N * C), *dx1 = malloc(sizeof(float) * N * C);
    float *dx2 = malloc(sizeof(float) * N * C);
    int32_t y[N];
    assert_true(xv && dx1 && dx2);
    for (int i = 0; i < N * C; i++) xv[i] = frand(&seed);
    for (int i = 0; i < N; i++) y[i] = (int32_t)((uint64_t)(i * 7919 + 13) % (uint64_t)cfg->vocab);
    fsc_dtype on_dt, off_dt;
    float on_loss, off_loss;
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    const size_t on = head_run(head, cfg, xv, y, &on_dt, &on_loss, dx1);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_OFF);
    const size_t off = head_run(head, cfg, xv, y, &off_dt, &off_loss, dx2);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_AUTO);
    assert_int_equal(on_dt, FSC_DTYPE_BF16);
    assert_int_equal(off_dt, FSC_DTYPE_F32);
    assert_int_equal(off - on, (size_t)N * cfg->vocab * 2);
    /* bf16 GEMMs and rounded logits against fp32: the same loss to a few
     * bf16 steps (it is near ln V), the same input gradient roughly */
    print_message("%s head: loss bf16 %.6f fp32 %.6f\n", cfg->arch ? "LLaMA" : "GPT-2", on_loss,
                  off_loss);
    assert_true(fabsf(on_loss - off_loss) <= 0x1p-6f * off_loss);
    double m = 0, d = 0;
    for (int i = 0; i < N * C; i++) m = fmax(m, fabs(dx2[i])), d = fmax(d, fabs(dx1[i] - dx2[i]));
    assert_true(d <= 0x1p-5 * m);
    free(xv), free(dx1), free(dx2);
    fsc_params_free(&ps);
    fsc_module_free(head);
}

static void test_gpt2_and_llama_heads_keep_bf16_logits(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    const fsc_gpt_config gpt2 = {.vocab = 500, .seq = T, .layers = 1, .d_model = 64, .heads = 2};
    head_case(&gpt2);
    const fsc_gpt_config llama = {.arch = FSC_ARCH_LLAMA,
                                  .vocab = 500,
                                  .seq = T,
                                  .layers = 1,
                                  .d_model = 64,
                                  .heads = 4,
                                  .kv_heads = 2};
    head_case(&llama);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_from_bf16_logits_within_rounding),
        cmocka_unit_test(test_cross_entropy_accepts_bf16),
        cmocka_unit_test(test_head_gemms_write_and_read_bf16),
        cmocka_unit_test(test_gpt2_and_llama_heads_keep_bf16_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
