/* Activations stored in bf16 under bf16 autocast (issue 27): a producer
 * whose output goes straight into a Linear's bf16 GEMM (LayerNorm into
 * c_attn and c_fc, GELU into c_proj, attention's output into c_proj) writes
 * it rounded to bf16, which that GEMM would round it to anyway. So:
 *  - a Linear reading a bf16 input computes bit for bit what it computes
 *    from that input's fp32 widening (output, input gradient, weight and
 *    bias gradients; both weight layouts);
 *  - a GPT block keeps exactly 2 bytes instead of 4 per element of those
 *    activations (ln_1, ln_2, attention output: C per row; GELU: 4C), and
 *    its output, input gradient and parameter gradients are bit for bit
 *    those of the same block whose LayerNorms and GELU are told no Linear
 *    reads them (so they store fp32), every GEMM in bf16 both times;
 *  - forced off (FSC_BF16_GEMM=off), nothing is stored in bf16;
 *  - attention keeps q/k/v (3C per row) and its probabilities in bf16,
 *    its output bit for bit the same;
 *  - LLaMA's SwiGLU MLP keeps its gated product (down_proj's input) and
 *    its two projections (gate_proj's and up_proj's outputs) in bf16: 3F
 *    elements per row at 2 bytes, the output unchanged in dtype;
 *  - GPT-2's MLP keeps c_fc's output (GELU's input, 4C per row) in bf16:
 *    GELU is evaluated, and differentiated, at the stored value, so the
 *    output and every gradient move, by no more than that one rounding
 *    can move them (test_mlp_reads_c_fc_in_bf16 derives the bound). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/kernels.h"
#include "fsc/nn.h"
#include "nn/layers_internal.h" /* nn_*_set_feeds: the producers' switch */
#include "bf16_test.h"
#include "frand.h"

enum { B = 2, T = 32, C = 64, NH = 2, N = B * T };
/* what attention keeps of its probabilities in bf16 instead of fp32 */
#define QKV_ATT_SAVED ((size_t)B * NH * T * T * 2)

/* Forward and backward of a Linear on x (dtype dt), autocast bf16. */
static void linear_run(fsc_module *m, fsc_params *ps, const fsc_tensor *x, const float *dyv,
                       float *y, float *dx, float *grads) {
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    assert_non_null(a);
    fsc_params_zero_grad(ps);
    fsc_ctx ctx = {.arena = a, .training = true, .autocast = FSC_DTYPE_BF16};
    fsc_tensor out, din;
    void *saved;
    assert_int_equal(fsc_module_forward(m, &ctx, x, &out, &saved), FSC_OK);
    assert_int_equal(out.dtype, FSC_DTYPE_F32);
    memcpy(y, out.data, fsc_tensor_nbytes(&out));
    fsc_tensor dy = out;
    dy.data = (void *)dyv;
    assert_int_equal(fsc_module_backward(m, &ctx, saved, &dy, &din), FSC_OK);
    assert_int_equal(din.dtype, FSC_DTYPE_F32);
    memcpy(dx, din.data, fsc_tensor_nbytes(&din));
    memcpy(grads, ps->grad, (size_t)ps->numel * sizeof(float));
    fsc_arena_free(a);
}

static void linear_case(fsc_weight_layout layout) {
    const int IN = 48, OUT = 40;
    fsc_module *m = fsc_linear_new("lin", IN, OUT, true, layout, 0.05f);
    assert_non_null(m);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 3, true, &ps), FSC_OK);
    uint64_t seed = 11;
    float xr[N * IN], dyv[N * OUT];
    uint16_t xh[N * IN];
    for (int i = 0; i < N * IN; i++) {
        xh[i] = fsc_f32_to_bf16(frand(&seed));
        xr[i] = fsc_bf16_to_f32(xh[i]);
    }
    for (int i = 0; i < N * OUT; i++) dyv[i] = frand(&seed);
    fsc_tensor x32 = fsc_tensor_2d(xr, FSC_DTYPE_F32, N, IN);
    fsc_tensor x16 = fsc_tensor_2d(xh, FSC_DTYPE_BF16, N, IN);
    float y1[N * OUT], y2[N * OUT], dx1[N * IN], dx2[N * IN];
    float *g1 = malloc((size_t)ps.numel * sizeof(float)), *g2 = malloc((size_t)ps.numel * 4);
    assert_non_null(g1), assert_non_null(g2);
    linear_run(m, &ps, &x32, dyv, y1, dx1, g1);
    linear_run(m, &ps, &x16, dyv, y2, dx2, g2);
    assert_memory_equal(y1, y2, sizeof y1);
    assert_memory_equal(dx1, dx2, sizeof dx1);
    assert_memory_equal(g1, g2, (size_t)ps.numel * sizeof(float));
    free(g1), free(g2);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

static void test_linear_reads_bf16_as_its_widening(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    linear_case(FSC_WEIGHT_IN_OUT);
    linear_case(FSC_WEIGHT_OUT_IN);
}

/* A block's forward and backward under autocast bf16: the bytes its
 * forward keeps in the arena; y, dx and the parameter gradients copied. */
static size_t block_run(fsc_module *blk, fsc_params *ps, const float *xv, const float *dyv,
                        float *y, float *dx, float *grads) {
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    assert_non_null(a);
    fsc_params_zero_grad(ps);
    fsc_ctx ctx = {.arena = a, .training = true, .keyed = true, .autocast = FSC_DTYPE_BF16};
    fsc_tensor x = fsc_tensor_3d((void *)xv, FSC_DTYPE_F32, B, T, C), out, din;
    void *saved;
    assert_int_equal(fsc_module_forward(blk, &ctx, &x, &out, &saved), FSC_OK);
    const size_t kept = fsc_arena_used(a);
    memcpy(y, out.data, fsc_tensor_nbytes(&out));
    fsc_tensor dy = out;
    dy.data = (void *)dyv;
    assert_int_equal(fsc_module_backward(blk, &ctx, saved, &dy, &din), FSC_OK);
    memcpy(dx, din.data, fsc_tensor_nbytes(&din));
    memcpy(grads, ps->grad, (size_t)ps->numel * sizeof(float));
    fsc_arena_free(a);
    return kept;
}

static void test_block_keeps_half_and_computes_the_same(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fsc_module *blk = fsc_block_new("h.0", C, NH, 0.f, 0, 1);
    assert_non_null(blk);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(blk, 5, true, &ps), FSC_OK);
    uint64_t seed = 23;
    static float xv[N * C], dyv[N * C], y1[N * C], y2[N * C], dx1[N * C], dx2[N * C];
    for (int i = 0; i < N * C; i++) xv[i] = frand(&seed), dyv[i] = frand(&seed);
    float *g1 = malloc((size_t)ps.numel * sizeof(float)), *g2 = malloc((size_t)ps.numel * 4);
    assert_non_null(g1), assert_non_null(g2);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON); /* every GEMM in bf16 */
    const size_t all = block_run(blk, &ps, xv, dyv, y1, dx1, g1);
    /* ln_1, ln_2 and GELU told no Linear reads them: they store fp32 */
    fsc_module *ln_1 = blk->children[0], *ln_2 = blk->children[2];
    fsc_module *act = blk->children[3]->children[1];
    const fsc_module *c_attn = blk->children[1]->children[0];
    const fsc_module *c_fc = blk->children[3]->children[0];
    const fsc_module *c_proj = blk->children[3]->children[2];
    nn_layernorm_set_feeds(ln_1, NULL), nn_layernorm_set_feeds(ln_2, NULL);
    nn_gelu_set_feeds(act, NULL);
    const size_t some = block_run(blk, &ps, xv, dyv, y2, dx2, g2);
    assert_memory_equal(y1, y2, sizeof y1);
    assert_memory_equal(dx1, dx2, sizeof dx1);
    assert_memory_equal(g1, g2, (size_t)ps.numel * sizeof(float));
    assert_int_equal(some - all, (size_t)N * (C + C + 4 * C) * 2);
    nn_layernorm_set_feeds(ln_1, c_attn), nn_layernorm_set_feeds(ln_2, c_fc);
    nn_gelu_set_feeds(act, c_proj);
    /* forced off: fp32 throughout, the attention output too */
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_OFF);
    const size_t none = block_run(blk, &ps, xv, dyv, y2, dx2, g2);
    assert_int_equal(none - all,
                     (size_t)N * (C + C + C + 4 * C + 4 * C + 3 * C) * 2 + QKV_ATT_SAVED);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_AUTO);
    free(g1), free(g2);
    fsc_params_free(&ps);
    fsc_module_free(blk);
}

/* max |a - b| over max |b| */
static double max_rel(const float *a, const float *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}

/* c_attn told its consumer reads fp32: q/k/v (3C per row) and the
 * probabilities (B*NH*T*T) stay fp32, exactly those bytes more; the output
 * is bit for bit the same (the bf16 GEMMs round both anyway), and so is
 * the value gradient path; dx and the gradients differ only through the
 * softmax backward reading p rounded (test_attention_bf16_act.c). */
static void test_attention_keeps_qkv_and_probabilities_in_bf16(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fsc_module *blk = fsc_block_new("h.0", C, NH, 0.f, 0, 1);
    assert_non_null(blk);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(blk, 5, true, &ps), FSC_OK);
    uint64_t seed = 29;
    static float xv[N * C], dyv[N * C], y1[N * C], y2[N * C], dx1[N * C], dx2[N * C];
    for (int i = 0; i < N * C; i++) xv[i] = frand(&seed), dyv[i] = frand(&seed);
    float *g1 = malloc((size_t)ps.numel * sizeof(float)), *g2 = malloc((size_t)ps.numel * 4);
    assert_non_null(g1), assert_non_null(g2);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    const size_t on = block_run(blk, &ps, xv, dyv, y1, dx1, g1);
    fsc_module *c_attn = blk->children[1]->children[0];
    nn_linear_set_out_bf16(c_attn, NULL, NULL);
    const size_t off = block_run(blk, &ps, xv, dyv, y2, dx2, g2);
    assert_int_equal(off - on, (size_t)N * 3 * C * 2 + QKV_ATT_SAVED);
    assert_memory_equal(y1, y2, sizeof y1);
    /* p off by at most 2^-9 p moves ds by about that relative to its
     * terms; the bf16 GEMMs after it round ds itself by 2^-9 and err by
     * up to e = 2^-7 of their sum|a||b|: so against the largest element,
     * each tensor moves by less than 2^-7; it stays below p's own 2^-9 */
    const double dxr = max_rel(dx1, dx2, N * C), gr = max_rel(g1, g2, ps.numel);
    print_message("p rounded in the softmax backward: dx %.2g, gradients %.2g of their max\n", dxr,
                  gr);
    assert_true(dxr < 1.0 / 512 && gr < 1.0 / 512);
    assert_true(memcmp(dx1, dx2, sizeof dx1) != 0); /* p really was read rounded */
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_AUTO);
    free(g1), free(g2);
    fsc_params_free(&ps);
    fsc_module_free(blk);
}

static size_t swiglu_kept(fsc_module *m, const float *xv, fsc_dtype *out_dt) {
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    assert_non_null(a);
    fsc_ctx ctx = {.arena = a, .training = true, .autocast = FSC_DTYPE_BF16};
    fsc_tensor x = fsc_tensor_3d((void *)xv, FSC_DTYPE_F32, B, T, C), out;
    void *saved;
    assert_int_equal(fsc_module_forward(m, &ctx, &x, &out, &saved), FSC_OK);
    *out_dt = out.dtype;
    const size_t kept = fsc_arena_used(a);
    fsc_arena_free(a);
    return kept;
}

static void test_swiglu_keeps_its_product_in_bf16(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    const int F = 160;
    fsc_module *m = fsc_swiglu_mlp_new("mlp", C, F, 0.02f, 0.02f);
    assert_non_null(m);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 9, true, &ps), FSC_OK);
    uint64_t seed = 31;
    static float xv[N * C];
    for (int i = 0; i < N * C; i++) xv[i] = frand(&seed);
    fsc_dtype on_dt, off_dt;
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    const size_t on = swiglu_kept(m, xv, &on_dt);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_OFF);
    const size_t off = swiglu_kept(m, xv, &off_dt);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_AUTO);
    assert_int_equal(on_dt, FSC_DTYPE_F32);
    assert_int_equal(off_dt, FSC_DTYPE_F32);
    assert_int_equal(off - on, (size_t)N * 3 * F * 2); /* product, gate, up */
    fsc_params_free(&ps);
    fsc_module_free(m);
}

/* ---- GPT-2's MLP reading c_fc's output in bf16 ----------------------------- */

/* An MLP's forward and backward under autocast ac: the bytes its forward
 * keeps; y, dx and the gradients copied. */
static size_t mlp_run(fsc_module *m, fsc_params *ps, fsc_dtype ac, const float *xv,
                      const float *dyv, float *y, float *dx, float *grads) {
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    assert_non_null(a);
    fsc_params_zero_grad(ps);
    fsc_ctx ctx = {.arena = a, .training = true, .keyed = true, .autocast = ac};
    fsc_tensor x = fsc_tensor_3d((void *)xv, FSC_DTYPE_F32, B, T, C), out, din;
    void *saved;
    assert_int_equal(fsc_module_forward(m, &ctx, &x, &out, &saved), FSC_OK);
    assert_int_equal(out.dtype, FSC_DTYPE_F32);
    const size_t kept = fsc_arena_used(a);
    memcpy(y, out.data, fsc_tensor_nbytes(&out));
    fsc_tensor dy = out;
    dy.data = (void *)dyv;
    assert_int_equal(fsc_module_backward(m, &ctx, saved, &dy, &din), FSC_OK);
    memcpy(dx, din.data, fsc_tensor_nbytes(&din));
    memcpy(grads, ps->grad, (size_t)ps->numel * sizeof(float));
    fsc_arena_free(a);
    return kept;
}

#define U_BF16 (1.0 / 256) /* bf16's unit roundoff, 2^-8 */
#define U_F32 (1.0 / 16777216)
#define GELU_D1 1.13 /* max |gelu'| (1.129 near x = 1.5) */
#define GELU_D2 0.80 /* max |gelu''| (sqrt(2/pi) = 0.798 at x = 0) */

static double gelu_d(double x, double *d1) { /* the tanh form and its derivative */
    const double k = 0.7978845608028654, t = tanh(k * (x + 0.044715 * x * x * x));
    *d1 = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    return 0.5 * x * (1 + t);
}

enum { F4 = 4 * C };
/* Worst-case bounds on how far the MLP's y, dx and gradients may move when
 * c_fc's output a is rounded to bf16 before GELU (u = 2^-8 of |a|), every
 * GEMM in bf16 both ways (exact products of bf16 operands, fp32 sums):
 *  - h = gelu(a) moves by at most u (D1 |a| + 2 |h|): the change through
 *    gelu', and both sides' own rounding of h to bf16 for c_proj;
 *  - dh = dy W_proj^T is the same both ways; da = dh gelu'(a) moves by at
 *    most u (D2 |a| |dh| + 2 |da|): the change through gelu'', and both
 *    sides' rounding of da to bf16 for c_fc's GEMMs;
 *  - a GEMM then carries those through |W| (1 + u), |dy| or |x|, plus each
 *    side's fp32 summation error, K 2^-24 of its sum of |products|.
 * All four bounds in one array laid out as the parameters and dx. */
static void mlp_bounds(const fsc_module *m, const float *xv, const float *dyv, double *by,
                       double *bdx, double *bg) {
    const float *wf = m->children[0]->params[0].data, *bf = m->children[0]->params[1].data;
    const float *wp = m->children[2]->params[0].data;
    static double dh_[N * F4], da_[N * F4], h_[N * F4], a_[N * F4];
    for (int n = 0; n < N; n++)
        for (int k = 0; k < F4; k++) {
            double a = bf[k], dh = 0, d1;
            for (int c = 0; c < C; c++) a += (double)xv[n * C + c] * wf[c * F4 + k];
            for (int j = 0; j < C; j++) dh += (double)dyv[n * C + j] * wp[k * C + j];
            h_[n * F4 + k] = fabs(gelu_d(a, &d1)), a_[n * F4 + k] = fabs(a);
            dh_[n * F4 + k] = fabs(dh), da_[n * F4 + k] = fabs(dh * d1);
        }
    const double w1 = 1 + U_BF16;
    /* parameters: c_fc.weight (C,4C), c_fc.bias (4C), c_proj.weight (4C,C), c_proj.bias (C) */
    double *gwf = bg, *gbf = gwf + C * F4, *gwp = gbf + F4, *gbp = gwp + F4 * C;
    memset(bg, 0, sizeof(double) * (size_t)(C * F4 + F4 + F4 * C + C));
    memset(by, 0, sizeof(double) * N * C), memset(bdx, 0, sizeof(double) * N * C);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < F4; k++) {
            const int i = n * F4 + k;
            const double dh = U_BF16 * (GELU_D1 * a_[i] + 2 * h_[i]);
            const double da = U_BF16 * (GELU_D2 * a_[i] * dh_[i] + 2 * da_[i]);
            for (int j = 0; j < C; j++) {
                const double wpa = fabs(wp[k * C + j]) * w1, dya = fabs(dyv[n * C + j]) * w1;
                by[n * C + j] += dh * wpa + 2 * F4 * U_F32 * h_[i] * wpa;
                gwp[k * C + j] += dh * dya + 2 * N * U_F32 * h_[i] * dya;
            }
            for (int c = 0; c < C; c++) {
                const double wfa = fabs(wf[c * F4 + k]) * w1, xa = fabs(xv[n * C + c]) * w1;
                bdx[n * C + c] += da * wfa + 2 * F4 * U_F32 * da_[i] * wfa;
                gwf[c * F4 + k] += da * xa + 2 * N * U_F32 * da_[i] * xa;
            }
            gbf[k] += da + 2 * N * U_F32 * da_[i];
        }
    (void)gbp; /* c_proj's bias gradient sums dy alone: equal both ways */
}

/* Elements where |a - b| exceeds bound (times 1.05 for second-order terms
 * the bound leaves out); prints the first. The largest share of its bound
 * any element uses goes to *used. */
static int over_bound(const char *what, const float *a, const float *b, const double *bound,
                      int64_t n, double *used) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]), lim = 1.05 * bound[i] + 1e-30;
        *used = fmax(*used, d / lim);
        if (d > lim && !bad++)
            print_error("%s[%lld]: %.9g vs %.9g, off by %.3g > bound %.3g\n", what, (long long)i,
                        a[i], b[i], d, lim);
    }
    return bad;
}

/* GELU and SwiGLU on inputs stored in bf16 compute, bit for bit, what the
 * fp32 kernels compute on those inputs' widenings: forward (fp32 or bf16
 * out) and backward, which so differentiates at the stored value. */
static void test_kernels_evaluate_at_the_widening(void **state) {
    (void)state;
    enum { M = 4099 }; /* not a multiple of any vector width */
    static uint16_t gh[M], uh[M], o1h[M], o2h[M];
    static float g[M], u[M], dout[M], o1[M], o2[M], d1[M], d2[M], e1[M], e2[M];
    uint64_t seed = 41;
    for (int i = 0; i < M; i++) {
        gh[i] = fsc_f32_to_bf16(12 * frand(&seed)), uh[i] = fsc_f32_to_bf16(4 * frand(&seed));
        g[i] = fsc_bf16_to_f32(gh[i]), u[i] = fsc_bf16_to_f32(uh[i]), dout[i] = frand(&seed);
    }
    fsc_gelu_forward(o1, g, M), fsc_gelu_forward_bf16_in(o2, gh, M);
    assert_memory_equal(o1, o2, sizeof o1);
    fsc_gelu_forward_bf16(o1h, g, M), fsc_gelu_forward_bf16_io(o2h, gh, M);
    assert_memory_equal(o1h, o2h, sizeof o1h);
    fsc_gelu_backward(d1, g, dout, M), fsc_gelu_backward_bf16_in(d2, gh, dout, M);
    assert_memory_equal(d1, d2, sizeof d1);
    fsc_swiglu_forward(o1, g, u, M), fsc_swiglu_forward_bf16_in(o2, gh, uh, M);
    assert_memory_equal(o1, o2, sizeof o1);
    fsc_swiglu_forward_bf16(o1h, g, u, M), fsc_swiglu_forward_bf16_io(o2h, gh, uh, M);
    assert_memory_equal(o1h, o2h, sizeof o1h);
    fsc_swiglu_backward(d1, e1, dout, g, u, M);
    memcpy(e2, dout, sizeof e2); /* dup over dout, as the MLP runs it */
    fsc_swiglu_backward_bf16_in(d2, e2, e2, gh, uh, M);
    assert_memory_equal(d1, d2, sizeof d1);
    assert_memory_equal(e1, e2, sizeof e1);
}

/* c_fc told GELU reads fp32 keeps exactly N x 4C x 2 bytes more; stored in
 * bf16 the MLP's y, dx and gradients stay within mlp_bounds of that fp32-
 * stored run and differ from it (GELU really read the rounded value);
 * forced off, bf16 autocast keeps everything fp32 and computes bit for bit
 * what fp32 computes. */
static void test_mlp_reads_c_fc_in_bf16(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fsc_module *m = fsc_mlp_new("mlp", C, 0.f, 1, 0.05f, 0.05f);
    assert_non_null(m);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 17, true, &ps), FSC_OK);
    assert_int_equal(ps.numel, C * F4 + F4 + F4 * C + C);
    uint64_t seed = 37;
    static float xv[N * C], dyv[N * C], y1[N * C], y2[N * C], dx1[N * C], dx2[N * C];
    for (int i = 0; i < N * C; i++) xv[i] = 4 * frand(&seed), dyv[i] = frand(&seed);
    float *g1 = malloc((size_t)ps.numel * sizeof(float)), *g2 = malloc((size_t)ps.numel * 4);
    double *bg = malloc((size_t)ps.numel * sizeof(double));
    static double by[N * C], bdx[N * C];
    assert_non_null(g1), assert_non_null(g2), assert_non_null(bg);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    const size_t h = mlp_run(m, &ps, FSC_DTYPE_BF16, xv, dyv, y1, dx1, g1);
    fsc_module *c_fc = m->children[0];
    nn_linear_set_out_bf16(c_fc, NULL, NULL); /* c_fc's output fp32, as before */
    const size_t f = mlp_run(m, &ps, FSC_DTYPE_BF16, xv, dyv, y2, dx2, g2);
    nn_linear_set_out_bf16(c_fc, nn_gelu_reads_bf16, m->children[1]);
    assert_int_equal(f - h, (size_t)N * F4 * 2);
    mlp_bounds(m, xv, dyv, by, bdx, bg);
    double used = 0;
    int bad = over_bound("y", y1, y2, by, N * C, &used);
    bad += over_bound("dx", dx1, dx2, bdx, N * C, &used);
    bad += over_bound("grad", g1, g2, bg, C * F4 + F4 + F4 * C, &used);
    print_message("c_fc's output in bf16: y, dx, gradients within %.0f%% of their bounds\n",
                  100 * used);
    assert_int_equal(bad, 0);
    assert_memory_equal(g1 + ps.numel - C, g2 + ps.numel - C, C * sizeof(float)); /* c_proj.bias */
    assert_true(memcmp(y1, y2, sizeof y1) != 0 && memcmp(dx1, dx2, sizeof dx1) != 0);
    /* forced off: fp32 kept throughout, bit for bit fp32 autocast's numbers */
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_OFF);
    const size_t off = mlp_run(m, &ps, FSC_DTYPE_BF16, xv, dyv, y1, dx1, g1);
    const size_t f32 = mlp_run(m, &ps, FSC_DTYPE_F32, xv, dyv, y2, dx2, g2);
    assert_int_equal(off - h, (size_t)N * (F4 + F4) * 2); /* c_fc's and GELU's outputs */
    assert_int_equal(off, f32);
    assert_memory_equal(y1, y2, sizeof y1);
    assert_memory_equal(dx1, dx2, sizeof dx1);
    assert_memory_equal(g1, g2, (size_t)ps.numel * sizeof(float));
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_AUTO);
    free(g1), free(g2), free(bg);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_reads_bf16_as_its_widening),
        cmocka_unit_test(test_block_keeps_half_and_computes_the_same),
        cmocka_unit_test(test_attention_keeps_qkv_and_probabilities_in_bf16),
        cmocka_unit_test(test_swiglu_keeps_its_product_in_bf16),
        cmocka_unit_test(test_kernels_evaluate_at_the_widening),
        cmocka_unit_test(test_mlp_reads_c_fc_in_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
