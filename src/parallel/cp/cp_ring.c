/* Ring attention over a context-parallel group (fsc/cp.h): the attend and
 * attend_backward of fsc_ctx.seq.
 *
 * Forward: this rank's K and V are packed into one buffer of rows [k | v]
 * and passed to the next rank while this rank computes its queries against
 * the block it holds; after P steps every query run has met every key run
 * at or before it (fsc_flash_attention_forward merges each block into the
 * out and lse already there). Backward: the same tour, each step's dK/dV of
 * the visiting block made in a fresh buffer while the partial sum of the
 * ranks before arrives, then added to it and sent on; after P steps each
 * sum reaches its owner. Between tiles the ring's requests are tested, since
 * a message moves only when someone drives the MPI library.
 *
 * The one idea: a rank's two runs are chunks c and 2P-1-c, so a key run
 * that starts after a query run ends is skipped, and that happens on every
 * rank equally often (load balance). Both runs see key chunk c at step 0,
 * so the first block of each query run is at step 0, key run 0: the only
 * call that does not merge. */
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "fsc/cp.h"
#include "fsc/kernels.h"

enum { TAG_KV = 7301, TAG_DKV = 7302, RUNS = 2 };

struct fsc_cp {
    fsc_group *g;
    int P, me;
    fsc_seq_split seq;
    float *buf; /* FSC_MEM_COMM: the ring's blocks, grown to the largest call */
    size_t cap;
    fsc_cp_stats st;
};

static int chunk_of(const fsc_cp *cp, int rank, int run) {
    return run == 0 ? rank : 2 * cp->P - 1 - rank;
}

static int ensure(fsc_cp *cp, size_t floats) {
    if (floats <= cp->cap) return FSC_OK;
    fsc_mem_free(cp->buf);
    cp->cap = 0;
    cp->buf = fsc_mem_alloc(FSC_MEM_COMM, floats * sizeof(float));
    if (!cp->buf) return fsc_error_context(FSC_ERR_NOMEM, "context parallelism's ring: ");
    cp->cap = floats;
    return FSC_OK;
}

static int check_dims(const fsc_cp *cp, const fsc_attn_dims *d) {
    const int T = cp->seq.runs * cp->seq.len;
    if (d->B < 1 || d->Tq != T || d->Tk != T || d->NKV < 1 || d->NH % d->NKV || d->hd < 1)
        return fsc_error(FSC_ERR_SHAPE,
                         "ring attention on group %s: expected %d rows per sequence (%d runs of "
                         "%d) and NKV dividing NH, got B %d, Tq %d, Tk %d, NH %d, NKV %d, hd %d",
                         fsc_group_name(cp->g), T, cp->seq.runs, cp->seq.len, d->B, d->Tq, d->Tk,
                         d->NH, d->NKV, d->hd);
    return FSC_OK;
}

/* rows of [k | v], W floats each, from k and v rows ldk and ldv apart */
static void pack(float *dst, const float *k, int ldk, const float *v, int ldv, int64_t rows,
                 int W) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(dst + r * 2 * W, k + r * ldk, (size_t)W * sizeof(float));
        memcpy(dst + r * 2 * W + W, v + r * ldv, (size_t)W * sizeof(float));
    }
}

static void unpack(float *k, int ldk, float *v, int ldv, const float *src, int64_t rows, int W) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(k + r * ldk, src + r * 2 * W, (size_t)W * sizeof(float));
        memcpy(v + r * ldv, src + r * 2 * W + W, (size_t)W * sizeof(float));
    }
}

/* Drives the ring's messages between tiles; a failure surfaces at the wait. */
static void poll(fsc_request **reqs, int n) {
    for (int i = 0; i < n; i++)
        if (reqs[i]) (void)fsc_request_test(&reqs[i], NULL);
}

static int wait_all(fsc_cp *cp, fsc_request **reqs, int n, int rc) {
    const double t0 = fsc_now();
    for (int i = 0; i < n; i++) {
        int r = fsc_request_wait(&reqs[i]);
        if (!rc) rc = r;
    }
    cp->st.wait_s += fsc_now() - t0;
    return rc;
}

/* One (query run, key run) block of batch row b: its dims and row offsets. */
typedef struct {
    fsc_attn_dims d;
    size_t qrow, krow, stat; /* first query row, first key row, first lse/delta float */
} block;

/* false for a key run wholly after the query run (nothing visible) */
static bool block_at(const fsc_cp *cp, const fsc_attn_dims *d, int src, int b, int qr, int kr,
                     block *out) {
    const int L = cp->seq.len, T = d->Tq, W = d->NKV * d->hd;
    const int qc = chunk_of(cp, cp->me, qr), kc = chunk_of(cp, src, kr);
    if (kc > qc) return false;
    out->d = *d;
    out->d.B = 1, out->d.Tq = L, out->d.Tk = L;
    out->d.q_pos0 = (int64_t)qc * L, out->d.k_pos0 = (int64_t)kc * L;
    out->d.ldk = out->d.ldv = 2 * W;
    out->qrow = (size_t)b * T + (size_t)qr * L;
    out->krow = (size_t)b * T + (size_t)kr * L;
    out->stat = ((size_t)b * RUNS + qr) * d->NH * L;
    return true;
}

/* A block's calls: slices of `per` KV heads with their query heads, so the
 * ring's messages are tested between slices (on one thread a whole block
 * takes hundreds of milliseconds). Heads are independent in the kernels, so
 * slicing changes no arithmetic. One KV head per call on one thread; with
 * more, as many KV heads per call as threads, to keep the kernels' threads
 * busy. */
static int heads_per_call(const fsc_attn_dims *d) {
    const int t = fsc_get_num_threads();
    return t < d->NKV ? t : d->NKV;
}

/* slice j0 .. j0+per-1 of block k's KV heads: its dims and float offsets
 * into the query/out rows (h), the key/value rows (kvh) and the lse/delta
 * rows (st) of the whole block */
static fsc_attn_dims slice_at(const block *k, int j0, int per, size_t *h, size_t *kvh, size_t *st) {
    fsc_attn_dims s = k->d;
    const int group = s.NH / s.NKV, n = s.NKV - j0 < per ? s.NKV - j0 : per;
    s.NKV = n, s.NH = n * group;
    *h = (size_t)j0 * group * s.hd, *kvh = (size_t)j0 * s.hd;
    *st = (size_t)j0 * group * s.Tq;
    return s;
}

/* This rank's queries against src's keys and values, held in kv. */
static void forward_blocks(fsc_cp *cp, const fsc_attn_dims *d, int s, int src, const float *q,
                           const float *kv, float *out, float *lse, fsc_gemm_prec prec,
                           fsc_request **reqs, int nreq) {
    const int W = d->NKV * d->hd, per = heads_per_call(d);
    const double t0 = fsc_now();
    bool fault = s > 0 && cp->me == cp->P - 1 && fsc_fault_is(FSC_FAULT_CP_SKIP_BLOCK);
    for (int b = 0; b < d->B; b++)
        for (int qr = 0; qr < RUNS; qr++)
            for (int kr = 0; kr < RUNS; kr++) {
                block k;
                if (!block_at(cp, d, src, b, qr, kr, &k)) continue;
                if (fault) { /* test-only: one visiting block never seen */
                    fault = false;
                    continue;
                }
                const float *kb = kv + k.krow * 2 * W;
                for (int j0 = 0; j0 < d->NKV; j0 += per) {
                    size_t h, kvh, st;
                    const fsc_attn_dims sd = slice_at(&k, j0, per, &h, &kvh, &st);
                    fsc_flash_attention_forward(&sd, q + k.qrow * d->ldq + h, kb + kvh,
                                                kb + W + kvh, out + k.qrow * d->ldo + h,
                                                lse + k.stat + st, !(s == 0 && kr == 0), prec);
                    poll(reqs, nreq);
                }
                cp->st.blocks++;
            }
    cp->st.compute_s += fsc_now() - t0;
}

static int ring_forward(void *impl, const fsc_attn_dims *d, const float *q, const float *k,
                        const float *v, float *out, float *lse, fsc_gemm_prec prec) {
    fsc_cp *cp = impl;
    int rc = check_dims(cp, d);
    const int W = d->NKV * d->hd, P = cp->P;
    const int64_t rows = (int64_t)d->B * d->Tq, n = rows * 2 * W;
    if (!rc) rc = ensure(cp, (size_t)n * 2);
    if (rc) return rc;
    float *kv[2] = {cp->buf, cp->buf + n};
    pack(kv[0], k, d->ldk, v, d->ldv, rows, W);
    const int next = (cp->me + 1) % P, prev = (cp->me + P - 1) % P;
    for (int s = 0; s < P && !rc; s++) {
        fsc_request *reqs[2] = {NULL, NULL};
        if (s < P - 1) { /* the block for step s+1 travels while this one computes */
            rc = fsc_group_irecv(cp->g, kv[(s + 1) & 1], n, FSC_DTYPE_F32, prev, TAG_KV, &reqs[0]);
            if (!rc)
                rc = fsc_group_isend(cp->g, kv[s & 1], n, FSC_DTYPE_F32, next, TAG_KV, &reqs[1]);
            cp->st.bytes += n * (int64_t)sizeof(float);
        }
        if (!rc)
            forward_blocks(cp, d, s, (cp->me - s + P) % P, q, kv[s & 1], out, lse, prec, reqs, 2);
        rc = wait_all(cp, reqs, 2, rc);
    }
    return rc;
}

/* dq and the visiting block's dK/dV (into part, [dk | dv] rows) from this
 * rank's queries against src's keys and values, held in kv. */
static void backward_blocks(fsc_cp *cp, const fsc_attn_dims *d, int src, const float *q,
                            const float *kv, const float *dout, const float *lse,
                            const float *delta, float *dq, float *part, fsc_gemm_prec prec,
                            fsc_request **reqs, int nreq) {
    const int W = d->NKV * d->hd, per = heads_per_call(d);
    const double t0 = fsc_now();
    for (int b = 0; b < d->B; b++)
        for (int qr = 0; qr < RUNS; qr++)
            for (int kr = 0; kr < RUNS; kr++) {
                block k;
                if (!block_at(cp, d, src, b, qr, kr, &k)) continue;
                const float *kb = kv + k.krow * 2 * W;
                float *pb = part + k.krow * 2 * W;
                for (int j0 = 0; j0 < d->NKV; j0 += per) {
                    size_t h, kvh, st;
                    const fsc_attn_dims sd = slice_at(&k, j0, per, &h, &kvh, &st);
                    fsc_flash_attention_backward(
                        &sd, q + k.qrow * d->ldq + h, kb + kvh, kb + W + kvh,
                        dout + k.qrow * d->ldo + h, lse + k.stat + st, delta + k.stat + st,
                        dq + k.qrow * d->ldq + h, pb + kvh, pb + W + kvh, prec);
                    poll(reqs, nreq);
                }
                cp->st.blocks++;
            }
    cp->st.compute_s += fsc_now() - t0;
}

/* delta = rowsum(dout * out) of every query run, once, from the final out */
static void deltas(const fsc_cp *cp, const fsc_attn_dims *d, const float *out, const float *dout,
                   float *delta) {
    for (int b = 0; b < d->B; b++)
        for (int qr = 0; qr < RUNS; qr++) {
            block k;
            block_at(cp, d, cp->me, b, qr, 0, &k); /* key run 0 of its own: always visible */
            fsc_flash_attention_delta(&k.d, out + k.qrow * d->ldo, dout + k.qrow * d->ldo,
                                      delta + k.stat);
        }
}

static int ring_backward(void *impl, const fsc_attn_dims *d, const float *q, const float *k,
                         const float *v, const float *out, const float *dout, const float *lse,
                         float *dq, float *dk, float *dv, fsc_gemm_prec prec) {
    fsc_cp *cp = impl;
    int rc = check_dims(cp, d);
    const int W = d->NKV * d->hd, P = cp->P, Wq = d->NH * d->hd;
    const int64_t rows = (int64_t)d->B * d->Tq, n = rows * 2 * W;
    const int64_t nd = (int64_t)d->B * d->NH * d->Tq;
    if (!rc) rc = ensure(cp, (size_t)(5 * n + nd));
    if (rc) return rc;
    float *kv[2] = {cp->buf, cp->buf + n}, *part[2] = {cp->buf + 2 * n, cp->buf + 3 * n};
    float *in = cp->buf + 4 * n, *delta = cp->buf + 5 * n;
    pack(kv[0], k, d->ldk, v, d->ldv, rows, W);
    deltas(cp, d, out, dout, delta);
    for (int64_t r = 0; r < rows; r++) memset(dq + r * d->ldq, 0, (size_t)Wq * sizeof(float));
    const int next = (cp->me + 1) % P, prev = (cp->me + P - 1) % P;
    const int64_t bytes = n * (int64_t)sizeof(float);
    fsc_request *dsend = NULL;
    for (int s = 0; s < P && !rc; s++) {
        fsc_request *reqs[3] = {NULL, NULL, NULL}; /* kv in, kv out, the partial dK/dV in */
        if (s < P - 1) {
            rc = fsc_group_irecv(cp->g, kv[(s + 1) & 1], n, FSC_DTYPE_F32, prev, TAG_KV, &reqs[0]);
            if (!rc)
                rc = fsc_group_isend(cp->g, kv[s & 1], n, FSC_DTYPE_F32, next, TAG_KV, &reqs[1]);
            cp->st.bytes += bytes;
        }
        if (!rc && s > 0)
            rc = fsc_group_irecv(cp->g, in, n, FSC_DTYPE_F32, prev, TAG_DKV, &reqs[2]);
        float *pd = part[s & 1];
        if (!rc) {
            memset(pd, 0, (size_t)n * sizeof(float));
            fsc_request *live[4] = {reqs[0], reqs[1], reqs[2], dsend};
            backward_blocks(cp, d, (cp->me - s + P) % P, q, kv[s & 1], dout, lse, delta, dq, pd,
                            prec, live, 4);
            reqs[0] = live[0], reqs[1] = live[1], reqs[2] = live[2], dsend = live[3];
        }
        rc = wait_all(cp, &reqs[2], 1, rc); /* the ranks before: their part of this block */
        if (!rc && s > 0) fsc_add_inplace(pd, in, n);
        rc = wait_all(cp, &dsend, 1, rc);
        if (!rc && P > 1) { /* on to the next rank; after step P-1, to the owner */
            rc = fsc_group_isend(cp->g, pd, n, FSC_DTYPE_F32, next, TAG_DKV, &dsend);
            cp->st.bytes += bytes;
        }
        rc = wait_all(cp, reqs, 2, rc);
    }
    const float *mine = part[0]; /* one rank: its own sum */
    if (P > 1) {
        fsc_request *r = NULL;
        if (!rc) rc = fsc_group_irecv(cp->g, in, n, FSC_DTYPE_F32, prev, TAG_DKV, &r);
        rc = wait_all(cp, &r, 1, rc);
        mine = in;
    }
    rc = wait_all(cp, &dsend, 1, rc);
    if (!rc) unpack(dk, d->ldk, dv, d->ldv, mine, rows, W);
    return rc;
}

fsc_cp *fsc_cp_new(fsc_group *g, int T) {
    const int P = fsc_group_size(g);
    if (!g || P < 1 || T < 1 || T % (2 * P)) {
        fsc_error(FSC_ERR_INVALID,
                  "context parallelism over %d ranks cuts each sequence into 2 x %d = %d chunks "
                  "(rank c holds chunks c and %d-c): the sequence length T = %d must be a "
                  "positive multiple of %d",
                  P, P, 2 * P, 2 * P - 1, T, 2 * P);
        return NULL;
    }
    fsc_cp *cp = calloc(1, sizeof *cp);
    if (!cp) {
        fsc_error(FSC_ERR_NOMEM, "fsc_cp_new: out of memory");
        return NULL;
    }
    cp->g = g, cp->P = P, cp->me = fsc_group_rank(g);
    const int L = T / (2 * P);
    cp->seq = (fsc_seq_split){
        .T = T,
        .runs = RUNS,
        .len = L,
        .pos0 = {(int64_t)chunk_of(cp, cp->me, 0) * L, (int64_t)chunk_of(cp, cp->me, 1) * L},
        .impl = cp,
        .attend = ring_forward,
        .attend_backward = ring_backward};
    return cp;
}

void fsc_cp_free(fsc_cp *cp) {
    if (!cp) return;
    fsc_mem_free(cp->buf);
    free(cp);
}

const fsc_seq_split *fsc_cp_seq(const fsc_cp *cp) {
    return cp ? &cp->seq : NULL;
}

void fsc_cp_take(const fsc_cp *cp, const int32_t *full, int B, int32_t *local) {
    const int L = cp->seq.len, T = cp->seq.T;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < RUNS; r++)
            memcpy(local + ((size_t)b * RUNS + r) * L, full + (size_t)b * T + cp->seq.pos0[r],
                   (size_t)L * sizeof *local);
}

fsc_cp_stats fsc_cp_get_stats(const fsc_cp *cp) {
    return cp ? cp->st : (fsc_cp_stats){0};
}

void fsc_cp_reset_stats(fsc_cp *cp) {
    if (cp) cp->st = (fsc_cp_stats){0};
}
