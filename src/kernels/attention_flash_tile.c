/* Flash attention's fp32 tile products on AVX-512, in registers.
 *
 * The one idea: a tile is small (64 query rows x 128 keys x hd), so a
 * general sgemm call per product spends as much on its set-up and on
 * packing both operands as on the arithmetic. Every product a tile needs
 * (S = q k^T, O += P v, dP = dout v^T, dq += dS k, dk += dS^T q,
 * dv += P^T dout) has the form C[i, :] (+)= alpha sum_k A(i, k) B[k, :] with
 * B's rows contiguous: A is read one scalar at a time (broadcast), so any
 * strides do, and only k^T and v^T (S's and dP's B) are packed, once per
 * tile. Six rows of C by 64 columns stay in 24 registers for the whole k
 * loop; the causal mask bounds each six-row group's columns or k range, so
 * the masked half of a diagonal tile is not computed. Each element of C is
 * a sum in a fixed order, so results do not depend on the thread count.
 * Machines without AVX-512 (and FSC_FLASH_TILES=gemm) run the tiles as
 * fsc_gemm calls instead (attention_flash.c, attention_flash_backward.c);
 * bf16 tiles are attention_flash_bf16.c's. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "kernels/attention_flash_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "kernels/attention_flash_block.h"
#define FLASH_AVX512 1
#endif

bool fsc_flash_fused(fsc_gemm_prec prec) {
#ifdef FLASH_AVX512
    if (prec != FSC_GEMM_F32) return false;
    int tiles; /* the table's words: auto|gemm; an invalid value keeps auto */
    if (fsc_env_enum("FSC_FLASH_TILES", &tiles) == FSC_OK && tiles == 1) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#else
    (void)prec;
    return false;
#endif
}

/* This thread's scratch buffers: a call's k^T and v^T are as large as k and
 * v, and fresh pages for them on every call cost as much as the tiles at
 * short sequences, so they are kept (and grown) for the thread's next call. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

typedef struct {
    float *buf[FSC_FLASH_SCRATCH_SLOTS];
    size_t cap[FSC_FLASH_SCRATCH_SLOTS];
} scratch;

static void scratch_free(void *p) {
    scratch *w = p;
    for (int i = 0; i < FSC_FLASH_SCRATCH_SLOTS; i++) fsc_mem_free(w->buf[i]);
    free(w);
}

static void scratch_init(void) {
    pthread_key_create(&scratch_key, scratch_free);
}

float *fsc_flash_scratch(int slot, size_t floats) {
    pthread_once(&scratch_once, scratch_init);
    scratch *w = pthread_getspecific(scratch_key);
    if (!w) {
        if (!(w = calloc(1, sizeof *w)) || pthread_setspecific(scratch_key, w)) {
            free(w);
            fsc_error(FSC_ERR_NOMEM, "flash attention: no memory for a thread's scratch");
            return NULL;
        }
    }
    if (floats > w->cap[slot] || !w->buf[slot]) {
        fsc_mem_free(w->buf[slot]);
        const size_t cap = (floats + 16383) & ~(size_t)16383;
        w->buf[slot] = fsc_mem_alloc(FSC_MEM_WORK, cap * sizeof(float));
        w->cap[slot] = w->buf[slot] ? cap : 0;
    }
    return w->buf[slot];
}

float *fsc_flash_heads(const fsc_attn_dims *d, const float *src, int ld, int T, int H, int slot) {
    const int hd = d->hd;
    const int64_t rows = (int64_t)d->B * H * T;
    float *dst = fsc_flash_scratch(slot, (size_t)(rows * hd));
    if (!dst) return NULL;
#pragma omp parallel for schedule(static) if (rows * hd >= (1 << 18))
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r % T, h = r / T % H, b = r / T / H;
        memcpy(dst + (size_t)r * hd, src + (size_t)(b * T + t) * ld + (size_t)h * hd,
               (size_t)hd * sizeof(float));
    }
    return dst;
}

/* Keys rounded up to 16, plus 16: rows 2^n floats apart would all map to
 * the same few L1 sets (a tile reads hd of them at once). */
int64_t fsc_flash_t_ld(const fsc_attn_dims *d) {
    return ((int64_t)d->Tk + 15) / 16 * 16 + 16;
}

#ifdef FLASH_AVX512
#define MR FSC_FLASH_MR

/* Rows [i, i + R) of C, columns [n0, n0 + 64) (lanes beyond n masked off),
 * summed over k in [k0, k1). R is a constant at every call, so acc stays in
 * registers. */
__attribute__((target("avx512f"), always_inline)) static inline void
block(const fsc_flash_mm *m, int R, int i, int n0, int n, int k0, int k1) {
    __m512 acc[MR][4];
    __mmask16 mk[4];
    fsc_flash_block_start(mk, n0, n, acc, R);
    const float *a = m->A + (size_t)i * m->sai;
    const float *b = m->B + n0;
    for (int k = k0; k < k1; k++) {
        const float *bk = b + (size_t)k * m->ldb;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) bv[v] = _mm512_maskz_loadu_ps(mk[v], bk + 16 * v);
        const float *ak = a + (size_t)k * m->sak;
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512 av = _mm512_set1_ps(ak[(size_t)r * m->sai]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    fsc_flash_block_store(m->C + (size_t)i * m->ldc + n0, m->ldc, m->alpha, m->accumulate, mk, acc,
                          R);
}

__attribute__((target("avx512f"))) void fsc_flash_mm_run(const fsc_flash_mm *m) {
    for (int i = 0; i < m->M; i += MR) {
        const int R = m->M - i < MR ? m->M - i : MR;
        int n = m->N, k0 = 0, k1 = m->K;
        fsc_flash_span(m->mask, m->diag, i, R, &n, &k0, &k1);
        for (int n0 = 0; n0 < n; n0 += 64) {
            FSC_FLASH_BY_ROWS(R, block, m, i, n0, n, k0, k1);
        }
    }
}

__attribute__((target("avx512f"))) void
fsc_flash_transpose16(float *dst, int64_t tld, const float *src, int ld, int n, int ne) {
    const __mmask16 me = fsc_flash_lanes(ne);
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = i < n ? _mm512_maskz_loadu_ps(me, src + (size_t)i * ld) : _mm512_setzero_ps();
    /* pairs of rows interleaved by 32 bits, then by 64 bits: within each
     * 128-bit lane L, r[4g + m] holds rows 4g .. 4g + 3 of column 4L + m */
    for (int i = 0; i < 8; i++) {
        t[i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[i + 8] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) {
        const __m512d lo0 = _mm512_castps_pd(t[2 * g]), lo1 = _mm512_castps_pd(t[2 * g + 1]);
        const __m512d hi0 = _mm512_castps_pd(t[2 * g + 8]), hi1 = _mm512_castps_pd(t[2 * g + 9]);
        r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
        r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
        r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
        r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
    }
    /* then the four row groups' lanes gathered: column 4L + m */
    for (int m = 0; m < 4; m++) {
        const __m512 u0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
        const __m512 u1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xdd);
        const __m512 u2 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
        const __m512 u3 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xdd);
        const __m512 col[4] = {
            _mm512_shuffle_f32x4(u0, u2, 0x88), _mm512_shuffle_f32x4(u1, u3, 0x88),
            _mm512_shuffle_f32x4(u0, u2, 0xdd), _mm512_shuffle_f32x4(u1, u3, 0xdd)};
        for (int L = 0; L < 4; L++)
            if (4 * L + m < ne) _mm512_storeu_ps(dst + (size_t)(4 * L + m) * tld, col[L]);
    }
}

__attribute__((target("avx512f"))) float *fsc_flash_transpose(const fsc_attn_dims *d,
                                                              const float *src, int ld, int slot) {
    const int hd = d->hd, Tk = d->Tk, NKV = d->NKV;
    const int64_t tld = fsc_flash_t_ld(d), heads = (int64_t)d->B * NKV;
    float *dst = fsc_flash_scratch(slot, (size_t)(heads * hd * tld));
    if (!dst) return NULL;
    const int64_t nblk = tld / 16;
#pragma omp parallel for schedule(static) if (heads * tld * hd >= (1 << 18))
    for (int64_t t = 0; t < heads * nblk; t++) {
        const int64_t bj = t / nblk, c0 = t % nblk * 16;
        const int b = (int)(bj / NKV), j = (int)(bj % NKV);
        const int n = Tk - c0 < 16 ? (int)(Tk - c0) : 16;
        for (int e0 = 0; e0 < hd; e0 += 16)
            fsc_flash_transpose16(dst + (size_t)(bj * hd + e0) * tld + c0, tld,
                                  src + ((size_t)b * Tk + c0) * ld + (size_t)j * hd + e0, ld, n,
                                  hd - e0);
    }
    return dst;
}
#else
/* never called: fsc_flash_fused is false without AVX-512 */
void fsc_flash_mm_run(const fsc_flash_mm *m) {
    (void)m;
}

float *fsc_flash_transpose(const fsc_attn_dims *d, const float *src, int ld, int slot) {
    (void)d, (void)src, (void)ld, (void)slot;
    return NULL;
}
#endif
