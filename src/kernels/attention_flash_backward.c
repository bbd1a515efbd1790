/* Flash attention's backward: each tile's probabilities recomputed from the
 * row's lse, never stored.
 *
 * Per tile (query block x key block): S = q k^T / sqrt(hd), P = exp(S -
 * lse), dP = dout v^T, dS = P (dP - delta) / sqrt(hd); then dv += P^T dout,
 * dk += dS^T q, dq += dS k. The key block's dk and dv are sums over every
 * query head of its group and every query block, and a query block's dq a
 * sum over key blocks: to stay free of races and deterministic, the sums
 * run in one fixed order whatever the thread count. With at least as many
 * (batch, KV head) pairs as threads, one task owns a pair and walks key
 * blocks, then heads, then query blocks (FlashAttention-2's loop, dq added
 * as it goes); with fewer, a first pass gives each (batch, KV head, key
 * block) its dk and dv and a second each (batch, head, query block) its dq,
 * recomputing the tiles (7 GEMMs a tile instead of 5). Both passes make the
 * same GEMM calls on the same tiles in the same order per element as the
 * fused loop, so the two give the same bits. */
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

typedef struct {
    const fsc_attn_dims *d;
    const float *q, *k, *v, *dout, *lse, *delta;
    float *dq, *dk, *dv;
    fsc_gemm_prec prec;
    float scale;
    /* k^T and v^T of the call (fsc_flash_transpose) when the tiles are fused
     * products (fsc_flash_mm, attention_flash_tile.c), else NULL (fsc_gemm) */
    const float *kt, *vt;
    int64_t tld;
    /* and k, q and dout head by head (fsc_flash_heads) */
    const float *kh, *qh, *gh;
    /* bf16 tiles (fsc_flash_mm16): k and v packed as the B of S and dP, q
     * and dout as their A, and k, q and dout in pairs of rows (fsc_flash_pack) */
    const uint32_t *kp, *vp, *qe, *ge, *kr, *qr, *gr;
} bwd;

/* Per-thread scratch: P and dS (BR x BC each), dk and dv of a key block (BC
 * x hd each), and for bf16 tiles dS in pairs of keys, P and dS in pairs of
 * query rows (BR x BC / 2 each). */
static size_t per_thread(int hd) {
    return 2 * (size_t)BR * BC + 2 * (size_t)BC * hd + 3 * (size_t)BR * BC / 2;
}

/* Row r of a tile at query row r0 and key c0 sees keys c0 .. c0 + r + diag. */
static int64_t tile_diag(const fsc_attn_dims *d, int r0, int c0) {
    return d->q_pos0 + r0 - d->k_pos0 - c0;
}

/* First query row of the call that sees key c0 (Tq if none). */
static int first_row(const fsc_attn_dims *d, int c0) {
    int64_t r = d->k_pos0 + c0 - d->q_pos0;
    return r < 0 ? 0 : r > d->Tq ? d->Tq : (int)r;
}

/* P and dS of the tile rows [r0, r0+rows) x keys [c0, c0+cols) of head h of
 * batch row b, into P and dS (row stride BC). */
static void tile(const bwd *a, int b, int h, int r0, int rows, int c0, int cols, float *P,
                 float *dS) {
    const fsc_attn_dims *d = a->d;
    const int hd = d->hd, j = h / (d->NH / d->NKV);
    const float *qb = a->q + ((size_t)b * d->Tq + r0) * d->ldq + (size_t)h * hd;
    const float *gb = a->dout + ((size_t)b * d->Tq + r0) * d->ldo + (size_t)h * hd;
    const float *kb = a->k + ((size_t)b * d->Tk + c0) * d->ldk + (size_t)j * hd;
    const float *vb = a->v + ((size_t)b * d->Tk + c0) * d->ldv + (size_t)j * hd;
    const size_t row = ((size_t)b * d->NH + h) * d->Tq + r0;
    const float *L = a->lse + row, *D = a->delta + row;
    if (a->kp) {
        const int64_t diag = tile_diag(d, r0, c0), ep = fsc_flash_pairs_ld(hd);
        const size_t at =
            ((size_t)b * d->NKV + j) * fsc_flash_pack_per_head(d, d->Tk, FSC_FLASH_PACK_KEYS_T) +
            c0;
        const size_t qa = (((size_t)b * d->NH + h) * d->Tq + r0) * ep;
        fsc_flash_mm16_do(rows, cols, hd, a->qe + qa, ep, 1, a->kp + at, a->tld, P, BC, a->scale,
                          false, FSC_FLASH_MASK_N_UPPER, diag);
        fsc_flash_mm16_do(rows, cols, hd, a->ge + qa, ep, 1, a->vp + at, a->tld, dS, BC, 1.f, false,
                          FSC_FLASH_MASK_N_UPPER, diag);
    } else if (a->kt) {
        const int64_t diag = tile_diag(d, r0, c0);
        const size_t at = ((size_t)b * d->NKV + j) * hd * a->tld + c0;
        fsc_flash_mm_do(rows, cols, hd, a->qh + (((size_t)b * d->NH + h) * d->Tq + r0) * hd, hd, 1,
                        a->kt + at, a->tld, P, BC, a->scale, false, FSC_FLASH_MASK_N_UPPER, diag);
        fsc_flash_mm_do(rows, cols, hd, a->gh + (((size_t)b * d->NH + h) * d->Tq + r0) * hd, hd, 1,
                        a->vt + at, a->tld, dS, BC, 1.f, false, FSC_FLASH_MASK_N_UPPER, diag);
    } else {
        fsc_gemm(a->prec, false, true, rows, cols, hd, a->scale, qb, d->ldq, kb, d->ldk, 0.f, P,
                 BC);
        fsc_gemm(a->prec, false, true, rows, cols, hd, 1.f, gb, d->ldo, vb, d->ldv, 0.f, dS, BC);
    }
    if (a->kt) { /* fused tiles: the rows in registers */
        fsc_flash_probs_rows(P, dS, rows, cols, tile_diag(d, r0, c0), L, D, a->scale);
        return;
    }
    for (int r = 0; r < rows; r++) {
        float *p = P + (size_t)r * BC, *ds = dS + (size_t)r * BC;
        int n = fsc_flash_visible(d, r0 + r) - c0;
        n = L[r] == -INFINITY || n < 0 ? 0 : n > cols ? cols : n;
        const float lr = L[r], dr = D[r], s = a->scale;
#pragma omp simd
        for (int u = 0; u < n; u++) {
            p[u] = fsc_fast_expf(p[u] - lr);
            ds[u] = p[u] * (ds[u] - dr) * s;
        }
        if (n < cols) {
            memset(p + n, 0, (size_t)(cols - n) * sizeof(float));
            memset(ds + n, 0, (size_t)(cols - n) * sizeof(float));
        }
    }
}

/* dq (rows x hd, stride ldq) += dS k of one tile (keys from c0 of KV head j
 * of batch row b), fused; bf16 tiles take dS in pairs of keys, dSp. */
static void dq_add(const bwd *a, int b, int j, int c0, int rows, int cols, const float *dS,
                   uint32_t *dSp, float *dq, int64_t diag) {
    const fsc_attn_dims *d = a->d;
    if (a->kr) {
        const int64_t per = fsc_flash_pack_per_head(d, d->Tk, FSC_FLASH_PACK_ROWS);
        fsc_flash_pairs_of_rows(dSp, BC / 2, dS, BC, rows, cols);
        fsc_flash_mm16_do(rows, d->hd, cols, dSp, BC / 2, 1,
                          a->kr + ((size_t)b * d->NKV + j) * per + (size_t)c0 / 2 * d->hd, d->hd,
                          dq, d->ldq, 1.f, true, FSC_FLASH_MASK_K_UPPER, diag);
        return;
    }
    fsc_flash_mm_do(rows, d->hd, cols, dS, BC, 1,
                    a->kh + (((size_t)b * d->NKV + j) * d->Tk + c0) * d->hd, d->hd, dq, d->ldq, 1.f,
                    true, FSC_FLASH_MASK_K_UPPER, diag);
}

/* Key block [c0, c0+cols) of KV head j of batch row b: its dk and dv summed
 * over the group's heads and the query blocks that see it, then added into
 * dk and dv; with_dq also adds each tile's dS k into dq. */
static void key_block(const bwd *a, int b, int j, int c0, int cols, bool with_dq, float *ws) {
    const fsc_attn_dims *d = a->d;
    const int hd = d->hd, group = d->NH / d->NKV;
    float *P = ws, *dS = P + (size_t)BR * BC, *dKb = dS + (size_t)BR * BC, *dVb = dKb + BC * hd;
    uint32_t *dSp = (uint32_t *)(dVb + BC * hd), *Pt = dSp + BR * BC / 2, *dSt = Pt + BR * BC / 2;
    memset(dKb, 0, 2 * (size_t)BC * hd * sizeof(float));
    const int start = first_row(d, c0) / BR * BR;
    const float *kb = a->k + ((size_t)b * d->Tk + c0) * d->ldk + (size_t)j * hd;
    for (int g = 0; g < group; g++) {
        const int h = j * group + g;
        for (int r0 = start; r0 < d->Tq; r0 += BR) {
            const int rows = d->Tq - r0 < BR ? d->Tq - r0 : BR;
            const size_t qo = ((size_t)b * d->Tq + r0) * d->ldq + (size_t)h * hd;
            const float *gb = a->dout + ((size_t)b * d->Tq + r0) * d->ldo + (size_t)h * hd;
            tile(a, b, h, r0, rows, c0, cols, P, dS);
            if (a->kp) {
                const int64_t diag = tile_diag(d, r0, c0);
                const size_t qo2 = ((size_t)b * d->NH + h) *
                                       fsc_flash_pack_per_head(d, d->Tq, FSC_FLASH_PACK_ROWS) +
                                   (size_t)r0 / 2 * hd;
                fsc_flash_pairs_down(Pt, BC, P, BC, rows, cols);
                fsc_flash_pairs_down(dSt, BC, dS, BC, rows, cols);
                fsc_flash_mm16_do(cols, hd, rows, Pt, 1, BC, a->gr + qo2, hd, dVb, hd, 1.f, true,
                                  FSC_FLASH_MASK_K_LOWER, diag);
                fsc_flash_mm16_do(cols, hd, rows, dSt, 1, BC, a->qr + qo2, hd, dKb, hd, 1.f, true,
                                  FSC_FLASH_MASK_K_LOWER, diag);
                if (with_dq) dq_add(a, b, j, c0, rows, cols, dS, dSp, a->dq + qo, diag);
            } else if (a->kt) {
                const int64_t diag = tile_diag(d, r0, c0);
                const size_t qa = (((size_t)b * d->NH + h) * d->Tq + r0) * hd;
                fsc_flash_mm_do(cols, hd, rows, P, 1, BC, a->gh + qa, hd, dVb, hd, 1.f, true,
                                FSC_FLASH_MASK_K_LOWER, diag);
                fsc_flash_mm_do(cols, hd, rows, dS, 1, BC, a->qh + qa, hd, dKb, hd, 1.f, true,
                                FSC_FLASH_MASK_K_LOWER, diag);
                if (with_dq) dq_add(a, b, j, c0, rows, cols, dS, NULL, a->dq + qo, diag);
            } else {
                fsc_gemm(a->prec, true, false, cols, hd, rows, 1.f, P, BC, gb, d->ldo, 1.f, dVb,
                         hd);
                fsc_gemm(a->prec, true, false, cols, hd, rows, 1.f, dS, BC, a->q + qo, d->ldq, 1.f,
                         dKb, hd);
                if (with_dq)
                    fsc_gemm(a->prec, false, false, rows, hd, cols, 1.f, dS, BC, kb, d->ldk, 1.f,
                             a->dq + qo, d->ldq);
            }
        }
    }
    for (int c = 0; c < cols; c++) {
        float *dk = a->dk + ((size_t)b * d->Tk + c0 + c) * d->ldk + (size_t)j * hd;
        float *dv = a->dv + ((size_t)b * d->Tk + c0 + c) * d->ldv + (size_t)j * hd;
        const float *sk = dKb + (size_t)c * hd, *sv = dVb + (size_t)c * hd;
#pragma omp simd
        for (int e = 0; e < hd; e++) {
            dk[e] += sk[e];
            dv[e] += sv[e];
        }
    }
}

/* dq of query block [r0, r0+rows) of head h: the key blocks it sees, in order. */
static void query_block(const bwd *a, int b, int h, int r0, int rows, float *ws) {
    const fsc_attn_dims *d = a->d;
    const int hd = d->hd, j = h / (d->NH / d->NKV);
    float *P = ws, *dS = P + (size_t)BR * BC;
    uint32_t *dSp = (uint32_t *)(dS + (size_t)BR * BC + 2 * (size_t)BC * hd);
    float *dq = a->dq + ((size_t)b * d->Tq + r0) * d->ldq + (size_t)h * hd;
    const int kend = fsc_flash_visible(d, r0 + rows - 1);
    for (int c0 = 0; c0 < kend; c0 += BC) {
        const int cols = d->Tk - c0 < BC ? d->Tk - c0 : BC; /* the fused loop's key block */
        if (first_row(d, c0) >= r0 + rows) break;
        tile(a, b, h, r0, rows, c0, cols, P, dS);
        const float *kb = a->k + ((size_t)b * d->Tk + c0) * d->ldk + (size_t)j * hd;
        if (a->kt || a->kp)
            dq_add(a, b, j, c0, rows, cols, dS, dSp, dq, tile_diag(d, r0, c0));
        else
            fsc_gemm(a->prec, false, false, rows, hd, cols, 1.f, dS, BC, kb, d->ldk, 1.f, dq,
                     d->ldq);
    }
}

void fsc_flash_attention_backward(const fsc_attn_dims *d, const float *q, const float *k,
                                  const float *v, const float *dout, const float *lse,
                                  const float *delta, float *dq, float *dk, float *dv,
                                  fsc_gemm_prec prec) {
    if (!fsc_flash_dims_ok(d, "flash attention backward") || d->Tq == 0 || d->Tk == 0) return;
    bwd a = {.d = d,
             .q = q,
             .k = k,
             .v = v,
             .dout = dout,
             .lse = lse,
             .delta = delta,
             .dq = dq,
             .dk = dk,
             .dv = dv,
             .prec = prec,
             .scale = 1.0f / sqrtf((float)d->hd)};
    if (fsc_flash_fused(prec)) {
        a.kt = fsc_flash_transpose(d, k, d->ldk, FSC_FLASH_KT);
        a.vt = a.kt ? fsc_flash_transpose(d, v, d->ldv, FSC_FLASH_VT) : NULL;
        a.tld = fsc_flash_t_ld(d);
        a.kh = a.vt ? fsc_flash_heads(d, k, d->ldk, d->Tk, d->NKV, FSC_FLASH_KH) : NULL;
        a.qh = a.kh ? fsc_flash_heads(d, q, d->ldq, d->Tq, d->NH, FSC_FLASH_QH) : NULL;
        a.gh = a.qh ? fsc_flash_heads(d, dout, d->ldo, d->Tq, d->NH, FSC_FLASH_GH) : NULL;
        if (!a.gh) {
            fsc_log(FSC_LOG_ERROR, "flash attention backward: %s", fsc_last_error());
            return;
        }
    } else if (fsc_flash_bf16_tiles(prec)) {
        /* the slots of the fp32 tiles' copies, which this call does not make */
        const struct {
            const uint32_t **dst;
            const float *src;
            int ld, T, H, kind, slot;
        } p[7] = {{&a.kp, k, d->ldk, d->Tk, d->NKV, FSC_FLASH_PACK_KEYS_T, FSC_FLASH_KT},
                  {&a.vp, v, d->ldv, d->Tk, d->NKV, FSC_FLASH_PACK_KEYS_T, FSC_FLASH_VT},
                  {&a.qe, q, d->ldq, d->Tq, d->NH, FSC_FLASH_PACK_ELEMS, FSC_FLASH_QH},
                  {&a.ge, dout, d->ldo, d->Tq, d->NH, FSC_FLASH_PACK_ELEMS, FSC_FLASH_GH},
                  {&a.kr, k, d->ldk, d->Tk, d->NKV, FSC_FLASH_PACK_ROWS, FSC_FLASH_KH},
                  {&a.qr, q, d->ldq, d->Tq, d->NH, FSC_FLASH_PACK_ROWS, FSC_FLASH_QR},
                  {&a.gr, dout, d->ldo, d->Tq, d->NH, FSC_FLASH_PACK_ROWS, FSC_FLASH_GR}};
        for (int i = 0; i < 7; i++) {
            *p[i].dst = fsc_flash_pack(d, p[i].src, p[i].ld, p[i].T, p[i].H,
                                       (fsc_flash_pack_kind)p[i].kind, p[i].slot);
            if (!*p[i].dst) {
                fsc_log(FSC_LOG_ERROR, "flash attention backward: %s", fsc_last_error());
                return;
            }
        }
        a.tld = fsc_flash_t_ld(d);
    }
    const int threads = fsc_get_num_threads(), nkb = (d->Tk + BC - 1) / BC;
    const int nqb = (d->Tq + BR - 1) / BR;
    const size_t per = per_thread(d->hd);
    float *ws = fsc_flash_scratch(FSC_FLASH_WS, (size_t)threads * per);
    if (!ws) {
        fsc_log(FSC_LOG_ERROR, "flash attention backward: %s", fsc_last_error());
        return;
    }
    const bool big = (int64_t)d->Tq * d->Tk * d->hd >= (1 << 16);
    const int64_t pairs = (int64_t)d->B * d->NKV;
    if (pairs >= threads) {
#pragma omp parallel for schedule(dynamic) if (pairs > 1 && big)
        for (int64_t t = 0; t < pairs; t++) {
            int tid = 0;
#ifdef _OPENMP
            tid = omp_get_thread_num();
#endif
            const int b = (int)(t / d->NKV), j = (int)(t % d->NKV);
            for (int c0 = 0; c0 < d->Tk; c0 += BC)
                key_block(&a, b, j, c0, d->Tk - c0 < BC ? d->Tk - c0 : BC, true,
                          ws + (size_t)tid * per);
        }
    } else {
        const int64_t kt = pairs * nkb, qt = (int64_t)d->B * d->NH * nqb;
#pragma omp parallel if (big)
        {
            int tid = 0;
#ifdef _OPENMP
            tid = omp_get_thread_num();
#endif
            float *w = ws + (size_t)tid * per;
#pragma omp for schedule(dynamic) nowait
            for (int64_t t = 0; t < kt; t++) {
                const int c0 = (int)(t % nkb) * BC, j = (int)(t / nkb % d->NKV);
                key_block(&a, (int)(t / nkb / d->NKV), j, c0, d->Tk - c0 < BC ? d->Tk - c0 : BC,
                          false, w);
            }
#pragma omp for schedule(dynamic)
            for (int64_t t = 0; t < qt; t++) {
                const int r0 = (int)(t % nqb) * BR, h = (int)(t / nqb % d->NH);
                query_block(&a, (int)(t / nqb / d->NH), h, r0, d->Tq - r0 < BR ? d->Tq - r0 : BR,
                            w);
            }
        }
    }
}
