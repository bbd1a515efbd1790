/* Element-wise arithmetic, counter-based dropout, and reductions for norms. */
#include <math.h>

#include "fsc/core.h"
#include "fsc/kernels.h"

#define PAR_MIN (1 << 16)

void fsc_add(float *out, const float *a, const float *b, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void fsc_add_inplace(float *acc, const float *x, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

void fsc_scale(float *x, float s, int64_t n) {
#pragma omp parallel for simd if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* Element e of global row g keeps iff its uniform draw from
 * philox(key, g, e / 4).v[e % 4] is >= p: the mask depends on what the element
 * is, never on how the batch was split across micro-batches or ranks. */
static void dropout_apply(float *out, const float *in, float p, uint64_t key, int64_t first_row,
                          int64_t rows, int64_t row_len) {
    float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for if (rows * row_len >= PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = in + r * row_len;
        float *y = out + r * row_len;
        for (int64_t e = 0; e < row_len; e += 4) {
            fsc_philox_out bits = fsc_philox4x32(key, (uint64_t)(first_row + r), (uint64_t)(e / 4));
            for (int j = 0; j < 4 && e + j < row_len; j++)
                y[e + j] = fsc_rng_uniform(bits.v[j]) >= p ? x[e + j] * keep_scale : 0.f;
        }
    }
}

void fsc_dropout_forward(float *out, const float *inp, float p, uint64_t key, int64_t first_row,
                         int64_t rows, int64_t row_len) {
    dropout_apply(out, inp, p, key, first_row, rows, row_len);
}

void fsc_dropout_backward(float *dinp, const float *dout, float p, uint64_t key, int64_t first_row,
                          int64_t rows, int64_t row_len) {
    dropout_apply(dinp, dout, p, key, first_row, rows, row_len);
}

void fsc_dropout_slice(float *out, const float *inp, float p, uint64_t key, int64_t first_row,
                       int64_t rows, int64_t e0, int64_t len) {
    float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for if (rows * len >= PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = inp + r * len;
        float *y = out + r * len;
        for (int64_t i = 0; i < len;) { /* one Philox call per group of 4 elements */
            int64_t e = e0 + i;
            fsc_philox_out bits = fsc_philox4x32(key, (uint64_t)(first_row + r), (uint64_t)(e / 4));
            for (int j = (int)(e % 4); j < 4 && i < len; j++, i++)
                y[i] = fsc_rng_uniform(bits.v[j]) >= p ? x[i] * keep_scale : 0.f;
        }
    }
}

double fsc_sumsq(const float *x, int64_t n) {
    double total = 0;
#pragma omp parallel for reduction(+ : total) if (n >= PAR_MIN) schedule(static)
    for (int64_t b = 0; b < n; b += 4096) { /* float partials per block, double across */
        int64_t end = b + 4096 < n ? b + 4096 : n;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = b; i < end; i++) s += x[i] * x[i];
        total += s;
    }
    return total;
}

float fsc_absmax(const float *x, int64_t n) {
    float m = 0.f;
#pragma omp parallel for simd reduction(max : m) if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}
