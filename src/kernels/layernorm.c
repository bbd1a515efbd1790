/* LayerNorm over the last dimension; mean and 1/std are kept for backward.
 * Under bf16 autocast the output that feeds a bf16 GEMM may be written in
 * bf16 (matmul_bf16_act.c). */
#include <math.h>

#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

/* One row: its mean and 1/std, then y in fp32 or, when yh, rounded to
 * bf16 (the same fp32 value rounded, as a bf16 GEMM rounds its input). */
static inline void ln_row(float *y, uint16_t *yh, float *mean, float *rstd, const float *x,
                          const float *weight, const float *bias, int C, float eps) {
    float m = 0.f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += x[c];
    m /= (float)C;
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    float s = 1.0f / sqrtf(v / (float)C + eps);
    if (yh) {
#pragma omp simd
        for (int c = 0; c < C; c++) yh[c] = fsc_bf16_round((x[c] - m) * s * weight[c] + bias[c]);
    } else {
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    }
    *mean = m;
    *rstd = s;
}

// out, inp are (N,C); mean, rstd are (N); weight, bias are (C)
void fsc_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C, float eps) {
#pragma omp parallel for if (N * C >= (1 << 16)) schedule(static)
    for (int i = 0; i < N; i++)
        ln_row(out + (size_t)i * C, NULL, &mean[i], &rstd[i], inp + (size_t)i * C, weight, bias, C,
               eps);
}

void fsc_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int N, int C, float eps) {
#pragma omp parallel for if (N * C >= (1 << 16)) schedule(static)
    for (int i = 0; i < N; i++)
        ln_row(NULL, out + (size_t)i * C, &mean[i], &rstd[i], inp + (size_t)i * C, weight, bias, C,
               eps);
}

void fsc_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            float dnorm = weight[c] * dy[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * xhat;
            dbias[c] += dy[c];
            dweight[c] += xhat * dy[c];
        }
        dnorm_mean /= (float)C;
        dnorm_norm_mean /= (float)C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            dx[c] = (weight[c] * dy[c] - dnorm_mean - xhat * dnorm_norm_mean) * s;
        }
    }
}
