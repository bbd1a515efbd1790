/* Linear layers through CBLAS sgemm (or, at FSC_GEMM_BF16, fsc_gemm's bf16
 * path). Both weight layouts (torch's (OC,C) and GPT-2 Conv1D's (C,OC)) map
 * onto GEMM transpose flags, so no copies. */
#include <string.h>

#include "fsc/kernels.h"

// out is (N,OC), inp is (N,C), weight (OC,C) or (C,OC), bias (OC) or NULL
void fsc_matmul_forward_prec(float *out, const float *inp, const float *weight, const float *bias,
                             int N, int C, int OC, fsc_weight_layout layout, fsc_gemm_prec prec) {
    bool in_out = layout == FSC_WEIGHT_IN_OUT;
    if (prec == FSC_GEMM_BF16) { /* oneDNN writes out directly; the bias after, in fp32 */
        fsc_gemm(prec, false, !in_out, N, OC, C, 1.f, inp, C, weight, in_out ? OC : C, 0.f, out,
                 OC);
        for (int i = 0; bias && i < N; i++) fsc_add_inplace(out + (size_t)i * OC, bias, OC);
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

void fsc_matmul_backward_prec(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int N, int C, int OC,
                              fsc_weight_layout layout, fsc_gemm_prec prec) {
    bool in_out = layout == FSC_WEIGHT_IN_OUT;
    if (dinp) /* dinp = dout @ W(OC,C), or dout @ W(C,OC)^T */
        fsc_gemm(prec, false, in_out, N, C, OC, 1.f, dout, OC, weight, in_out ? OC : C, 0.f, dinp,
                 C);
    if (dweight) {
        if (in_out) /* dW(C,OC) += inp^T @ dout */
            fsc_gemm(prec, true, false, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dweight, OC);
        else /* dW(OC,C) += dout^T @ inp */
            fsc_gemm(prec, true, false, OC, C, N, 1.f, dout, OC, inp, C, 1.f, dweight, C);
    }
    if (dbias)
        for (int i = 0; i < N; i++) {
            const float *row = dout + (size_t)i * OC;
#pragma omp simd
            for (int o = 0; o < OC; o++) dbias[o] += row[o];
        }
}

void fsc_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC,
                         fsc_weight_layout layout) {
    fsc_matmul_backward_prec(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout,
                             FSC_GEMM_F32);
}
