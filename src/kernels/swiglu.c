/* SwiGLU's gate (LLaMA's MLP): out = silu(gate) * up, element-wise, with
 * silu(g) = g sigmoid(g). The two projections stay separate arrays (they are
 * separate nn.Linear weights under Hugging Face's names); only this product
 * is fused, so the MLP keeps gate and up and no silu(gate) copy. */
#include "fastmath.h"
#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

#define PAR_MIN (1 << 16)

// out, gate, up are (n); out may equal gate or up
void fsc_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + fsc_fast_expf(-g)) * up[i];
    }
}

/* The same product rounded once to bf16 (down_proj's GEMM input under bf16
 * autocast: matmul_bf16_act.c). */
void fsc_swiglu_forward_bf16(uint16_t *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = fsc_bf16_round(g / (1.0f + fsc_fast_expf(-g)) * up[i]);
    }
}

/* dgate = dout * up * silu'(gate), silu'(g) = sig (1 + g (1 - sig));
 * dup = dout * silu(gate). Both written. */
void fsc_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], sig = 1.0f / (1.0f + fsc_fast_expf(-g));
        float dy = dout[i];
        dgate[i] = dy * up[i] * sig * (1.0f + g * (1.0f - sig));
        dup[i] = dy * g * sig;
    }
}
