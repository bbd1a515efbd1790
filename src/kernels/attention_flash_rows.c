/* Flash attention's per-row steps on the fp32 tiles, in AVX-512 registers:
 * the forward's online softmax (a row's max, exp and sum, and its output
 * row rescaled) and the backward's recomputed P and dS.
 *
 * The one idea: a tile row is at most 128 scores, eight vectors, so a
 * compiler's generic vector loop (a peeled head and tail per row, a
 * horizontal reduction per loop) costs as much as the exponentials; here a
 * row is loaded once, masked at its causal bound, and reduced once. The
 * exponential is fsc_fast_expf's operations in its order (fsc builds
 * without floating-point contraction), so every probability is the bits the
 * scalar code gives; only the row sum's order differs from a scalar loop's.
 * Rows are independent, so results do not depend on the thread count. */
#include "kernels/attention_flash_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <math.h>

#define ROW_VECS (FSC_FLASH_BC / 16)

/* fsc_fast_expf (fastmath.h) on 16 lanes, operation for operation. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x); /* x < -87 ? -87 : x, NaN kept */
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), x);
    const __m512 big = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_sub_ps(
        _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), big), big);
    __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f))),
                             _mm512_mul_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f)));
    /* fsc_fast_expf's Horner coefficients, innermost first */
    static const float c[] = {0.00138888892252087593f,
                              0.00833333376795053482f,
                              0.0416666679084300995f,
                              0.166666671633720398f,
                              0.5f,
                              1.0f,
                              1.0f};
    __m512 p = _mm512_set1_ps(c[0]);
    for (int i = 1; i < 7; i++) p = _mm512_add_ps(_mm512_set1_ps(c[i]), _mm512_mul_ps(r, p));
    const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(n, n, _CMP_EQ_OQ), n);
    const __m512i bits =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(e), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

/* Whole rows are written, zeros past the row's bound: S, P and dS have
 * rows of FSC_FLASH_BC floats, and a fixed count keeps them in registers. */

/* Keys of the tile row r sees: r + diag + 1, clamped to [0, cols]. */
static inline int row_keys(int64_t diag, int r, int cols) {
    const int64_t n = r + diag + 1;
    return n < 0 ? 0 : n > cols ? cols : (int)n;
}

__attribute__((target("avx512f"))) void fsc_flash_softmax_rows(float *S, int rows, int cols,
                                                               int64_t diag, float *m, float *l,
                                                               float *O, int hd) {
    for (int r = 0; r < rows; r++) {
        float *s = S + (size_t)r * FSC_FLASH_BC;
        const int n = row_keys(diag, r, cols);
        if (n == 0) {
            for (int v = 0; v < ROW_VECS; v++) _mm512_storeu_ps(s + 16 * v, _mm512_setzero_ps());
            continue;
        }
        __m512 x[ROW_VECS], mx = _mm512_set1_ps(-INFINITY);
        for (int v = 0; v < ROW_VECS; v++) {
            x[v] = _mm512_mask_loadu_ps(mx, fsc_flash_lanes(n - 16 * v), s + 16 * v);
            mx = _mm512_max_ps(x[v], mx);
        }
        const float rmax = _mm512_reduce_max_ps(mx);
        const float mnew = m[r] > rmax ? m[r] : rmax;
        const __m512 mv = _mm512_set1_ps(mnew);
        __m512 sum = _mm512_setzero_ps();
        for (int v = 0; v < ROW_VECS; v++) {
            const __m512 p =
                _mm512_maskz_mov_ps(fsc_flash_lanes(n - 16 * v), exp16(_mm512_sub_ps(x[v], mv)));
            _mm512_storeu_ps(s + 16 * v, p);
            sum = _mm512_add_ps(sum, p);
        }
        /* the correction as fsc_fast_expf gives it: lane 0 of exp16 */
        const float corr =
            m[r] == -INFINITY ? 0.f : _mm512_cvtss_f32(exp16(_mm512_set1_ps(m[r] - mnew)));
        l[r] = l[r] * corr + _mm512_reduce_add_ps(sum);
        m[r] = mnew;
        if (corr != 1.f) {
            float *o = O + (size_t)r * hd;
            const __m512 cv = _mm512_set1_ps(corr);
            for (int e = 0; e < hd; e += 16) {
                const __mmask16 k = fsc_flash_lanes(hd - e);
                _mm512_mask_storeu_ps(o + e, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, o + e), cv));
            }
        }
    }
}

__attribute__((target("avx512f"))) void fsc_flash_probs_rows(float *P, float *dS, int rows,
                                                             int cols, int64_t diag,
                                                             const float *lse, const float *delta,
                                                             float scale) {
    const __m512 sv = _mm512_set1_ps(scale);
    for (int r = 0; r < rows; r++) {
        float *p = P + (size_t)r * FSC_FLASH_BC, *ds = dS + (size_t)r * FSC_FLASH_BC;
        const int n = lse[r] == -INFINITY ? 0 : row_keys(diag, r, cols);
        const __m512 lv = _mm512_set1_ps(lse[r]), dv = _mm512_set1_ps(delta[r]);
        for (int v = 0; v < ROW_VECS; v++) {
            const __mmask16 k = fsc_flash_lanes(n - 16 * v);
            const __m512 pe = _mm512_maskz_mov_ps(
                k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p + 16 * v), lv)));
            /* p (ds - delta) scale, in that order */
            const __m512 g = _mm512_mul_ps(
                _mm512_mul_ps(pe, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, ds + 16 * v), dv)), sv);
            _mm512_storeu_ps(p + 16 * v, pe);
            _mm512_storeu_ps(ds + 16 * v, _mm512_maskz_mov_ps(k, g));
        }
    }
}
#else
/* never called: the fused tiles (fsc_flash_fused) need AVX-512 */
void fsc_flash_softmax_rows(float *S, int rows, int cols, int64_t diag, float *m, float *l,
                            float *O, int hd) {
    (void)S, (void)rows, (void)cols, (void)diag, (void)m, (void)l, (void)O, (void)hd;
}

void fsc_flash_probs_rows(float *P, float *dS, int rows, int cols, int64_t diag, const float *lse,
                          const float *delta, float scale) {
    (void)P, (void)dS, (void)rows, (void)cols, (void)diag, (void)lse, (void)delta, (void)scale;
}
#endif
