/* Shared by the flash attention kernel tests: causal grouped-query attention
 * in double precision (forward and its analytic backward, causality by
 * global position as fsc_attn_dims states it), a runner that puts one set
 * of operands through the flash kernels and the reference, and the
 * comparisons: against the reference at a stated bound, and against a
 * naive kernel's result within that kernel's own distance from the exact
 * answer (the noise floor: EQ_NOISE_K times it, plus EQ_FLOOR_ULPS ulps). */
#ifndef FSC_TEST_FLASH_REF_H
#define FSC_TEST_FLASH_REF_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/kernels.h"

#define FR_NOISE_K 8.0     /* as equivalence.h's EQ_NOISE_K */
#define FR_FLOOR_ULPS 64.0 /* as equivalence.h's EQ_FLOOR_ULPS */

static inline float *fr_random(size_t n, uint64_t seed) {
    float *x = malloc(n * sizeof(float));
    fsc_rng_normal_fill(x, (int64_t)n, 0, fsc_rng_key(seed, "flash"), 0.f, 1.f);
    return x;
}

/* Rows [start, start + n) of each of B batch rows of x (B, T, W). */
static inline float *fr_rows(const float *x, int B, int T, int W, int start, int n) {
    float *y = malloc((size_t)B * n * W * sizeof(float));
    for (int b = 0; b < B; b++)
        memcpy(y + (size_t)b * n * W, x + ((size_t)b * T + start) * W, (size_t)n * W * 4);
    return y;
}
static inline void fr_rows_add(float *x, const float *y, int B, int T, int W, int start, int n) {
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < (size_t)n * W; i++)
            x[((size_t)b * T + start) * W + i] += y[(size_t)b * n * W + i];
}

/* Element e of head h at position t of batch row b, in a layout of stride ld. */
static inline size_t fr_at(int b, int T, int t, int ld, int h, int hd, int e) {
    return ((size_t)b * T + t) * ld + (size_t)h * hd + e;
}

/* The exact attention of d's operands: out (layout of ldo), lse, and with
 * dout the gradients (dq in q's layout, dk, dv in k's and v's), each
 * double and zeroed here. */
static inline void fr_reference(const fsc_attn_dims *d, const float *q, const float *k,
                                const float *v, const float *dout, double *out, double *lse,
                                double *dq, double *dk, double *dv) {
    const int hd = d->hd, group = d->NH / d->NKV;
    const double scale = 1 / sqrt((double)hd);
    memset(out, 0, (size_t)d->B * d->Tq * d->ldo * sizeof(double));
    if (dout) {
        memset(dq, 0, (size_t)d->B * d->Tq * d->ldq * sizeof(double));
        memset(dk, 0, (size_t)d->B * d->Tk * d->ldk * sizeof(double));
        memset(dv, 0, (size_t)d->B * d->Tk * d->ldv * sizeof(double));
    }
    double *p = malloc(((size_t)d->Tk + 1) * sizeof(double));
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < d->NH; h++)
            for (int i = 0; i < d->Tq; i++) {
                const int j = h / group;
                int64_t n = d->q_pos0 + i - d->k_pos0 + 1;
                n = n < 0 ? 0 : n > d->Tk ? d->Tk : n;
                double m = -INFINITY, s = 0;
                for (int u = 0; u < n; u++) {
                    double x = 0;
                    for (int e = 0; e < hd; e++)
                        x += (double)q[fr_at(b, d->Tq, i, d->ldq, h, hd, e)] *
                             k[fr_at(b, d->Tk, u, d->ldk, j, hd, e)];
                    p[u] = x * scale;
                    m = p[u] > m ? p[u] : m;
                }
                for (int u = 0; u < n; u++) s += (p[u] = exp(p[u] - m));
                lse[((size_t)b * d->NH + h) * d->Tq + i] = n ? m + log(s) : -INFINITY;
                for (int u = 0; u < n; u++) p[u] /= s;
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int u = 0; u < n; u++) o += p[u] * v[fr_at(b, d->Tk, u, d->ldv, j, hd, e)];
                    out[fr_at(b, d->Tq, i, d->ldo, h, hd, e)] = o;
                }
                if (!dout) continue;
                const float *g = dout + fr_at(b, d->Tq, i, d->ldo, h, hd, 0);
                double delta = 0;
                for (int e = 0; e < hd; e++)
                    delta += g[e] * out[fr_at(b, d->Tq, i, d->ldo, h, hd, e)];
                for (int u = 0; u < n; u++) {
                    double dp = 0;
                    for (int e = 0; e < hd; e++)
                        dp += g[e] * (double)v[fr_at(b, d->Tk, u, d->ldv, j, hd, e)];
                    const double ds = p[u] * (dp - delta) * scale;
                    for (int e = 0; e < hd; e++) {
                        dq[fr_at(b, d->Tq, i, d->ldq, h, hd, e)] +=
                            ds * k[fr_at(b, d->Tk, u, d->ldk, j, hd, e)];
                        dk[fr_at(b, d->Tk, u, d->ldk, j, hd, e)] +=
                            ds * q[fr_at(b, d->Tq, i, d->ldq, h, hd, e)];
                        dv[fr_at(b, d->Tk, u, d->ldv, j, hd, e)] += p[u] * g[e];
                    }
                }
            }
    free(p);
}

/* Largest |analytic - central difference| of the reference's gradients of
 * sum(w * out) over every element of q, k and v (separate arrays of d's
 * strides), in double with a step of 1e-3 on the float operands. */
static inline double fr_reference_gradcheck(const fsc_attn_dims *d) {
    const size_t nq = (size_t)d->B * d->Tq * d->ldq, nk = (size_t)d->B * d->Tk * d->ldk;
    const size_t nv = (size_t)d->B * d->Tk * d->ldv, no = (size_t)d->B * d->Tq * d->ldo;
    float *x[3] = {fr_random(nq, 21), fr_random(nk, 22), fr_random(nv, 23)};
    float *w = fr_random(no, 24);
    const size_t nx[3] = {nq, nk, nv};
    double *out = malloc(no * 8), *lse = malloc((size_t)d->B * d->NH * d->Tq * 8);
    double *g[3] = {malloc(nq * 8), malloc(nk * 8), malloc(nv * 8)};
    fr_reference(d, x[0], x[1], x[2], w, out, lse, g[0], g[1], g[2]);
    double worst = 0;
    for (int a = 0; a < 3; a++)
        for (size_t i = 0; i < nx[a]; i++) {
            const float keep = x[a][i];
            double f[2];
            for (int s = 0; s < 2; s++) {
                x[a][i] = keep + (s ? 1e-3f : -1e-3f);
                fr_reference(d, x[0], x[1], x[2], NULL, out, lse, NULL, NULL, NULL);
                f[s] = 0;
                for (size_t o = 0; o < no; o++) f[s] += w[o] * out[o];
            }
            x[a][i] = keep;
            const double h = (double)(keep + 1e-3f) - (double)(keep - 1e-3f);
            const double fd = (f[1] - f[0]) / h, diff = fabs(fd - g[a][i]) / (1 + fabs(g[a][i]));
            worst = diff > worst ? diff : worst;
        }
    for (int a = 0; a < 3; a++) free(x[a]), free(g[a]);
    free(w), free(out), free(lse);
    return worst;
}

/* One set of operands through the flash kernels (out, lse, delta, and the
 * gradients added into zeroes) and through the reference. */
typedef struct fr_case {
    fsc_attn_dims d;
    fsc_gemm_prec prec;
    float *out, *lse, *delta, *dq, *dk, *dv;
    double *r_out, *r_lse, *r_dq, *r_dk, *r_dv;
} fr_case;

static inline fr_case fr_case_run(const fsc_attn_dims *d, const float *q, const float *k,
                                  const float *v, const float *dout, fsc_gemm_prec prec) {
    fr_case c = {.d = *d, .prec = prec};
    const size_t no = (size_t)d->B * d->Tq * d->ldo, nl = (size_t)d->B * d->NH * d->Tq;
    const size_t nq = (size_t)d->B * d->Tq * d->ldq, nk = (size_t)d->B * d->Tk * d->ldk;
    const size_t nv = (size_t)d->B * d->Tk * d->ldv;
    c.out = calloc(no, 4), c.lse = malloc(nl * 4), c.delta = malloc(nl * 4);
    c.dq = calloc(nq, 4), c.dk = calloc(nk, 4), c.dv = calloc(nv, 4);
    fsc_flash_attention_forward(d, q, k, v, c.out, c.lse, false, prec);
    fsc_flash_attention_delta(d, c.out, dout, c.delta);
    fsc_flash_attention_backward(d, q, k, v, dout, c.lse, c.delta, c.dq, c.dk, c.dv, prec);
    c.r_out = malloc(no * 8), c.r_lse = malloc(nl * 8);
    c.r_dq = malloc(nq * 8), c.r_dk = malloc(nk * 8), c.r_dv = malloc(nv * 8);
    fr_reference(d, q, k, v, dout, c.r_out, c.r_lse, c.r_dq, c.r_dk, c.r_dv);
    return c;
}

static inline void fr_case_free(fr_case *c) {
    free(c->out), free(c->lse), free(c->delta), free(c->dq), free(c->dk), free(c->dv);
    free(c->r_out), free(c->r_lse), free(c->r_dq), free(c->r_dk), free(c->r_dv);
}

/* Largest |x - ref| and |ref| over the heads' columns of a (B, T, ld) tensor. */
static inline void fr_err(const float *x, int xld, const double *ref, int ld, int B, int T, int W,
                          double *err, double *mag) {
    *err = 0, *mag = 0;
    for (size_t bt = 0; bt < (size_t)B * T; bt++)
        for (int e = 0; e < W; e++) {
            const double r = ref[bt * ld + e], diff = fabs(x[bt * xld + e] - r);
            *err = diff > *err ? diff : *err;
            *mag = fabs(r) > *mag ? fabs(r) : *mag;
        }
}

/* Each of out, dq, dk, dv within rtol (relative to the tensor's largest
 * element) of the reference; lse within rtol of it where finite, -inf where
 * the reference's is. fp32: 1e-4; bf16 GEMM inputs: 3e-2. */
static inline void fr_check_against_reference(const fr_case *c) {
    const fsc_attn_dims *d = &c->d;
    const double rtol = c->prec == FSC_GEMM_F32 ? 1e-4 : 3e-2;
    struct {
        const char *name;
        const float *x;
        const double *r;
        int ld, T, W;
    } t[4] = {{"out", c->out, c->r_out, d->ldo, d->Tq, d->NH * d->hd},
              {"dq", c->dq, c->r_dq, d->ldq, d->Tq, d->NH * d->hd},
              {"dk", c->dk, c->r_dk, d->ldk, d->Tk, d->NKV * d->hd},
              {"dv", c->dv, c->r_dv, d->ldv, d->Tk, d->NKV * d->hd}};
    for (int i = 0; i < 4; i++) {
        double err, mag;
        fr_err(t[i].x, t[i].ld, t[i].r, t[i].ld, d->B, t[i].T, t[i].W, &err, &mag);
        if (err > rtol * mag + 1e-30) {
            fprintf(stderr, "flash %s off the reference by %.3g (largest |value| %.3g)\n",
                    t[i].name, err, mag);
            fail();
        }
    }
    for (size_t i = 0; i < (size_t)d->B * d->NH * d->Tq; i++) {
        if (c->r_lse[i] == -INFINITY) {
            assert_true(c->lse[i] == -INFINITY);
            continue;
        }
        if (fabs(c->lse[i] - c->r_lse[i]) > rtol * (1 + fabs(c->r_lse[i]))) {
            fprintf(stderr, "flash lse[%zu] = %.8g, reference %.8g\n", i, c->lse[i], c->r_lse[i]);
            fail();
        }
    }
}

/* flash's error from the reference at most FR_NOISE_K times the naive
 * kernel's (given in its own layout: dq with qld, dk with kld, dv with vld;
 * out compact (B,Tq,NH*hd)), plus FR_FLOOR_ULPS ulps of the tensor's
 * largest element; and within fr_check_against_reference's bound. */
static inline void fr_check_against_naive(const fr_case *c, const float *out, const float *dq,
                                          const float *dk, const float *dv, int qld, int kld,
                                          int vld) {
    const fsc_attn_dims *d = &c->d;
    fr_check_against_reference(c);
    struct {
        const char *name;
        const float *x, *n;
        const double *r;
        int ld, nld, T, W;
    } t[4] = {{"out", c->out, out, c->r_out, d->ldo, d->NH * d->hd, d->Tq, d->NH * d->hd},
              {"dq", c->dq, dq, c->r_dq, d->ldq, qld, d->Tq, d->NH * d->hd},
              {"dk", c->dk, dk, c->r_dk, d->ldk, kld, d->Tk, d->NKV * d->hd},
              {"dv", c->dv, dv, c->r_dv, d->ldv, vld, d->Tk, d->NKV * d->hd}};
    for (int i = 0; i < 4; i++) {
        double ef, en, mag;
        fr_err(t[i].x, t[i].ld, t[i].r, t[i].ld, d->B, t[i].T, t[i].W, &ef, &mag);
        fr_err(t[i].n, t[i].nld, t[i].r, t[i].ld, d->B, t[i].T, t[i].W, &en, &mag);
        const double bound = FR_NOISE_K * en + FR_FLOOR_ULPS * mag * 5.96e-8;
        printf("  %-3s flash err %.3g, naive err %.3g (bound %.3g)\n", t[i].name, ef, en, bound);
        if (ef > bound) {
            fprintf(stderr, "flash %s: error %.3g beyond the naive kernel's noise (%.3g)\n",
                    t[i].name, ef, bound);
            fail();
        }
    }
}

static inline void fr_assert_close(const char *name, const float *x, const float *y, size_t n,
                                   double rtol) {
    double err = 0, mag = 0;
    for (size_t i = 0; i < n; i++) {
        if (x[i] == y[i]) continue; /* -inf lse included */
        const double diff = fabs((double)x[i] - y[i]);
        err = diff > err ? diff : err;
    }
    for (size_t i = 0; i < n; i++)
        if (isfinite(y[i])) mag = fabs(y[i]) > mag ? fabs(y[i]) : mag;
    if (!(err <= rtol * mag)) {
        fprintf(stderr, "%s: off by %.3g (largest |value| %.3g, rtol %.1g)\n", name, err, mag,
                rtol);
        fail();
    }
}

/* Under FSC_GEMM_BF16 the tiles must have rounded their inputs to bf16
 * (oneDNN or the avx512_bf16 tiles), not fallen back to fp32: flash's out
 * is then off the double-precision reference by far more than fp32 sums
 * could put it (bf16 keeps 8 bits: relative errors near 2^-9, fp32's near
 * 2^-24 times a few hundred terms). */
static inline void fr_assert_rounded_bf16(const fr_case *c) {
    double err, mag;
    fr_err(c->out, c->d.ldo, c->r_out, c->d.ldo, c->d.B, c->d.Tq, c->d.NH * c->d.hd, &err, &mag);
    if (!(err > 1e-4 * mag)) {
        fprintf(stderr,
                "flash out off the reference by only %.3g (largest |value| %.3g): "
                "the bf16 tiles did not round to bf16\n",
                err, mag);
        fail();
    }
}

/* GPT-2's layout (q, k, v as column blocks of one (B,T,3C) array, T = 150,
 * not a multiple of the tiles): flash at precision prec against the
 * reference and the naive kernel at the same precision. Under
 * FSC_GEMM_BF16 the flash tiles must have rounded to bf16. Operands from
 * seeds seed and seed + 1. */
static inline void fr_gpt2_fused_case(fsc_gemm_prec prec, uint64_t seed) {
    enum { B = 2, T = 150, NH = 4, HD = 16, C = NH * HD };
    float *qkv = fr_random((size_t)B * T * 3 * C, seed);
    float *dout = fr_random((size_t)B * T * C, seed + 1);
    fsc_attn_dims d = {.B = B,
                       .NH = NH,
                       .NKV = NH,
                       .hd = HD,
                       .Tq = T,
                       .Tk = T,
                       .ldq = 3 * C,
                       .ldk = 3 * C,
                       .ldv = 3 * C,
                       .ldo = C};
    fsc_bf16_gemm_reset_stats();
    fr_case c = fr_case_run(&d, qkv, qkv + C, qkv + 2 * C, dout, prec);
    if (prec == FSC_GEMM_BF16) fr_assert_rounded_bf16(&c);
    float *out = malloc((size_t)B * T * C * 4), *att = calloc((size_t)B * NH * T * T, 4);
    float *dqkv = malloc((size_t)B * T * 3 * C * 4);
    fsc_attention_forward_prec(out, att, qkv, B, T, C, NH, prec);
    fsc_attention_backward_prec(dqkv, dout, qkv, att, B, T, C, NH, prec);
    fr_check_against_naive(&c, out, dqkv, dqkv + C, dqkv + 2 * C, 3 * C, 3 * C, 3 * C);
    fr_case_free(&c);
    free(qkv), free(dout), free(out), free(att), free(dqkv);
}

/* Causal self-attention over T positions with q, k and v as separate
 * (B, T, heads * hd) tensors: NH query heads on NKV key/value heads. */
static inline fsc_attn_dims fr_self_dims(int B, int T, int NH, int NKV, int HD) {
    return (fsc_attn_dims){.B = B,
                           .NH = NH,
                           .NKV = NKV,
                           .hd = HD,
                           .Tq = T,
                           .Tk = T,
                           .ldq = NH * HD,
                           .ldk = NKV * HD,
                           .ldv = NKV * HD,
                           .ldo = NH * HD};
}

/* LLaMA's layout: separate q (B,T,NH*hd), k and v (B,T,NKV*hd), two query
 * heads per KV head, T = 200; as fr_gpt2_fused_case, operands from seeds
 * seed .. seed + 3. */
static inline void fr_llama_gqa_case(fsc_gemm_prec prec, uint64_t seed) {
    enum { B = 1, T = 200, NH = 4, NKV = 2, HD = 16, CQ = NH * HD, CK = NKV * HD };
    float *q = fr_random((size_t)B * T * CQ, seed), *k = fr_random((size_t)B * T * CK, seed + 1);
    float *v = fr_random((size_t)B * T * CK, seed + 2);
    float *dout = fr_random((size_t)B * T * CQ, seed + 3);
    fsc_attn_dims d = fr_self_dims(B, T, NH, NKV, HD);
    fr_case c = fr_case_run(&d, q, k, v, dout, prec);
    float *out = malloc((size_t)B * T * CQ * 4), *att = calloc((size_t)B * NH * T * T, 4);
    float *dq = malloc((size_t)B * T * CQ * 4), *dk = malloc((size_t)B * T * CK * 4);
    float *dv = malloc((size_t)B * T * CK * 4);
    fsc_attention_gqa_forward_prec(out, att, q, k, v, B, T, NH, NKV, HD, prec);
    fsc_attention_gqa_backward_prec(dq, dk, dv, dout, q, k, v, att, B, T, NH, NKV, HD, prec);
    fr_check_against_naive(&c, out, dq, dk, dv, CQ, CK, CK);
    fr_case_free(&c);
    free(q), free(k), free(v), free(dout), free(out), free(att), free(dq), free(dk), free(dv);
}

/* The backward's fused loop (one thread) and its two passes (more threads
 * than (batch, KV head) pairs) give the same bits, as does the forward; T
 * odd, so under bf16 the last query and key rows pair with zero. Both runs
 * are also checked against the reference (and, in bf16, for rounding). */
static inline void fr_thread_count_case(fsc_gemm_prec prec, uint64_t seed) {
    enum { B = 1, T = 333, NH = 4, NKV = 1, HD = 32, CQ = NH * HD, CK = NKV * HD };
    float *q = fr_random(B * T * CQ, seed), *k = fr_random(B * T * CK, seed + 1);
    float *v = fr_random(B * T * CK, seed + 2), *dout = fr_random(B * T * CQ, seed + 3);
    fsc_attn_dims d = fr_self_dims(B, T, NH, NKV, HD);
    const int saved = fsc_get_num_threads();
    fsc_set_num_threads(1);
    fr_case one = fr_case_run(&d, q, k, v, dout, prec);
    fsc_set_num_threads(3);
    fr_case three = fr_case_run(&d, q, k, v, dout, prec);
    fsc_set_num_threads(saved);
    assert_memory_equal(one.out, three.out, (size_t)B * T * CQ * 4);
    assert_memory_equal(one.dq, three.dq, (size_t)B * T * CQ * 4);
    assert_memory_equal(one.dk, three.dk, (size_t)B * T * CK * 4);
    assert_memory_equal(one.dv, three.dv, (size_t)B * T * CK * 4);
    fr_check_against_reference(&one);
    if (prec == FSC_GEMM_BF16) fr_assert_rounded_bf16(&one);
    fr_case_free(&one), fr_case_free(&three);
    free(q), free(k), free(v), free(dout);
}

#endif
