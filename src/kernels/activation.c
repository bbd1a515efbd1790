/* Point-wise activations: GELU (tanh form, as GPT-2) and ReLU. */
#include "fastmath.h"
#include "fsc/kernels.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define PAR_MIN (1 << 16)

void fsc_gelu_forward(float *out, const float *inp, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float t = fsc_fast_tanhf(GELU_K * (x + 0.044715f * x * x * x));
        out[i] = 0.5f * x * (1.0f + t);
    }
}

void fsc_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float t = fsc_fast_tanhf(u);
        float sech2 = 1.0f - t * t;
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
    }
}

void fsc_relu_forward(float *out, const float *inp, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = inp[i] > 0.f ? inp[i] : 0.f;
}

void fsc_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) dinp[i] = inp[i] > 0.f ? dout[i] : 0.f;
}
