/* Softmax + cross-entropy in one pass over the logits, writing the gradient in
 * their place: the (N,V) logits are the largest activation of a language model,
 * and fusing avoids keeping both them and their softmax. */
#include <math.h>

#include "fastmath.h"
#include "fsc/kernels.h"

int64_t fsc_crossentropy_fused(float *losses, float *logits, const int32_t *targets, int N, int V,
                               int ignore_index, float grad_scale, int64_t *bad_target) {
    int64_t counted = 0, bad = -1;
#pragma omp parallel for reduction(+ : counted) if ((int64_t)N * V >= (1 << 16)) schedule(static)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * V;
        int y = targets[i];
        if (y == ignore_index || y < 0 || y >= V) {
            if (y != ignore_index) {
#pragma omp critical
                if (bad < 0 || i < bad) bad = i;
            }
            losses[i] = 0.f;
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
