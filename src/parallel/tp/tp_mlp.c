/* The tensor-parallel MLP: c_fc column-parallel (4C/t outputs), GELU on the
 * local part, c_proj row-parallel, dropout; fsc_mlp_new's child names.
 *
 * GELU's input and output are the largest tensors a layer keeps under
 * sequence parallelism (4C/t floats per token each, a full sequence: they
 * live inside the TP region). With recompute_activation the MLP keeps the
 * input alone and backward makes the output again from it, by the same
 * kernel, so c_proj's weight gradient sees the same floats: the gradients
 * are the stored-output ones bit for bit.
 *
 * The MLP knows one thing about its children beyond the module contract:
 * c_proj (a row-parallel linear) saves only its input's descriptor
 * (fsc_save_input), so backward hands it a copy pointing at the
 * recomputed output. */
#include <string.h>

#include "nn/layers_internal.h"
#include "tp_internal.h"

enum { FC, ACT, PROJ, DROP };

typedef struct {
    tp_module tp;
    bool recompute;
} tp_mlp;

typedef struct {
    void *part[4];     /* the children's records; act's unused when recomputing */
    fsc_tensor h;      /* recompute: c_fc's output, GELU's input */
    fsc_tensor proj_x; /* recompute: c_proj's record, its input to be made again */
} mlp_saved;

/* c_proj on GELU(h) made in a buffer given back before returning: only
 * c_proj's output (copied below the buffer) and its record stay. */
static int proj_forward_recompute(fsc_module *m, const fsc_ctx *ctx, mlp_saved *s, fsc_tensor *p) {
    fsc_module *proj = m->children[PROJ];
    const tp_module *t = tp_module_of(proj);
    if (!t || proj->ops->kind != TP_KIND_ROW)
        return fsc_error(FSC_ERR_INVALID, "TP MLP %s: c_proj must be a row-parallel linear",
                         m->name);
    fsc_tensor out = s->h; /* c_proj's output: (B, T/t, C) under SP, else (B, T, C) */
    out.shape[out.ndim - 1] = proj->params[0].shape[1]; /* weight (4C/t, C) */
    if (t->sp) out.shape[1] /= t->size;
    out.data = fsc_arena_alloc(ctx->arena, fsc_tensor_nbytes(&out));
    if (!out.data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor a, y;
    int rc = fsc_alloc_like(ctx->arena, &s->h, s->h.shape[s->h.ndim - 1], &a);
    if (rc) return rc;
    fsc_gelu_forward(a.data, s->h.data, fsc_tensor_numel(&a));
    void *ps = NULL;
    if ((rc = fsc_module_forward(proj, ctx, &a, &y, &ps))) return rc;
    if (fsc_tensor_nbytes(&y) != fsc_tensor_nbytes(&out))
        return tp_shape_error(m, "c_proj's output has an unexpected size", &y);
    memcpy(out.data, y.data, fsc_tensor_nbytes(&out));
    s->proj_x = *(const fsc_tensor *)ps;
    fsc_arena_release(ctx->arena, mark);
    *p = out;
    return FSC_OK;
}

static int mlp_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    tp_mlp *l = (tp_mlp *)m;
    mlp_saved *s = fsc_arena_calloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    fsc_tensor h, a, p;
    int rc = fsc_module_forward(m->children[FC], ctx, x, &h, &s->part[FC]);
    if (rc) return rc;
    if (l->recompute && ctx->training) {
        s->h = h;
        rc = proj_forward_recompute(m, ctx, s, &p);
    } else {
        rc = fsc_module_forward(m->children[ACT], ctx, &h, &a, &s->part[ACT]);
        if (!rc) rc = fsc_module_forward(m->children[PROJ], ctx, &a, &p, &s->part[PROJ]);
    }
    if (!rc) rc = fsc_module_forward(m->children[DROP], ctx, &p, y, &s->part[DROP]);
    *saved = s;
    return rc;
}

/* c_proj's and GELU's backward from the recomputed output: the output goes
 * in a buffer that then takes GELU's input gradient, so c_proj's input
 * gradient and temporaries are given back at once. */
static int act_proj_backward_recompute(fsc_module *m, const fsc_ctx *ctx, const mlp_saved *s,
                                       const fsc_tensor *dp, fsc_tensor *dh) {
    fsc_tensor a;
    int rc = fsc_alloc_like(ctx->arena, &s->h, s->h.shape[s->h.ndim - 1], &a);
    if (rc) return rc;
    const int64_t n = fsc_tensor_numel(&a);
    fsc_gelu_forward(a.data, s->h.data, n);
    fsc_tensor again = s->proj_x, da;
    again.data = a.data;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    if ((rc = fsc_module_backward(m->children[PROJ], ctx, &again, dp, &da))) return rc;
    if (ctx->defer) { /* c_proj's deferred weight gradient reads the output later: keep it */
        if ((rc = fsc_alloc_like(ctx->arena, &a, a.shape[a.ndim - 1], dh))) return rc;
        fsc_gelu_backward(dh->data, s->h.data, da.data, n);
        return FSC_OK;
    }
    fsc_gelu_backward(a.data, s->h.data, da.data, n); /* a now holds dh */
    fsc_arena_release(ctx->arena, mark);
    *dh = a;
    return FSC_OK;
}

static int mlp_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    const mlp_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    fsc_tensor dp, da, dh;
    rc = fsc_module_backward(m->children[DROP], ctx, s->part[DROP], dy, &dp);
    if (rc) return rc;
    if (s->h.data) {
        rc = act_proj_backward_recompute(m, ctx, s, &dp, &dh);
    } else {
        rc = fsc_module_backward(m->children[PROJ], ctx, s->part[PROJ], &dp, &da);
        if (!rc) rc = fsc_module_backward(m->children[ACT], ctx, s->part[ACT], &da, &dh);
    }
    if (rc) return rc;
    return fsc_module_backward(m->children[FC], ctx, s->part[FC], &dh, dx);
}

static const fsc_module_ops mlp_ops = {TP_KIND_MLP, mlp_forward, mlp_backward, NULL};

fsc_module *fsc_tp_mlp_new(const char *name, int C, float dropout, uint32_t layer_id,
                           float init_std, float proj_std, const fsc_tp_options *tp) {
    if (C <= 0) {
        fsc_error(FSC_ERR_INVALID, "%s %s: d_model %d must be positive", TP_KIND_MLP,
                  name ? name : "", C);
        return NULL;
    }
    tp_mlp *l = tp_module_alloc(sizeof *l, &mlp_ops, name, tp);
    fsc_module *parts[4] = {
        fsc_tp_column_linear_new("c_fc", C, 4 * C, true, FSC_WEIGHT_IN_OUT, init_std, false, tp),
        fsc_gelu_new("act"),
        fsc_tp_row_linear_new("c_proj", 4 * C, C, true, FSC_WEIGHT_IN_OUT, proj_std, true, tp),
        fsc_tp_dropout_new("dropout", dropout, layer_id, tp),
    };
    bool ok = l != NULL;
    for (int i = 0; i < 4; i++) ok = ok && parts[i];
    for (int i = 0; ok && i < 4; i++) ok = fsc_module_add_child(&l->tp.base, parts[i]) == FSC_OK;
    if (!ok) {
        for (int i = l ? l->tp.base.nchildren : 0; i < 4; i++) fsc_module_free(parts[i]);
        if (l) fsc_module_free(&l->tp.base);
        return NULL;
    }
    l->recompute = tp->recompute_activation;
    return &l->tp.base;
}
