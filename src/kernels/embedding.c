/* Token + position embedding lookup, and its scatter-add backward. */
#include <string.h>

#include "fsc/kernels.h"

// out is (B,T,C); tokens (B,T); wte (V,C); wpe (T,C) or NULL
void fsc_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                         int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tokens[b * T + t] * C;
            if (!wpe) {
                memcpy(o, e, (size_t)C * sizeof(float));
                continue;
            }
            const float *p = wpe + (size_t)t * C;
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
        }
}

void fsc_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B,
                          int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *dw = dwte + (size_t)tokens[b * T + t] * C;
#pragma omp simd
            for (int c = 0; c < C; c++) dw[c] += d[c];
            if (dwpe) {
                float *dp = dwpe + (size_t)t * C;
#pragma omp simd
                for (int c = 0; c < C; c++) dp[c] += d[c];
            }
        }
}
