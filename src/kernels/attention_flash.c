/* Flash attention's forward (FlashAttention-2 on the CPU) and its row term.
 *
 * The one idea: a query block's softmax is built one key block at a time
 * with a running row max m and sum l, so only a BR x BC tile of scores ever
 * exists and backward needs per row only lse = m + log l, not the T x T
 * probabilities. One task is a (batch, head, query block); its output rows
 * are its own, so tasks run in parallel with no reduction and the result
 * does not depend on the thread count. Merging folds a call's keys into an
 * out and lse already there, which a ring of key blocks (context
 * parallelism) needs: out is the normalised sum of earlier keys, so
 * starting from m = lse, l = 1 and O = out continues the same recurrence.
 * Exponentials use fsc_fast_expf as the naive kernel's softmax does. */
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "fsc/core.h"
#include "fsc/kernels.h"
#include "kernels/attention_flash_internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define BR FSC_FLASH_BR
#define BC FSC_FLASH_BC

bool fsc_flash_dims_ok(const fsc_attn_dims *d, const char *who) {
    const char *bad = NULL;
    if (d->B < 1 || d->NH < 1 || d->NKV < 1 || d->hd < 1)
        bad = "B, NH, NKV and hd must be positive";
    else if (d->NH % d->NKV)
        bad = "NKV must divide NH";
    else if (d->Tq < 0 || d->Tk < 0)
        bad = "Tq and Tk must not be negative";
    else if (d->ldq < d->NH * d->hd || d->ldo < d->NH * d->hd)
        bad = "ldq and ldo must be at least NH * hd";
    else if (d->ldk < d->NKV * d->hd || d->ldv < d->NKV * d->hd)
        bad = "ldk and ldv must be at least NKV * hd";
    if (bad)
        fsc_log(FSC_LOG_ERROR, "%s: %s (B %d NH %d NKV %d hd %d Tq %d Tk %d ld %d %d %d %d)", who,
                bad, d->B, d->NH, d->NKV, d->hd, d->Tq, d->Tk, d->ldq, d->ldk, d->ldv, d->ldo);
    return !bad;
}

/* Folds scores s[0, cols) of one row into (m, l) and turns them into
 * exp(s - m_new); keys n and beyond (if n < cols) are not visible and get 0. Returns the
 * factor the row's accumulated output must be scaled by. */
static float online_row(float *s, int n, int cols, float *m, float *l) {
    n = n > cols ? cols : n;
    if (n <= 0) {
        memset(s, 0, (size_t)cols * sizeof(float));
        return 1.f;
    }
    float mx = -INFINITY, sum = 0.f;
#pragma omp simd reduction(max : mx)
    for (int u = 0; u < n; u++) mx = s[u] > mx ? s[u] : mx;
    const float mnew = *m > mx ? *m : mx;
    const float corr = *m == -INFINITY ? 0.f : fsc_fast_expf(*m - mnew);
#pragma omp simd reduction(+ : sum)
    for (int u = 0; u < n; u++) {
        s[u] = fsc_fast_expf(s[u] - mnew);
        sum += s[u];
    }
    if (n < cols) memset(s + n, 0, (size_t)(cols - n) * sizeof(float));
    *l = *l * corr + sum;
    *m = mnew;
    return corr;
}

/* The call's packed operands: kt (k^T, fsc_flash_transpose) and vhd (v
 * head by head, fsc_flash_heads) when the tiles are fp32 fused products
 * (fsc_flash_mm); kp, vp and qp (k, v and q in bf16 pairs, fsc_flash_pack)
 * when they are bf16 ones (fsc_flash_mm16); all NULL for fsc_gemm tiles. */
typedef struct {
    const float *kt, *vhd;
    const uint32_t *kp, *vp, *qp;
} fwd_tiles;

/* Per-thread scratch: S (BR x BC), O (BR x hd), m and l (BR each), and P
 * in bf16 pairs (BR x BC / 2). */
static size_t fwd_per_thread(int hd) {
    return (size_t)BR * BC + (size_t)BR * hd + 2 * BR + (size_t)BR * BC / 2;
}

/* One (b, h) query block of rows [r0, r0 + rows), ws its scratch. */
static void forward_block(const fsc_attn_dims *d, const float *q, const float *k, const float *v,
                          float *out, float *lse, bool merge, fsc_gemm_prec prec,
                          const fwd_tiles *tl, int b, int h, int r0, int rows, float *ws) {
    const int hd = d->hd, j = h / (d->NH / d->NKV);
    const float scale = 1.0f / sqrtf((float)hd);
    const float *kt = tl->kt, *vhd = tl->vhd;
    float *S = ws, *O = S + BR * BC, *m = O + (size_t)BR * hd, *l = m + BR;
    uint32_t *Pp = (uint32_t *)(l + BR);
    const float *qb = q + ((size_t)b * d->Tq + r0) * d->ldq + (size_t)h * hd;
    const float *kh = k + (size_t)b * d->Tk * d->ldk + (size_t)j * hd;
    const float *vh = v + (size_t)b * d->Tk * d->ldv + (size_t)j * hd;
    float *ob = out + ((size_t)b * d->Tq + r0) * d->ldo + (size_t)h * hd;
    float *lb = lse + ((size_t)b * d->NH + h) * d->Tq + r0;
    for (int r = 0; r < rows; r++) {
        const bool seen = merge && lb[r] != -INFINITY;
        m[r] = merge ? lb[r] : -INFINITY;
        l[r] = seen ? 1.f : 0.f;
        if (seen)
            memcpy(O + (size_t)r * hd, ob + (size_t)r * d->ldo, (size_t)hd * sizeof(float));
        else
            memset(O + (size_t)r * hd, 0, (size_t)hd * sizeof(float));
    }
    const int kend = fsc_flash_visible(d, r0 + rows - 1); /* the last row sees the most */
    for (int c0 = 0; c0 < kend; c0 += BC) {
        const int cols = kend - c0 < BC ? kend - c0 : BC;
        /* row r of the tile sees keys c0 .. c0 + r + diag */
        const int64_t diag = d->q_pos0 + r0 - d->k_pos0 - c0;
        if (tl->kp) {
            const int64_t ep = fsc_flash_pairs_ld(hd);
            const int64_t kper = fsc_flash_pack_per_head(d, d->Tk, FSC_FLASH_PACK_KEYS_T);
            fsc_flash_mm16_do(rows, cols, hd, tl->qp + (((size_t)b * d->NH + h) * d->Tq + r0) * ep,
                              ep, 1, tl->kp + ((size_t)b * d->NKV + j) * kper + c0,
                              fsc_flash_t_ld(d), S, BC, scale, false, FSC_FLASH_MASK_N_UPPER, diag);
        } else if (kt) {
            const int64_t tld = fsc_flash_t_ld(d);
            fsc_flash_mm_do(rows, cols, hd, qb, d->ldq, 1,
                            kt + ((size_t)b * d->NKV + j) * hd * tld + c0, tld, S, BC, scale, false,
                            FSC_FLASH_MASK_N_UPPER, diag);
        } else {
            fsc_gemm(prec, false, true, rows, cols, hd, scale, qb, d->ldq, kh + (size_t)c0 * d->ldk,
                     d->ldk, 0.f, S, BC);
        }
        if (kt) /* fused tiles: the rows in registers */
            fsc_flash_softmax_rows(S, rows, cols, diag, m, l, O, hd);
        else
            for (int r = 0; r < rows; r++) {
                const float corr = online_row(S + (size_t)r * BC, fsc_flash_visible(d, r0 + r) - c0,
                                              cols, &m[r], &l[r]);
                if (corr != 1.f) {
                    float *o = O + (size_t)r * hd;
#pragma omp simd
                    for (int e = 0; e < hd; e++) o[e] *= corr;
                }
            }
        if (tl->vp) {
            const int64_t vper = fsc_flash_pack_per_head(d, d->Tk, FSC_FLASH_PACK_ROWS);
            fsc_flash_pairs_of_rows(Pp, BC / 2, S, BC, rows, cols);
            fsc_flash_mm16_do(rows, hd, cols, Pp, BC / 2, 1,
                              tl->vp + ((size_t)b * d->NKV + j) * vper + (size_t)c0 / 2 * hd, hd, O,
                              hd, 1.f, true, FSC_FLASH_MASK_K_UPPER, diag);
        } else if (kt) {
            fsc_flash_mm_do(rows, hd, cols, S, BC, 1,
                            vhd + (((size_t)b * d->NKV + j) * d->Tk + c0) * hd, hd, O, hd, 1.f,
                            true, FSC_FLASH_MASK_K_UPPER, diag);
        } else {
            fsc_gemm(prec, false, false, rows, hd, cols, 1.f, S, BC, vh + (size_t)c0 * d->ldv,
                     d->ldv, 1.f, O, hd);
        }
    }
    for (int r = 0; r < rows; r++) {
        float *o = ob + (size_t)r * d->ldo;
        if (l[r] == 0.f) { /* no key seen, here or in an earlier merged call */
            memset(o, 0, (size_t)hd * sizeof(float));
            lb[r] = -INFINITY;
            continue;
        }
        const float inv = 1.f / l[r], *src = O + (size_t)r * hd;
#pragma omp simd
        for (int e = 0; e < hd; e++) o[e] = src[e] * inv;
        lb[r] = m[r] + logf(l[r]);
    }
}

void fsc_flash_attention_forward(const fsc_attn_dims *d, const float *q, const float *k,
                                 const float *v, float *out, float *lse, bool merge,
                                 fsc_gemm_prec prec) {
    if (!fsc_flash_dims_ok(d, "flash attention forward") || d->Tq == 0) return;
    const int nqb = (d->Tq + BR - 1) / BR, threads = fsc_get_num_threads();
    const size_t per = fwd_per_thread(d->hd);
    float *ws = fsc_flash_scratch(FSC_FLASH_WS, (size_t)threads * per);
    const bool fused = fsc_flash_fused(prec), b16 = fsc_flash_bf16_tiles(prec);
    fwd_tiles tl = {0};
    bool packed = true;
    if (fused) {
        tl.kt = fsc_flash_transpose(d, k, d->ldk, FSC_FLASH_KT);
        tl.vhd = tl.kt ? fsc_flash_heads(d, v, d->ldv, d->Tk, d->NKV, FSC_FLASH_VH) : NULL;
        packed = tl.vhd;
    } else if (b16) {
        tl.kp = fsc_flash_pack(d, k, d->ldk, d->Tk, d->NKV, FSC_FLASH_PACK_KEYS_T, FSC_FLASH_KT);
        tl.vp = tl.kp
                    ? fsc_flash_pack(d, v, d->ldv, d->Tk, d->NKV, FSC_FLASH_PACK_ROWS, FSC_FLASH_VH)
                    : NULL;
        tl.qp = tl.vp
                    ? fsc_flash_pack(d, q, d->ldq, d->Tq, d->NH, FSC_FLASH_PACK_ELEMS, FSC_FLASH_QH)
                    : NULL;
        packed = tl.qp;
    }
    if (!ws || !packed) {
        fsc_log(FSC_LOG_ERROR, "flash attention forward: %s", fsc_last_error());
        return;
    }
    const int64_t tasks = (int64_t)d->B * d->NH * nqb;
#pragma omp parallel for schedule(dynamic) if (tasks > 1 &&                                        \
                                               (int64_t)d->Tq * d->Tk * d->hd >= (1 << 16))
    for (int64_t t = 0; t < tasks; t++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        /* query blocks innermost: neighbours in time share a head's K and V */
        const int qi = (int)(t % nqb), h = (int)(t / nqb % d->NH), b = (int)(t / nqb / d->NH);
        const int r0 = qi * BR, rows = d->Tq - r0 < BR ? d->Tq - r0 : BR;
        forward_block(d, q, k, v, out, lse, merge, prec, &tl, b, h, r0, rows,
                      ws + (size_t)tid * per);
    }
}

void fsc_flash_attention_delta(const fsc_attn_dims *d, const float *out, const float *dout,
                               float *delta) {
    if (!fsc_flash_dims_ok(d, "flash attention delta")) return;
    const int hd = d->hd, NH = d->NH, Tq = d->Tq;
    const int64_t rows = (int64_t)d->B * Tq;
#pragma omp parallel for schedule(static) if (rows * NH * hd >= (1 << 16))
    for (int64_t br = 0; br < rows; br++) {
        const int b = (int)(br / Tq), r = (int)(br % Tq);
        for (int h = 0; h < NH; h++) {
            const float *o = out + (size_t)br * d->ldo + (size_t)h * hd;
            const float *g = dout + (size_t)br * d->ldo + (size_t)h * hd;
            float s = 0.f;
#pragma omp simd reduction(+ : s)
            for (int e = 0; e < hd; e++) s += o[e] * g[e];
            delta[((size_t)b * NH + h) * Tq + r] = s;
        }
    }
}
