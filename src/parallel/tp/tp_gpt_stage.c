/* A pipeline stage of the tensor-parallel GPT: parts [first, end) of the
 * model as fsc_gpt_stage_parts_new cuts it (part 0 the embedding, each
 * block three parts, the last ln_f and the head tied to wte; whole layers
 * through fsc_tp_gpt_stage_new), built of the TP layers of tp_gpt.c over
 * one TP group, a block cut by the range as tp_block_parts.c's segments.
 * Children keep the whole model's names, so a stage's shards are slices of
 * the one-process tensors by global name.
 *
 * The one idea: what crosses a stage boundary is what flows between the TP
 * GPT's layers: the (B,T,C) activation, equal on every TP rank, or under
 * sequence parallelism this rank's (B,T/t,C) sequence shard; inside a
 * block's MLP the residual and this rank's GELU columns, (B,T,C + 4C/t).
 * Each TP rank sends its own to the same TP rank of the next stage, so the
 * pipeline needs no TP collective of its own. The head's logits are this
 * rank's vocabulary rows (B,T,ceil(V/t)), the input of
 * fsc_tp_cross_entropy, or, when the pipeline hands the stage the targets
 * (fsc_ctx.head_loss), the head runs fused with the loss over chunks of
 * rows (tp_head.c) and the logits never exist whole. The stage with the
 * head but not the embedding holds its own copy of this rank's wte rows,
 * which the pipeline keeps equal to the first stage's. */
#include <stdio.h>
#include <string.h>

#include "nn/layers_internal.h"
#include "nn/moe_internal.h"
#include "tp_internal.h"

static const char TP_KIND_STAGE[] = "TensorParallelGPTStage";

typedef struct {
    tp_module tp;
    fsc_gpt_config cfg;
    bool embed, head;
    fsc_module *wte, *wpe, *drop, *ln_f;
    fsc_module **h; /* whole blocks and blocks' parts, in order */
    int nh;
    int in_w, out_w;        /* channels in and out: C, or C + 4C/t at a cut inside an MLP */
    int vfirst, vcount, vp; /* this rank's vocabulary rows */
} tp_stage;

typedef struct {
    fsc_tensor in; /* ids (embedding stage) or the input activation */
    int T;         /* the whole sequence (the activations may be shards of it) */
    void *drop, *ln_f;
    void **h;
    fsc_tensor final; /* ln_f's output: the head's input */
    /* fsc_ctx.head_loss (the pipeline's targets): the head runs fused with
     * the loss, as in tp_gpt.c, in forward when evaluating, else first thing
     * in backward, into the (1,) output *loss */
    bool fused;
    fsc_head_loss hl;
    float *loss;
} tp_stage_saved;

/* The head and loss fused (tp_head.c) over ln_f's output: the loss into
 * *s->loss; in training also wte's gradient and *dfin, the gradient at
 * ln_f's output. */
static int head_fused(tp_stage *g, const fsc_ctx *ctx, const tp_stage_saved *s, fsc_tensor *dfin) {
    double sum = 0;
    int rc = tp_head_loss(&g->tp, ctx, &s->final, &g->wte->params[0], g->vfirst, g->vcount, g->vp,
                          &s->hl, &sum, dfin);
    if (!rc) *s->loss = (float)(sum / s->hl.norm);
    return rc;
}

/* The embedding: this rank's wte rows, summed over the group (or the
 * sequence shard of the sum), plus wpe, then dropout. */
static int embed_forward(tp_stage *g, const fsc_ctx *ctx, const fsc_tensor *x, tp_stage_saved *s,
                         fsc_tensor *out) {
    const int B = (int)x->shape[0], T = (int)x->shape[1], C = g->cfg.d_model;
    const int32_t *ids = x->data;
    for (int64_t i = 0; i < (int64_t)B * T; i++)
        if (ids[i] < 0 || ids[i] >= g->cfg.vocab)
            return fsc_error(FSC_ERR_INVALID,
                             "TP GPT stage: token %d at position %lld outside vocab [0,%d)", ids[i],
                             (long long)i, g->cfg.vocab);
    fsc_tensor part = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C}), e;
    if (!part.data) return FSC_ERR_NOMEM;
    tp_vocab_lookup(part.data, ids, (int64_t)B * T, g->wte->params[0].data, g->vfirst, g->vcount,
                    C);
    int rc = tp_leave_forward(&g->tp, ctx->arena, &part, &e);
    if (rc) return rc;
    const int S = (int)e.shape[1], t0 = g->tp.sp ? g->tp.rank * S : 0;
    const float *wpe = g->wpe->params[0].data;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++)
            fsc_add_inplace((float *)e.data + ((int64_t)b * S + i) * C, wpe + (int64_t)(t0 + i) * C,
                            C);
    return fsc_module_forward(g->drop, ctx, &e, out, &s->drop);
}

static int stage_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                         void **saved) {
    tp_stage *g = (tp_stage *)m;
    const int C = g->cfg.d_model, t = g->tp.size;
    int B, T;
    if (g->embed) {
        if (x->dtype != FSC_DTYPE_I32 || x->ndim != 2 || x->shape[1] < 1 ||
            x->shape[1] > g->cfg.seq)
            return fsc_error(FSC_ERR_SHAPE,
                             "TP GPT stage %s: expected int32 (B,T) ids, 1 <= T <= %d", m->name,
                             g->cfg.seq);
        B = (int)x->shape[0], T = (int)x->shape[1];
        if (g->tp.sp && T % t)
            return fsc_error(FSC_ERR_SHAPE,
                             "TP GPT stage: sequence parallelism over %d ranks needs T divisible "
                             "by %d, got T = %d",
                             t, t, T);
    } else {
        if (x->dtype != FSC_DTYPE_F32 || x->ndim != 3 || x->shape[2] != g->in_w)
            return fsc_error(FSC_ERR_SHAPE, "TP GPT stage %s: expected F32 (B,T,%d) activations%s",
                             m->name, g->in_w,
                             g->tp.sp       ? " (a sequence shard: T/t rows)"
                             : g->in_w != C ? " (the residual, then this rank's GELU columns)"
                                            : "");
        B = (int)x->shape[0], T = (int)x->shape[1] * (g->tp.sp ? t : 1);
    }
    tp_stage_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    memset(s, 0, sizeof *s);
    s->in = *x, s->T = T;
    s->h = fsc_arena_alloc(ctx->arena, sizeof(void *) * (size_t)(g->nh ? g->nh : 1));
    if (!s->h) return FSC_ERR_NOMEM;
    fsc_tensor cur = *x;
    int rc = g->embed ? embed_forward(g, ctx, x, s, &cur) : FSC_OK;
    for (int l = 0; !rc && l < g->nh; l++) {
        fsc_tensor next;
        rc = fsc_module_forward(g->h[l], ctx, &cur, &next, &s->h[l]);
        cur = next;
    }
    if (rc) return rc;
    if (!g->head) {
        *y = cur;
        *saved = s;
        return FSC_OK;
    }
    if ((rc = fsc_module_forward(g->ln_f, ctx, &cur, &s->final, &s->ln_f))) return rc;
    *saved = s;
    if (ctx->head_loss) {
        if ((rc =
                 tp_head_loss_keep(&g->tp, ctx, (int64_t)B * T, g->cfg.vocab, &s->hl, y, &s->loss)))
            return rc;
        s->fused = true;
        return ctx->training ? FSC_OK : head_fused(g, ctx, s, NULL);
    }
    *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, g->vp});
    if (!y->data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor fin;
    if ((rc = tp_enter_forward(&g->tp, ctx->arena, &s->final, &fin))) return rc;
    fsc_matmul_forward_prec(y->data, fin.data, g->wte->params[0].data, NULL, B * T, C, g->vp,
                            FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    fsc_arena_release(ctx->arena, mark);
    *saved = s;
    return FSC_OK;
}

/* The head's backward: d(final) from the logits' gradient (this rank's
 * vocabulary part, then summed over the group: Megatron's f), and wte's
 * rows' gradient now or, for a zero-bubble schedule's W, later. */
static int head_backward(tp_stage *g, const fsc_ctx *ctx, tp_stage_saved *s, const fsc_tensor *dy,
                         fsc_tensor *dfin) {
    const int B = (int)s->in.shape[0], T = s->T, C = g->cfg.d_model;
    fsc_param *wte = &g->wte->params[0];
    *dfin = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!dfin->data) return FSC_ERR_NOMEM;
    /* the gathered input stays until W when the weight gradient is deferred */
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor fin;
    int rc = tp_enter_forward(&g->tp, ctx->arena, &s->final, &fin);
    if (rc) return rc;
    const fsc_gemm_prec prec = fsc_ctx_prec(ctx);
    fsc_matmul_backward_prec(dfin->data, ctx->defer ? NULL : wte->grad, NULL, dy->data, fin.data,
                             wte->data, B * T, C, g->vp, FSC_WEIGHT_OUT_IN, prec);
    if (ctx->defer)
        rc = fsc_deferred_matmul_prec(ctx->defer, wte->grad, NULL, dy->data, fin.data, wte->data,
                                      B * T, C, g->vp, FSC_WEIGHT_OUT_IN, prec);
    else
        fsc_arena_release(ctx->arena, mark);
    return rc ? rc : tp_enter_backward(&g->tp, ctx->arena, dfin);
}

/* The embedding's backward from dropout's input gradient de (B,S,C):
 * wpe's rows (summed over the group under SP, where each rank has other
 * positions), then wte's rows of the ids in this rank's range. */
static int embed_backward(tp_stage *g, const fsc_ctx *ctx, tp_stage_saved *s,
                          const fsc_tensor *de) {
    const int B = (int)de->shape[0], S = (int)de->shape[1], C = g->cfg.d_model, T = s->T;
    const int t0 = g->tp.sp ? g->tp.rank * S : 0;
    float *dwpe = g->wpe->params[0].grad;
    if (g->tp.sp && !(dwpe = fsc_arena_calloc(ctx->arena, (size_t)T * C * sizeof(float))))
        return FSC_ERR_NOMEM;
    const float *d = de->data;
    for (int b = 0; b < B; b++) /* fsc_encoder_backward's order */
        for (int i = 0; i < S; i++)
            fsc_add_inplace(dwpe + (int64_t)(t0 + i) * C, d + ((int64_t)b * S + i) * C, C);
    int rc = g->tp.sp
                 ? tp_accumulate_replicated(&g->tp, g->wpe->params[0].grad, dwpe, (int64_t)T * C)
                 : FSC_OK;
    fsc_tensor full;
    if (!rc) rc = tp_leave_backward(&g->tp, ctx->arena, de, &full);
    if (rc) return rc;
    tp_vocab_lookup_backward(g->wte->params[0].grad, full.data, s->in.data, (int64_t)B * T,
                             g->vfirst, g->vcount, C);
    return FSC_OK;
}

static int stage_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                          fsc_tensor *dx) {
    tp_stage *g = (tp_stage *)m;
    tp_stage_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    const int B = (int)s->in.shape[0], C = g->cfg.d_model;
    const int S = g->tp.sp ? s->T / g->tp.size : s->T;
    if (s->fused)
        rc = tp_head_loss_check_dy(&g->tp, dy);
    else
        rc = fsc_module_check_dy(m, dy, 3,
                                 (int64_t[]){B, g->head ? s->T : S, g->head ? g->vp : g->out_w});
    if (rc) return rc;
    fsc_tensor cur = *dy;
    if (g->head) {
        fsc_tensor dfin;
        rc = s->fused ? head_fused(g, ctx, s, &dfin) : head_backward(g, ctx, s, dy, &dfin);
        if (rc) return rc;
        if ((rc = fsc_module_backward(g->ln_f, ctx, s->ln_f, &dfin, &cur))) return rc;
    }
    fsc_tensor pingpong[2];
    for (int i = 0; g->nh && i < 2; i++) {
        pingpong[i] = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, S, C});
        if (!pingpong[i].data) return FSC_ERR_NOMEM;
    }
    if ((rc = fsc_blocks_backward(g->h, s->h, g->nh, ctx, &cur, pingpong))) return rc;
    if (g->embed) {
        fsc_tensor de;
        if ((rc = fsc_module_backward(g->drop, ctx, s->drop, &cur, &de))) return rc;
        return embed_backward(g, ctx, s, &de);
    }
    if (dx) *dx = cur;
    return FSC_OK;
}

static void stage_free(fsc_module *m) {
    tp_stage *g = (tp_stage *)m;
    free(g->h);
    free(g);
}

static const fsc_module_ops stage_ops = {TP_KIND_STAGE, stage_forward, stage_backward, stage_free};

/* Adds a child made by the caller; frees it and fails if it is NULL or rc is set. */
static int adopt(tp_stage *g, fsc_module *child, fsc_module **slot, int rc) {
    if (rc || !child) {
        fsc_module_free(child);
        return rc ? rc : FSC_ERR_INVALID;
    }
    *slot = child;
    return fsc_module_add_child(&g->tp.base, child);
}

int fsc_tp_gpt_part_width(const fsc_gpt_config *cfg, int t, int part) {
    const bool proj = part >= 1 && part <= 3 * cfg->layers && (part - 1) % 3 == FSC_BLOCK_PROJ;
    return proj && t > 0 ? cfg->d_model + 4 * cfg->d_model / t : cfg->d_model;
}

fsc_module *fsc_tp_gpt_stage_new(const fsc_gpt_config *cfg, int first, int end,
                                 const fsc_tp_options *tp) {
    if (!cfg) {
        fsc_error(FSC_ERR_INVALID, "fsc_tp_gpt_stage_new: cfg is NULL");
        return NULL;
    }
    if (fsc_gpt_config_check(cfg)) return NULL;
    const int n = cfg->layers + 2;
    if (first < 0 || end > n || first >= end) {
        fsc_error(FSC_ERR_INVALID, "TP GPT stage: layers [%d, %d) outside [0, %d) or empty", first,
                  end, n);
        return NULL;
    }
    int pf, pe; /* whole layers: cuts at whole quarters, never inside a layer */
    if (fsc_gpt_part_of_cut(cfg, 4 * first, &pf) || fsc_gpt_part_of_cut(cfg, 4 * end, &pe))
        return NULL;
    return fsc_tp_gpt_stage_parts_new(cfg, pf, pe, tp);
}

fsc_module *fsc_tp_gpt_stage_parts_new(const fsc_gpt_config *cfg, int first, int end,
                                       const fsc_tp_options *tp) {
    if (!cfg) {
        fsc_error(FSC_ERR_INVALID, "fsc_tp_gpt_stage_parts_new: cfg is NULL");
        return NULL;
    }
    if (fsc_gpt_config_check(cfg)) return NULL;
    if (moe_refuse(cfg->moe, "fsc_tp_gpt_stage_new (tensor parallelism)")) return NULL;
    const int n = fsc_gpt_num_parts(cfg);
    if (first < 0 || end > n || first >= end) {
        fsc_error(FSC_ERR_INVALID, "TP GPT stage: parts [%d, %d) outside [0, %d) or empty", first,
                  end, n);
        return NULL;
    }
    char name[48];
    snprintf(name, sizeof name, "gpt[%g:%g]", fsc_gpt_cut_of_part(cfg, first) / 4.0,
             fsc_gpt_cut_of_part(cfg, end) / 4.0);
    tp_stage *g = tp_module_alloc(sizeof *g, &stage_ops, name, tp);
    if (!g) return NULL;
    g->cfg = *cfg;
    g->embed = first == 0, g->head = end == n;
    g->in_w = fsc_tp_gpt_part_width(cfg, g->tp.size, first);
    g->out_w = fsc_tp_gpt_part_width(cfg, g->tp.size, end);
    fsc_tp_vocab_range(cfg->vocab, g->tp.size, g->tp.rank, &g->vfirst, &g->vcount, &g->vp);
    /* block b's parts 3b+1 .. 3b+3 within [first, end) */
    const int p0 = first > 1 ? first : 1, p1 = end < n - 1 ? end : n - 1;
    g->h = calloc((size_t)(p1 > p0 ? p1 - p0 : 1), sizeof *g->h);
    int rc = g->h ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "out of memory creating a TP GPT stage");
    if (!rc && (cfg->heads % g->tp.size || cfg->d_model % g->tp.size))
        rc = fsc_error(FSC_ERR_INVALID,
                       "TP GPT stage: heads %d and d_model %d must be divisible by the "
                       "tensor-parallel size %d",
                       cfg->heads, cfg->d_model, g->tp.size);
    /* the whole model's children, in its order, so names and init match it */
    if (g->embed || g->head) {
        rc =
            adopt(g, fsc_tp_embedding_new("wte", cfg->vocab, cfg->d_model, 0.02f, tp), &g->wte, rc);
        if (!rc) g->wte->params_used_by_parent = true;
    }
    if (g->embed) {
        rc = adopt(g, fsc_embedding_new("wpe", cfg->seq, cfg->d_model, 0.02f), &g->wpe, rc);
        if (!rc) g->wpe->params_used_by_parent = true;
        rc = adopt(g, fsc_tp_dropout_new("drop", cfg->dropout, 0, tp), &g->drop, rc);
    }
    for (int p = p0; !rc && p < p1;) {
        const int b = (p - 1) / 3, from = (p - 1) % 3;
        const int to = p1 - 3 * b - 1 < FSC_BLOCK_SEGMENTS ? p1 - 3 * b - 1 : FSC_BLOCK_SEGMENTS;
        const bool whole = from == FSC_BLOCK_ATTN && to == FSC_BLOCK_SEGMENTS;
        snprintf(name, sizeof name, "h.%d", b);
        fsc_module *blk = whole ? fsc_tp_block_new(name, cfg->d_model, cfg->heads, cfg->dropout,
                                                   (uint32_t)b, cfg->layers, tp)
                                : tp_block_part_new(name, cfg->d_model, cfg->heads, cfg->dropout,
                                                    (uint32_t)b, cfg->layers, from, to, tp);
        rc = adopt(g, blk, &g->h[g->nh++], rc);
        p += to - from;
    }
    if (g->head) rc = adopt(g, fsc_tp_layernorm_new("ln_f", cfg->d_model, 1e-5f, tp), &g->ln_f, rc);
    if (rc) {
        fsc_module_free(&g->tp.base);
        return NULL;
    }
    return &g->tp.base;
}
