/* Internal to the kernels: the bf16 GEMM with operands a caller already
 * holds in bf16, so that a value rounded once serves every GEMM that reads
 * it (a gradient feeding both dX and dW, a weight FSDP gathered in bf16).
 */
#ifndef FSC_KERNELS_GEMM_BF16_INTERNAL_H
#define FSC_KERNELS_GEMM_BF16_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fsc/kernels.h"

/* Bit for bit fsc_f32_to_bf16 (nearest even; NaN stays NaN), in a form the
 * compiler vectorises. */
static inline uint16_t fsc_bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40) : h;
}

/* The exact fp32 value of bf16 h (its top half), in a form the compiler
 * vectorises. */
static inline float fsc_bf16_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fsc_gemm(FSC_GEMM_BF16, ...), where Ah (Bh), when not NULL, is op's A (B)
 * already rounded to bf16 as fsc_f32_to_bf16 rounds it, dense: (M,K) rows,
 * or (K,M) when ta; B's (K,N), or (N,K) when tb. A and B are always given
 * (a shape that runs on sgemm reads them, unrounded), and Ah (Bh) must hold
 * exactly their rounding, or the two paths compute different products. */
void fsc_gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                   const uint16_t *Ah, int lda, const float *B, const uint16_t *Bh, int ldb,
                   float beta, float *C, int ldc);

/* C(M,N) = A @ op(B) + bias (the fp32 row bias added to every row of C),
 * with A's rounding and the product as fsc_gemm_bf16's at alpha 1, beta 0
 * (Ah, Bh as there);
 * on oneDNN the bias is added inside the primitive rather than in a second
 * pass over C; on sgemm C is first set to the bias rows, as the fp32 path
 * does. Bh as in fsc_gemm_bf16. */
void fsc_gemm_bf16_bias(bool tb, int M, int N, int K, const float *A, const uint16_t *Ah, int lda,
                        const float *B, const uint16_t *Bh, int ldb, const float *bias, float *C,
                        int ldc);

/* Whether fsc_gemm_bf16 with this shape, alpha, beta and ldc runs on oneDNN
 * (so that rounding an operand ahead pays); chooses the shape's path on its
 * first call, timing both on A and B. */
bool fsc_gemm_bf16_runs(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, int ldc);

/* This thread's bf16 buffer `slot` (0 .. FSC_BF16_WS_SLOTS-1) of at least
 * elems elements (FSC_MEM_WORK, kept and grown for reuse, never shared with
 * fsc_gemm_bf16's own); NULL if out of memory. */
#define FSC_BF16_WS_SLOTS 5
uint16_t *fsc_bf16_ws(int slot, size_t elems);

/* fsc_bf16_gemm_wanted: kernels.h. */
/* Adds a GEMM run outside fsc_gemm_bf16 (attention's batched ones) to the
 * counters of fsc_bf16_gemm_get_stats: on oneDNN (bf16) or not. */
void fsc_gemm_bf16_count(bool bf16, double seconds, double flops);

/* dst (rows, cols) dense = bf16(src), src rows of stride ld. */
void fsc_pack_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld);

/* fsc_matmul_backward_prec at FSC_GEMM_BF16 where inph, when not NULL, is
 * inp already in bf16 (inp must then hold its exact widening), as
 * fsc_gemm_bf16's Ah: the weight gradient's GEMM reads it unrounded again. */
void fsc_matmul_backward_bf16_in(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const uint16_t *inph, const float *weight, int N,
                                 int C, int OC, fsc_weight_layout layout);

#endif
