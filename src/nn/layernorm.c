/* LayerNorm module: saves x plus per-row mean and 1/std. Its output, when it
 * goes straight into a plain Linear under bf16 autocast, is written in
 * bf16 (nn_layernorm_set_feeds): the same product, half the bytes. */
#include "layers_internal.h"

typedef struct {
    fsc_module base;
    int dim;
    float eps;
    const fsc_module *feeds; /* the Linear reading the output, or NULL */
} layernorm;

typedef struct {
    fsc_tensor x;
    float *mean, *rstd;
} ln_saved;

/* The forward, its output in bf16 when out_bf16. */
static int ln_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                             void **saved, int dim, float eps, bool out_bf16) {
    int rc = fsc_check_last(m, x, dim);
    if (!rc)
        rc = fsc_alloc_like_dt(ctx->arena, x, dim, out_bf16 ? FSC_DTYPE_BF16 : FSC_DTYPE_F32, y);
    if (rc) return rc;
    int64_t n = fsc_rows(x);
    ln_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    s->x = *x;
    s->mean = fsc_arena_alloc(ctx->arena, (size_t)n * sizeof(float));
    s->rstd = fsc_arena_alloc(ctx->arena, (size_t)n * sizeof(float));
    if (!s->mean || !s->rstd) return FSC_ERR_NOMEM;
    if (out_bf16)
        fsc_layernorm_forward_bf16(y->data, s->mean, s->rstd, x->data, m->params[0].data,
                                   m->params[1].data, (int)n, dim, eps);
    else
        fsc_layernorm_forward(y->data, s->mean, s->rstd, x->data, m->params[0].data,
                              m->params[1].data, (int)n, dim, eps);
    *saved = s;
    return FSC_OK;
}

int fsc_layernorm_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x,
                                 fsc_tensor *y, void **saved, int dim, float eps) {
    return ln_module_forward(m, ctx, x, y, saved, dim, eps, false);
}

int fsc_layernorm_module_backward(fsc_module *m, const fsc_ctx *ctx, void *saved,
                                  const fsc_tensor *dy, fsc_tensor *dx, int dim, float *dweight,
                                  float *dbias) {
    ln_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, &s->x, dim);
    if (rc) return rc;
    fsc_tensor tmp;
    if (!dx) dx = &tmp; /* the kernel computes dx alongside dweight; keep it simple */
    rc = fsc_alloc_like(ctx->arena, &s->x, dim, dx);
    if (rc) return rc;
    /* the kernel always adds into both: a frozen one's goes to scratch */
    if (m->params[0].frozen || m->params[1].frozen) {
        float *scratch = fsc_arena_alloc(ctx->arena, (size_t)dim * sizeof(float));
        if (!scratch) return FSC_ERR_NOMEM;
        if (m->params[0].frozen) dweight = scratch;
        if (m->params[1].frozen) dbias = scratch;
    }
    fsc_layernorm_backward(dx->data, dweight, dbias, dy->data, s->x.data, m->params[0].data,
                           s->mean, s->rstd, (int)fsc_rows(&s->x), dim);
    return FSC_OK;
}

static int ln_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                      void **saved) {
    const layernorm *l = (const layernorm *)m;
    const bool out_bf16 =
        l->feeds && nn_linear_is(l->feeds) && fsc_ctx_bf16_act(ctx) && !ctx->kv && !ctx->seq;
    return ln_module_forward(m, ctx, x, y, saved, l->dim, l->eps, out_bf16);
}

static int ln_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                       fsc_tensor *dx) {
    const layernorm *l = (const layernorm *)m;
    return fsc_layernorm_module_backward(m, ctx, saved, dy, dx, l->dim, m->params[0].grad,
                                         m->params[1].grad);
}

static const fsc_module_ops ln_ops = {"LayerNorm", ln_forward, ln_backward, NULL};

void nn_layernorm_set_feeds(fsc_module *m, const fsc_module *linear) {
    ((layernorm *)m)->feeds = linear;
}

fsc_module *nn_norm_alloc(size_t size, const fsc_module_ops *ops, const char *name, int dim,
                          bool bias) {
    if (dim <= 0) {
        fsc_error(FSC_ERR_INVALID, "%s %s: dim %d must be positive", ops->kind, name, dim);
        return NULL;
    }
    fsc_module *m = fsc_module_alloc(size, ops, name);
    if (!m) return NULL;
    if (fsc_module_add_param(m, "weight", 1, (int64_t[]){dim}, FSC_INIT_ONES, 0) < 0 ||
        (bias && fsc_module_add_param(m, "bias", 1, (int64_t[]){dim}, FSC_INIT_ZEROS, 0) < 0)) {
        fsc_module_free(m);
        return NULL;
    }
    return m;
}

fsc_module *fsc_layernorm_new(const char *name, int dim, float eps) {
    layernorm *l = (layernorm *)nn_norm_alloc(sizeof *l, &ln_ops, name, dim, true);
    if (!l) return NULL;
    l->dim = dim;
    l->eps = eps > 0 ? eps : 1e-5f;
    return &l->base;
}
