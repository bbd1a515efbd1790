/* Linear layers reading activations stored in bf16 (issue 27's bf16 end to
 * end): their producers (GELU, activation.c; LayerNorm, layernorm.c) round
 * them once as the bf16 GEMM would round them, so the product is the same
 * and the fp32 copy is never kept. A bf16 input is the
 * operand the bf16 GEMM multiplies, handed to oneDNN as is; it is also
 * widened into a per-thread fp32 workspace (exactly: bf16 is the top half
 * of an fp32), because a shape that measured faster on sgemm, and the first
 * call's measurement, read fp32. That workspace is FSC_MEM_WORK, reused by
 * every layer, not an activation. */
#include <string.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

#define PAR_MIN (1 << 16)
#define WS_IN 1 /* fsc_bf16_ws slot of the widened input (slot 0: backward's dout) */

void fsc_widen_bf16(float *dst, const uint16_t *src, int64_t n) {
    /* a short span opens no OpenMP region: callers widen single rows inside
     * their own loops, where even a region run on one thread costs more than
     * the row (the bf16 attention backward: 244 -> 40 ms a medium step) */
    if (n < PAR_MIN) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = fsc_bf16_widen(src[i]);
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] = fsc_bf16_widen(src[i]);
}

/* A per-thread fp32 workspace of n floats in slot `slot`; NULL when out of
 * memory. */
static float *ws_f32(int slot, int64_t n) {
    return (float *)(void *)fsc_bf16_ws(slot, 2 * (size_t)n);
}

int fsc_matmul_forward_bf16_act(float *out, const uint16_t *inph, const float *weight,
                                const float *bias, int N, int C, int OC, fsc_weight_layout layout) {
    const bool in_out = layout == FSC_WEIGHT_IN_OUT;
    float *a = ws_f32(WS_IN, (int64_t)N * C);
    if (!a) return FSC_ERR_NOMEM;
    fsc_widen_bf16(a, inph, (int64_t)N * C);
    const uint16_t *wh = fsc_bf16_weight_find(weight, (int64_t)C * OC);
    if (bias)
        fsc_gemm_bf16_bias(!in_out, N, OC, C, a, inph, C, weight, wh, in_out ? OC : C, bias, out,
                           OC);
    else
        fsc_gemm_bf16(false, !in_out, N, OC, C, 1.f, a, inph, C, weight, wh, in_out ? OC : C, 0.f,
                      out, OC);
    return FSC_OK;
}

int fsc_matmul_backward_bf16_act(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const uint16_t *inph, const float *weight, int N, int C, int OC,
                                 fsc_weight_layout layout) {
    float *a = ws_f32(WS_IN, (int64_t)N * C);
    if (!a) return FSC_ERR_NOMEM;
    fsc_widen_bf16(a, inph, (int64_t)N * C);
    fsc_matmul_backward_bf16_in(dinp, dweight, dbias, dout, a, inph, weight, N, C, OC, layout);
    return FSC_OK;
}
