/* Internal to the kernels: what the per-head attention (attention.c) and its
 * batched bf16 form (attention_bf16.c) share, so that both compute the same
 * softmax on the same causal blocks. */
#ifndef FSC_KERNELS_ATTENTION_INTERNAL_H
#define FSC_KERNELS_ATTENTION_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Queries are taken in blocks of FSC_ATT_BLOCK rows; block i needs keys up to
 * its last row only, so the upper triangle of the score matrix is computed
 * and multiplied only within diagonal blocks (3/4 of the work at T=128, 5/8
 * at T=256). Entries of att right of a block's last key are never written
 * or read. */
#define FSC_ATT_BLOCK 64

/* fsc_softmax_causal_row (fsc/kernels.h) is the softmax of both. */
/* Its backward for row t: dp[0, t] becomes ds = scale p (dp - sum p dp),
 * dp(t, ncols) zeros. */
void fsc_softmax_causal_row_backward(float *dp, const float *p, int t, int ncols, float scale);

/* The per-head backwards' (attention.c, attention_gqa.c) score-gradient
 * scratch: one T x T block per OpenMP thread, from fsc_mem_alloc
 * (FSC_MEM_WORK; the caller frees it); NULL, the error set, when short. */
float *fsc_attention_scratch(int T);
/* The calling thread's block of it. */
static inline float *fsc_attention_scratch_mine(float *scratch, int T) {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    return scratch + (size_t)tid * T * T;
}

/* Attention's forward (backward) with every GEMM in bf16 through batched
 * oneDNN primitives: fsc_attention_forward_prec's (backward_prec's)
 * contract at FSC_GEMM_BF16. false when that path is not to run here (mode
 * off, no native bf16 under auto, oneDNN absent or refusing, memory short);
 * outputs may then be partly written, and the caller runs the per-head
 * path, which writes every one of them again. Buffers: this thread's
 * fsc_bf16_ws slots 0-4 (FSC_MEM_WORK, kept for reuse). */
bool fsc_attention_bf16_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH);
bool fsc_attention_bf16_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                 int B, int T, int C, int NH);

#endif
