/* GPT-2: token + position embedding, L pre-LN blocks, final LayerNorm, and an
 * LM head tied to wte. The embeddings and the head call kernels directly on
 * the wte/wpe parameters (the tie needs one table in two places); the blocks
 * and ln_f are children called through the module contract. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "layers_internal.h"
#include "fsc/gpt.h"
#include "fsc/moe.h"

typedef struct {
    fsc_module base;
    fsc_gpt_config cfg;
    fsc_module *wte, *wpe, *drop, *ln_f;
    fsc_module **h;
} gpt;

typedef struct {
    fsc_tensor ids;
    void *drop, *ln_f;
    void **h;
    fsc_tensor final; /* ln_f output: input of the head */
} gpt_saved;

static int gpt_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    gpt *g = (gpt *)m;
    const fsc_gpt_config *c = &g->cfg;
    if (x->dtype != FSC_DTYPE_I32 || x->ndim != 2 || x->shape[1] > c->seq || x->shape[1] < 1)
        return fsc_error(FSC_ERR_SHAPE, "GPT: expected int32 (B,T) ids with 1 <= T <= %d", c->seq);
    int B = (int)x->shape[0], T = (int)x->shape[1], C = c->d_model, V = c->vocab;
    const int32_t *ids = x->data;
    for (int64_t i = 0; i < (int64_t)B * T; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return fsc_error(FSC_ERR_INVALID, "GPT: token %d at position %lld outside vocab [0,%d)",
                             ids[i], (long long)i, V);
    gpt_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    s->ids = *x;
    s->h = fsc_arena_alloc(ctx->arena, sizeof(void *) * (size_t)c->layers);
    fsc_tensor e = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!s->h || !e.data) return FSC_ERR_NOMEM;
    fsc_encoder_forward(e.data, ids, g->wte->params[0].data, g->wpe->params[0].data, B, T, C);
    fsc_tensor cur;
    int rc = fsc_module_forward(g->drop, ctx, &e, &cur, &s->drop);
    for (int l = 0; !rc && l < c->layers; l++) {
        fsc_tensor next;
        rc = fsc_module_forward(g->h[l], ctx, &cur, &next, &s->h[l]);
        cur = next;
    }
    if (!rc) rc = fsc_module_forward(g->ln_f, ctx, &cur, &s->final, &s->ln_f);
    if (rc) return rc;
    *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, V});
    if (!y->data) return FSC_ERR_NOMEM;
    fsc_matmul_forward_prec(y->data, s->final.data, g->wte->params[0].data, NULL, B * T, C, V,
                            FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    *saved = s;
    return FSC_OK;
}

static int gpt_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    (void)dx; /* token ids have no gradient */
    gpt *g = (gpt *)m;
    gpt_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    int B = (int)s->ids.shape[0], T = (int)s->ids.shape[1], C = g->cfg.d_model, V = g->cfg.vocab;
    if ((rc = fsc_module_check_dy(m, dy, 3, (int64_t[]){B, T, V}))) return rc;
    fsc_param *wte = &g->wte->params[0];
    fsc_tensor dfinal = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    if (!dfinal.data) return FSC_ERR_NOMEM;
    fsc_matmul_backward_prec(dfinal.data, wte->grad, NULL, dy->data, s->final.data, wte->data,
                             B * T, C, V, FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    fsc_tensor cur;
    rc = fsc_module_backward(g->ln_f, ctx, s->ln_f, &dfinal, &cur);
    /* the two (B,T,C) buffers the blocks' input gradients alternate in */
    fsc_tensor pingpong[2] = {dfinal, cur};
    if (!rc) rc = fsc_blocks_backward(g->h, s->h, g->cfg.layers, ctx, &cur, pingpong);
    fsc_tensor de;
    if (!rc) rc = fsc_module_backward(g->drop, ctx, s->drop, &cur, &de);
    if (rc) return rc;
    fsc_encoder_backward(wte->grad, g->wpe->params[0].grad, de.data, s->ids.data, B, T, C);
    return FSC_OK;
}

static void gpt_free(fsc_module *m) {
    gpt *g = (gpt *)m;
    free(g->h);
    free(g);
}

static const fsc_module_ops gpt_ops = {"GPT", gpt_forward, gpt_backward, gpt_free};

int fsc_gpt_config_check(const fsc_gpt_config *c) {
    if (c->vocab < 2) return fsc_error(FSC_ERR_INVALID, "vocab %d must be at least 2", c->vocab);
    if (c->seq < 1) return fsc_error(FSC_ERR_INVALID, "seq %d must be positive", c->seq);
    if (c->layers < 1) return fsc_error(FSC_ERR_INVALID, "layers %d must be positive", c->layers);
    if (c->d_model < 1)
        return fsc_error(FSC_ERR_INVALID, "d_model %d must be positive", c->d_model);
    if (c->heads < 1 || c->d_model % c->heads)
        return fsc_error(FSC_ERR_INVALID, "heads %d must divide d_model %d", c->heads, c->d_model);
    if (!(c->dropout >= 0.f && c->dropout < 1.f))
        return fsc_error(FSC_ERR_INVALID, "dropout %g must be in [0, 1)", (double)c->dropout);
    if (c->moe && c->moe->experts) return fsc_moe_check(c->moe);
    return FSC_OK;
}

/* Whether block l's MLP is an MoE layer under cfg. */
static bool moe_block(const fsc_gpt_config *c, int l) {
    const fsc_moe_options *o = c->moe;
    return o && o->experts && (l + 1) % (o->every > 0 ? o->every : 1) == 0;
}

/* Replaces block l's dense MLP (child 3, "mlp") by an MoE layer with the
 * same dropout key and initialisation. */
static int moe_swap(fsc_module *block, const fsc_gpt_config *c, int l) {
    if (!moe_block(c, l)) return FSC_OK;
    const float proj_std = 0.02f / sqrtf(2.0f * (float)c->layers); /* as fsc_block_new's */
    fsc_module *m =
        fsc_moe_new("mlp", c->d_model, c->moe, c->dropout, (uint32_t)(2 * l + 2), 0.02f, proj_std);
    if (!m) return FSC_ERR_INVALID;
    fsc_module_free(block->children[3]);
    block->children[3] = m;
    m->parent = block;
    return FSC_OK;
}

fsc_module *fsc_gpt_new(const fsc_gpt_config *cfg) {
    if (fsc_gpt_config_check(cfg)) return NULL;
    gpt *g = fsc_module_alloc(sizeof *g, &gpt_ops, "gpt");
    if (!g) return NULL;
    g->cfg = *cfg;
    g->h = calloc((size_t)cfg->layers, sizeof *g->h);
    int rc = g->h ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "out of memory creating GPT");
    /* Children in the order Hugging Face lists them: wte, wpe, drop, h.0..h.L-1, ln_f. */
    fsc_module **slots[] = {&g->wte, &g->wpe, &g->drop};
    fsc_module *made[] = {fsc_embedding_new("wte", cfg->vocab, cfg->d_model, 0.02f),
                          fsc_embedding_new("wpe", cfg->seq, cfg->d_model, 0.02f),
                          fsc_dropout_new("drop", cfg->dropout, 0)};
    for (int i = 0; i < 3; i++) {
        *slots[i] = made[i];
        if (made[i] && i < 2) made[i]->params_used_by_parent = true; /* wte, wpe */
        if (!rc)
            rc = made[i] ? fsc_module_add_child(&g->base, made[i]) : FSC_ERR_INVALID;
        else
            fsc_module_free(made[i]);
    }
    for (int l = 0; !rc && l < cfg->layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "h.%d", l);
        g->h[l] =
            fsc_block_new(name, cfg->d_model, cfg->heads, cfg->dropout, (uint32_t)l, cfg->layers);
        rc = g->h[l] ? fsc_module_add_child(&g->base, g->h[l]) : FSC_ERR_INVALID;
        if (!rc) rc = moe_swap(g->h[l], cfg, l);
    }
    if (!rc) {
        g->ln_f = fsc_layernorm_new("ln_f", cfg->d_model, 1e-5f);
        rc = g->ln_f ? fsc_module_add_child(&g->base, g->ln_f) : FSC_ERR_INVALID;
    }
    if (rc) {
        fsc_module_free(&g->base);
        return NULL;
    }
    return &g->base;
}

/* Parameters of the MoE blocks beyond a dense MLP's, counting `experts`
 * experts per layer (all of them, or the two a token meets). */
static int64_t moe_extra_params(const fsc_gpt_config *c, int64_t experts) {
    int64_t C = c->d_model, H = c->moe && c->moe->hidden ? c->moe->hidden : 4 * C, n = 0;
    for (int l = 0; l < c->layers; l++)
        if (moe_block(c, l))
            n += c->moe->experts * C + experts * (2 * C * H + H + C) - (8 * C * C + 5 * C);
    return n;
}

int64_t fsc_gpt_num_params(const fsc_gpt_config *c) {
    int64_t C = c->d_model;
    int64_t per_block = 12 * C * C + 13 * C;
    return (int64_t)c->vocab * C + (int64_t)c->seq * C + c->layers * per_block + 2 * C +
           moe_extra_params(c, c->moe ? c->moe->experts : 0);
}

double fsc_gpt_flops_per_token(const fsc_gpt_config *c, int T) {
    double n = (double)fsc_gpt_num_params(c) - (double)c->seq * c->d_model;
    n += (double)(moe_extra_params(c, 2) - moe_extra_params(c, c->moe ? c->moe->experts : 0));
    return 6.0 * n + 12.0 * c->layers * (double)c->d_model * T;
}

/* Counts targets that are not ignore_index: the normaliser of a batch's mean. */
static int64_t count_targets(const int32_t *y, int64_t n, int ignore_index) {
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
    int64_t n = count_targets(y, (int64_t)B * T, ignore_index);
    if (!n) return fsc_error(FSC_ERR_INVALID, "eval loss: every target is ignore_index");
    return gpt_loss(m, &eval, x, y, B, T, ignore_index, (double)n, loss, false);
}
