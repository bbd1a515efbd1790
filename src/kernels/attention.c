/* Softmax and causal multi-head self-attention.
 * Each (batch, head) pair is three sgemm calls on strided views of the fused
 * qkv buffer (leading dimension 3C), so q, k, v are never copied out; the
 * (b,h) pairs are independent and run in parallel. At FSC_GEMM_BF16 the
 * GEMMs run batched over all heads (attention_bf16.c) where oneDNN does
 * bf16, else per head through fsc_gemm; softmax stays fp32 either way. */
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "fsc/core.h"
#include "fsc/kernels.h"
#include "kernels/attention_internal.h"

void fsc_softmax_forward(float *out, const float *inp, int N, int V) {
#pragma omp parallel for if ((int64_t)N * V >= (1 << 16)) schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * V;
        float *y = out + (size_t)i * V;
        float m = -INFINITY, s = 0.f;
        for (int v = 0; v < V; v++) m = x[v] > m ? x[v] : m;
#pragma omp simd reduction(+ : s)
        for (int v = 0; v < V; v++) {
            y[v] = fsc_fast_expf(x[v] - m);
            s += y[v];
        }
        float inv = 1.f / s;
#pragma omp simd
        for (int v = 0; v < V; v++) y[v] *= inv;
    }
}

#define ATT_BLOCK FSC_ATT_BLOCK

/* Softmax of row[0, n) in place. Its own function, so that GCC vectorises
 * the loops (inlined into the row loop it kept them scalar: 5% of a bf16
 * training step). */
static __attribute__((noinline)) void softmax_row(float *row, int n) {
    float m = -INFINITY, sum = 0.f;
#pragma omp simd reduction(max : m)
    for (int u = 0; u < n; u++) m = row[u] > m ? row[u] : m; /* fmaxf: a libm call per element */
#pragma omp simd
    for (int u = 0; u < n; u++) row[u] = fsc_fast_expf(row[u] - m);
#pragma omp simd reduction(+ : sum)
    for (int u = 0; u < n; u++) sum += row[u];
    float inv = 1.f / sum;
#pragma omp simd
    for (int u = 0; u < n; u++) row[u] *= inv;
}

void fsc_softmax_causal_row(float *row, int t, int ncols) {
    softmax_row(row, t + 1);
    memset(row + t + 1, 0, (size_t)(ncols - t - 1) * sizeof(float));
}

void fsc_softmax_causal_row_backward(float *dp, const float *p, int t, int ncols, float scale) {
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int u = 0; u <= t; u++) dot += p[u] * dp[u];
#pragma omp simd
    for (int u = 0; u <= t; u++) dp[u] = p[u] * (dp[u] - dot) * scale;
    memset(dp + t + 1, 0, (size_t)(ncols - t - 1) * sizeof(float));
}

/* In-place causal softmax of rows [r0, r0+rows) of a score matrix with row
 * stride T, over columns 0..ncols-1. */
static void causal_softmax(float *s, int T, int r0, int rows, int ncols) {
    for (int t = r0; t < r0 + rows; t++) fsc_softmax_causal_row(s + (size_t)t * T, t, ncols);
}

// out is (B,T,C); att is (B,NH,T,T); qkv is (B,T,3C) = [q | k | v], heads of size hs = C/NH
void fsc_attention_forward_prec(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH, fsc_gemm_prec prec) {
    if (prec == FSC_GEMM_BF16 && fsc_attention_bf16_forward(out, att, qkv, B, T, C, NH)) return;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) if (B * NH > 1 && (int64_t)T * T * hs >= (1 << 16))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + (size_t)h * hs;
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int rows = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, ncols = r0 + rows;
                float *ab = a + (size_t)r0 * T;
                /* scores = q k^T / sqrt(hs) for this block's rows and the keys they see */
                fsc_gemm(prec, false, true, rows, ncols, hs, scale, q + (size_t)r0 * 3 * C, 3 * C,
                         k, 3 * C, 0.f, ab, T);
                causal_softmax(a, T, r0, rows, ncols);
                fsc_gemm(prec, false, false, rows, hs, ncols, 1.f, ab, T, v, 3 * C, 0.f,
                         o + (size_t)r0 * C, C);
            }
        }
}

float *fsc_attention_scratch(int T) {
    return fsc_mem_alloc(FSC_MEM_WORK, (size_t)fsc_get_num_threads() * T * T * sizeof(float));
}

void fsc_attention_backward_prec(float *dqkv, const float *dout, const float *qkv, const float *att,
                                 int B, int T, int C, int NH, fsc_gemm_prec prec) {
    if (prec == FSC_GEMM_BF16 && fsc_attention_bf16_backward(dqkv, dout, qkv, att, B, T, C, NH))
        return;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    float *scratch = fsc_attention_scratch(T);
    if (!scratch) { /* cannot happen for sane sizes; leave the gradient defined */
        memset(dqkv, 0, (size_t)B * T * 3 * C * sizeof(float));
        fsc_log(FSC_LOG_ERROR, "attention backward: %s", fsc_last_error());
        return;
    }
#pragma omp parallel for collapse(2) if (B * NH > 1 && (int64_t)T * T * hs >= (1 << 16))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            float *dp = fsc_attention_scratch_mine(scratch, T);
            size_t base = (size_t)b * T * 3 * C + (size_t)h * hs;
            const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            const float *dy = dout + (size_t)b * T * C + (size_t)h * hs;
            /* per query block: datt = dy v^T, softmax backward to ds, dq = ds k */
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int rows = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, ncols = r0 + rows;
                float *db = dp + (size_t)r0 * T;
                fsc_gemm(prec, false, true, rows, ncols, hs, 1.f, dy + (size_t)r0 * C, C, v, 3 * C,
                         0.f, db, T);
                for (int t = r0; t < r0 + rows; t++)
                    fsc_softmax_causal_row_backward(dp + (size_t)t * T, a + (size_t)t * T, t, ncols,
                                                    scale);
                fsc_gemm(prec, false, false, rows, hs, ncols, 1.f, db, T, k, 3 * C, 0.f,
                         dq + (size_t)r0 * 3 * C, 3 * C);
            }
            /* per key block: only queries at or after the block see it.
             * dv = att^T dy ; dk = ds^T q */
            for (int c0 = 0; c0 < T; c0 += ATT_BLOCK) {
                int cols = T - c0 < ATT_BLOCK ? T - c0 : ATT_BLOCK;
                size_t corner = (size_t)c0 * T + c0;
                fsc_gemm(prec, true, false, cols, hs, T - c0, 1.f, a + corner, T,
                         dy + (size_t)c0 * C, C, 0.f, dv + (size_t)c0 * 3 * C, 3 * C);
                fsc_gemm(prec, true, false, cols, hs, T - c0, 1.f, dp + corner, T,
                         q + (size_t)c0 * 3 * C, 3 * C, 0.f, dk + (size_t)c0 * 3 * C, 3 * C);
            }
        }
    fsc_mem_free(scratch);
}

void fsc_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    fsc_attention_forward_prec(out, att, qkv, B, T, C, NH, FSC_GEMM_F32);
}

void fsc_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                            int B, int T, int C, int NH) {
    fsc_attention_backward_prec(dqkv, dout, qkv, att, B, T, C, NH, FSC_GEMM_F32);
}
