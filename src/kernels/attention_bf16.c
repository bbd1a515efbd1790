/* Causal attention's GEMMs in bf16, batched over every (batch, head) pair.
 *
 * The per-head path (attention.c) makes 8 small GEMMs per head and query
 * block forward and backward: at T = 256, hs = 64 that is ~6,000 calls a
 * step, each rounding its operands again and paying oneDNN's per-call cost,
 * so bf16 bought attention almost nothing. Here q, k, v (and dy) are
 * rounded once per call into bf16 buffers of the fused layout, and one
 * oneDNN primitive per query (or key) block covers all B x NH heads through
 * strided 4-D descriptors, keeping the causal block skipping of attention.c:
 * 24 primitive runs per layer and step instead of ~770. The scale 1/sqrt(hs)
 * and the softmax (and its backward) stay fp32, as in the per-head path,
 * which also remains the fallback (mode off, no oneDNN, or a refused shape).
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "kernels/attention_internal.h"
#include "kernels/blas_internal.h"
#include "kernels/dnnl_internal.h"
#include "kernels/gemm_bf16_internal.h"

#define BLOCKS_MAX 64 /* query blocks: T <= 64 * FSC_ATT_BLOCK */
#define CONFIGS 8     /* (B, T, C, NH) kept at once; a model has one or two */

enum { QK, PV, DP, DQ, DV, DK, KINDS };

/* Every primitive of one (B, T, C, NH): kind x block. */
typedef struct {
    int B, T, C, NH;
    bool ok; /* all made */
    fsc_dnnl_matmul *mm[KINDS][BLOCKS_MAX];
    size_t scratch; /* the largest run's */
} config;

static struct {
    pthread_mutex_t lock;
    config c[CONFIGS];
    int n;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* (B, NH, rows, cols) at base offset 0 with the given strides */
static fsc_dnnl_layout view(const config *c, int64_t rows, int64_t cols, int64_t sb, int64_t sr,
                            int64_t sc, int64_t sh) {
    return (fsc_dnnl_layout){4, {c->B, c->NH, rows, cols}, {sb, sh, sr, sc}};
}

/* Makes block i of kind k; false if oneDNN refuses it. Layouts, per head:
 * qkv-like operands (B,T,3C) rows of stride 3C at column h*hs (heads stride
 * hs); dy and out (B,T,C) rows of stride C; att and dP (B,NH,T,T). */
static bool make(config *c, int k, int i) {
    const int64_t T = c->T, C = c->C, hs = C / c->NH, r0 = (int64_t)i * FSC_ATT_BLOCK;
    const int64_t rows = T - r0 < FSC_ATT_BLOCK ? T - r0 : FSC_ATT_BLOCK, ncols = r0 + rows;
    const int64_t Q = T * 3 * C, Y = T * C, A = c->NH * T * T; /* batch strides */
    fsc_dnnl_layout a, b, d;
    switch (k) {
    case QK: /* s = q k^T: (rows, hs) x (hs, ncols) */
    case DP: /* dp = dy v^T */
        a = k == QK ? view(c, rows, hs, Q, 3 * C, 1, hs) : view(c, rows, hs, Y, C, 1, hs);
        b = view(c, hs, ncols, Q, 1, 3 * C, hs);
        d = view(c, rows, ncols, A, T, 1, T * T);
        break;
    case PV: /* out = p v: (rows, ncols) x (ncols, hs) */
    case DQ: /* dq = ds k */
        a = view(c, rows, ncols, A, T, 1, T * T);
        b = view(c, ncols, hs, Q, 3 * C, 1, hs);
        d = k == PV ? view(c, rows, hs, Y, C, 1, hs) : view(c, rows, hs, Q, 3 * C, 1, hs);
        break;
    default: /* DV: dv = p^T dy, DK: dk = ds^T q, over key block i: (rows, T-r0) x (T-r0, hs) */
        a = view(c, rows, T - r0, A, 1, T, T * T);
        b = k == DV ? view(c, T - r0, hs, Y, C, 1, hs) : view(c, T - r0, hs, Q, 3 * C, 1, hs);
        d = view(c, rows, hs, Q, 3 * C, 1, hs);
        break;
    }
    char why[256];
    c->mm[k][i] =
        fsc_dnnl_matmul_new_nd(&a, &b, &d, false, false, fsc_blas_threads(), why, sizeof why);
    if (!c->mm[k][i]) return false;
    size_t s = fsc_dnnl_matmul_scratch(c->mm[k][i]);
    if (s > c->scratch) c->scratch = s;
    return true;
}

/* The primitives of (B, T, C, NH), made on first use; NULL when the batched
 * path is not to run (not wanted, too long a sequence, oneDNN refused). */
static const config *get(int B, int T, int C, int NH) {
    if (!fsc_bf16_gemm_wanted() || T > BLOCKS_MAX * FSC_ATT_BLOCK || C % NH) return NULL;
    pthread_mutex_lock(&g.lock);
    config *c = NULL;
    for (int i = 0; i < g.n && !c; i++)
        if (g.c[i].B == B && g.c[i].T == T && g.c[i].C == C && g.c[i].NH == NH) c = &g.c[i];
    if (!c && g.n < CONFIGS) {
        c = &g.c[g.n++];
        *c = (config){.B = B, .T = T, .C = C, .NH = NH, .ok = true};
        int nb = (T + FSC_ATT_BLOCK - 1) / FSC_ATT_BLOCK;
        for (int k = 0; k < KINDS && c->ok; k++)
            for (int i = 0; i < nb && c->ok; i++) c->ok = make(c, k, i);
    }
    pthread_mutex_unlock(&g.lock);
    return c && c->ok ? c : NULL;
}

/* Runs primitive (k, i) on operand bases a, b (bf16) and d (fp32); counts it. */
static bool run(const config *c, int k, int i, const uint16_t *a, const uint16_t *b, float *d,
                void *scratch) {
    double t0 = fsc_now();
    bool ok = !fsc_dnnl_matmul_run(c->mm[k][i], a, b, d, NULL, scratch, fsc_blas_threads());
    const int64_t r0 = (int64_t)i * FSC_ATT_BLOCK, T = c->T, hs = c->C / c->NH;
    const int64_t rows = T - r0 < FSC_ATT_BLOCK ? T - r0 : FSC_ATT_BLOCK;
    const int64_t inner = k == DV || k == DK ? T - r0 : r0 + rows; /* the other long side */
    fsc_gemm_bf16_count(ok, fsc_now() - t0, 2.0 * c->B * c->NH * rows * inner * hs);
    return ok;
}

/* This thread's buffers: the fused qkv and dy in bf16, p (or ds) in bf16,
 * an fp32 (B,NH,T,T) for dp, and scratch. */
typedef struct {
    uint16_t *qkv, *dy, *p;
    float *dp;
    void *scratch;
} buffers;

static bool buffers_get(const config *c, bool backward, buffers *w) {
    const size_t BT = (size_t)c->B * c->T, att = BT * c->NH * c->T;
    w->qkv = fsc_bf16_ws(0, BT * 3 * c->C);
    w->p = fsc_bf16_ws(1, att);
    w->scratch = fsc_bf16_ws(2, c->scratch / 2 + 32);
    w->dy = backward ? fsc_bf16_ws(3, BT * c->C) : NULL;
    w->dp = backward ? (float *)(void *)fsc_bf16_ws(4, 2 * att) : NULL;
    return w->qkv && w->p && w->scratch && (!backward || (w->dy && w->dp));
}

/* Either pass's start: the shape's primitives, the buffers and qkv packed
 * to bf16; NULL when this path is not to run. */
static const config *begin(const float *qkv, int B, int T, int C, int NH, bool backward,
                           buffers *w) {
    const config *c = get(B, T, C, NH);
    if (!c || !buffers_get(c, backward, w)) return NULL;
    fsc_pack_bf16(w->qkv, qkv, B * T, 3 * C, 3 * C);
    return c;
}

bool fsc_attention_bf16_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH) {
    buffers w;
    const config *c = begin(qkv, B, T, C, NH, false, &w);
    if (!c) return false;
    const int hs = C / NH, nb = (T + FSC_ATT_BLOCK - 1) / FSC_ATT_BLOCK;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int i = 0; i < nb; i++) /* raw scores q k^T of block i: scaled with the softmax */
        if (!run(c, QK, i, w.qkv + (size_t)i * FSC_ATT_BLOCK * 3 * C, w.qkv + C,
                 att + (size_t)i * FSC_ATT_BLOCK * T, w.scratch))
            return false;
#pragma omp parallel for if (B * NH > 1 && fsc_get_num_threads() > 1)
    for (int bh = 0; bh < B * NH; bh++) {
        float *a = att + (size_t)bh * T * T;
        uint16_t *p = w.p + (size_t)bh * T * T;
        for (int t = 0; t < T; t++) {
            int ncols = (t / FSC_ATT_BLOCK + 1) * FSC_ATT_BLOCK;
            ncols = ncols < T ? ncols : T;
            float *row = a + (size_t)t * T;
#pragma omp simd
            for (int u = 0; u <= t; u++) row[u] *= scale; /* as alpha = scale would */
            fsc_softmax_causal_row(row, t, ncols);
            fsc_pack_bf16(p + (size_t)t * T, row, 1, ncols, 0);
        }
    }
    for (int i = 0; i < nb; i++)
        if (!run(c, PV, i, w.p + (size_t)i * FSC_ATT_BLOCK * T, w.qkv + 2 * C,
                 out + (size_t)i * FSC_ATT_BLOCK * C, w.scratch))
            return false;
    return true;
}

bool fsc_attention_bf16_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                 int B, int T, int C, int NH) {
    buffers w;
    const config *c = begin(qkv, B, T, C, NH, true, &w);
    if (!c) return false;
    const int hs = C / NH, nb = (T + FSC_ATT_BLOCK - 1) / FSC_ATT_BLOCK;
    const float scale = 1.0f / sqrtf((float)hs);
    fsc_pack_bf16(w.dy, dout, B * T, C, C);
    for (int i = 0; i < nb; i++) /* dp = dy v^T, per query block */
        if (!run(c, DP, i, w.dy + (size_t)i * FSC_ATT_BLOCK * C, w.qkv + 2 * C,
                 w.dp + (size_t)i * FSC_ATT_BLOCK * T, w.scratch))
            return false;
    uint16_t *ph = w.p; /* p in bf16 for dv; then ds in bf16, into the same rows */
#pragma omp parallel for if (B * NH > 1 && fsc_get_num_threads() > 1)
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++) {
            int ncols = (t / FSC_ATT_BLOCK + 1) * FSC_ATT_BLOCK;
            ncols = ncols < T ? ncols : T;
            size_t at = ((size_t)bh * T + t) * T;
            fsc_pack_bf16(ph + at, att + at, 1, ncols, 0);
        }
    for (int i = 0; i < nb; i++) /* dv = p^T dy, per key block */
        if (!run(c, DV, i, ph + (size_t)i * FSC_ATT_BLOCK * (T + 1),
                 w.dy + (size_t)i * FSC_ATT_BLOCK * C,
                 dqkv + 2 * C + (size_t)i * FSC_ATT_BLOCK * 3 * C, w.scratch))
            return false;
#pragma omp parallel for if (B * NH > 1 && fsc_get_num_threads() > 1)
    for (int bh = 0; bh < B * NH; bh++) /* ds = scale p (dp - p.dp), fp32, then bf16 */
        for (int t = 0; t < T; t++) {
            int ncols = (t / FSC_ATT_BLOCK + 1) * FSC_ATT_BLOCK;
            ncols = ncols < T ? ncols : T;
            size_t at = ((size_t)bh * T + t) * T;
            fsc_softmax_causal_row_backward(w.dp + at, att + at, t, ncols, scale);
            fsc_pack_bf16(ph + at, w.dp + at, 1, ncols, 0);
        }
    for (int i = 0; i < nb; i++) {
        size_t r0 = (size_t)i * FSC_ATT_BLOCK;
        if (!run(c, DQ, i, ph + r0 * T, w.qkv + C, dqkv + r0 * 3 * C, w.scratch) ||
            !run(c, DK, i, ph + r0 * (T + 1), w.qkv + r0 * 3 * C, dqkv + C + r0 * 3 * C, w.scratch))
            return false;
    }
    return true;
}

/* ---- q/k/v and the probabilities stored in bf16 (autocast's saves) ----------
 * The batched path above rounds qkv and p to bf16 for its GEMMs anyway, so
 * under bf16 autocast they are kept that way: c_attn writes qkv in bf16, the
 * forward writes p in bf16 and backward reads both as the GEMMs' operands.
 * The softmax backward reads p widened from bf16 (fp32 arithmetic), the one
 * place the numbers move against fp32 probabilities; the rest is bit for bit
 * the batched path on the widened values. When that path cannot run (memory,
 * a primitive failing) the per-head path runs on fp32 widenings in
 * FSC_MEM_WORK, so the result is defined either way. */

bool fsc_attention_bf16_act_ready(int B, int T, int C, int NH) {
    return B > 0 && T > 0 && NH > 0 && get(B, T, C, NH) != NULL;
}

/* src widened into a new FSC_MEM_WORK array of n floats; NULL when out of memory. */
static float *widened(const uint16_t *src, size_t n) {
    float *f = fsc_mem_alloc(FSC_MEM_WORK, n * sizeof(float));
    if (f) fsc_widen_bf16(f, src, (int64_t)n);
    return f;
}

/* The probabilities' rows in bf16, entries right of each block's last key
 * left unwritten (the batched path's causal blocks). */
static void narrow_att(uint16_t *atth, const float *att, int BH, int T) {
#pragma omp parallel for if (BH > 1 && fsc_get_num_threads() > 1)
    for (int bh = 0; bh < BH; bh++)
        for (int t = 0; t < T; t++) {
            int ncols = (t / FSC_ATT_BLOCK + 1) * FSC_ATT_BLOCK;
            size_t at = ((size_t)bh * T + t) * T;
            fsc_pack_bf16(atth + at, att + at, 1, ncols < T ? ncols : T, 0);
        }
}

static int forward_fallback(float *out, uint16_t *atth, const uint16_t *qkvh, int B, int T, int C,
                            int NH) {
    const size_t nq = (size_t)B * T * 3 * C, na = (size_t)B * NH * T * T;
    float *qkv = widened(qkvh, nq), *att = fsc_mem_alloc(FSC_MEM_WORK, na * sizeof(float));
    int rc = qkv && att ? FSC_OK : FSC_ERR_NOMEM;
    if (!rc) {
        fsc_attention_forward_prec(out, att, qkv, B, T, C, NH, FSC_GEMM_BF16);
        narrow_att(atth, att, B * NH, T);
    }
    fsc_mem_free(qkv), fsc_mem_free(att);
    return rc;
}

int fsc_attention_forward_bf16_act(float *out, uint16_t *atth, const uint16_t *qkvh, int B, int T,
                                   int C, int NH) {
    const config *c = get(B, T, C, NH);
    buffers w;
    /* the fp32 scores: backward's dp buffer, free during a forward */
    if (!c || !buffers_get(c, true, &w)) return forward_fallback(out, atth, qkvh, B, T, C, NH);
    const int hs = C / NH, nb = (T + FSC_ATT_BLOCK - 1) / FSC_ATT_BLOCK;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int i = 0; i < nb; i++)
        if (!run(c, QK, i, qkvh + (size_t)i * FSC_ATT_BLOCK * 3 * C, qkvh + C,
                 w.dp + (size_t)i * FSC_ATT_BLOCK * T, w.scratch))
            return forward_fallback(out, atth, qkvh, B, T, C, NH);
#pragma omp parallel for if (B * NH > 1 && fsc_get_num_threads() > 1)
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++) { /* as fsc_attention_bf16_forward's rows */
            int ncols = (t / FSC_ATT_BLOCK + 1) * FSC_ATT_BLOCK;
            ncols = ncols < T ? ncols : T;
            float *row = w.dp + ((size_t)bh * T + t) * T;
#pragma omp simd
            for (int u = 0; u <= t; u++) row[u] *= scale;
            fsc_softmax_causal_row(row, t, ncols);
            fsc_pack_bf16(atth + ((size_t)bh * T + t) * T, row, 1, ncols, 0);
        }
    for (int i = 0; i < nb; i++)
        if (!run(c, PV, i, atth + (size_t)i * FSC_ATT_BLOCK * T, qkvh + 2 * C,
                 out + (size_t)i * FSC_ATT_BLOCK * C, w.scratch))
            return forward_fallback(out, atth, qkvh, B, T, C, NH);
    return FSC_OK;
}

static int backward_fallback(float *dqkv, const float *dout, const uint16_t *qkvh,
                             const uint16_t *atth, int B, int T, int C, int NH) {
    const size_t nq = (size_t)B * T * 3 * C, na = (size_t)B * NH * T * T;
    float *qkv = widened(qkvh, nq), *att = fsc_mem_alloc(FSC_MEM_WORK, na * sizeof(float));
    int rc = qkv && att ? FSC_OK : FSC_ERR_NOMEM;
    if (!rc) {
#pragma omp parallel for if (B * NH > 1 && fsc_get_num_threads() > 1)
        for (int bh = 0; bh < B * NH; bh++)
            for (int t = 0; t < T; t++) { /* the causal part; the per-head path reads no more */
                size_t at = ((size_t)bh * T + t) * T;
                fsc_widen_bf16(att + at, atth + at, t + 1);
                memset(att + at + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
            }
        fsc_attention_backward_prec(dqkv, dout, qkv, att, B, T, C, NH, FSC_GEMM_BF16);
    }
    fsc_mem_free(qkv), fsc_mem_free(att);
    return rc;
}

int fsc_attention_backward_bf16_act(float *dqkv, const float *dout, const uint16_t *qkvh,
                                    const uint16_t *atth, int B, int T, int C, int NH) {
    const config *c = get(B, T, C, NH);
    buffers w;
    if (!c || !buffers_get(c, true, &w))
        return backward_fallback(dqkv, dout, qkvh, atth, B, T, C, NH);
    const int hs = C / NH, nb = (T + FSC_ATT_BLOCK - 1) / FSC_ATT_BLOCK;
    const float scale = 1.0f / sqrtf((float)hs);
    fsc_pack_bf16(w.dy, dout, B * T, C, C);
    bool ok = true;
    for (int i = 0; i < nb && ok; i++) /* dp = dy v^T, per query block */
        ok = run(c, DP, i, w.dy + (size_t)i * FSC_ATT_BLOCK * C, qkvh + 2 * C,
                 w.dp + (size_t)i * FSC_ATT_BLOCK * T, w.scratch);
    for (int i = 0; i < nb && ok; i++) /* dv = p^T dy, per key block, p as saved */
        ok = run(c, DV, i, atth + (size_t)i * FSC_ATT_BLOCK * (T + 1),
                 w.dy + (size_t)i * FSC_ATT_BLOCK * C,
                 dqkv + 2 * C + (size_t)i * FSC_ATT_BLOCK * 3 * C, w.scratch);
    if (!ok) return backward_fallback(dqkv, dout, qkvh, atth, B, T, C, NH);
#pragma omp parallel for if (B * NH > 1 && fsc_get_num_threads() > 1)
    for (int bh = 0; bh < B * NH; bh++) { /* ds from p widened, fp32, then bf16 */
        float p[BLOCKS_MAX * FSC_ATT_BLOCK];
        for (int t = 0; t < T; t++) {
            int ncols = (t / FSC_ATT_BLOCK + 1) * FSC_ATT_BLOCK;
            ncols = ncols < T ? ncols : T;
            size_t at = ((size_t)bh * T + t) * T;
            fsc_widen_bf16(p, atth + at, t + 1);
            fsc_softmax_causal_row_backward(w.dp + at, p, t, ncols, scale);
            fsc_pack_bf16(w.p + at, w.dp + at, 1, ncols, 0);
        }
    }
    for (int i = 0; i < nb && ok; i++) {
        size_t r0 = (size_t)i * FSC_ATT_BLOCK;
        ok = run(c, DQ, i, w.p + r0 * T, qkvh + C, dqkv + r0 * 3 * C, w.scratch) &&
             run(c, DK, i, w.p + r0 * (T + 1), qkvh + r0 * 3 * C, dqkv + C + r0 * 3 * C, w.scratch);
    }
    return ok ? FSC_OK : backward_fallback(dqkv, dout, qkvh, atth, B, T, C, NH);
}
