/* Causal self-attention, GPT-2 layout: c_attn (C -> 3C, fused q|k|v), the
 * attention kernel, c_proj (C -> C), residual dropout. Saves qkv and the
 * softmax probabilities (B,NH,T,T) for backward (both in bf16 under bf16
 * autocast where the batched bf16 kernel runs), or under flash attention
 * (attention_kernel.c) per-row log-sum-exps. Under fsc_ctx.kv
 * (generation) the same parts run on the new rows only, which attend over
 * the keys and values the earlier rows left in the cache. */
#include <math.h>
#include <string.h>

#include "attention_seq.h"
#include "layers_internal.h"

typedef struct {
    fsc_module base;
    int C, NH;
    fsc_module *c_attn, *c_proj, *drop;
} attention;

/* Causal attention of the n new rows (positions p0 .. p0+n-1) over cached
 * rows 0 .. p0+n-1 of one layer: qkv (n, 3C), k and v (T, C), y (n, C). */
static int attend_cached(fsc_arena *a, const float *qkv, const float *k, const float *v, float *y,
                         int p0, int n, int C, int NH, bool flash) {
    const int hs = C / NH, keys = p0 + n;
    if (flash) { /* the new rows as queries at positions p0.., the cache as keys */
        const fsc_attn_dims d = {.B = 1,
                                 .NH = NH,
                                 .NKV = NH,
                                 .hd = hs,
                                 .Tq = n,
                                 .Tk = keys,
                                 .q_pos0 = p0,
                                 .ldq = 3 * C,
                                 .ldk = C,
                                 .ldv = C,
                                 .ldo = C};
        float *lse = fsc_arena_alloc(a, (size_t)NH * n * sizeof(float));
        if (!lse) return FSC_ERR_NOMEM;
        fsc_flash_attention_forward(&d, qkv, k, v, y, lse, false, FSC_GEMM_F32);
        return FSC_OK;
    }
    const float scale = 1.0f / sqrtf((float)hs);
    float *scores = fsc_arena_alloc(a, (size_t)n * keys * sizeof(float));
    if (!scores) return FSC_ERR_NOMEM;
    for (int hh = 0; hh < NH; hh++) {
        const int o = hh * hs;
        /* scores (n, keys) = q_h k_h^T / sqrt(hs), then row i sees keys 0..p0+i */
        fsc_sgemm(false, true, n, keys, hs, scale, qkv + o, 3 * C, k + o, C, 0.f, scores, keys);
        /* the training forward's softmax (its exp and its 1/sum), so the two
         * paths differ only in the order of their sums, which the noise floor
         * of the equivalence tests measures; libm's expf differed from it by
         * more than that on some CPUs */
        for (int i = 0; i < n; i++) fsc_softmax_causal_row(scores + (size_t)i * keys, p0 + i, keys);
        fsc_sgemm(false, false, n, hs, keys, 1.f, scores, keys, v + o, C, 0.f, y + o, C);
    }
    return FSC_OK;
}

/* The forward under fsc_ctx.kv: this layer's slot takes the new rows' keys
 * and values, and the rows attend over the cache. Nothing is saved. */
static int attention_cached(fsc_module *const parts[3], const fsc_ctx *ctx, const fsc_tensor *x,
                            fsc_tensor *y, void **saved, int C, int NH) {
    fsc_kv_cache *kv = ctx->kv;
    const int n = x->ndim == 3 ? (int)x->shape[1] : 0, p0 = kv->len;
    if (x->ndim != 3 || x->shape[0] != 1 || kv->C != C || kv->next >= kv->slots || n > kv->T - p0)
        return fsc_error(FSC_ERR_INVALID,
                         "KV cache: attention layer %d of %d, %d channels, %d + %d positions of "
                         "%d (a cache made for this model, batch 1?)",
                         kv->next, kv->slots, C, p0, n, kv->T);
    const size_t slot = (size_t)kv->next++ * kv->T * C;
    float *k = kv->k + slot, *v = kv->v + slot;
    fsc_tensor qkv, h, p;
    void *rec;
    int rc = fsc_module_forward(parts[0], ctx, x, &qkv, &rec);
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        const float *row = (const float *)qkv.data + (size_t)i * 3 * C;
        memcpy(k + (size_t)(p0 + i) * C, row + C, (size_t)C * sizeof(float));
        memcpy(v + (size_t)(p0 + i) * C, row + 2 * C, (size_t)C * sizeof(float));
    }
    if ((rc = fsc_alloc_like(ctx->arena, x, C, &h))) return rc;
    if ((rc = attend_cached(ctx->arena, qkv.data, k, v, h.data, p0, n, C, NH,
                            fsc_attention_uses_flash(ctx->attention, kv->T))))
        return rc;
    rc = fsc_module_forward(parts[1], ctx, &h, &p, &rec);
    if (!rc) rc = fsc_module_forward(parts[2], ctx, &p, y, &rec);
    *saved = NULL;
    return rc;
}

/* c_attn's output, q/k/v, in bf16 (asked per call, nn_linear_set_out_bf16):
 * under bf16 autocast where the batched bf16 kernel runs, which rounds q/k/v
 * to bf16 for its GEMMs anyway; not for flash, whose tiles read fp32, nor
 * under kv or seq, whose paths read fp32. The probabilities then stay in
 * bf16 as well (attention_kernel.c). */
static bool qkv_in_bf16(const fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x) {
    const attention *a = (const attention *)m;
    return fsc_ctx_bf16_act(ctx) && !ctx->kv && !ctx->seq && x->ndim == 3 &&
           !fsc_attention_uses_flash(ctx->attention, x->shape[1]) &&
           fsc_attention_bf16_act_ready((int)x->shape[0], (int)x->shape[1], a->C, a->NH);
}

/* The attention output h (B,T,C) for c_proj. Under bf16 autocast, when
 * c_proj is a plain Linear and the kernel is naive (flash's backward reads
 * its output again), h is kept in bf16, as c_proj's GEMM would round it:
 * the kernel writes fp32 into this thread's narrowing scratch (kept between
 * calls: a buffer mapped per call faults its pages in every time). */
static int attention_output(const fsc_ctx *ctx, fsc_attn_saved *s, const fsc_module *c_proj,
                            fsc_tensor *h, int C, int NH) {
    const bool bf16 = fsc_ctx_bf16_act(ctx) && nn_linear_is(c_proj) &&
                      !fsc_attention_uses_flash(ctx->attention, (int)s->qkv.shape[1]);
    int rc = fsc_alloc_like_dt(ctx->arena, &s->qkv, C, bf16 ? FSC_DTYPE_BF16 : FSC_DTYPE_F32, h);
    if (rc || !bf16) return rc ? rc : nn_attention_fused_forward(ctx, s, h->data, C, NH);
    const int64_t n = fsc_tensor_numel(h);
    float *tmp = fsc_bf16_narrow_scratch(n);
    if (!tmp) return FSC_ERR_NOMEM;
    rc = nn_attention_fused_forward(ctx, s, tmp, C, NH);
    if (!rc) fsc_narrow_bf16(h->data, tmp, n);
    return rc;
}

int fsc_attention_parts_forward(fsc_module *const parts[3], const fsc_ctx *ctx, const fsc_tensor *x,
                                fsc_tensor *y, void **saved, int C, int NH) {
    if (ctx->kv) return attention_cached(parts, ctx, x, y, saved, C, NH);
    if (ctx->seq) return nn_attention_seq_forward(parts, ctx, x, y, saved, C, NH);
    fsc_attn_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    int rc = fsc_module_forward(parts[0], ctx, x, &s->qkv, &s->c_attn);
    if (rc) return rc;
    fsc_tensor h;
    rc = attention_output(ctx, s, parts[1], &h, C, NH);
    if (rc) return rc;
    fsc_tensor p;
    rc = fsc_module_forward(parts[1], ctx, &h, &p, &s->c_proj);
    if (!rc) rc = fsc_module_forward(parts[2], ctx, &p, y, &s->drop);
    *saved = s;
    return rc;
}

int fsc_attention_parts_backward(fsc_module *const parts[3], const fsc_ctx *ctx,
                                 const fsc_attn_saved *s, const fsc_tensor *dy, fsc_tensor *dx,
                                 int C, int NH) {
    if (ctx->seq) return nn_attention_seq_backward(parts, ctx, s, dy, dx, C, NH);
    fsc_tensor dp, dh, dqkv;
    int rc = fsc_module_backward(parts[2], ctx, s->drop, dy, &dp);
    if (!rc) rc = fsc_module_backward(parts[1], ctx, s->c_proj, &dp, &dh);
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->qkv, 3 * C, &dqkv);
    if (rc) return rc;
    if ((rc = nn_attention_fused_backward(ctx, s, dh.data, dqkv.data, C, NH))) return rc;
    return fsc_module_backward(parts[0], ctx, s->c_attn, &dqkv, dx);
}

static int attn_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    attention *a = (attention *)m;
    /* bf16: ln_1's output under bf16 autocast, read only by c_attn */
    if (x->ndim != 3 || (x->dtype != FSC_DTYPE_F32 && x->dtype != FSC_DTYPE_BF16) ||
        x->shape[2] != a->C)
        return fsc_error(FSC_ERR_SHAPE,
                         "CausalSelfAttention %s: expected f32 (or bf16) (B,T,%d) input", m->name,
                         a->C);
    fsc_module *parts[3] = {a->c_attn, a->c_proj, a->drop};
    return fsc_attention_parts_forward(parts, ctx, x, y, saved, a->C, a->NH);
}

static int attn_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    attention *a = (attention *)m;
    const fsc_attn_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, &s->qkv, a->C);
    if (rc) return rc;
    fsc_module *parts[3] = {a->c_attn, a->c_proj, a->drop};
    return fsc_attention_parts_backward(parts, ctx, s, dy, dx, a->C, a->NH);
}

static const fsc_module_ops attn_ops = {"CausalSelfAttention", attn_forward, attn_backward, NULL};

fsc_module *fsc_attention_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                              float init_std, float proj_std) {
    if (C <= 0 || NH <= 0 || C % NH) {
        fsc_error(FSC_ERR_INVALID, "CausalSelfAttention %s: %d heads must divide d_model %d", name,
                  NH, C);
        return NULL;
    }
    attention *a = fsc_module_alloc(sizeof *a, &attn_ops, name);
    if (!a) return NULL;
    a->C = C, a->NH = NH;
    a->c_attn = fsc_linear_new("c_attn", C, 3 * C, true, FSC_WEIGHT_IN_OUT, init_std);
    a->c_proj = fsc_linear_new("c_proj", C, C, true, FSC_WEIGHT_IN_OUT, proj_std);
    a->drop = fsc_dropout_new("resid_dropout", dropout, layer_id);
    if (fsc_module_add_child(&a->base, a->c_attn) || fsc_module_add_child(&a->base, a->c_proj) ||
        fsc_module_add_child(&a->base, a->drop)) {
        fsc_module_free(&a->base);
        fsc_module_free(a->c_attn), fsc_module_free(a->c_proj), fsc_module_free(a->drop);
        return NULL;
    }
    nn_linear_set_out_bf16(a->c_attn, qkv_in_bf16, &a->base);
    return &a->base;
}
