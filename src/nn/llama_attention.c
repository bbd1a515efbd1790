/* LLaMA's causal self-attention: q_proj, k_proj, v_proj (nn.Linear layout,
 * biases only where asked: Qwen 2), rotary embeddings on q and k, grouped-
 * query attention (n_kv_heads key/value heads shared by n_heads query heads,
 * fsc_attention_gqa_forward_prec) and o_proj. No dropout: LLaMA trains
 * without it. Saves the rotated q and k, v, the probabilities, the rotary
 * tables and the projections' records. Under fsc_ctx.kv (generation) the
 * new rows are rotated at their positions (the cache's length on), their
 * keys and values appended to a cache that holds the KV heads only, and
 * the rows attend over it. */
#include <string.h>

#include "attention_seq.h"
#include "layers_internal.h"
#include "llama_internal.h"

typedef struct {
    fsc_module base;
    int C, NH, NKV, hd;
    fsc_module *q_proj, *k_proj, *v_proj, *o_proj;
    float inv_freq[]; /* (hd/2) */
} llama_attention;

typedef struct {
    void *q_rec, *k_rec, *v_rec, *o_rec;
    fsc_tensor x;       /* the input's shape */
    fsc_tensor q, k, v; /* q and k rotated */
    float *att;         /* (B, NH, T, T) */
    float *cos_t, *sin_t;
    fsc_tensor h; /* under fsc_ctx.seq: the attention output, and */
    float *lse;   /* the ring's log-sum-exps instead of att */
} lattn_saved;

/* The ring's operands: q (B,T,NH*hd), k and v (B,T,NKV*hd), out like q. */
static fsc_attn_dims seq_dims(const llama_attention *a, const lattn_saved *s) {
    const int T = (int)s->q.shape[1];
    return (fsc_attn_dims){.B = (int)s->q.shape[0],
                           .NH = a->NH,
                           .NKV = a->NKV,
                           .hd = a->hd,
                           .Tq = T,
                           .Tk = T,
                           .ldq = a->NH * a->hd,
                           .ldk = a->NKV * a->hd,
                           .ldv = a->NKV * a->hd,
                           .ldo = a->NH * a->hd};
}

/* Attention over every rank's keys under context parallelism: the ring
 * (fsc_ctx.seq) writes h and the log-sum-exps; no probabilities kept. */
static int seq_attend(const llama_attention *a, const fsc_ctx *ctx, lattn_saved *s, fsc_tensor *h) {
    const fsc_attn_dims d = seq_dims(a, s);
    s->lse = fsc_arena_alloc(ctx->arena, (size_t)d.B * d.NH * d.Tq * sizeof(float));
    if (!s->lse) return FSC_ERR_NOMEM;
    s->h = *h;
    return ctx->seq->attend(ctx->seq->impl, &d, s->q.data, s->k.data, s->v.data, h->data, s->lse,
                            fsc_ctx_prec(ctx));
}

/* Flash attention on this rank's whole sequence: h and the log-sum-exps
 * kept (s->h, s->lse), no probabilities. */
static int flash_attend(const llama_attention *a, const fsc_ctx *ctx, lattn_saved *s,
                        fsc_tensor *h) {
    const fsc_attn_dims d = seq_dims(a, s);
    s->lse = fsc_arena_alloc(ctx->arena, (size_t)d.B * d.NH * d.Tq * sizeof(float));
    if (!s->lse) return FSC_ERR_NOMEM;
    s->h = *h;
    fsc_flash_attention_forward(&d, s->q.data, s->k.data, s->v.data, h->data, s->lse, false,
                                fsc_ctx_prec(ctx));
    return FSC_OK;
}

/* Its backward: dq, dk, dv (zeroed here) get the gradients. */
static int flash_backward(const llama_attention *a, const fsc_ctx *ctx, const lattn_saved *s,
                          const float *dh, float *dq, float *dk, float *dv) {
    const fsc_attn_dims d = seq_dims(a, s);
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    float *delta = fsc_arena_alloc(ctx->arena, (size_t)d.B * d.NH * d.Tq * sizeof(float));
    if (!delta) return FSC_ERR_NOMEM;
    memset(dq, 0, fsc_tensor_numel(&s->q) * sizeof(float));
    memset(dk, 0, fsc_tensor_numel(&s->k) * sizeof(float));
    memset(dv, 0, fsc_tensor_numel(&s->v) * sizeof(float));
    fsc_flash_attention_delta(&d, s->h.data, dh, delta);
    fsc_flash_attention_backward(&d, s->q.data, s->k.data, s->v.data, dh, s->lse, delta, dq, dk,
                                 dv, fsc_ctx_prec(ctx));
    fsc_arena_release(ctx->arena, mark);
    return FSC_OK;
}

/* The forward under fsc_ctx.kv: x (1, n, C) at positions p0 .. p0+n-1,
 * p0 the cache's length; this layer's slot holds (T, NKV*hd) keys and
 * values. Nothing is saved. */
static int lattn_cached(llama_attention *a, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    fsc_kv_cache *kv = ctx->kv;
    const int n = (int)x->shape[1], p0 = kv->len, ck = a->NKV * a->hd, cq = a->NH * a->hd;
    if (x->shape[0] != 1 || kv->C != ck || kv->next >= kv->slots || n > kv->T - p0)
        return fsc_error(FSC_ERR_INVALID,
                         "KV cache: LlamaAttention %s is layer %d of %d, %d key/value channels, "
                         "%d + %d positions of %d (a cache of %d channels, batch 1?)",
                         a->base.name, kv->next, kv->slots, ck, p0, n, kv->T, kv->C);
    const size_t slot = (size_t)kv->next++ * kv->T * ck;
    float *k = kv->k + slot, *v = kv->v + slot;
    fsc_tensor q, kn, vn, h;
    float *cos_t, *sin_t;
    void *rec;
    int rc = fsc_module_forward(a->q_proj, ctx, x, &q, &rec);
    if (!rc) rc = fsc_module_forward(a->k_proj, ctx, x, &kn, &rec);
    if (!rc) rc = fsc_module_forward(a->v_proj, ctx, x, &vn, &rec);
    if (!rc) rc = fsc_rope_tables_alloc(ctx->arena, a->inv_freq, n, a->hd, p0, &cos_t, &sin_t);
    if (!rc) rc = fsc_alloc_like(ctx->arena, &q, cq, &h);
    const int keys = p0 + n;
    float *scores = rc ? NULL : fsc_arena_alloc(ctx->arena, (size_t)n * keys * sizeof(float));
    if (!rc && !scores) rc = FSC_ERR_NOMEM;
    if (rc) return rc;
    fsc_rope_forward(q.data, q.data, cos_t, sin_t, 1, n, a->NH, a->hd);
    fsc_rope_forward(k + (size_t)p0 * ck, kn.data, cos_t, sin_t, 1, n, a->NKV, a->hd);
    memcpy(v + (size_t)p0 * ck, vn.data, (size_t)n * ck * sizeof(float));
    if (fsc_attention_uses_flash(ctx->attention, kv->T)) {
        /* the new rows as queries at positions p0.., the cache as keys */
        const fsc_attn_dims d = {.B = 1, .NH = a->NH, .NKV = a->NKV, .hd = a->hd, .Tq = n,
                                 .Tk = keys, .q_pos0 = p0, .ldq = cq, .ldk = ck, .ldv = ck,
                                 .ldo = cq};
        float *lse = fsc_arena_alloc(ctx->arena, (size_t)a->NH * n * sizeof(float));
        if (!lse) return FSC_ERR_NOMEM;
        fsc_flash_attention_forward(&d, q.data, k, v, h.data, lse, false, fsc_ctx_prec(ctx));
        *saved = NULL;
        return fsc_module_forward(a->o_proj, ctx, &h, y, &rec);
    }
    const int group = a->NH / a->NKV;
    const float scale = 1.0f / sqrtf((float)a->hd);
    for (int hh = 0; hh < a->NH; hh++) {
        const float *qh = (const float *)q.data + (size_t)hh * a->hd;
        const size_t o = (size_t)(hh / group) * a->hd;
        /* the training forward's GEMMs and softmax on the rows at hand */
        fsc_gemm(fsc_ctx_prec(ctx), false, true, n, keys, a->hd, scale, qh, cq, k + o, ck, 0.f,
                 scores, keys);
        for (int i = 0; i < n; i++) fsc_softmax_causal_row(scores + (size_t)i * keys, p0 + i, keys);
        fsc_gemm(fsc_ctx_prec(ctx), false, false, n, a->hd, keys, 1.f, scores, keys, v + o, ck, 0.f,
                 (float *)h.data + (size_t)hh * a->hd, cq);
    }
    *saved = NULL;
    return fsc_module_forward(a->o_proj, ctx, &h, y, &rec);
}

static int lattn_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                         void **saved) {
    llama_attention *a = (llama_attention *)m;
    if (x->ndim != 3 || x->dtype != FSC_DTYPE_F32 || x->shape[2] != a->C)
        return fsc_error(FSC_ERR_SHAPE, "LlamaAttention %s: expected f32 (B,T,%d) input", m->name,
                         a->C);
    if (ctx->kv) return lattn_cached(a, ctx, x, y, saved);
    lattn_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    s->x = *x;
    int rc = fsc_module_forward(a->q_proj, ctx, x, &s->q, &s->q_rec);
    if (!rc) rc = fsc_module_forward(a->k_proj, ctx, x, &s->k, &s->k_rec);
    if (!rc) rc = fsc_module_forward(a->v_proj, ctx, x, &s->v, &s->v_rec);
    if (rc) return rc;
    /* the whole sequence: x may be a sequence shard the projections gathered */
    const int B = (int)s->q.shape[0], T = (int)s->q.shape[1];
    if (ctx->seq && T != ctx->seq->runs * ctx->seq->len)
        return fsc_error(FSC_ERR_SHAPE,
                         "LlamaAttention %s: %d rows per sequence under context parallelism, "
                         "expected %d runs of %d",
                         m->name, T, ctx->seq->runs, ctx->seq->len);
    rc = ctx->seq ? nn_rope_tables_seq(ctx->arena, a->inv_freq, ctx->seq, a->hd, &s->cos_t,
                                       &s->sin_t)
                  : fsc_rope_tables_alloc(ctx->arena, a->inv_freq, T, a->hd, 0, &s->cos_t,
                                          &s->sin_t);
    if (rc) return rc;
    /* the projections' outputs are this layer's to keep: rotate in place */
    fsc_rope_forward(s->q.data, s->q.data, s->cos_t, s->sin_t, B, T, a->NH, a->hd);
    fsc_rope_forward(s->k.data, s->k.data, s->cos_t, s->sin_t, B, T, a->NKV, a->hd);
    fsc_tensor h;
    if (ctx->seq) {
        s->att = NULL;
        rc = fsc_alloc_like(ctx->arena, &s->q, s->q.shape[2], &h);
        if (!rc) rc = seq_attend(a, ctx, s, &h);
        if (!rc) rc = fsc_module_forward(a->o_proj, ctx, &h, y, &s->o_rec);
        *saved = s;
        return rc;
    }
    s->lse = NULL;
    if (fsc_attention_uses_flash(ctx->attention, T)) {
        s->att = NULL;
        rc = fsc_alloc_like(ctx->arena, &s->q, s->q.shape[2], &h);
        if (!rc) rc = flash_attend(a, ctx, s, &h);
        if (!rc) rc = fsc_module_forward(a->o_proj, ctx, &h, y, &s->o_rec);
        *saved = s;
        return rc;
    }
    s->att = fsc_arena_alloc(ctx->arena, (size_t)B * a->NH * T * T * sizeof(float));
    rc = s->att ? fsc_alloc_like(ctx->arena, &s->q, s->q.shape[2], &h)
                : nn_attention_refused(B, T, a->NH);
    if (rc) return rc;
    fsc_attention_gqa_forward_prec(h.data, s->att, s->q.data, s->k.data, s->v.data, B, T, a->NH,
                                   a->NKV, a->hd, fsc_ctx_prec(ctx));
    rc = fsc_module_forward(a->o_proj, ctx, &h, y, &s->o_rec);
    *saved = s;
    return rc;
}

static int lattn_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                          fsc_tensor *dx) {
    llama_attention *a = (llama_attention *)m;
    const lattn_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, &s->x, a->C);
    if (rc) return rc;
    const int B = (int)s->q.shape[0], T = (int)s->q.shape[1];
    fsc_tensor dh, dq, dk, dv, dxk, dxv;
    rc = fsc_module_backward(a->o_proj, ctx, s->o_rec, dy, &dh);
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->q, s->q.shape[2], &dq);
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->k, s->k.shape[2], &dk);
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->v, s->v.shape[2], &dv);
    if (rc) return rc;
    if (ctx->seq) {
        const fsc_attn_dims d = seq_dims(a, s);
        rc = ctx->seq->attend_backward(ctx->seq->impl, &d, s->q.data, s->k.data, s->v.data,
                                       s->h.data, dh.data, s->lse, dq.data, dk.data, dv.data,
                                       fsc_ctx_prec(ctx));
        if (rc) return rc;
    } else if (s->lse) {
        rc = flash_backward(a, ctx, s, dh.data, dq.data, dk.data, dv.data);
        if (rc) return rc;
    } else {
        fsc_attention_gqa_backward_prec(dq.data, dk.data, dv.data, dh.data, s->q.data, s->k.data,
                                        s->v.data, s->att, B, T, a->NH, a->NKV, a->hd,
                                        fsc_ctx_prec(ctx));
    }
    fsc_rope_backward(dq.data, dq.data, s->cos_t, s->sin_t, B, T, a->NH, a->hd);
    fsc_rope_backward(dk.data, dk.data, s->cos_t, s->sin_t, B, T, a->NKV, a->hd);
    rc = fsc_module_backward(a->q_proj, ctx, s->q_rec, &dq, dx);
    if (!rc) rc = fsc_module_backward(a->k_proj, ctx, s->k_rec, &dk, dx ? &dxk : NULL);
    if (!rc) rc = fsc_module_backward(a->v_proj, ctx, s->v_rec, &dv, dx ? &dxv : NULL);
    if (!rc && dx) {
        fsc_add_inplace(dx->data, dxk.data, fsc_tensor_numel(dx));
        fsc_add_inplace(dx->data, dxv.data, fsc_tensor_numel(dx));
    }
    return rc;
}

static const fsc_module_ops lattn_ops = {"LlamaAttention", lattn_forward, lattn_backward, NULL};

/* Checks the sizes and makes the module without its projections. */
static llama_attention *lattn_alloc(const char *name, const fsc_llama_attention_config *cfg) {
    if (!cfg) {
        fsc_error(FSC_ERR_INVALID, "LlamaAttention %s: NULL configuration", name);
        return NULL;
    }
    int C = cfg->d_model, NH = cfg->n_heads, NKV = cfg->n_kv_heads ? cfg->n_kv_heads : NH;
    if (C <= 0 || NH <= 0 || NKV <= 0 || NH % NKV) {
        fsc_error(FSC_ERR_INVALID,
                  "LlamaAttention %s: d_model %d, %d heads, %d key/value heads: all positive, "
                  "and the key/value heads must divide the heads",
                  name, C, NH, NKV);
        return NULL;
    }
    if (!cfg->head_dim && C % NH) {
        fsc_error(FSC_ERR_INVALID,
                  "LlamaAttention %s: %d heads must divide d_model %d (or give head_dim)", name, NH,
                  C);
        return NULL;
    }
    int hd = cfg->head_dim ? cfg->head_dim : C / NH;
    float theta = cfg->rope_theta > 0.f ? cfg->rope_theta : 10000.f;
    if (fsc_rope_check_config("LlamaAttention", name, hd, theta, &cfg->rope_scaling)) return NULL;
    llama_attention *a =
        fsc_module_alloc(sizeof *a + (size_t)(hd / 2) * sizeof(float), &lattn_ops, name);
    if (!a) return NULL;
    a->C = C, a->NH = NH, a->NKV = NKV, a->hd = hd;
    fsc_rope_inv_freq(a->inv_freq, hd, theta, &cfg->rope_scaling);
    return a;
}

/* Adopts the four projections (all freed on failure, with a). */
static fsc_module *lattn_adopt(llama_attention *a, fsc_module *const kids[4]) {
    a->q_proj = kids[0], a->k_proj = kids[1], a->v_proj = kids[2], a->o_proj = kids[3];
    for (int i = 0; i < 4; i++)
        if (!kids[i] || fsc_module_add_child(&a->base, kids[i])) {
            for (int j = i; j < 4; j++) fsc_module_free(kids[j]); /* not adopted */
            fsc_module_free(&a->base);
            return NULL;
        }
    return &a->base;
}

fsc_module *fsc_llama_attention_new(const char *name, const fsc_llama_attention_config *cfg) {
    llama_attention *a = lattn_alloc(name, cfg);
    if (!a) return NULL;
    const int C = a->C, hd = a->hd;
    const bool bias = cfg->qkv_bias;
    fsc_module *kids[4] = {
        fsc_linear_new("q_proj", C, a->NH * hd, bias, FSC_WEIGHT_OUT_IN, cfg->init_std),
        fsc_linear_new("k_proj", C, a->NKV * hd, bias, FSC_WEIGHT_OUT_IN, cfg->init_std),
        fsc_linear_new("v_proj", C, a->NKV * hd, bias, FSC_WEIGHT_OUT_IN, cfg->init_std),
        fsc_linear_new("o_proj", a->NH * hd, C, false, FSC_WEIGHT_OUT_IN, cfg->proj_std),
    };
    return lattn_adopt(a, kids);
}

fsc_module *llama_attention_split_new(const char *name, const fsc_llama_attention_config *cfg,
                                      int t, const llama_proj_maker *mk) {
    llama_attention *a = lattn_alloc(name, cfg);
    if (!a) return NULL;
    if (t < 1 || a->NH % t || a->NKV % t) {
        fsc_error(FSC_ERR_INVALID,
                  "LlamaAttention %s: %d heads and %d key/value heads must both be divisible by "
                  "the tensor-parallel size %d (key/value heads are split, not replicated)",
                  name, a->NH, a->NKV, t);
        fsc_module_free(&a->base);
        return NULL;
    }
    const int C = a->C, hd = a->hd;
    const bool bias = cfg->qkv_bias;
    fsc_module *kids[4] = {
        mk->column(mk->user, "q_proj", C, a->NH * hd, bias, cfg->init_std),
        mk->column(mk->user, "k_proj", C, a->NKV * hd, bias, cfg->init_std),
        mk->column(mk->user, "v_proj", C, a->NKV * hd, bias, cfg->init_std),
        mk->row(mk->user, "o_proj", a->NH * hd, C, cfg->proj_std),
    };
    a->NH /= t, a->NKV /= t; /* this rank's heads: a query head keeps its key/value head */
    return lattn_adopt(a, kids);
}
