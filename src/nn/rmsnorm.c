/* RMSNorm module (LLaMA's norm): one weight, no bias; saves x and per-row
 * 1/rms for backward. */
#include "layers_internal.h"

typedef struct {
    fsc_module base;
    int dim;
    float eps;
} rmsnorm;

typedef struct {
    fsc_tensor x;
    float *rstd;
} rms_saved;

int fsc_rmsnorm_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, int dim,
                               float eps, fsc_tensor *y, void **saved) {
    int rc = fsc_check_last(m, x, dim);
    if (!rc) rc = fsc_alloc_like(ctx->arena, x, dim, y);
    if (rc) return rc;
    const int64_t n = fsc_rows(x);
    rms_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s || !(s->rstd = fsc_arena_alloc(ctx->arena, (size_t)n * sizeof(float))))
        return FSC_ERR_NOMEM;
    s->x = *x;
    fsc_rmsnorm_forward(y->data, s->rstd, x->data, m->params[0].data, (int)n, dim, eps);
    *saved = s;
    return FSC_OK;
}

int fsc_rmsnorm_module_backward(fsc_module *m, const fsc_ctx *ctx, void *saved,
                                const fsc_tensor *dy, int dim, float *dw, fsc_tensor *dx) {
    const rms_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, &s->x, dim);
    fsc_tensor tmp;
    if (!dx) dx = &tmp; /* the kernel computes dx alongside dweight */
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->x, dim, dx);
    if (rc) return rc;
    fsc_rmsnorm_backward(dx->data, dw, dy->data, s->x.data, m->params[0].data, s->rstd,
                         (int)fsc_rows(&s->x), dim);
    return FSC_OK;
}

static int rms_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    const rmsnorm *l = (const rmsnorm *)m;
    return fsc_rmsnorm_module_forward(m, ctx, x, l->dim, l->eps, y, saved);
}

static int rms_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    const rmsnorm *l = (const rmsnorm *)m;
    /* the kernel always adds into dweight: a frozen weight's goes to scratch */
    float *dw = m->params[0].frozen ? fsc_arena_calloc(ctx->arena, (size_t)l->dim * sizeof(float))
                                    : m->params[0].grad;
    if (!dw) return FSC_ERR_NOMEM;
    return fsc_rmsnorm_module_backward(m, ctx, saved, dy, l->dim, dw, dx);
}

static const fsc_module_ops rms_ops = {"RMSNorm", rms_forward, rms_backward, NULL};

fsc_module *fsc_rmsnorm_new(const char *name, int dim, float eps) {
    rmsnorm *l = (rmsnorm *)nn_norm_alloc(sizeof *l, &rms_ops, name, dim, false);
    if (!l) return NULL;
    l->dim = dim;
    l->eps = eps > 0 ? eps : 1e-5f;
    return &l->base;
}
