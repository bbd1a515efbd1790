/* The decoder-only model, written once: token embedding (plus position
 * embedding in GPT-2), L pre-norm blocks, a final norm and an LM head (tied
 * to wte, or its own weight), as any contiguous range of its parts
 * (gpt_internal.h), under any layout and family. The whole model, every
 * pipeline stage, every tensor-parallel rank and the KV-cache decoder run
 * this forward and this backward; a layout (GPT-2's plain one below,
 * LLaMA's in llama.c, the TP one in src/parallel/tp/tp_gpt.c) only makes
 * the children and computes the two ends, which call kernels on the tables
 * directly (a tie needs one table in two places). A range with a tied head
 * but not the embedding holds its own copy of wte: the pipeline keeps the
 * copies equal by summing their gradients. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fsc/kernels.h"
#include "fsc/moe.h"
#include "gpt_internal.h"
#include "moe_internal.h"

/* ---- the model ------------------------------------------------------------------------------- */

static int check_ids(const gpt_model *g, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= g->cfg.vocab)
            return fsc_error(FSC_ERR_INVALID, "%s: token %d at position %lld outside vocab [0,%d)",
                             g->ops->label, ids[i], (long long)i, g->cfg.vocab);
    return FSC_OK;
}

/* The input's batch and whole sequence length, checked: ids for a range
 * with the embedding, else the activation a cut passes. */
static int check_input(const gpt_model *g, const fsc_tensor *x, int *B, int *T) {
    const char *label = g->ops->label, *name = g->base.name;
    const int t = g->seq_split;
    if (!g->embed) {
        if (x->dtype != FSC_DTYPE_F32 || x->ndim != 3 || x->shape[2] != g->in_w)
            return fsc_error(FSC_ERR_SHAPE, "%s '%s': expected F32 (B,T,%d) activations%s", label,
                             name, g->in_w,
                             t > 1                       ? " (a sequence shard: T/t rows)"
                             : g->in_w != g->cfg.d_model ? " (the residual, then the GELU columns)"
                                                         : "");
        *B = (int)x->shape[0], *T = (int)x->shape[1] * t;
        return FSC_OK;
    }
    if (x->dtype != FSC_DTYPE_I32 || x->ndim != 2 || x->shape[1] < 1 || x->shape[1] > g->cfg.seq)
        return fsc_error(FSC_ERR_SHAPE, "%s '%s': expected int32 (B,T) ids with 1 <= T <= %d",
                         label, name, g->cfg.seq);
    *B = (int)x->shape[0], *T = (int)x->shape[1];
    if (*T % t)
        return fsc_error(FSC_ERR_SHAPE,
                         "%s: sequence parallelism over %d ranks needs T divisible by %d, got "
                         "T = %d",
                         label, t, t, *T);
    return check_ids(g, x->data, (int64_t)*B * *T);
}

static int model_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                         void **saved) {
    gpt_model *g = (gpt_model *)m;
    int B = 0, T = 0;
    int rc = check_input(g, x, &B, &T);
    if (rc) return rc;
    if (ctx->kv && ctx->seq)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s '%s': a KV cache decodes in one process, not under context "
                         "parallelism",
                         g->ops->label, m->name);
    if (ctx->kv && (!g->embed || !g->head || !g->ops->decodes || B != 1))
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s '%s': a KV cache decodes one sequence (batch 1) through the whole "
                         "one-process model",
                         g->ops->label, m->name);
    gpt_saved *s = fsc_arena_calloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    s->in = *x, s->T = T;
    s->h = fsc_arena_alloc(ctx->arena, sizeof(void *) * (size_t)(g->nh ? g->nh : 1));
    if (!s->h) return FSC_ERR_NOMEM;
    fsc_tensor cur = *x;
    if (g->embed) {
        fsc_tensor e;
        rc = g->ops->embed_forward(g, ctx, x, &e);
        if (!rc && g->drop) rc = fsc_module_forward(g->drop, ctx, &e, &cur, &s->drop);
        if (!rc && !g->drop) cur = e;
    }
    for (int l = 0; !rc && l < g->nh; l++) {
        fsc_tensor next;
        rc = fsc_module_forward(g->h[l], ctx, &cur, &next, &s->h[l]);
        cur = next;
    }
    if (rc) return rc;
    *saved = s;
    if (!g->head) {
        *y = cur;
        return FSC_OK;
    }
    rc = fsc_module_forward(g->ln_f, ctx, &cur, &s->final, &s->ln_f);
    return rc ? rc : g->ops->head_forward(g, ctx, s, y);
}

static int model_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                          fsc_tensor *dx) {
    gpt_model *g = (gpt_model *)m;
    gpt_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    const int B = (int)s->in.shape[0], T = s->T, S = T / g->seq_split, C = g->cfg.d_model;
    fsc_tensor dyc = *dy; /* bf16 logits take their gradient in bf16 or fp32 */
    if (s->logits_bf16 && dy->dtype == FSC_DTYPE_BF16) dyc.dtype = FSC_DTYPE_F32;
    if (!s->fused && /* a fused head checks its (1,) dy itself */
        (rc = fsc_module_check_dy(
             m, &dyc, 3, (int64_t[]){B, g->head ? T : S, g->head ? g->logit_width : g->out_w})))
        return rc;
    fsc_tensor cur = *dy;
    /* the two (B,S,C) buffers the blocks' input gradients alternate in */
    fsc_tensor pingpong[2];
    if (g->head) {
        fsc_tensor dfin;
        if ((rc = g->ops->head_backward(g, ctx, s, dy, &dfin))) return rc;
        if ((rc = fsc_module_backward(g->ln_f, ctx, s->ln_f, &dfin, &cur))) return rc;
        pingpong[0] = dfin, pingpong[1] = cur;
    } else {
        for (int i = 0; g->nh && i < 2; i++) {
            pingpong[i] = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, S, C});
            if (!pingpong[i].data) return FSC_ERR_NOMEM;
        }
    }
    if ((rc = fsc_blocks_backward(g->h, s->h, g->nh, ctx, &cur, pingpong))) return rc;
    if (g->embed) { /* token ids have no gradient: dx stays untouched */
        fsc_tensor de = cur;
        if (g->drop) rc = fsc_module_backward(g->drop, ctx, s->drop, &cur, &de);
        return rc ? rc : g->ops->embed_backward(g, ctx, s, &de);
    }
    if (dx) *dx = cur;
    return FSC_OK;
}

static void model_free(fsc_module *m) {
    gpt_model *g = (gpt_model *)m;
    if (g->ops->free_state) g->ops->free_state(g->st);
    free(g->h);
    free(g);
}

/* Adds a child made by the layout; frees it and fails if it is NULL or rc is set. */
static int adopt(gpt_model *g, fsc_module *child, fsc_module **slot, int rc) {
    if (rc || !child) {
        fsc_module_free(child);
        return rc ? rc : FSC_ERR_INVALID;
    }
    *slot = child;
    return fsc_module_add_child(&g->base, child);
}

/* The children of parts [first, end), in the whole model's order. */
static int make_children(gpt_model *g, int first, int end) {
    const fsc_gpt_config *c = &g->cfg;
    const int n = fsc_gpt_num_parts(c);
    /* block b's parts 3b+1 .. 3b+3 within [first, end) */
    const int p0 = first > 1 ? first : 1, p1 = end < n - 1 ? end : n - 1;
    g->h = calloc((size_t)(p1 > p0 ? p1 - p0 : 1), sizeof *g->h);
    int rc = g->h ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "out of memory creating a %s", g->ops->label);
    /* an untied head has its own weight: wte then stays with the embedding */
    fsc_module *lm_head = NULL;
    if (!rc && g->head && g->ops->lm_head) rc = g->ops->lm_head(g->st, c, &lm_head);
    if (g->embed || (g->head && !lm_head)) {
        rc = adopt(g, g->ops->wte(g->st, c), &g->wte, rc);
        if (!rc) g->wte->params_used_by_parent = true;
    }
    if (g->embed && g->ops->wpe) {
        rc = adopt(g, g->ops->wpe(g->st, c), &g->wpe, rc);
        if (!rc) g->wpe->params_used_by_parent = true;
    }
    if (g->embed && g->ops->drop) rc = adopt(g, g->ops->drop(g->st, c), &g->drop, rc);
    for (int p = p0; !rc && p < p1;) {
        const int b = (p - 1) / 3, from = (p - 1) % 3;
        const int to = p1 - 3 * b - 1 < FSC_BLOCK_SEGMENTS ? p1 - 3 * b - 1 : FSC_BLOCK_SEGMENTS;
        char name[FSC_NAME_MAX];
        snprintf(name, sizeof name, g->ops->block_fmt, b);
        rc = adopt(g, g->ops->block(g->st, c, name, b, from, to), &g->h[g->nh++], rc);
        p += to - from;
    }
    if (g->head) rc = adopt(g, g->ops->ln_f(g->st, c), &g->ln_f, rc);
    if (lm_head) {
        rc = adopt(g, lm_head, &g->lm_head, rc);
        if (!rc) g->lm_head->params_used_by_parent = true;
    }
    return rc;
}

fsc_module *gpt_model_new(const fsc_gpt_config *cfg, int first, int end, const gpt_layout_ops *ops,
                          void *st, bool stage, int seq_split, int logit_width) {
    const int n = fsc_gpt_num_parts(cfg);
    if (first < 0 || end > n || first >= end) {
        fsc_error(FSC_ERR_INVALID, "%s stage: parts [%d, %d) outside [0, %d) or empty", ops->label,
                  first, end, n);
        if (ops->free_state) ops->free_state(st);
        return NULL;
    }
    char name[48] = "gpt";
    if (stage)
        snprintf(name, sizeof name, "gpt[%g:%g]", fsc_gpt_cut_of_part(cfg, first) / 4.0,
                 fsc_gpt_cut_of_part(cfg, end) / 4.0);
    static const fsc_module_ops no_ops; /* replaced by the model's own table below */
    gpt_model *g = fsc_module_alloc(sizeof *g, &no_ops, name);
    if (!g) {
        if (ops->free_state) ops->free_state(st);
        return NULL;
    }
    g->mops = (fsc_module_ops){stage ? ops->stage_kind : ops->kind, model_forward, model_backward,
                               model_free};
    g->base.ops = &g->mops;
    g->cfg = *cfg, g->ops = ops, g->st = st;
    g->embed = first == 0, g->head = end == n;
    g->in_w = ops->width(st, cfg, first), g->out_w = ops->width(st, cfg, end);
    g->seq_split = seq_split, g->logit_width = logit_width;
    if (make_children(g, first, end)) {
        fsc_module_free(&g->base);
        return NULL;
    }
    return &g->base;
}

int fsc_gpt_blocks(fsc_module *m, fsc_module **blocks, int max) {
    if (!m || m->ops->forward != model_forward)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_gpt_blocks: '%s' is not a model fsc_gpt_new or a "
                         "stage constructor made",
                         m ? m->name : "(null)");
    const gpt_model *g = (const gpt_model *)m;
    for (int i = 0; i < g->nh && i < max; i++) blocks[i] = g->h[i];
    return g->nh;
}

const gpt_model *gpt_model_decoding(const fsc_module *m) {
    const gpt_model *g = m && m->ops->forward == model_forward ? (const gpt_model *)m : NULL;
    return g && g->ops->decodes && g->embed && g->head ? g : NULL;
}

gpt_model *gpt_model_find(fsc_module *m, const char *kind) {
    while (m && m->ops->kind != kind) m = m->wraps;
    return (gpt_model *)m;
}

/* ---- the plain layout: one process ----------------------------------------------------------- */

static fsc_module *plain_wte(void *st, const fsc_gpt_config *c) {
    (void)st;
    return fsc_embedding_new("wte", c->vocab, c->d_model, 0.02f);
}

static fsc_module *plain_wpe(void *st, const fsc_gpt_config *c) {
    (void)st;
    return fsc_embedding_new("wpe", c->seq, c->d_model, 0.02f);
}

static fsc_module *plain_drop(void *st, const fsc_gpt_config *c) {
    (void)st;
    return fsc_dropout_new("drop", c->dropout, 0);
}

/* Replaces block l's dense MLP (child 3, "mlp") by an MoE layer with the
 * same dropout key and initialisation. */
static int moe_swap(fsc_module *block, const fsc_gpt_config *c, int l) {
    if (!fsc_gpt_moe_block(c, l)) return FSC_OK;
    const float proj_std = 0.02f / sqrtf(2.0f * (float)c->layers); /* as fsc_block_new's */
    fsc_module *m =
        fsc_moe_new("mlp", c->d_model, c->moe, c->dropout, (uint32_t)(2 * l + 2), 0.02f, proj_std);
    if (!m) return FSC_ERR_INVALID;
    /* ln_2 fed the dense MLP's c_fc (bf16 activations): it feeds a router now */
    nn_layernorm_set_feeds(block->children[2], NULL);
    fsc_module_free(block->children[3]);
    block->children[3] = m;
    m->parent = block;
    return FSC_OK;
}

static fsc_module *plain_block(void *st, const fsc_gpt_config *c, const char *name, int b, int from,
                               int to) {
    (void)st;
    if (from != FSC_BLOCK_ATTN || to != FSC_BLOCK_SEGMENTS)
        return fsc_block_part_new(name, c->d_model, c->heads, c->dropout, (uint32_t)b, c->layers,
                                  from, to);
    fsc_module *blk = fsc_block_new(name, c->d_model, c->heads, c->dropout, (uint32_t)b, c->layers);
    if (blk && moe_swap(blk, c, b)) {
        fsc_module_free(blk);
        return NULL;
    }
    return blk;
}

static fsc_module *plain_ln_f(void *st, const fsc_gpt_config *c) {
    (void)st;
    return fsc_layernorm_new("ln_f", c->d_model, 1e-5f);
}

static int plain_width(void *st, const fsc_gpt_config *c, int p) {
    (void)st;
    return fsc_gpt_part_width(c, p);
}

/* Under context parallelism (fsc_ctx.seq) row b's runs take the position
 * rows of their global positions. */
static int embed_seq(gpt_model *g, const fsc_ctx *ctx, const fsc_tensor *ids, fsc_tensor *e) {
    const fsc_seq_split *q = ctx->seq;
    const int B = (int)ids->shape[0], T = (int)ids->shape[1], C = g->cfg.d_model;
    if (T != q->runs * q->len || q->T > g->cfg.seq)
        return fsc_error(FSC_ERR_SHAPE,
                         "GPT: context parallelism holds %d runs of %d positions of %d (the "
                         "model's %d), got %d ids per row",
                         q->runs, q->len, q->T, g->cfg.seq, T);
    *e = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!e->data) return FSC_ERR_NOMEM;
    const float *wte = g->wte->params[0].data, *wpe = g->wpe ? g->wpe->params[0].data : NULL;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < q->runs; r++) {
            const size_t at = (size_t)b * T + (size_t)r * q->len;
            fsc_encoder_forward((float *)e->data + at * C, (const int32_t *)ids->data + at, wte,
                                wpe ? wpe + q->pos0[r] * C : NULL, 1, q->len, C);
        }
    return FSC_OK;
}

static void embed_seq_backward(const fsc_ctx *ctx, fsc_param *wte, fsc_param *wpe,
                               const fsc_tensor *de, const int32_t *ids, int B, int T, int C) {
    const fsc_seq_split *q = ctx->seq;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < q->runs; r++) {
            const size_t at = (size_t)b * T + (size_t)r * q->len;
            const float *d = (const float *)de->data + at * C;
            float *dwpe = wpe && !wpe->frozen ? (float *)wpe->grad + q->pos0[r] * C : NULL;
            if (!wte->frozen)
                fsc_encoder_backward(wte->grad, dwpe, d, ids + at, 1, q->len, C);
            else if (dwpe)
                fsc_add_inplace(dwpe, d, (int64_t)q->len * C);
        }
}

/* Positions start at 0, or after the cached ones when decoding. */
int gpt_plain_embed_forward(gpt_model *g, const fsc_ctx *ctx, const fsc_tensor *ids,
                            fsc_tensor *e) {
    if (ctx->seq) return embed_seq(g, ctx, ids, e);
    const int B = (int)ids->shape[0], T = (int)ids->shape[1], C = g->cfg.d_model;
    const int p0 = ctx->kv ? ctx->kv->len : 0;
    if (p0 + T > g->cfg.seq)
        return fsc_error(FSC_ERR_INVALID, "GPT: positions %d .. %d past the model's %d", p0,
                         p0 + T - 1, g->cfg.seq);
    *e = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!e->data) return FSC_ERR_NOMEM;
    const float *wpe = g->wpe ? (const float *)g->wpe->params[0].data + (size_t)p0 * C : NULL;
    fsc_encoder_forward(e->data, ids->data, g->wte->params[0].data, wpe, B, T, C);
    return FSC_OK;
}

int gpt_plain_embed_backward(gpt_model *g, const fsc_ctx *ctx, const gpt_saved *s,
                             const fsc_tensor *de) {
    const int B = (int)s->in.shape[0], T = s->T, C = g->cfg.d_model;
    fsc_param *wte = &g->wte->params[0], *wpe = g->wpe ? &g->wpe->params[0] : NULL;
    if (ctx->seq) {
        embed_seq_backward(ctx, wte, wpe, de, s->in.data, B, T, C);
        return FSC_OK;
    }
    if (!wte->frozen) {
        fsc_encoder_backward(wte->grad, wpe && !wpe->frozen ? wpe->grad : NULL, de->data,
                             s->in.data, B, T, C);
    } else if (wpe && !wpe->frozen) { /* fine-tuning the positions alone */
        for (int b = 0; b < B; b++)
            fsc_add_inplace(wpe->grad, (const float *)de->data + (size_t)b * T * C, (int64_t)T * C);
    }
    return FSC_OK;
}

/* The head's weight (V, C): its own, or wte when tied. */
static fsc_param *head_weight(gpt_model *g) {
    return g->lm_head ? &g->lm_head->params[0] : &g->wte->params[0];
}

/* Logits of every row, or when decoding with kv->last_only of the last.
 * Under bf16 autocast they are written in bf16, as torch's autocast leaves
 * them: half the bytes of the largest activation, and what the loss then
 * reads and writes its gradient into (not when decoding: fp32 for sampling). */
int gpt_plain_head_forward(gpt_model *g, const fsc_ctx *ctx, gpt_saved *s, fsc_tensor *y) {
    const int B = (int)s->in.shape[0], C = g->cfg.d_model, V = g->cfg.vocab;
    const int T = ctx->kv && ctx->kv->last_only ? 1 : s->T;
    const float *in = (const float *)s->final.data + (size_t)(s->T - T) * C; /* batch 1 then */
    s->logits_bf16 = fsc_ctx_bf16_act(ctx) && !ctx->kv;
    *y = fsc_tensor_arena(ctx->arena, s->logits_bf16 ? FSC_DTYPE_BF16 : FSC_DTYPE_F32, 3,
                          (int64_t[]){B, T, V});
    if (!y->data) return FSC_ERR_NOMEM;
    if (s->logits_bf16)
        return fsc_matmul_forward_bf16_out(y->data, in, head_weight(g)->data, B * T, C, V,
                                           FSC_WEIGHT_OUT_IN);
    fsc_matmul_forward_prec(y->data, in, head_weight(g)->data, NULL, B * T, C, V, FSC_WEIGHT_OUT_IN,
                            fsc_ctx_prec(ctx));
    return FSC_OK;
}

/* The head weight's gradient now or, for a zero-bubble schedule's W, later. */
int gpt_plain_head_backward(gpt_model *g, const fsc_ctx *ctx, gpt_saved *s, const fsc_tensor *dy,
                            fsc_tensor *dfin) {
    const int B = (int)s->in.shape[0], T = s->T, C = g->cfg.d_model, V = g->cfg.vocab;
    fsc_param *wte = head_weight(g);
    *dfin = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!dfin->data) return FSC_ERR_NOMEM;
    const fsc_gemm_prec prec = fsc_ctx_prec(ctx);
    float *dw = ctx->defer || wte->frozen ? NULL : wte->grad;
    const float *dout = dy->data;
    if (dy->dtype == FSC_DTYPE_BF16) { /* the loss's gradient of bf16 logits */
        int rc = fsc_matmul_backward_bf16_dout(dfin->data, dw, dy->data, s->final.data, wte->data,
                                               B * T, C, V, FSC_WEIGHT_OUT_IN);
        if (rc || !ctx->defer || wte->frozen) return rc;
        /* the deferred weight gradient reads dy later, in fp32: its exact
         * widening, kept in the arena with the GEMM's other operands */
        float *w = fsc_arena_alloc(ctx->arena, (size_t)B * T * V * sizeof(float));
        if (!w) return FSC_ERR_NOMEM;
        fsc_widen_bf16(w, dy->data, (int64_t)B * T * V);
        dout = w;
    } else {
        fsc_matmul_backward_prec(dfin->data, dw, NULL, dout, s->final.data, wte->data, B * T, C, V,
                                 FSC_WEIGHT_OUT_IN, prec);
    }
    if (!ctx->defer || wte->frozen) return FSC_OK;
    return fsc_deferred_matmul_prec(ctx->defer, wte->grad, NULL, dout, s->final.data, wte->data,
                                    B * T, C, V, FSC_WEIGHT_OUT_IN, prec);
}

static const gpt_layout_ops plain_layout = {
    .kind = "GPT",
    .stage_kind = "GPTStage",
    .label = "GPT",
    .block_fmt = "h.%d",
    .decodes = true,
    .wte = plain_wte,
    .wpe = plain_wpe,
    .drop = plain_drop,
    .block = plain_block,
    .ln_f = plain_ln_f,
    .width = plain_width,
    GPT_PLAIN_ENDS,
};

/* The one-process layout of cfg's family. */
static const gpt_layout_ops *family(const fsc_gpt_config *cfg) {
    return cfg->arch == FSC_ARCH_LLAMA ? &gpt_llama_layout : &plain_layout;
}

fsc_module *fsc_gpt_new(const fsc_gpt_config *cfg) {
    if (fsc_gpt_config_check(cfg)) return NULL;
    return gpt_model_new(cfg, 0, fsc_gpt_num_parts(cfg), family(cfg), NULL, false, 1, cfg->vocab);
}

fsc_module *fsc_gpt_stage_new(const fsc_gpt_config *cfg, int first, int end) {
    int pf, pe;
    if (fsc_gpt_config_check(cfg) ||
        fsc_gpt_parts_of_layers(cfg, first, end, "GPT stage", &pf, &pe))
        return NULL;
    return fsc_gpt_stage_parts_new(cfg, pf, pe);
}

fsc_module *fsc_gpt_stage_parts_new(const fsc_gpt_config *cfg, int first, int end) {
    if (fsc_gpt_config_check(cfg) || moe_refuse(cfg->moe, "fsc_gpt_stage_new (pipeline stages)"))
        return NULL;
    return gpt_model_new(cfg, first, end, family(cfg), NULL, true, 1, cfg->vocab);
}

/* ---- training and evaluation in one process -------------------------------------------------- */

int64_t gpt_count_targets(const int32_t *y, int64_t n, int ignore_index) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += y[i] != ignore_index;
    return c;
}

static int gpt_loss(fsc_module *m, const fsc_ctx *ctx, const int32_t *x, const int32_t *y, int B,
                    int T, int ignore_index, double norm, float *loss, bool train) {
    fsc_tensor ids = fsc_tensor_2d((void *)x, FSC_DTYPE_I32, B, T), logits;
    fsc_tensor targets = fsc_tensor_2d((void *)y, FSC_DTYPE_I32, B, T);
    void *saved = NULL;
    int rc = fsc_module_forward(m, ctx, &ids, &logits, &saved);
    if (!rc) rc = fsc_cross_entropy(loss, &logits, &targets, ignore_index, norm, ctx->arena);
    if (rc || !train) return rc;
    return fsc_module_backward(m, ctx, saved, &logits, NULL); /* logits now hold dloss/dlogits */
}

int fsc_gpt_train_micro(fsc_module *m, const fsc_ctx *ctx, const int32_t *x, const int32_t *y,
                        int B, int T, int ignore_index, double norm, float *loss) {
    if (!(norm > 0)) return fsc_error(FSC_ERR_INVALID, "loss normaliser %g must be > 0", norm);
    fsc_moe_set_loss_norm(m, norm); /* l_aux's rows weigh as the loss's tokens */
    return gpt_loss(m, ctx, x, y, B, T, ignore_index, norm, loss, true);
}

int fsc_gpt_eval_loss(fsc_module *m, const fsc_ctx *ctx, const int32_t *x, const int32_t *y, int B,
                      int T, int ignore_index, float *loss) {
    fsc_ctx eval = *ctx;
    eval.training = false;
    int64_t n = gpt_count_targets(y, (int64_t)B * T, ignore_index);
    if (!n) return fsc_error(FSC_ERR_INVALID, "eval loss: every target is ignore_index");
    return gpt_loss(m, &eval, x, y, B, T, ignore_index, (double)n, loss, false);
}
