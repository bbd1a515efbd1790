/* Tensor-parallel transformer pieces: attention with heads split over the
 * group and the pre-LN block (the MLP is tp_mlp.c), with the one-process
 * modules' child names, initialisation and dropout keys.
 *
 * Attention: c_attn is column-parallel over 3C outputs laid out [q | k | v];
 * rank r holds the q, k and v columns of its heads, i.e. three blocks of
 * C/t columns (its shard record says blocks = 3), so the local qkv is
 * [q_r | k_r | v_r] and the one-process attention kernel runs on it with
 * C/t channels and NH/t heads. c_proj is row-parallel on those channels. */
#include <math.h>
#include <string.h>

#include "nn/layers_internal.h"
#include "tp_internal.h"

/* ---- attention ------------------------------------------------------------------- */
typedef struct {
    tp_module tp;
    int C, NH; /* global sizes */
    bool recompute;
    fsc_module *c_attn, *c_proj, *drop;
} tp_attention;

/* fsc_attention_parts_forward, keeping no probabilities: they are made in
 * a buffer given back once the attention output is computed (s->att NULL). */
static int attn_forward_recompute(fsc_module *const parts[3], const fsc_ctx *ctx,
                                  const fsc_tensor *x, fsc_tensor *y, void **saved, int C, int NH) {
    fsc_attn_saved *s = fsc_arena_calloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    int rc = fsc_module_forward(parts[0], ctx, x, &s->qkv, &s->c_attn);
    fsc_tensor h;
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->qkv, C, &h);
    if (rc) return rc;
    int B = (int)s->qkv.shape[0], T = (int)s->qkv.shape[1];
    if (fsc_attention_uses_flash(ctx->attention, T)) { /* it keeps no probabilities anyway */
        rc = nn_attention_fused_forward(ctx, s, h.data, C, NH);
    } else {
        fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
        float *att = fsc_arena_alloc(ctx->arena, (size_t)B * NH * T * T * sizeof(float));
        if (!att) return nn_attention_refused(B, T, NH);
        fsc_attention_forward_prec(h.data, att, s->qkv.data, B, T, C, NH, fsc_ctx_prec(ctx));
        fsc_arena_release(ctx->arena, mark);
    }
    if (rc) return rc;
    fsc_tensor p;
    rc = fsc_module_forward(parts[1], ctx, &h, &p, &s->c_proj);
    if (!rc) rc = fsc_module_forward(parts[2], ctx, &p, y, &s->drop);
    *saved = s;
    return rc;
}

/* The probabilities again, from the saved q and k by the same kernel at the
 * same precision, hence the same floats as the forward's. */
static int attn_recompute(const fsc_ctx *ctx, const fsc_attn_saved *s, int C, int NH,
                          fsc_attn_saved *out) {
    int B = (int)s->qkv.shape[0], T = (int)s->qkv.shape[1];
    *out = *s;
    out->att = fsc_arena_alloc(ctx->arena, (size_t)B * NH * T * T * sizeof(float));
    if (!out->att) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    float *h = fsc_arena_alloc(ctx->arena, (size_t)B * T * C * sizeof(float)); /* unused output */
    if (!h) return FSC_ERR_NOMEM;
    fsc_attention_forward_prec(h, out->att, s->qkv.data, B, T, C, NH, fsc_ctx_prec(ctx));
    fsc_arena_release(ctx->arena, mark);
    return FSC_OK;
}

static int attn_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    tp_attention *a = (tp_attention *)m;
    if (x->ndim != 3 || x->dtype != FSC_DTYPE_F32 || x->shape[2] != a->C)
        return tp_shape_error(m, "expected f32 (B, T, C) input (T/t under sequence parallelism)",
                              x);
    fsc_module *parts[3] = {a->c_attn, a->c_proj, a->drop};
    int C = a->C / a->tp.size, NH = a->NH / a->tp.size;
    if (a->recompute && !ctx->seq) /* the ring keeps no probabilities anyway */
        return attn_forward_recompute(parts, ctx, x, y, saved, C, NH);
    return fsc_attention_parts_forward(parts, ctx, x, y, saved, C, NH);
}

static int attn_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    tp_attention *a = (tp_attention *)m;
    const fsc_attn_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    int64_t B = s->qkv.shape[0], T = s->qkv.shape[1], S = a->tp.sp ? T / a->tp.size : T;
    if ((rc = fsc_module_check_dy(m, dy, 3, (int64_t[]){B, S, a->C}))) return rc;
    fsc_module *parts[3] = {a->c_attn, a->c_proj, a->drop};
    int C = a->C / a->tp.size, NH = a->NH / a->tp.size;
    fsc_attn_saved again;
    if (!s->att && !s->lse && !ctx->seq) { /* recompute_attention */
        if ((rc = attn_recompute(ctx, s, C, NH, &again))) return rc;
        s = &again;
    }
    return fsc_attention_parts_backward(parts, ctx, s, dy, dx, C, NH);
}

static const fsc_module_ops attn_ops = {TP_KIND_ATTENTION, attn_forward, attn_backward, NULL};

fsc_module *fsc_tp_attention_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                                 float init_std, float proj_std, const fsc_tp_options *tp) {
    tp_attention *a = tp_module_alloc(sizeof *a, &attn_ops, name, tp);
    if (!a) return NULL;
    int t = a->tp.size;
    if (C <= 0 || NH <= 0 || C % NH || NH % t) {
        fsc_error(FSC_ERR_INVALID,
                  "%s %s: %d heads must divide d_model %d and be divisible by the "
                  "tensor-parallel size %d",
                  TP_KIND_ATTENTION, name ? name : "", NH, C, t);
        fsc_module_free(&a->tp.base);
        return NULL;
    }
    a->C = C, a->NH = NH, a->recompute = tp && tp->recompute_attention;
    a->c_attn =
        fsc_tp_column_linear_new("c_attn", C, 3 * C, true, FSC_WEIGHT_IN_OUT, init_std, false, tp);
    a->c_proj = fsc_tp_row_linear_new("c_proj", C, C, true, FSC_WEIGHT_IN_OUT, proj_std, true, tp);
    a->drop = fsc_tp_dropout_new("resid_dropout", dropout, layer_id, tp);
    if (a->c_attn) { /* this rank's q, k and v columns: three blocks of C/t */
        tp_module *ca = tp_module_of(a->c_attn);
        for (int i = 0; i < 2; i++) ca->shard[i].blocks = 3, ca->shard[i].local_block = C / t;
    }
    if (!a->c_attn || !a->c_proj || !a->drop || fsc_module_add_child(&a->tp.base, a->c_attn) ||
        fsc_module_add_child(&a->tp.base, a->c_proj) ||
        fsc_module_add_child(&a->tp.base, a->drop)) {
        /* adopted children go with the parent; the rest are freed here */
        fsc_module *kids[3] = {a->c_attn, a->c_proj, a->drop};
        for (int i = a->tp.base.nchildren; i < 3; i++) fsc_module_free(kids[i]);
        fsc_module_free(&a->tp.base);
        return NULL;
    }
    return &a->tp.base;
}

/* ---- block ----------------------------------------------------------------------------- */
/* fsc_block_new's block over TP children: the residual adds run on whole
 * tensors or sequence shards alike, so block.c's forward and backward are
 * this block's too. */
static const fsc_module_ops block_ops = {TP_KIND_BLOCK, fsc_block_forward, fsc_block_backward,
                                         NULL};

fsc_module *fsc_tp_block_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                             int n_layers, const fsc_tp_options *tp) {
    if (n_layers <= 0) {
        fsc_error(FSC_ERR_INVALID, "%s %s: n_layers %d must be positive", TP_KIND_BLOCK,
                  name ? name : "", n_layers);
        return NULL;
    }
    /* fsc_block_new's init and dropout keys */
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)n_layers);
    tp_module *m = tp_module_alloc(sizeof *m, &block_ops, name, tp);
    fsc_module *parts[4] = {
        fsc_tp_layernorm_new("ln_1", C, 1e-5f, tp),
        fsc_tp_attention_new("attn", C, NH, dropout, 2 * layer_id + 1, std, proj_std, tp),
        fsc_tp_layernorm_new("ln_2", C, 1e-5f, tp),
        fsc_tp_mlp_new("mlp", C, dropout, 2 * layer_id + 2, std, proj_std, tp),
    };
    bool ok = m != NULL;
    for (int i = 0; i < 4; i++) ok = ok && parts[i];
    for (int i = 0; ok && i < 4; i++) ok = fsc_module_add_child(&m->base, parts[i]) == FSC_OK;
    if (!ok) {
        for (int i = m ? m->base.nchildren : 0; i < 4; i++) fsc_module_free(parts[i]);
        if (m) fsc_module_free(&m->base);
        return NULL;
    }
    return &m->base;
}
