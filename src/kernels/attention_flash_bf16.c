/* Flash attention's bf16 tile products on avx512_bf16, in registers.
 *
 * The one idea: _mm512_dpbf16_ps multiplies pairs of bf16 values and adds
 * both products to an fp32 lane, twice the work of an fp32 FMA per
 * instruction. Its operands must hold the two terms of each pair side by
 * side, so every operand is packed once into 32-bit pairs along the summed
 * index: per call, k and v (and for backward q and dout) head by head, as
 * pairs of elements (the B of S = q k^T and dP = dout v^T, the A of S and
 * dP) or pairs of rows (the B of O += P v, dq += dS k, dk += dS^T q and
 * dv += P^T dout); per tile, P and dS as pairs of keys, or of query rows
 * for the transposed products. The register blocking, the masks and the
 * fixed order of each element's sum are attention_flash_tile.c's, so the
 * results do not depend on the thread count. Rounding is the bf16 GEMM
 * path's: operands rounded to bf16 (nearest even, fsc_f32_to_bf16's bits),
 * exact products, fp32 accumulation and output. */
#include <stdatomic.h>
#include <string.h>

#include "fsc/core.h"
#include "kernels/attention_flash_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

#include "kernels/attention_flash_block.h"
#define FLASH_BF16 1
#endif

#ifdef FLASH_BF16
static bool cpu_avx512_bf16(void) {
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        __get_cpuid_max(0, NULL) < 7)
        return false;
    __cpuid_count(7, 1, a, b, c, d);
    return a & (1u << 5);
}
#endif

bool fsc_flash_bf16_tiles(fsc_gemm_prec prec) {
#ifdef FLASH_BF16
    if (prec != FSC_GEMM_BF16) return false;
    int tiles; /* auto|gemm, as fsc_flash_fused */
    if (fsc_env_enum("FSC_FLASH_TILES", &tiles) == FSC_OK && tiles == 1) return false;
    static _Atomic int has = -1; /* racing first calls store the same value */
    int h = atomic_load_explicit(&has, memory_order_relaxed);
    if (h < 0) atomic_store_explicit(&has, h = cpu_avx512_bf16(), memory_order_relaxed);
    return h;
#else
    (void)prec;
    return false;
#endif
}

int64_t fsc_flash_pairs_ld(int n) {
    return ((int64_t)(n + 1) / 2 + 15) / 16 * 16;
}

int64_t fsc_flash_pack_per_head(const fsc_attn_dims *d, int T, fsc_flash_pack_kind kind) {
    const int hd = d->hd;
    if (kind == FSC_FLASH_PACK_KEYS_T) return (int64_t)(hd + 1) / 2 * fsc_flash_t_ld(d);
    if (kind == FSC_FLASH_PACK_ELEMS) return (int64_t)T * fsc_flash_pairs_ld(hd);
    return ((int64_t)T + 1) / 2 * hd;
}

#ifdef FLASH_BF16
#define MR FSC_FLASH_MR
#define TGT __attribute__((target("avx512f,avx512bw,avx512bf16")))

/* fsc_f32_to_bf16 on 16 lanes (NaN stays a quiet NaN), as 16-bit values in
 * the low halves of 32-bit lanes. */
TGT static inline __m512i narrow16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    r = _mm512_srli_epi32(r, 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

/* Pairs (lo[i], hi[i]) of 16 lanes (lanes past n: (0, 0)). */
TGT static inline __m512i pair16(const float *lo, const float *hi, int n) {
    const __mmask16 m = fsc_flash_lanes(n);
    const __m512i a = narrow16(_mm512_maskz_loadu_ps(m, lo));
    const __m512i b = hi ? narrow16(_mm512_maskz_loadu_ps(m, hi)) : _mm512_setzero_si512();
    return _mm512_maskz_or_epi32(m, a, _mm512_slli_epi32(b, 16));
}

/* 32 consecutive floats of src as 16 pairs (src[2i], src[2i+1]); floats
 * past n are zero. */
TGT static inline __m512i pairs_of_row(const float *src, int n) {
    const __mmask16 m0 = fsc_flash_lanes(n);
    const int n1 = n - 16;
    const __mmask16 m1 = fsc_flash_lanes(n1);
    const __m512i a = narrow16(_mm512_maskz_loadu_ps(m0, src));
    const __m512i b = narrow16(_mm512_maskz_loadu_ps(m1, src + 16));
    /* a's and b's low halves packed in order: 32 bf16 = 16 pairs */
    const __m512i idx =
        _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26,
                         24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    return _mm512_permutex2var_epi16(a, idx, b);
}

/* Rows [i, i + R) of C, columns [n0, n0 + 64), summed over pairs [p0, p1). */
TGT __attribute__((always_inline)) static inline void block(const fsc_flash_mm16 *m, int R, int i,
                                                            int n0, int n, int p0, int p1) {
    __m512 acc[MR][4];
    __mmask16 mk[4];
    fsc_flash_block_start(mk, n0, n, acc, R);
    const uint32_t *a = m->A + (size_t)i * m->sai;
    const uint32_t *b = m->B + n0;
    for (int p = p0; p < p1; p++) {
        const uint32_t *bp = b + (size_t)p * m->ldb;
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) bv[v] = (__m512bh)_mm512_maskz_loadu_epi32(mk[v], bp + 16 * v);
        const uint32_t *ap = a + (size_t)p * m->sak;
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[(size_t)r * m->sai]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
    }
    fsc_flash_block_store(m->C + (size_t)i * m->ldc + n0, m->ldc, m->alpha, m->accumulate, mk, acc,
                          R);
}

TGT void fsc_flash_mm16_run(const fsc_flash_mm16 *m) {
    for (int i = 0; i < m->M; i += MR) {
        const int R = m->M - i < MR ? m->M - i : MR;
        int n = m->N, k0 = 0, k1 = m->K;
        fsc_flash_span(m->mask, m->diag, i, R, &n, &k0, &k1);
        /* whole pairs: the terms a bound cuts in two are zero in A */
        const int p0 = k0 / 2, p1 = (k1 + 1) / 2;
        for (int n0 = 0; n0 < n; n0 += 64) {
            FSC_FLASH_BY_ROWS(R, block, m, i, n0, n, p0, p1);
        }
    }
}

TGT void fsc_flash_pairs_of_rows(uint32_t *dst, int64_t ldd, const float *src, int64_t lds,
                                 int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c += 32)
            _mm512_mask_storeu_epi32(dst + (size_t)r * ldd + c / 2,
                                     fsc_flash_lanes((cols - c + 1) / 2),
                                     pairs_of_row(src + (size_t)r * lds + c, cols - c));
}

TGT void fsc_flash_pairs_down(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int rows,
                              int cols) {
    for (int r = 0; r < rows; r += 2) {
        const float *lo = src + (size_t)r * lds, *hi = r + 1 < rows ? lo + lds : NULL;
        for (int c = 0; c < cols; c += 16)
            _mm512_mask_storeu_epi32(dst + (size_t)(r / 2) * ldd + c, fsc_flash_lanes(cols - c),
                                     pair16(lo + c, hi ? hi + c : NULL, cols - c));
    }
}

TGT uint32_t *fsc_flash_pack(const fsc_attn_dims *d, const float *src, int ld, int T, int H,
                             fsc_flash_pack_kind kind, int slot) {
    const int hd = d->hd;
    const int64_t heads = (int64_t)d->B * H, tld = fsc_flash_t_ld(d);
    const int64_t per = fsc_flash_pack_per_head(d, T, kind);
    uint32_t *dst = (uint32_t *)fsc_flash_scratch(slot, (size_t)(heads * per));
    if (!dst) return NULL;
#pragma omp parallel for schedule(static) if (heads * per >= (1 << 17))
    for (int64_t bh = 0; bh < heads; bh++) {
        const int b = (int)(bh / H), h = (int)(bh % H);
        const float *s = src + (size_t)b * T * ld + (size_t)h * hd;
        uint32_t *o = dst + (size_t)(bh * per);
        if (kind == FSC_FLASH_PACK_ELEMS) {
            fsc_flash_pairs_of_rows(o, fsc_flash_pairs_ld(hd), s, ld, T, hd);
        } else if (kind == FSC_FLASH_PACK_ROWS) {
            fsc_flash_pairs_down(o, hd, s, ld, T, hd);
        } else {
            /* pair p of key t at o[p * tld + t]: 16 keys' pairs, transposed */
            uint32_t tmp[16][16];
            for (int t0 = 0; t0 < (int)tld; t0 += 16) {
                const int n = T - t0 < 0 ? 0 : T - t0 < 16 ? T - t0 : 16;
                for (int e0 = 0; e0 < hd; e0 += 32) {
                    for (int t = 0; t < n; t++)
                        _mm512_storeu_si512(tmp[t],
                                            pairs_of_row(s + (size_t)(t0 + t) * ld + e0, hd - e0));
                    fsc_flash_transpose16((float *)(o + (size_t)(e0 / 2) * tld + t0), tld,
                                          (const float *)tmp[0], 16, n, (hd - e0 + 1) / 2);
                }
            }
        }
    }
    return dst;
}
#else
/* never called: fsc_flash_bf16_tiles is false off x86-64 */
void fsc_flash_mm16_run(const fsc_flash_mm16 *m) {
    (void)m;
}

uint32_t *fsc_flash_pack(const fsc_attn_dims *d, const float *src, int ld, int T, int H,
                         fsc_flash_pack_kind kind, int slot) {
    (void)d, (void)src, (void)ld, (void)T, (void)H, (void)kind, (void)slot;
    return NULL;
}

void fsc_flash_pairs_of_rows(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int rows,
                             int cols) {
    (void)dst, (void)ldd, (void)src, (void)lds, (void)rows, (void)cols;
}

void fsc_flash_pairs_down(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int rows,
                          int cols) {
    (void)dst, (void)ldd, (void)src, (void)lds, (void)rows, (void)cols;
}
#endif
