/* Pre-LN transformer block (GPT-2): x + attn(ln_1(x)), then + mlp(ln_2(.)).
 * Children are named as in Hugging Face GPT-2: ln_1, attn, ln_2, mlp. */
#include <math.h>
#include <string.h>

#include "layers_internal.h"

typedef struct {
    void *ln_1, *attn, *ln_2, *mlp;
} block_saved;

enum { LN_1, ATTN, LN_2, MLP };

int fsc_block_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                      void **saved) {
    block_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    fsc_tensor h, a, r, f;
    int rc = fsc_module_forward(m->children[LN_1], ctx, x, &h, &s->ln_1);
    if (!rc) rc = fsc_module_forward(m->children[ATTN], ctx, &h, &a, &s->attn);
    if (!rc) rc = fsc_alloc_like(ctx->arena, x, x->shape[x->ndim - 1], &r);
    if (rc) return rc;
    fsc_add(r.data, x->data, a.data, fsc_tensor_numel(x));
    rc = fsc_module_forward(m->children[LN_2], ctx, &r, &h, &s->ln_2);
    if (!rc) rc = fsc_module_forward(m->children[MLP], ctx, &h, &f, &s->mlp);
    if (!rc) rc = fsc_alloc_like(ctx->arena, x, x->shape[x->ndim - 1], y);
    if (rc) return rc;
    fsc_add(y->data, r.data, f.data, fsc_tensor_numel(x));
    *saved = s;
    return FSC_OK;
}

int fsc_block_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                       fsc_tensor *dx) {
    block_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    int64_t n = fsc_tensor_numel(dy);
    fsc_tensor dh, dr, da, dln;
    /* y = r + mlp(ln_2(r)): dr = dy + ln_2'(mlp'(dy)); mlp's c_proj checks dy's shape */
    rc = fsc_module_backward(m->children[MLP], ctx, s->mlp, dy, &dh);
    if (!rc) rc = fsc_module_backward(m->children[LN_2], ctx, s->ln_2, &dh, &dln);
    if (!rc) rc = fsc_alloc_like(ctx->arena, dy, dy->shape[dy->ndim - 1], &dr);
    if (rc) return rc;
    fsc_add(dr.data, dy->data, dln.data, n);
    /* r = x + attn(ln_1(x)): dx = dr + ln_1'(attn'(dr)) */
    rc = fsc_module_backward(m->children[ATTN], ctx, s->attn, &dr, &da);
    if (!rc) rc = fsc_module_backward(m->children[LN_1], ctx, s->ln_1, &da, &dln);
    if (rc) return rc;
    if (dx) {
        *dx = dr;
        fsc_add_inplace(dx->data, dln.data, n); /* dr is ours: reuse it for dx */
    }
    return FSC_OK;
}

static const fsc_module_ops block_ops = {"TransformerBlock", fsc_block_forward, fsc_block_backward,
                                         NULL};

fsc_module *fsc_block_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                          int n_layers) {
    if (n_layers <= 0) {
        fsc_error(FSC_ERR_INVALID, "TransformerBlock %s: n_layers %d must be positive", name,
                  n_layers);
        return NULL;
    }
    /* GPT-2 init: N(0, 0.02); residual projections scaled by 1/sqrt(2 * n_layers). */
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)n_layers);
    fsc_module *m = fsc_module_alloc(sizeof *m, &block_ops, name);
    fsc_module *parts[4] = {
        fsc_layernorm_new("ln_1", C, 1e-5f),
        fsc_attention_new("attn", C, NH, dropout, 2 * layer_id + 1, std, proj_std),
        fsc_layernorm_new("ln_2", C, 1e-5f),
        fsc_mlp_new("mlp", C, dropout, 2 * layer_id + 2, std, proj_std),
    };
    bool ok = m != NULL;
    for (int i = 0; i < 4; i++) ok = ok && parts[i];
    for (int i = 0; ok && i < 4; i++) ok = fsc_module_add_child(m, parts[i]) == FSC_OK;
    if (!ok) {
        for (int i = m ? m->nchildren : 0; i < 4; i++) fsc_module_free(parts[i]);
        fsc_module_free(m);
        return NULL;
    }
    return m;
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
