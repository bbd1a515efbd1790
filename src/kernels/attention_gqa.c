/* Causal self-attention with grouped key/value heads (LLaMA's grouped-query
 * attention; multi-query at NKV = 1, multi-head at NKV = NH). q, k and v are
 * separate (B,T,heads*hd) arrays, as separate projections give them; query
 * head h reads key/value head h / (NH/NKV), Hugging Face's repeat_kv order,
 * by pointer arithmetic: the shared heads are never copied out. Per head the
 * work is attention.c's: blocks of FSC_ATT_BLOCK queries against the keys
 * they see, its causal softmax and softmax backward, GEMMs through fsc_gemm
 * at the caller's precision. Backward runs one (batch, KV head) pair per
 * thread and walks its query heads in order, so the key and value gradients
 * of a group are sums in a fixed order with no reduction across threads. */
#include <math.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "kernels/attention_internal.h"

#define ATT_BLOCK FSC_ATT_BLOCK

// out, q are (B,T,NH*hd); att is (B,NH,T,T); k, v are (B,T,NKV*hd)
void fsc_attention_gqa_forward_prec(float *out, float *att, const float *q, const float *k,
                                    const float *v, int B, int T, int NH, int NKV, int hd,
                                    fsc_gemm_prec prec) {
    const int group = NH / NKV, ldq = NH * hd, ldk = NKV * hd;
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(2) if (B * NH > 1 && (int64_t)T * T * hd >= (1 << 16))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *qh = q + (size_t)b * T * ldq + (size_t)h * hd;
            size_t kv = (size_t)b * T * ldk + (size_t)(h / group) * hd;
            const float *kh = k + kv, *vh = v + kv;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * ldq + (size_t)h * hd;
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int rows = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, ncols = r0 + rows;
                float *ab = a + (size_t)r0 * T;
                fsc_gemm(prec, false, true, rows, ncols, hd, scale, qh + (size_t)r0 * ldq, ldq, kh,
                         ldk, 0.f, ab, T);
                for (int t = r0; t < r0 + rows; t++)
                    fsc_softmax_causal_row(a + (size_t)t * T, t, ncols);
                fsc_gemm(prec, false, false, rows, hd, ncols, 1.f, ab, T, vh, ldk, 0.f,
                         o + (size_t)r0 * ldq, ldq);
            }
        }
}

void fsc_attention_gqa_backward_prec(float *dq, float *dk, float *dv, const float *dout,
                                     const float *q, const float *k, const float *v,
                                     const float *att, int B, int T, int NH, int NKV, int hd,
                                     fsc_gemm_prec prec) {
    const int group = NH / NKV, ldq = NH * hd, ldk = NKV * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *scratch = fsc_attention_scratch(T);
    if (!scratch) { /* as attention.c: leave the gradients defined */
        memset(dq, 0, (size_t)B * T * ldq * sizeof(float));
        memset(dk, 0, (size_t)B * T * ldk * sizeof(float));
        memset(dv, 0, (size_t)B * T * ldk * sizeof(float));
        fsc_log(FSC_LOG_ERROR, "grouped-query attention backward: %s", fsc_last_error());
        return;
    }
#pragma omp parallel for collapse(2) if (B * NKV > 1 && (int64_t)T * T * hd >= (1 << 16))
    for (int b = 0; b < B; b++)
        for (int j = 0; j < NKV; j++) {
            float *dp = fsc_attention_scratch_mine(scratch, T);
            size_t kv = (size_t)b * T * ldk + (size_t)j * hd;
            const float *kh = k + kv, *vh = v + kv;
            float *dkh = dk + kv, *dvh = dv + kv;
            for (int g = 0; g < group; g++) {
                int h = j * group + g;
                const float beta = g ? 1.f : 0.f; /* the group's first head writes */
                size_t qo = (size_t)b * T * ldq + (size_t)h * hd;
                const float *qh = q + qo, *dy = dout + qo;
                float *dqh = dq + qo;
                const float *a = att + ((size_t)b * NH + h) * T * T;
                /* per query block: datt = dy v^T, softmax backward to ds, dq = ds k */
                for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                    int rows = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, ncols = r0 + rows;
                    float *db = dp + (size_t)r0 * T;
                    fsc_gemm(prec, false, true, rows, ncols, hd, 1.f, dy + (size_t)r0 * ldq, ldq,
                             vh, ldk, 0.f, db, T);
                    for (int t = r0; t < r0 + rows; t++)
                        fsc_softmax_causal_row_backward(dp + (size_t)t * T, a + (size_t)t * T, t,
                                                        ncols, scale);
                    fsc_gemm(prec, false, false, rows, hd, ncols, 1.f, db, T, kh, ldk, 0.f,
                             dqh + (size_t)r0 * ldq, ldq);
                }
                /* per key block, over the queries at or after it:
                 * dv (+)= att^T dy ; dk (+)= ds^T q */
                for (int c0 = 0; c0 < T; c0 += ATT_BLOCK) {
                    int cols = T - c0 < ATT_BLOCK ? T - c0 : ATT_BLOCK;
                    size_t corner = (size_t)c0 * T + c0;
                    fsc_gemm(prec, true, false, cols, hd, T - c0, 1.f, a + corner, T,
                             dy + (size_t)c0 * ldq, ldq, beta, dvh + (size_t)c0 * ldk, ldk);
                    fsc_gemm(prec, true, false, cols, hd, T - c0, 1.f, dp + corner, T,
                             qh + (size_t)c0 * ldq, ldq, beta, dkh + (size_t)c0 * ldk, ldk);
                }
            }
        }
    fsc_mem_free(scratch);
}
