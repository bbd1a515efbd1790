/* RMSNorm over the last dimension (LLaMA's): y = x / sqrt(mean(x^2) + eps) * w.
 * No centring and no bias, so the only statistic backward needs is 1/rms
 * per row. The products are taken in Hugging Face's order, (x * rstd) * w. */
#include <math.h>

#include "fsc/kernels.h"

// out, inp are (N,C); rstd is (N); weight is (C)
void fsc_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps) {
#pragma omp parallel for if ((int64_t)N * C >= (1 << 16)) schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = (x[c] * s) * weight[c];
        rstd[i] = s;
    }
}

/* With xhat = x s and g = w dy: dx = s (g - xhat mean(g xhat)), dw += xhat dy. */
void fsc_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        float s = rstd[i], dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++) {
            float xhat = x[c] * s;
            dot += weight[c] * dy[c] * xhat;
            dweight[c] += xhat * dy[c];
        }
        dot /= (float)C;
#pragma omp simd
        for (int c = 0; c < C; c++) dx[c] = (weight[c] * dy[c] - x[c] * s * dot) * s;
    }
}
