/* The tensor-parallel GPT: fsc_gpt_new's architecture and names over TP
 * layers. wte is vocab-parallel and serves as the tied LM head, so the head
 * is a column-parallel matmul over this rank's vocabulary rows and its
 * logits go to fsc_tp_cross_entropy without being gathered.
 *
 * Under sequence parallelism the embedding leaves its TP region by
 * reduce-scatter (a (B, T/t, C) shard), blocks and ln_f run on shards, and
 * the head enters a region again by sequence gather. wpe is replicated; its
 * gradient from a shard of positions is summed over the group in backward.
 * The embedding sum (a row of wte plus zeros from the other ranks) is exact,
 * so the embedded tokens are the one-process ones bit for bit.
 *
 * fsc_tp_gpt_train_micro and eval_loss run the head fused with its loss
 * (tp_head.c): they pass the targets in fsc_ctx.head_loss, through any
 * wrapper, and forward then outputs a (1,) loss instead of logits, which
 * the head fills when it runs: in forward when evaluating, else first thing
 * in backward, so that every gradient is written inside backward (as
 * wrappers expect: ShardedDDP commits gradient memory at backward start). */
#include <stdio.h>
#include <string.h>

#include "nn/layers_internal.h"
#include "nn/moe_internal.h"
#include "tp_internal.h"

typedef struct {
    tp_module tp;
    fsc_gpt_config cfg;
    fsc_module *wte, *wpe, *drop, *ln_f;
    fsc_module **h;
    int first, count, vp; /* this rank's vocabulary rows */
} tp_gpt;

typedef struct {
    fsc_tensor ids;
    void *drop, *ln_f;
    void **h;
    fsc_tensor final; /* ln_f's output (a shard under SP): the head's input */
    /* fsc_ctx.head_loss: the head runs with its loss, in forward when
     * evaluating, else first thing in backward (where wrappers expect
     * gradients to be written: ShardedDDP commits their memory then) */
    bool fused;
    fsc_head_loss hl; /* its targets copied: the caller's need not outlive forward */
    float *loss;      /* the (1,) output, filled by backward in training */
} tp_gpt_saved;

/* The head and loss fused (tp_head.c) over ln_f's output: the loss into
 * s->loss; in training also dW and the gradient at the head's input. */
static int head_fused(tp_gpt *g, const fsc_ctx *ctx, const tp_gpt_saved *s, fsc_tensor *dfin) {
    double sum = 0;
    int rc = tp_head_loss(&g->tp, ctx, &s->final, &g->wte->params[0], g->first, g->count, g->vp,
                          &s->hl, &sum, dfin);
    if (!rc) *s->loss = (float)(sum / s->hl.norm);
    return rc;
}

/* Fused: y is the (1,) loss, computed now when evaluating, by backward in
 * training; the targets are checked now either way. */
static int forward_fused(tp_gpt *g, const fsc_ctx *ctx, tp_gpt_saved *s, fsc_tensor *y) {
    int rc = tp_head_loss_keep(&g->tp, ctx, fsc_tensor_numel(&s->ids), g->cfg.vocab, &s->hl, y,
                               &s->loss);
    if (rc) return rc;
    s->fused = true;
    return ctx->training ? FSC_OK : head_fused(g, ctx, s, NULL);
}

static int gpt_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    tp_gpt *g = (tp_gpt *)m;
    const fsc_gpt_config *c = &g->cfg;
    const int t = g->tp.size;
    if (x->dtype != FSC_DTYPE_I32 || x->ndim != 2 || x->shape[1] > c->seq || x->shape[1] < 1)
        return fsc_error(FSC_ERR_SHAPE, "TP GPT: expected int32 (B,T) ids with 1 <= T <= %d",
                         c->seq);
    int B = (int)x->shape[0], T = (int)x->shape[1], C = c->d_model;
    if (g->tp.sp && T % t)
        return fsc_error(FSC_ERR_SHAPE,
                         "TP GPT: sequence parallelism over %d ranks needs T divisible by %d, "
                         "got T = %d",
                         t, t, T);
    const int32_t *ids = x->data;
    for (int64_t i = 0; i < (int64_t)B * T; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return fsc_error(FSC_ERR_INVALID,
                             "TP GPT: token %d at position %lld outside vocab [0,%d)", ids[i],
                             (long long)i, c->vocab);
    tp_gpt_saved *s = fsc_arena_calloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    s->ids = *x;
    s->h = fsc_arena_alloc(ctx->arena, sizeof(void *) * (size_t)c->layers);
    fsc_tensor part = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C}), e;
    if (!s->h || !part.data) return FSC_ERR_NOMEM;
    tp_vocab_lookup(part.data, ids, (int64_t)B * T, g->wte->params[0].data, g->first, g->count, C);
    int rc = tp_leave_forward(&g->tp, ctx->arena, &part, &e);
    if (rc) return rc;
    int S = (int)e.shape[1], t0 = g->tp.sp ? g->tp.rank * S : 0;
    const float *wpe = g->wpe->params[0].data;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++)
            fsc_add_inplace((float *)e.data + ((int64_t)b * S + i) * C, wpe + (int64_t)(t0 + i) * C,
                            C);
    fsc_tensor cur;
    rc = fsc_module_forward(g->drop, ctx, &e, &cur, &s->drop);
    for (int l = 0; !rc && l < c->layers; l++) {
        fsc_tensor next;
        rc = fsc_module_forward(g->h[l], ctx, &cur, &next, &s->h[l]);
        cur = next;
    }
    if (!rc) rc = fsc_module_forward(g->ln_f, ctx, &cur, &s->final, &s->ln_f);
    if (rc) return rc;
    *saved = s;
    if (ctx->head_loss && !ctx->defer) return forward_fused(g, ctx, s, y);
    *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, g->vp});
    if (!y->data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor fin;
    if ((rc = tp_enter_forward(&g->tp, ctx->arena, &s->final, &fin))) return rc;
    fsc_matmul_forward_prec(y->data, fin.data, g->wte->params[0].data, NULL, B * T, C, g->vp,
                            FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    fsc_arena_release(ctx->arena, mark);
    return FSC_OK;
}

/* wpe's gradient: rows t0 .. t0+S-1 from dE (B, S, C); under SP each rank
 * has other rows, so the (T, C) sum over the group is exact (one non-zero
 * term per element). */
static int wpe_backward(tp_gpt *g, const fsc_ctx *ctx, const fsc_tensor *de, int T) {
    int B = (int)de->shape[0], S = (int)de->shape[1], C = g->cfg.d_model;
    int t0 = g->tp.sp ? g->tp.rank * S : 0;
    float *dwpe = g->wpe->params[0].grad;
    if (g->tp.sp && !(dwpe = fsc_arena_calloc(ctx->arena, (size_t)T * C * sizeof(float))))
        return FSC_ERR_NOMEM;
    const float *d = de->data;
    for (int b = 0; b < B; b++) /* fsc_encoder_backward's order */
        for (int i = 0; i < S; i++)
            fsc_add_inplace(dwpe + (int64_t)(t0 + i) * C, d + ((int64_t)b * S + i) * C, C);
    if (!g->tp.sp) return FSC_OK;
    return tp_accumulate_replicated(&g->tp, g->wpe->params[0].grad, dwpe, (int64_t)T * C);
}

/* The unfused head's backward: dy is d(loss)/d(logits) (B, T, vp). */
static int head_backward(tp_gpt *g, const fsc_ctx *ctx, const tp_gpt_saved *s, const fsc_tensor *dy,
                         fsc_tensor *dfin) {
    int B = (int)s->ids.shape[0], T = (int)s->ids.shape[1], C = g->cfg.d_model;
    int rc = fsc_module_check_dy(&g->tp.base, dy, 3, (int64_t[]){B, T, g->vp});
    if (rc) return rc;
    fsc_param *wte = &g->wte->params[0];
    fsc_tensor fin;
    *dfin = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!dfin->data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    if ((rc = tp_enter_forward(&g->tp, ctx->arena, &s->final, &fin))) return rc;
    fsc_matmul_backward_prec(dfin->data, wte->grad, NULL, dy->data, fin.data, wte->data, B * T, C,
                             g->vp, FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    fsc_arena_release(ctx->arena, mark);
    return tp_enter_backward(&g->tp, ctx->arena, dfin); /* f / scatter */
}

/* The fused head's backward: dy is d(total)/d(loss), and the loss is
 * differentiated at 1/norm, so only 1 is meaningful. */
static int fused_backward(tp_gpt *g, const fsc_ctx *ctx, const tp_gpt_saved *s,
                          const fsc_tensor *dy, fsc_tensor *dfin) {
    int rc = tp_head_loss_check_dy(&g->tp, dy);
    return rc ? rc : head_fused(g, ctx, s, dfin);
}

static int gpt_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    (void)dx; /* token ids have no gradient */
    tp_gpt *g = (tp_gpt *)m;
    tp_gpt_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    int B = (int)s->ids.shape[0], T = (int)s->ids.shape[1], C = g->cfg.d_model;
    fsc_param *wte = &g->wte->params[0];
    fsc_tensor dfin;
    rc = s->fused ? fused_backward(g, ctx, s, dy, &dfin) : head_backward(g, ctx, s, dy, &dfin);
    if (rc) return rc;
    fsc_tensor cur;
    rc = fsc_module_backward(g->ln_f, ctx, s->ln_f, &dfin, &cur);
    fsc_tensor pingpong[2] = {dfin, cur};
    if (!rc) rc = fsc_blocks_backward(g->h, s->h, g->cfg.layers, ctx, &cur, pingpong);
    fsc_tensor de, full;
    if (!rc) rc = fsc_module_backward(g->drop, ctx, s->drop, &cur, &de);
    if (!rc) rc = wpe_backward(g, ctx, &de, T);
    if (!rc) rc = tp_leave_backward(&g->tp, ctx->arena, &de, &full);
    if (rc) return rc;
    tp_vocab_lookup_backward(wte->grad, full.data, s->ids.data, (int64_t)B * T, g->first, g->count,
                             C);
    return FSC_OK;
}

static void gpt_free(fsc_module *m) {
    tp_gpt *g = (tp_gpt *)m;
    free(g->h);
    free(g);
}

static const fsc_module_ops gpt_ops = {TP_KIND_GPT, gpt_forward, gpt_backward, gpt_free};

static int check_divisible(const fsc_gpt_config *c, int t) {
    if (c->heads % t || c->d_model % t)
        return fsc_error(FSC_ERR_INVALID,
                         "TP GPT: heads %d and d_model %d must be divisible by the "
                         "tensor-parallel size %d",
                         c->heads, c->d_model, t);
    return FSC_OK;
}

fsc_module *fsc_tp_gpt_new(const fsc_gpt_config *cfg, const fsc_tp_options *tp) {
    if (!cfg) {
        fsc_error(FSC_ERR_INVALID, "fsc_tp_gpt_new: cfg is NULL");
        return NULL;
    }
    if (fsc_gpt_config_check(cfg)) return NULL;
    if (moe_refuse(cfg->moe, "fsc_tp_gpt_new (tensor parallelism)")) return NULL;
    tp_gpt *g = tp_module_alloc(sizeof *g, &gpt_ops, "gpt", tp);
    if (!g) return NULL;
    g->cfg = *cfg;
    fsc_tp_vocab_range(cfg->vocab, g->tp.size, g->tp.rank, &g->first, &g->count, &g->vp);
    g->h = calloc((size_t)cfg->layers, sizeof *g->h);
    int rc = check_divisible(cfg, g->tp.size);
    if (!rc && !g->h) rc = fsc_error(FSC_ERR_NOMEM, "out of memory creating the TP GPT");
    /* Children in the order Hugging Face lists them: wte, wpe, drop, h.0..h.L-1, ln_f. */
    fsc_module **slots[] = {&g->wte, &g->wpe, &g->drop};
    fsc_module *made[3] = {NULL, NULL, NULL};
    if (!rc) {
        made[0] = fsc_tp_embedding_new("wte", cfg->vocab, cfg->d_model, 0.02f, tp);
        made[1] = fsc_embedding_new("wpe", cfg->seq, cfg->d_model, 0.02f);
        made[2] = fsc_tp_dropout_new("drop", cfg->dropout, 0, tp);
    }
    for (int i = 0; i < 3; i++) {
        *slots[i] = made[i];
        if (made[i] && i < 2) made[i]->params_used_by_parent = true; /* wte, wpe */
        if (!rc)
            rc = made[i] ? fsc_module_add_child(&g->tp.base, made[i]) : FSC_ERR_INVALID;
        else
            fsc_module_free(made[i]);
    }
    for (int l = 0; !rc && l < cfg->layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "h.%d", l);
        g->h[l] = fsc_tp_block_new(name, cfg->d_model, cfg->heads, cfg->dropout, (uint32_t)l,
                                   cfg->layers, tp);
        rc = g->h[l] ? fsc_module_add_child(&g->tp.base, g->h[l]) : FSC_ERR_INVALID;
    }
    if (!rc) {
        g->ln_f = fsc_tp_layernorm_new("ln_f", cfg->d_model, 1e-5f, tp);
        rc = g->ln_f ? fsc_module_add_child(&g->tp.base, g->ln_f) : FSC_ERR_INVALID;
    }
    if (rc) {
        fsc_module_free(&g->tp.base);
        return NULL;
    }
    return &g->tp.base;
}

static int64_t count_targets(const int32_t *y, int64_t n, int ignore_index) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += y[i] != ignore_index;
    return c;
}

static int gpt_loss(fsc_module *m, const fsc_ctx *ctx, const int32_t *x, const int32_t *y, int B,
                    int T, int ignore_index, double norm, float *loss, bool train) {
    fsc_module *inner = m; /* m may be a wrapper (DDP, ShardedDDP) around the GPT */
    while (inner && inner->ops->kind != TP_KIND_GPT) inner = inner->wraps;
    if (!inner || !ctx || !x || !y || !loss)
        return fsc_error(FSC_ERR_INVALID, "TP GPT loss: NULL argument or a module that "
                                          "fsc_tp_gpt_new did not make (nor wraps)");
    tp_gpt *g = (tp_gpt *)inner;
    fsc_tensor ids = fsc_tensor_2d((void *)x, FSC_DTYPE_I32, B, T), out;
    void *saved = NULL;
    fsc_ctx plain = *ctx; /* what the modules below the head see, and backward */
    plain.head_loss = NULL;
    if (ctx->defer) { /* weight gradients wait: the head runs unfused, on whole logits */
        fsc_tensor targets = fsc_tensor_2d((void *)y, FSC_DTYPE_I32, B, T);
        int rc = fsc_module_forward(m, &plain, &ids, &out, &saved);
        if (!rc)
            rc = fsc_tp_cross_entropy(loss, &out, &targets, g->cfg.vocab, ignore_index, norm,
                                      g->tp.g, ctx->arena);
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
    int64_t n = count_targets(y, (int64_t)B * T, ignore_index);
    if (!n) return fsc_error(FSC_ERR_INVALID, "eval loss: every target is ignore_index");
    return gpt_loss(m, &eval, x, y, B, T, ignore_index, (double)n, loss, false);
}
