/* Linear layers through CBLAS sgemm (or, at FSC_GEMM_BF16, fsc_gemm's bf16
 * path). Both weight layouts (torch's (OC,C) and GPT-2 Conv1D's (C,OC)) map
 * onto GEMM transpose flags, so no copies. In bf16 each value is rounded at
 * most once per call: a weight with a bf16 view (FSDP's gather) or a cached
 * copy of this weights version (fsc_bf16_weight_find) not at all, dout once
 * for the two backward GEMMs that read it. */
#include <string.h>

#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

// out is (N,OC), inp is (N,C), weight (OC,C) or (C,OC), bias (OC) or NULL
void fsc_matmul_forward_prec(float *out, const float *inp, const float *weight, const float *bias,
                             int N, int C, int OC, fsc_weight_layout layout, fsc_gemm_prec prec) {
    bool in_out = layout == FSC_WEIGHT_IN_OUT;
    if (prec == FSC_GEMM_BF16) { /* oneDNN writes out directly, adding the bias in fp32 */
        const uint16_t *wh = fsc_bf16_weight_find(weight, (int64_t)C * OC);
        if (bias)
            fsc_gemm_bf16_bias(!in_out, N, OC, C, inp, NULL, C, weight, wh, in_out ? OC : C, bias,
                               out, OC);
        else
            fsc_gemm_bf16(false, !in_out, N, OC, C, 1.f, inp, NULL, C, weight, wh, in_out ? OC : C,
                          0.f, out, OC);
        return;
    }
    float beta = 0.f;
    if (bias) {
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.f;
    }
    fsc_sgemm(false, !in_out, N, OC, C, 1.f, inp, C, weight, in_out ? OC : C, beta, out, OC);
}

void fsc_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                        int C, int OC, fsc_weight_layout layout) {
    fsc_matmul_forward_prec(out, inp, weight, bias, N, C, OC, layout, FSC_GEMM_F32);
}

/* The backward's two GEMMs in bf16: dout (N,OC), dense in both, is rounded
 * once when both run on oneDNN; inph, when not NULL, is inp in bf16. */
static void backward_bf16(float *dinp, float *dweight, const float *dout, const float *inp,
                          const uint16_t *inph, const float *weight, int N, int C, int OC,
                          bool in_out) {
    const int ldw = in_out ? OC : C;
    const uint16_t *wh = dinp ? fsc_bf16_weight_find(weight, (int64_t)C * OC) : NULL;
    uint16_t *douth = NULL;
    if (dinp && dweight &&
        fsc_gemm_bf16_runs(false, in_out, N, C, OC, 1.f, dout, OC, weight, ldw, 0.f, C) &&
        (in_out ? fsc_gemm_bf16_runs(true, false, C, OC, N, 1.f, inp, C, dout, OC, 1.f, OC)
                : fsc_gemm_bf16_runs(true, false, OC, C, N, 1.f, dout, OC, inp, C, 1.f, C)) &&
        (douth = fsc_bf16_ws(0, (size_t)N * OC)))
        fsc_pack_bf16(douth, dout, N, OC, OC);
    if (dinp) /* dinp = dout @ W(OC,C), or dout @ W(C,OC)^T */
        fsc_gemm_bf16(false, in_out, N, C, OC, 1.f, dout, douth, OC, weight, wh, ldw, 0.f, dinp, C);
    if (dweight && in_out) /* dW(C,OC) += inp^T @ dout */
        fsc_gemm_bf16(true, false, C, OC, N, 1.f, inp, inph, C, dout, douth, OC, 1.f, dweight, OC);
    else if (dweight) /* dW(OC,C) += dout^T @ inp */
        fsc_gemm_bf16(true, false, OC, C, N, 1.f, dout, douth, OC, inp, inph, C, 1.f, dweight, C);
}

static void bias_grad(float *dbias, const float *dout, int N, int OC) {
    for (int i = 0; i < N; i++) {
        const float *row = dout + (size_t)i * OC;
#pragma omp simd
        for (int o = 0; o < OC; o++) dbias[o] += row[o];
    }
}

void fsc_matmul_backward_bf16_in(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const uint16_t *inph, const float *weight, int N,
                                 int C, int OC, fsc_weight_layout layout) {
    backward_bf16(dinp, dweight, dout, inp, inph, weight, N, C, OC, layout == FSC_WEIGHT_IN_OUT);
    if (dbias) bias_grad(dbias, dout, N, OC);
}

void fsc_matmul_backward_prec(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int N, int C, int OC,
                              fsc_weight_layout layout, fsc_gemm_prec prec) {
    bool in_out = layout == FSC_WEIGHT_IN_OUT;
    if (prec == FSC_GEMM_BF16) {
        backward_bf16(dinp, dweight, dout, inp, NULL, weight, N, C, OC, in_out);
    } else {
        if (dinp) /* dinp = dout @ W(OC,C), or dout @ W(C,OC)^T */
            fsc_sgemm(false, in_out, N, C, OC, 1.f, dout, OC, weight, in_out ? OC : C, 0.f, dinp,
                      C);
        if (dweight && in_out) /* dW(C,OC) += inp^T @ dout */
            fsc_sgemm(true, false, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dweight, OC);
        else if (dweight) /* dW(OC,C) += dout^T @ inp */
            fsc_sgemm(true, false, OC, C, N, 1.f, dout, OC, inp, C, 1.f, dweight, C);
    }
    if (dbias) bias_grad(dbias, dout, N, OC);
}

void fsc_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC,
                         fsc_weight_layout layout) {
    fsc_matmul_backward_prec(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout,
                             FSC_GEMM_F32);
}
