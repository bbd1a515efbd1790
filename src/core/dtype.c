/* Element types and the half-precision conversions (round to nearest even). */
#include <math.h>
#include <string.h>

#include "fsc/core.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[FSC_DTYPE_COUNT] = {
    [FSC_DTYPE_F32] = {"F32", 4}, [FSC_DTYPE_BF16] = {"BF16", 2}, [FSC_DTYPE_F16] = {"F16", 2},
    [FSC_DTYPE_I32] = {"I32", 4}, [FSC_DTYPE_I64] = {"I64", 8},   [FSC_DTYPE_U16] = {"U16", 2},
};

size_t fsc_dtype_size(fsc_dtype dt) {
    return (unsigned)dt < FSC_DTYPE_COUNT ? dtypes[dt].size : 0;
}

const char *fsc_dtype_name(fsc_dtype dt) {
    return (unsigned)dt < FSC_DTYPE_COUNT ? dtypes[dt].name : "?";
}

int fsc_dtype_parse(const char *name, fsc_dtype *out) {
    for (int i = 0; i < FSC_DTYPE_COUNT; i++)
        if (name && strcmp(name, dtypes[i].name) == 0) {
            *out = (fsc_dtype)i;
            return FSC_OK;
        }
    return fsc_error(FSC_ERR_DTYPE, "unknown dtype \"%s\" (expected F32, BF16, F16, I32, I64, U16)",
                     name ? name : "(null)");
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float fsc_bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t fsc_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fsc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero or subnormal */
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t fsc_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to inf */
    if (a < 0x38800000u) {                       /* subnormal or zero in f16 */
        float v = bits_f32(a);
        uint32_t m = (uint32_t)lrintf(ldexpf(v, 24)); /* nearest even under default rounding */
        return sign | (uint16_t)m;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}
