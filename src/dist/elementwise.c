/* Local element-wise math of the distributed runtime: staging BF16/F16 into
 * F32 comm buffers and back, the reduction step of the rings, and AVG's
 * division.
 *
 * The one idea: half-precision reductions are summed in F32 (the wire and
 * the accumulator are F32), so a sum over many ranks loses no more than one
 * final rounding.
 */
#include <string.h>

#include "dist_internal.h"

/* BF16 inline and vectorisable (the same bits as core's fsc_bf16_to_f32 /
 * fsc_f32_to_bf16): a call per element made BF16 allreduces 10x slower than
 * F32 ones. F16 keeps core's functions (subnormals need care). */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

void fsc_dist_to_f32(float *dst, const void *src, int64_t n, fsc_dtype dt) {
    const uint16_t *s = src;
    if (dt == FSC_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = fsc_f16_to_f32(s[i]);
}

void fsc_dist_from_f32(void *dst, const float *src, int64_t n, fsc_dtype dt) {
    uint16_t *d = dst;
    if (dt == FSC_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) d[i] = fsc_f32_to_f16(src[i]);
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

void fsc_dist_accumulate(void *dst, const void *a, const void *b, int64_t n, fsc_dtype dt,
                         fsc_reduce_op op) {
    switch (dt) {
    case FSC_DTYPE_F32:
        ACC(float);
        break;
    case FSC_DTYPE_I32:
        ACC(int32_t);
        break;
    case FSC_DTYPE_I64:
        ACC(int64_t);
        break;
    default:
        break; /* the front end stages every other dtype into F32 */
    }
}

void fsc_dist_divide(void *buf, int64_t n, fsc_dtype dt, int64_t by) {
    if (by <= 1) return;
    if (dt == FSC_DTYPE_F32) {
        float *p = buf, d = (float)by; /* divide, not multiply: x / n exactly as a reader expects */
        for (int64_t i = 0; i < n; i++) p[i] /= d;
    } else if (dt == FSC_DTYPE_I32) {
        int32_t *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(p[i] / by);
    } else if (dt == FSC_DTYPE_I64) {
        int64_t *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] /= by;
    }
}
