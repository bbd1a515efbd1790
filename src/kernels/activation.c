/* Point-wise activations: GELU (tanh form, as GPT-2) and ReLU. Under bf16
 * autocast GELU also reads c_fc's output stored in bf16 and writes c_proj's
 * input in bf16: every variant evaluates the one formula below on the
 * widened value, so storage changes what GELU is evaluated at, never how. */
#include "fastmath.h"
#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define PAR_MIN (1 << 16)

static inline float gelu_at(float x) {
    float t = fsc_fast_tanhf(GELU_K * (x + 0.044715f * x * x * x));
    return 0.5f * x * (1.0f + t);
}

/* dout * gelu'(x) */
static inline float gelu_grad_at(float x, float dout) {
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float t = fsc_fast_tanhf(u);
    float sech2 = 1.0f - t * t;
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return dout * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
}

void fsc_gelu_forward(float *out, const float *inp, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = gelu_at(inp[i]);
}

void fsc_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) dinp[i] = gelu_grad_at(inp[i], dout[i]);
}

void fsc_gelu_forward_bf16(uint16_t *out, const float *inp, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = fsc_bf16_round(gelu_at(inp[i]));
}

void fsc_gelu_forward_bf16_in(float *out, const uint16_t *inp, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = gelu_at(fsc_bf16_widen(inp[i]));
}

void fsc_gelu_forward_bf16_io(uint16_t *out, const uint16_t *inp, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = fsc_bf16_round(gelu_at(fsc_bf16_widen(inp[i])));
}

void fsc_gelu_backward_bf16_in(float *dinp, const uint16_t *inp, const float *dout, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) dinp[i] = gelu_grad_at(fsc_bf16_widen(inp[i]), dout[i]);
}

void fsc_relu_forward(float *out, const float *inp, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = inp[i] > 0.f ? inp[i] : 0.f;
}

void fsc_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) dinp[i] = inp[i] > 0.f ? dout[i] : 0.f;
}
