/* Local element-wise math of the distributed runtime: the reduction step of
 * the rings (and of every other reduction path), AVG's division, and the
 * half-precision conversions behind them.
 *
 * The one idea: half-precision sums travel as halves and are added like
 * NCCL adds them: each hop widens both operands to F32, adds, and rounds the
 * sum once back to the half type. The wire carries half the bytes of F32;
 * a sum over P ranks is rounded P - 1 times (each within half a unit in the
 * last place of that partial sum), not once.
 */
#include <string.h>

#include "dist_internal.h"

/* Inline and vectorisable, bit for bit core's fsc_bf16_to_f32 / fsc_f32_to_bf16
 * and fsc_f16_to_f32 / fsc_f32_to_f16 (round to nearest even, quiet NaNs,
 * F16 subnormals and overflow to infinity): a call per element made half
 * reductions 10x slower than F32 ones. tests/comm/mpi_collectives.c compares them
 * with core's over every half value. */
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t nan = (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? (u >> 16) | 0x40u : rounded);
}

/* F16 -> F32: shift exponent and mantissa into place and rebias; infinities
 * and NaNs get the full F32 exponent; subnormals are renormalised by an
 * exact F32 subtraction (magic 2^-14). */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t u = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t exp = u & 0x0f800000u;
    u += (uint32_t)(127 - 15) << 23;
    if (exp == 0x0f800000u) {
        u += (uint32_t)(128 - 16) << 23; /* Inf / NaN */
    } else if (exp == 0) {               /* zero / subnormal */
        u += 1u << 23;
        u = f32_bits(bits_f32(u) - bits_f32(113u << 23));
    }
    return bits_f32(u | sign);
}

/* F32 -> F16, round to nearest even: subnormal results by adding a magic
 * number whose unit in the last place is F16's smallest subnormal, so the
 * FPU's own rounding (nearest even) does the work. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    uint32_t o;
    if (u >= 0x47800000u) { /* >= 65536: Inf, or NaN (kept quiet) */
        o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (u < 0x38800000u) {           /* below F16's smallest normal, 2^-14 */
        float magic = bits_f32(126u << 23); /* 0.5: ulp 2^-24 */
        o = f32_bits(bits_f32(u) + magic) - f32_bits(magic);
    } else {
        uint32_t odd = (u >> 13) & 1u;
        u += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
        o = u >> 13; /* a carry out of the mantissa bumps the exponent (65520.. -> Inf) */
    }
    return (uint16_t)(o | sign);
}

void fsc_dist_to_f32(float *dst, const void *src, int64_t n, fsc_dtype dt) {
    const uint16_t *s = src;
    if (dt == FSC_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
}

void fsc_dist_from_f32(void *dst, const float *src, int64_t n, fsc_dtype dt) {
    uint16_t *d = dst;
    if (dt == FSC_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]);
}

#define ACC(T)                                                                                     \
    do {                                                                                           \
        T *d = dst;                                                                                \
        const T *x = a, *y = b;                                                                    \
        if (op == FSC_REDUCE_MAX)                                                                  \
            for (int64_t i = 0; i < n; i++) d[i] = x[i] > y[i] ? x[i] : y[i];                      \
        else                                                                                       \
            for (int64_t i = 0; i < n; i++) d[i] = x[i] + y[i];                                    \
    } while (0)

/* Halves: widen, combine in F32, round once. MAX picks one operand's bits
 * (no rounding). */
#define ACC_HALF(TO_F32, FROM_F32)                                                                 \
    do {                                                                                           \
        uint16_t *d = dst;                                                                         \
        const uint16_t *x = a, *y = b;                                                             \
        if (op == FSC_REDUCE_MAX)                                                                  \
            for (int64_t i = 0; i < n; i++) d[i] = TO_F32(x[i]) > TO_F32(y[i]) ? x[i] : y[i];      \
        else                                                                                       \
            for (int64_t i = 0; i < n; i++) d[i] = FROM_F32(TO_F32(x[i]) + TO_F32(y[i]));          \
    } while (0)

void fsc_dist_accumulate(void *dst, const void *a, const void *b, int64_t n, fsc_dtype dt,
                         fsc_reduce_op op) {
    switch (dt) {
    case FSC_DTYPE_F32:
        ACC(float);
        break;
    case FSC_DTYPE_BF16:
        ACC_HALF(bf16_to_f32, f32_to_bf16);
        break;
    case FSC_DTYPE_F16:
        ACC_HALF(f16_to_f32, f32_to_f16);
        break;
    case FSC_DTYPE_I32:
        ACC(int32_t);
        break;
    case FSC_DTYPE_I64:
        ACC(int64_t);
        break;
    default:
        break; /* U16 is never reduced (refused by the front end) */
    }
}

void fsc_dist_divide(void *buf, int64_t n, fsc_dtype dt, int64_t by) {
    if (by <= 1) return;
    float d = (float)by; /* divide, not multiply: x / n exactly as a reader expects */
    if (dt == FSC_DTYPE_F32) {
        float *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] /= d;
    } else if (dt == FSC_DTYPE_BF16) {
        uint16_t *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / d);
    } else if (dt == FSC_DTYPE_F16) {
        uint16_t *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] = f32_to_f16(f16_to_f32(p[i]) / d);
    } else if (dt == FSC_DTYPE_I32) {
        int32_t *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(p[i] / by);
    } else if (dt == FSC_DTYPE_I64) {
        int64_t *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] /= by;
    }
}
