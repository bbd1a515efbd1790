/* SwiGLU's gate (LLaMA's MLP): out = silu(gate) * up, element-wise, with
 * silu(g) = g sigmoid(g). The two projections stay separate arrays (they are
 * separate nn.Linear weights under Hugging Face's names); only this product
 * is fused, so the MLP keeps gate and up and no silu(gate) copy. Under bf16
 * autocast gate and up may be stored in bf16 (their Linears' outputs) and
 * the product in bf16 (down_proj's input): every variant evaluates the one
 * formula below on the widened values. */
#include "fastmath.h"
#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

#define PAR_MIN (1 << 16)

static inline float swiglu_at(float g, float u) {
    return g / (1.0f + fsc_fast_expf(-g)) * u;
}

/* dgate = dout * up * silu'(gate), silu'(g) = sig (1 + g (1 - sig));
 * dup = dout * silu(gate). dup may alias dout: dout is read first. */
static inline void swiglu_grad_at(float *dgate, float *dup, float dy, float g, float u) {
    float sig = 1.0f / (1.0f + fsc_fast_expf(-g));
    *dgate = dy * u * sig * (1.0f + g * (1.0f - sig));
    *dup = dy * g * sig;
}

// out, gate, up are (n); out may equal gate or up
void fsc_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = swiglu_at(gate[i], up[i]);
}

/* The same product rounded once to bf16 (down_proj's GEMM input under bf16
 * autocast: matmul_bf16_act.c). */
void fsc_swiglu_forward_bf16(uint16_t *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = fsc_bf16_round(swiglu_at(gate[i], up[i]));
}

void fsc_swiglu_forward_bf16_in(float *out, const uint16_t *gate, const uint16_t *up, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = swiglu_at(fsc_bf16_widen(gate[i]), fsc_bf16_widen(up[i]));
}

void fsc_swiglu_forward_bf16_io(uint16_t *out, const uint16_t *gate, const uint16_t *up,
                                int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = fsc_bf16_round(swiglu_at(fsc_bf16_widen(gate[i]), fsc_bf16_widen(up[i])));
}

void fsc_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float dg, du;
        swiglu_grad_at(&dg, &du, dout[i], gate[i], up[i]);
        dgate[i] = dg, dup[i] = du;
    }
}

void fsc_swiglu_backward_bf16_in(float *dgate, float *dup, const float *dout, const uint16_t *gate,
                                 const uint16_t *up, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float dg, du;
        swiglu_grad_at(&dg, &du, dout[i], fsc_bf16_widen(gate[i]), fsc_bf16_widen(up[i]));
        dgate[i] = dg, dup[i] = du;
    }
}
