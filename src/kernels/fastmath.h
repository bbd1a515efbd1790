/* Branch-free float exp and tanh that the compiler vectorises.
 * libm's expf/tanhf are scalar calls here; GELU, softmax and cross-entropy
 * evaluate millions of them per step, so a polynomial exp (relative error
 * ~2e-7 over the clamped range) keeps those kernels memory-bound. */
#ifndef FSC_FASTMATH_H
#define FSC_FASTMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float fsc_fast_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* round to nearest by the 1.5 * 2^23 trick: floorf/rintf only vectorise
     * under -fno-trapping-math, which fsc does not impose on its users */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666671633720398f +
                                                  r * (0.0416666679084300995f +
                                                       r * (0.00833333376795053482f +
                                                            r * 0.00138888892252087593f)))));
    /* NaN in gives NaN out (p is NaN); the exponent is built from 0 then,
     * since converting NaN to an integer is undefined behaviour */
    const float e = n == n ? n : 0.0f;
    int32_t bits = ((int32_t)e + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float fsc_fast_tanhf(float u) {
    return 1.0f - 2.0f / (fsc_fast_expf(2.0f * u) + 1.0f);
}

#endif
