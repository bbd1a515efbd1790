/* Softmax + cross-entropy in one pass over the logits, writing the gradient in
 * their place: the (N,V) logits are the largest activation of a language model,
 * and fusing avoids keeping both them and their softmax. Under bf16 autocast
 * the logits arrive in bf16 (half the bytes): a row is read three times,
 * widened on the fly (max, sum of exps, gradient), so no fp32 copy of it is
 * made; the arithmetic is fp32 and the gradient is rounded once to bf16. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "fastmath.h"
#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

/* Row i's target y is ignored or out of range: its loss is 0 and the caller
 * zeroes its gradient; the first out-of-range row is kept for the error. */
static bool skipped(int i, int y, int V, int ignore_index, int64_t *bad, float *loss) {
    if (y != ignore_index && y >= 0 && y < V) return false;
    if (y != ignore_index) {
#pragma omp critical
        if (*bad < 0 || i < *bad) *bad = i;
    }
    *loss = 0.f;
    return true;
}

int64_t fsc_crossentropy_fused(float *losses, float *logits, const int32_t *targets, int N, int V,
                               int ignore_index, float grad_scale, int64_t *bad_target) {
    int64_t counted = 0, bad = -1;
#pragma omp parallel for reduction(+ : counted) if ((int64_t)N * V >= (1 << 16)) schedule(static)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * V;
        int y = targets[i];
        if (skipped(i, y, V, ignore_index, &bad, &losses[i])) {
#pragma omp simd
            for (int v = 0; v < V; v++) x[v] = 0.f;
            continue;
        }
        float m = -INFINITY, s = 0.f;
        for (int v = 0; v < V; v++) m = x[v] > m ? x[v] : m;
        float xt = x[y];
#pragma omp simd reduction(+ : s)
        for (int v = 0; v < V; v++) {
            x[v] = fsc_fast_expf(x[v] - m);
            s += x[v];
        }
        losses[i] = logf(s) - (xt - m);
        float g = grad_scale / s;
#pragma omp simd
        for (int v = 0; v < V; v++) x[v] *= g;
        x[y] -= grad_scale;
        counted++;
    }
    if (bad_target) *bad_target = bad;
    return counted;
}

int64_t fsc_crossentropy_fused_bf16(float *losses, uint16_t *logits, const int32_t *targets, int N,
                                    int V, int ignore_index, float grad_scale,
                                    int64_t *bad_target) {
    int64_t counted = 0, bad = -1;
#pragma omp parallel for reduction(+ : counted) if ((int64_t)N * V >= (1 << 16)) schedule(static)
    for (int i = 0; i < N; i++) {
        uint16_t *x = logits + (size_t)i * V;
        int y = targets[i];
        if (skipped(i, y, V, ignore_index, &bad, &losses[i])) {
            memset(x, 0, (size_t)V * sizeof *x);
            continue;
        }
        float m = -INFINITY, s = 0.f;
        for (int v = 0; v < V; v++) {
            const float xv = fsc_bf16_widen(x[v]);
            m = xv > m ? xv : m;
        }
        const float xt = fsc_bf16_widen(x[y]);
#pragma omp simd reduction(+ : s)
        for (int v = 0; v < V; v++) s += fsc_fast_expf(fsc_bf16_widen(x[v]) - m);
        losses[i] = logf(s) - (xt - m);
        const float g = grad_scale / s;
        /* the target's entry before rounding: p_y g - scale, as the fp32 kernel */
        const float gy = fsc_fast_expf(xt - m) * g - grad_scale;
#pragma omp simd
        for (int v = 0; v < V; v++)
            x[v] = fsc_bf16_round(fsc_fast_expf(fsc_bf16_widen(x[v]) - m) * g);
        x[y] = fsc_bf16_round(gy);
        counted++;
    }
    if (bad_target) *bad_target = bad;
    return counted;
}
