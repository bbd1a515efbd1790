/* Internal to the AVX-512 tile kernels (attention_flash_tile.c for fp32,
 * attention_flash_bf16.c for bf16 pairs): what their register blocks share
 * around the product itself, which differs (fmadd on floats, dpbf16 on
 * pairs): the lane masks of a block's 64 columns, and R rows of 4
 * accumulators stored into C, scaled by alpha and added to C's old values
 * when the product accumulates. Always inlined with R a constant, so the
 * accumulators stay in registers. x86-64 with GCC-style intrinsics only. */
#ifndef FSC_KERNELS_ATTENTION_FLASH_BLOCK_H
#define FSC_KERNELS_ATTENTION_FLASH_BLOCK_H

#include <immintrin.h>

#include "kernels/attention_flash_internal.h"

#define FSC_FLASH_BLOCK_FN __attribute__((target("avx512f"), always_inline)) static inline

/* Masks of columns [n0, n0 + 64) below n, 16 per vector; the accumulators zeroed. */
FSC_FLASH_BLOCK_FN void fsc_flash_block_start(__mmask16 mk[4], int n0, int n,
                                              __m512 acc[FSC_FLASH_MR][4], int R) {
    for (int v = 0; v < 4; v++) mk[v] = fsc_flash_lanes(n - n0 - 16 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
}

/* C[r, 0..64) (row stride ldc) = alpha acc[r] (+ C[r] when accumulate), r < R. */
FSC_FLASH_BLOCK_FN void fsc_flash_block_store(float *C, int64_t ldc, float alpha, bool accumulate,
                                              const __mmask16 mk[4], __m512 acc[FSC_FLASH_MR][4],
                                              int R) {
    const __m512 av = _mm512_set1_ps(alpha);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *c = C + (size_t)r * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m512 x = _mm512_mul_ps(acc[r][v], av);
            if (accumulate) x = _mm512_add_ps(_mm512_maskz_loadu_ps(mk[v], c + 16 * v), x);
            _mm512_mask_storeu_ps(c + 16 * v, mk[v], x);
        }
    }
}

#endif
