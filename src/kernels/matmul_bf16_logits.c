/* The LM head's GEMMs with the logits held in bf16 (issue 27's bf16 end to
 * end): under bf16 autocast the (N,V) logits are the largest activation,
 * and keeping them in bf16 halves them, as PyTorch's autocast does. The
 * GEMMs still accumulate in fp32; the product goes through a per-thread
 * fp32 workspace a block of rows at a time, each value rounded once, so
 * the whole fp32 product never exists. In backward the gradient, written
 * in bf16 by the loss, is the operand both bf16 GEMMs multiply as is; a
 * block's exact fp32 widening is made beside it only because a shape that
 * measured faster on sgemm reads fp32. */
#include "fsc/core.h"
#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

#define BLOCK_BYTES ((int64_t)8 << 20) /* fp32 bytes of one block of rows */
#define MIN_ROWS 64                    /* below this the GEMMs lose more than memory saves */
#define PAR_MIN (1 << 16)
/* fsc_bf16_ws slots, free while the head runs (matmul.c's and
 * matmul_bf16_act.c's, attention's, all between calls) */
enum { WS_WEIGHT = 0, WS_ROWS = 1 };

static int block_rows(int N, int OC) {
    int64_t r = BLOCK_BYTES / (4 * (int64_t)OC);
    r = r < MIN_ROWS ? MIN_ROWS : r;
    return r < N ? (int)r : N;
}

/* The weight in bf16, rounded once for every block: the cache's copy or a
 * view (fsc_bf16_weight_find), else rounded here. With one block the GEMM
 * rounds it itself: *wh stays NULL. FSC_ERR_NOMEM. */
static int weight_bf16(const float *w, int64_t n, bool blocks, const uint16_t **wh) {
    *wh = fsc_bf16_weight_find(w, n);
    if (*wh || !blocks) return FSC_OK;
    uint16_t *r = fsc_bf16_ws(WS_WEIGHT, (size_t)n);
    if (!r) return FSC_ERR_NOMEM;
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) r[i] = fsc_bf16_round(w[i]);
    *wh = r;
    return FSC_OK;
}

static float *rows_f32(int64_t n) {
    return (float *)(void *)fsc_bf16_ws(WS_ROWS, 2 * (size_t)n);
}

int fsc_matmul_forward_bf16_out(uint16_t *out, const float *inp, const float *weight, int N, int C,
                                int OC, fsc_weight_layout layout) {
    if (N <= 0) return FSC_OK;
    const bool in_out = layout == FSC_WEIGHT_IN_OUT;
    const int R = block_rows(N, OC);
    const uint16_t *wh;
    int rc = weight_bf16(weight, (int64_t)C * OC, R < N, &wh);
    float *yf = rc ? NULL : rows_f32((int64_t)R * OC);
    if (!yf) return FSC_ERR_NOMEM;
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        fsc_gemm_bf16(false, !in_out, n, OC, C, 1.f, inp + (size_t)r0 * C, NULL, C, weight, wh,
                      in_out ? OC : C, 0.f, yf, OC);
        uint16_t *o = out + (size_t)r0 * OC;
        const int64_t m = (int64_t)n * OC;
#pragma omp parallel for simd if (m >= PAR_MIN) schedule(static)
        for (int64_t i = 0; i < m; i++) o[i] = fsc_bf16_round(yf[i]);
    }
    return FSC_OK;
}

int fsc_matmul_backward_bf16_dout(float *dinp, float *dweight, const uint16_t *douth,
                                  const float *inp, const float *weight, int N, int C, int OC,
                                  fsc_weight_layout layout) {
    if (N <= 0 || (!dinp && !dweight)) return FSC_OK;
    const bool in_out = layout == FSC_WEIGHT_IN_OUT;
    const int R = block_rows(N, OC), ldw = in_out ? OC : C;
    const uint16_t *wh = NULL;
    int rc = dinp ? weight_bf16(weight, (int64_t)C * OC, R < N, &wh) : FSC_OK;
    float *df = rc ? NULL : rows_f32((int64_t)R * OC);
    if (!df) return FSC_ERR_NOMEM;
    /* dW sums its blocks' products in fp32, in the order of the rows */
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        const uint16_t *dh = douth + (size_t)r0 * OC;
        const float *x = inp + (size_t)r0 * C;
        fsc_widen_bf16(df, dh, (int64_t)n * OC);
        if (dinp) /* dinp = dout @ W(OC,C), or dout @ W(C,OC)^T */
            fsc_gemm_bf16(false, in_out, n, C, OC, 1.f, df, dh, OC, weight, wh, ldw, 0.f,
                          dinp + (size_t)r0 * C, C);
        if (dweight && in_out) /* dW(C,OC) += x^T @ dout */
            fsc_gemm_bf16(true, false, C, OC, n, 1.f, x, NULL, C, df, dh, OC, 1.f, dweight, OC);
        else if (dweight) /* dW(OC,C) += dout^T @ x */
            fsc_gemm_bf16(true, false, OC, C, n, 1.f, df, dh, OC, x, NULL, C, 1.f, dweight, C);
    }
    return FSC_OK;
}
