/* Pre-LN transformer block (GPT-2): x + attn(ln_1(x)), then + mlp(ln_2(.)).
 * Children are named as in Hugging Face GPT-2: ln_1, attn, ln_2, mlp. The
 * block is two residual halves, x + f(ln(x)), each also offered alone (a
 * module of two children with the block's name) so a pipeline stage may end
 * between attention and MLP. */
#include <math.h>
#include <string.h>

#include "layers_internal.h"

typedef struct {
    void *ln, *f;
} half_saved;

/* y = x + f(ln(x)); x, y (B,T,C) */
static int residual_forward(fsc_module *ln, fsc_module *f, const fsc_ctx *ctx, const fsc_tensor *x,
                            fsc_tensor *y, half_saved *s) {
    fsc_tensor h, a;
    int rc = fsc_module_forward(ln, ctx, x, &h, &s->ln);
    if (!rc) rc = fsc_module_forward(f, ctx, &h, &a, &s->f);
    if (!rc) rc = fsc_alloc_like(ctx->arena, x, x->shape[x->ndim - 1], y);
    if (rc) return rc;
    fsc_add(y->data, x->data, a.data, fsc_tensor_numel(x));
    return FSC_OK;
}

/* dx = dy + ln'(f'(dy)), written over ln's input gradient (ours to reuse:
 * dy may still be read by f's deferred weight gradients). f checks dy. */
static int residual_backward(fsc_module *ln, fsc_module *f, const fsc_ctx *ctx, const half_saved *s,
                             const fsc_tensor *dy, fsc_tensor *dx) {
    fsc_tensor dh, dln;
    int rc = fsc_module_backward(f, ctx, s->f, dy, &dh);
    if (!rc) rc = fsc_module_backward(ln, ctx, s->ln, &dh, &dln);
    if (rc) return rc;
    if (dx) {
        fsc_add_inplace(dln.data, dy->data, fsc_tensor_numel(dy));
        *dx = dln;
    }
    return FSC_OK;
}

enum { LN_1, ATTN, LN_2, MLP };

int fsc_block_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                      void **saved) {
    half_saved *s = fsc_arena_alloc(ctx->arena, 2 * sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    fsc_tensor r;
    fsc_module *const *c = m->children;
    int rc = residual_forward(c[LN_1], c[ATTN], ctx, x, &r, &s[0]);
    if (!rc) rc = residual_forward(c[LN_2], c[MLP], ctx, &r, y, &s[1]);
    if (!rc) *saved = s;
    return rc;
}

int fsc_block_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                       fsc_tensor *dx) {
    const half_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    fsc_tensor dr;
    fsc_module *const *c = m->children;
    rc = residual_backward(c[LN_2], c[MLP], ctx, &s[1], dy, &dr);
    if (!rc) rc = residual_backward(c[LN_1], c[ATTN], ctx, &s[0], &dr, dx);
    return rc;
}

static const fsc_module_ops block_ops = {"TransformerBlock", fsc_block_forward, fsc_block_backward,
                                         NULL};

/* A half: children ln and f (ln_1, attn or ln_2, mlp). */
static int half_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    half_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    int rc = residual_forward(m->children[0], m->children[1], ctx, x, y, s);
    if (!rc) *saved = s;
    return rc;
}

static int half_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    int rc = fsc_check_saved(m, saved);
    return rc ? rc : residual_backward(m->children[0], m->children[1], ctx, saved, dy, dx);
}

static const fsc_module_ops attn_half_ops = {"TransformerBlockAttnHalf", half_forward,
                                             half_backward, NULL};
static const fsc_module_ops mlp_half_ops = {"TransformerBlockMLPHalf", half_forward, half_backward,
                                            NULL};

/* Children [from, to) of the block, made and adopted as fsc_block_new makes them. */
static fsc_module *block_parts_new(const fsc_module_ops *ops, const char *name, int C, int NH,
                                   float dropout, uint32_t layer_id, int n_layers, int from,
                                   int to) {
    if (n_layers <= 0) {
        fsc_error(FSC_ERR_INVALID, "%s %s: n_layers %d must be positive", ops->kind, name,
                  n_layers);
        return NULL;
    }
    /* GPT-2 init: N(0, 0.02); residual projections scaled by 1/sqrt(2 * n_layers). */
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)n_layers);
    fsc_module *m = fsc_module_alloc(sizeof *m, ops, name);
    fsc_module *parts[4] = {NULL};
    for (int i = from; i < to; i++)
        parts[i] = i == LN_1 ? fsc_layernorm_new("ln_1", C, 1e-5f)
                   : i == ATTN
                       ? fsc_attention_new("attn", C, NH, dropout, 2 * layer_id + 1, std, proj_std)
                   : i == LN_2 ? fsc_layernorm_new("ln_2", C, 1e-5f)
                               : fsc_mlp_new("mlp", C, dropout, 2 * layer_id + 2, std, proj_std);
    bool ok = m != NULL;
    for (int i = from; i < to; i++) ok = ok && parts[i];
    for (int i = from; ok && i < to; i++) ok = fsc_module_add_child(m, parts[i]) == FSC_OK;
    if (!ok) { /* the adopted ones go with m */
        for (int i = from + (m ? m->nchildren : 0); i < to; i++) fsc_module_free(parts[i]);
        fsc_module_free(m);
        return NULL;
    }
    return m;
}

fsc_module *fsc_block_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                          int n_layers) {
    return block_parts_new(&block_ops, name, C, NH, dropout, layer_id, n_layers, LN_1, MLP + 1);
}

fsc_module *fsc_block_half_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                               int n_layers, bool mlp) {
    return mlp ? block_parts_new(&mlp_half_ops, name, C, NH, dropout, layer_id, n_layers, LN_2,
                                 MLP + 1)
               : block_parts_new(&attn_half_ops, name, C, NH, dropout, layer_id, n_layers, LN_1,
                                 ATTN + 1);
}
int fsc_blocks_backward(fsc_module *const *h, void *const *saved, int n, const fsc_ctx *ctx,
                        fsc_tensor *cur, fsc_tensor pingpong[2]) {
    int rc = FSC_OK;
    for (int l = n - 1; !rc && l >= 0; l--) {
        fsc_tensor next;
        fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
        rc = fsc_module_backward(h[l], ctx, saved[l], cur, &next);
        if (rc) break;
        if (ctx->defer) { /* deferred weight gradients still read this block's buffers */
            *cur = next;
            continue;
        }
        fsc_tensor *keep = &pingpong[l & 1];
        if (keep->data == cur->data) keep = &pingpong[(l + 1) & 1];
        memcpy(keep->data, next.data, fsc_tensor_nbytes(&next));
        fsc_arena_release(ctx->arena, mark);
        *cur = *keep;
    }
    return rc;
}
