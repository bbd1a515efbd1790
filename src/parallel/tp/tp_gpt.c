/* The GPT's tensor-parallel layout: src/nn/gpt.c's one model (the whole
 * of it, or any pipeline stage's range of parts) over TP layers. What this
 * file adds are the layers it makes and the two ends:
 *
 * - wte is vocab-parallel and also the tied LM head, so the head is a
 *   column-parallel matmul over this rank's vocabulary rows and its logits
 *   go to fsc_tp_cross_entropy without being gathered; or, when the caller
 *   passes the targets (fsc_ctx.head_loss: fsc_tp_gpt_train_micro, or the
 *   pipeline to its last stage), the head runs fused with the loss over
 *   chunks of rows (tp_head.c) and the logits never exist whole. The fused
 *   head fills its (1,) loss in forward when evaluating, else first thing
 *   in backward, so that every gradient is written inside backward (as
 *   wrappers expect: ShardedDDP commits gradient memory at backward start).
 * - Under sequence parallelism the embedding leaves its TP region by
 *   reduce-scatter (a (B, T/t, C) shard), blocks and ln_f run on shards,
 *   and the head enters a region again by sequence gather. wpe is
 *   replicated; its gradient from a shard of positions is summed over the
 *   group in backward. The embedding sum (a row of wte plus zeros from the
 *   other ranks) is exact, so the embedded tokens are the one-process ones
 *   bit for bit.
 *
 * What crosses a stage boundary is what flows between the layers: the
 * (B,T,C) activation, equal on every TP rank, or under SP this rank's
 * sequence shard; inside a block's MLP the residual and this rank's GELU
 * columns, (B,T,C + 4C/t). Each TP rank sends its own to the same TP rank
 * of the next stage, so the pipeline needs no TP collective of its own. */
#include <stdio.h>
#include <string.h>

#include "nn/gpt_internal.h"
#include "nn/moe_internal.h"
#include "tp_internal.h"

const char TP_KIND_STAGE[] = "TensorParallelGPTStage";

static tp_ends *ends_of(const gpt_model *g) {
    return g->st;
}

/* ---- the layers ------------------------------------------------------------------------------ */

static fsc_module *tp_wte(void *st, const fsc_gpt_config *c) {
    return fsc_tp_embedding_new("wte", c->vocab, c->d_model, 0.02f, &((tp_ends *)st)->opt);
}

static fsc_module *tp_wpe(void *st, const fsc_gpt_config *c) {
    (void)st; /* replicated: every rank adds the rows of the positions it holds */
    return fsc_embedding_new("wpe", c->seq, c->d_model, 0.02f);
}

static fsc_module *tp_drop(void *st, const fsc_gpt_config *c) {
    return fsc_tp_dropout_new("drop", c->dropout, 0, &((tp_ends *)st)->opt);
}

static fsc_module *tp_block(void *st, const fsc_gpt_config *c, const char *name, int b, int from,
                            int to) {
    const fsc_tp_options *opt = &((tp_ends *)st)->opt;
    if (from == FSC_BLOCK_ATTN && to == FSC_BLOCK_SEGMENTS)
        return fsc_tp_block_new(name, c->d_model, c->heads, c->dropout, (uint32_t)b, c->layers,
                                opt);
    return tp_block_part_new(name, c->d_model, c->heads, c->dropout, (uint32_t)b, c->layers, from,
                             to, opt);
}

static fsc_module *tp_ln_f(void *st, const fsc_gpt_config *c) {
    return fsc_tp_layernorm_new("ln_f", c->d_model, 1e-5f, &((tp_ends *)st)->opt);
}

int fsc_tp_gpt_part_width(const fsc_gpt_config *cfg, int t, int part) {
    const bool proj = part >= 1 && part <= 3 * cfg->layers && (part - 1) % 3 == FSC_BLOCK_PROJ;
    /* inside an MLP: the residual, then this rank's GELU or SwiGLU-product columns */
    const int F = cfg->arch == FSC_ARCH_LLAMA ? fsc_gpt_ffn_hidden(cfg) : 4 * cfg->d_model;
    return proj && t > 0 ? cfg->d_model + F / t : cfg->d_model;
}

static int tp_width(void *st, const fsc_gpt_config *c, int p) {
    return fsc_tp_gpt_part_width(c, ((tp_ends *)st)->tp.size, p);
}

/* ---- the embedding --------------------------------------------------------------------------- */

/* The global position of row i of the rows held: from t0 (a sequence
 * shard's first), or under context parallelism in fsc_ctx.seq's runs. */
static int64_t position(const fsc_ctx *ctx, int i, int t0) {
    const fsc_seq_split *q = ctx->seq;
    return q ? q->pos0[i / q->len] + i % q->len : t0 + i;
}

/* This rank's wte rows, summed over the group (or the sequence shard of
 * the sum), plus wpe's rows of the positions held. */
int tp_gpt_embed_forward(gpt_model *g, const fsc_ctx *ctx, const fsc_tensor *ids, fsc_tensor *e) {
    const tp_ends *t = ends_of(g);
    const int B = (int)ids->shape[0], T = (int)ids->shape[1], C = g->cfg.d_model;
    fsc_tensor part = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!part.data) return FSC_ERR_NOMEM;
    tp_vocab_lookup(part.data, ids->data, (int64_t)B * T, g->wte->params[0].data, t->first,
                    t->count, C);
    int rc = tp_leave_forward(&t->tp, ctx->arena, &part, e);
    if (rc || !g->wpe) return rc; /* LLaMA: positions are rotary, inside attention */
    const int S = (int)e->shape[1], t0 = t->tp.sp ? t->tp.rank * S : 0;
    const float *wpe = g->wpe->params[0].data;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++)
            fsc_add_inplace((float *)e->data + ((int64_t)b * S + i) * C,
                            wpe + position(ctx, i, t0) * C, C);
    return FSC_OK;
}

/* wpe's rows from de (B,S,C), the gradient at the embedding's output,
 * summed over the group under SP, where each rank has other positions (the
 * sum is exact, one non-zero term per element). */
static int wpe_backward(gpt_model *g, const fsc_ctx *ctx, const gpt_saved *s,
                        const fsc_tensor *de) {
    const tp_ends *t = ends_of(g);
    const int B = (int)de->shape[0], S = (int)de->shape[1], C = g->cfg.d_model, T = s->T;
    const int t0 = t->tp.sp ? t->tp.rank * S : 0;
    float *dwpe = g->wpe->params[0].grad;
    if (t->tp.sp && !(dwpe = fsc_arena_calloc(ctx->arena, (size_t)T * C * sizeof(float))))
        return FSC_ERR_NOMEM;
    const float *d = de->data;
    for (int b = 0; b < B; b++) /* fsc_encoder_backward's order */
        for (int i = 0; i < S; i++)
            fsc_add_inplace(dwpe + position(ctx, i, t0) * C, d + ((int64_t)b * S + i) * C, C);
    return t->tp.sp ? tp_accumulate_replicated(&t->tp, g->wpe->params[0].grad, dwpe, (int64_t)T * C)
                    : FSC_OK;
}

/* From de: wpe's rows (a family with positions), then wte's rows of the
 * ids in this rank's range. */
int tp_gpt_embed_backward(gpt_model *g, const fsc_ctx *ctx, const gpt_saved *s,
                          const fsc_tensor *de) {
    const tp_ends *t = ends_of(g);
    const int B = (int)de->shape[0], C = g->cfg.d_model, T = s->T;
    int rc = g->wpe ? wpe_backward(g, ctx, s, de) : FSC_OK;
    fsc_tensor full;
    if (!rc) rc = tp_leave_backward(&t->tp, ctx->arena, de, &full);
    if (rc) return rc;
    tp_vocab_lookup_backward(g->wte->params[0].grad, full.data, s->in.data, (int64_t)B * T,
                             t->first, t->count, C);
    return FSC_OK;
}

/* ---- the head -------------------------------------------------------------------------------- */

/* The head's weight: this rank's rows of lm_head, or of wte when tied. */
static fsc_param *head_weight(gpt_model *g) {
    return g->lm_head ? &g->lm_head->params[0] : &g->wte->params[0];
}

/* The head and loss fused (tp_head.c) over ln_f's output: the loss into
 * *s->loss; in training also wte's gradient and *dfin. */
static int head_fused(gpt_model *g, const fsc_ctx *ctx, const gpt_saved *s, fsc_tensor *dfin) {
    const tp_ends *t = ends_of(g);
    double sum = 0;
    int rc = tp_head_loss(&t->tp, ctx, &s->final, head_weight(g), t->first, t->count, t->vp, &s->hl,
                          &sum, dfin);
    if (!rc) *s->loss = (float)(sum / s->hl.norm);
    return rc;
}

int tp_gpt_head_forward(gpt_model *g, const fsc_ctx *ctx, gpt_saved *s, fsc_tensor *y) {
    const tp_ends *t = ends_of(g);
    const int B = (int)s->in.shape[0], T = s->T, C = g->cfg.d_model;
    int rc;
    if (ctx->head_loss) { /* y: the (1,) loss, now when evaluating, else by backward */
        rc = tp_head_loss_keep(&t->tp, ctx, (int64_t)B * T, g->cfg.vocab, &s->hl, y, &s->loss);
        if (rc) return rc;
        s->fused = true;
        return ctx->training ? FSC_OK : head_fused(g, ctx, s, NULL);
    }
    *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, t->vp});
    if (!y->data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor fin;
    if ((rc = tp_enter_forward(&t->tp, ctx->arena, &s->final, &fin))) return rc;
    fsc_matmul_forward_prec(y->data, fin.data, head_weight(g)->data, NULL, B * T, C, t->vp,
                            FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    fsc_arena_release(ctx->arena, mark);
    return FSC_OK;
}

/* Fused: dy is d(total)/d(loss), and the loss was differentiated at 1/norm,
 * so only 1 is meaningful. Unfused: d(final) from the logits' gradient
 * (this rank's vocabulary part, then summed over the group: Megatron's f),
 * and wte's rows' gradient now or, for a zero-bubble schedule's W, later. */
int tp_gpt_head_backward(gpt_model *g, const fsc_ctx *ctx, gpt_saved *s, const fsc_tensor *dy,
                         fsc_tensor *dfin) {
    const tp_ends *t = ends_of(g);
    if (s->fused) {
        int rc = tp_head_loss_check_dy(&t->tp, dy);
        return rc ? rc : head_fused(g, ctx, s, dfin);
    }
    const int B = (int)s->in.shape[0], T = s->T, C = g->cfg.d_model;
    fsc_param *wte = head_weight(g);
    *dfin = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!dfin->data) return FSC_ERR_NOMEM;
    /* the gathered input stays until W when the weight gradient is deferred */
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor fin;
    int rc = tp_enter_forward(&t->tp, ctx->arena, &s->final, &fin);
    if (rc) return rc;
    const fsc_gemm_prec prec = fsc_ctx_prec(ctx);
    fsc_matmul_backward_prec(dfin->data, ctx->defer ? NULL : wte->grad, NULL, dy->data, fin.data,
                             wte->data, B * T, C, t->vp, FSC_WEIGHT_OUT_IN, prec);
    if (ctx->defer)
        rc = fsc_deferred_matmul_prec(ctx->defer, wte->grad, NULL, dy->data, fin.data, wte->data,
                                      B * T, C, t->vp, FSC_WEIGHT_OUT_IN, prec);
    else
        fsc_arena_release(ctx->arena, mark);
    return rc ? rc : tp_enter_backward(&t->tp, ctx->arena, dfin); /* f / scatter */
}

static const gpt_layout_ops tp_layout = {
    .label = "TP GPT",
    .block_fmt = "h.%d",
    .wte = tp_wte,
    .wpe = tp_wpe,
    .drop = tp_drop,
    .block = tp_block,
    .ln_f = tp_ln_f,
    .width = tp_width,
    TP_GPT_ENDS,
    .free_state = free,
};

/* ---- construction ---------------------------------------------------------------------------- */

static const fsc_module_ops ends_ops = {"TensorParallelGPTEnds", NULL, NULL, NULL};

/* Parts [first, end) over the TP group of tp, after the checks every
 * constructor shares; `who` names the caller in errors. */
static fsc_module *tp_gpt_range(const fsc_gpt_config *cfg, int first, int end,
                                const fsc_tp_options *tp, bool stage, const char *who) {
    if (!cfg) {
        fsc_error(FSC_ERR_INVALID, "%s: cfg is NULL", who);
        return NULL;
    }
    char what[80];
    snprintf(what, sizeof what, "%s (tensor parallelism)", who);
    if (fsc_gpt_config_check(cfg) || moe_refuse(cfg->moe, what)) return NULL;
    const bool llama = cfg->arch == FSC_ARCH_LLAMA;
    tp_ends *t = tp_module_alloc(sizeof *t, &ends_ops, "gpt", tp);
    if (!t) return NULL;
    t->opt = *tp;
    const int kv = cfg->kv_heads ? cfg->kv_heads : cfg->heads;
    if (cfg->heads % t->tp.size || cfg->d_model % t->tp.size || (llama && kv % t->tp.size)) {
        if (llama)
            fsc_error(FSC_ERR_INVALID,
                      "TP LLaMA: heads %d, key/value heads %d and d_model %d must be divisible by "
                      "the tensor-parallel size %d (key/value heads are split over the group, "
                      "not replicated: choose --tp dividing --kv-heads)",
                      cfg->heads, kv, cfg->d_model, t->tp.size);
        else
            fsc_error(FSC_ERR_INVALID,
                      "TP GPT: heads %d and d_model %d must be divisible by the tensor-parallel "
                      "size %d",
                      cfg->heads, cfg->d_model, t->tp.size);
        free(t);
        return NULL;
    }
    if (llama && (tp->recompute_attention || tp->recompute_activation)) {
        fsc_error(FSC_ERR_UNSUPPORTED,
                  "TP LLaMA: recompute_attention and recompute_activation are GPT-2's TP "
                  "options (use activation checkpointing of whole decoder layers instead)");
        free(t);
        return NULL;
    }
    fsc_tp_vocab_range(cfg->vocab, t->tp.size, t->tp.rank, &t->first, &t->count, &t->vp);
    return gpt_model_new(cfg, first, end, llama ? &tp_llama_layout : &tp_layout, t, stage,
                         t->tp.sp ? t->tp.size : 1, t->vp);
}

fsc_module *fsc_tp_gpt_new(const fsc_gpt_config *cfg, const fsc_tp_options *tp) {
    return tp_gpt_range(cfg, 0, cfg ? fsc_gpt_num_parts(cfg) : 0, tp, false, "fsc_tp_gpt_new");
}

fsc_module *fsc_tp_gpt_stage_new(const fsc_gpt_config *cfg, int first, int end,
                                 const fsc_tp_options *tp) {
    int pf, pe;
    if (!cfg) {
        fsc_error(FSC_ERR_INVALID, "fsc_tp_gpt_stage_new: cfg is NULL");
        return NULL;
    }
    if (fsc_gpt_config_check(cfg) ||
        fsc_gpt_parts_of_layers(cfg, first, end, "TP GPT stage", &pf, &pe))
        return NULL;
    return tp_gpt_range(cfg, pf, pe, tp, true, "fsc_tp_gpt_stage_new");
}

fsc_module *fsc_tp_gpt_stage_parts_new(const fsc_gpt_config *cfg, int first, int end,
                                       const fsc_tp_options *tp) {
    return tp_gpt_range(cfg, first, end, tp, true, "fsc_tp_gpt_stage_parts_new");
}

/* ---- training and evaluation of the whole TP model ------------------------------------------- */

static int gpt_loss(fsc_module *m, const fsc_ctx *ctx, const int32_t *x, const int32_t *y, int B,
                    int T, int ignore_index, double norm, float *loss, bool train) {
    /* m may be a wrapper (DDP, ShardedDDP) around the GPT */
    gpt_model *g = gpt_model_find(m, TP_KIND_GPT);
    if (!g || !ctx || !x || !y || !loss)
        return fsc_error(FSC_ERR_INVALID, "TP GPT loss: NULL argument or a module that "
                                          "fsc_tp_gpt_new did not make (nor wraps)");
    fsc_tensor ids = fsc_tensor_2d((void *)x, FSC_DTYPE_I32, B, T), out;
    void *saved = NULL;
    fsc_ctx plain = *ctx; /* what the modules below the head see, and backward */
    plain.head_loss = NULL;
    if (ctx->defer) { /* weight gradients wait: the head runs unfused, on whole logits */
        fsc_tensor targets = fsc_tensor_2d((void *)y, FSC_DTYPE_I32, B, T);
        int rc = fsc_module_forward(m, &plain, &ids, &out, &saved);
        if (!rc)
            rc = fsc_tp_cross_entropy(loss, &out, &targets, g->cfg.vocab, ignore_index, norm,
                                      ends_of(g)->tp.g, ctx->arena);
        if (rc || !train) return rc;
        return fsc_module_backward(m, &plain, saved, &out, NULL); /* out holds dloss/dlogits */
    }
    const fsc_head_loss hl = {.targets = y, .ignore_index = ignore_index, .norm = norm};
    fsc_ctx fused = plain;
    fused.head_loss = &hl;
    int rc = fsc_module_forward(m, &fused, &ids, &out, &saved);
    if (!rc && train) {  /* the head and loss run first thing in backward */
        float one = 1.f; /* d(loss)/d(loss) */
        fsc_tensor dl = fsc_tensor_1d(&one, FSC_DTYPE_F32, 1);
        rc = fsc_module_backward(m, &plain, saved, &dl, NULL);
    }
    if (!rc) *loss = *(const float *)out.data;
    return rc;
}

int fsc_tp_gpt_train_micro(fsc_module *m, const fsc_ctx *ctx, const int32_t *x, const int32_t *y,
                           int B, int T, int ignore_index, double norm, float *loss) {
    if (!(norm > 0)) return fsc_error(FSC_ERR_INVALID, "loss normaliser %g must be > 0", norm);
    return gpt_loss(m, ctx, x, y, B, T, ignore_index, norm, loss, true);
}

int fsc_tp_gpt_eval_loss(fsc_module *m, const fsc_ctx *ctx, const int32_t *x, const int32_t *y,
                         int B, int T, int ignore_index, float *loss) {
    if (!ctx || !y) return fsc_error(FSC_ERR_INVALID, "TP GPT eval loss: NULL argument");
    fsc_ctx eval = *ctx;
    eval.training = false;
    int64_t n = gpt_count_targets(y, (int64_t)B * T, ignore_index);
    if (!n) return fsc_error(FSC_ERR_INVALID, "eval loss: every target is ignore_index");
    return gpt_loss(m, &eval, x, y, B, T, ignore_index, (double)n, loss, false);
}
