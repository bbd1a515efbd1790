/* Dropout with masks keyed by meaning: (seed, layer, step) names the draw and
 * (global sample index, element) the element (docs/architecture.md, decision 5), so any
 * split of the batch over micro-batches, threads or ranks, and any
 * recomputation, drops the same elements. Nothing is saved for backward.
 *
 * The flip side of keying by meaning: a caller who never sets step and
 * sample0 gets the same masks at every step, and nothing looks wrong. So a
 * training forward refuses a ctx whose keyed flag the caller did not set;
 * (0, 0) itself is the first micro-batch's legitimate key, so the values
 * alone cannot tell. */
#include "layers_internal.h"

typedef struct {
    fsc_module base;
    float p;
    uint32_t layer_id;
} dropout;

uint64_t fsc_dropout_key(const fsc_ctx *ctx, uint32_t layer_id) {
    return fsc_rng_key_ints(ctx->seed, 0xD20Full << 32 | layer_id, (uint64_t)ctx->step);
}

static bool active(const dropout *d, const fsc_ctx *ctx) {
    return ctx->training && d->p > 0.f;
}

static int dropout_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                           void **saved) {
    (void)saved;
    dropout *d = (dropout *)m;
    if (!active(d, ctx)) {
        *y = *x;
        return FSC_OK;
    }
    if (!ctx->keyed) {
        char path[FSC_NAME_MAX * 2];
        return fsc_error(FSC_ERR_INVALID,
                         "module '%s' (Dropout, p = %g): training forward with a ctx that is not "
                         "keyed: masks are drawn from (seed, step, sample0), so left unset they "
                         "repeat every step; set seed, step and sample0 for each micro-batch "
                         "and ctx.keyed = true",
                         fsc_module_path(m, path, sizeof path), (double)d->p);
    }
    int rc = fsc_alloc_like(ctx->arena, x, x->shape[x->ndim - 1], y);
    if (rc) return rc;
    int64_t rows = x->shape[0];
    fsc_dropout_forward(y->data, x->data, d->p, fsc_dropout_key(ctx, d->layer_id), ctx->sample0,
                        rows, fsc_tensor_numel(x) / rows);
    return FSC_OK;
}

static int dropout_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                            fsc_tensor *dx) {
    (void)saved;
    dropout *d = (dropout *)m;
    if (!dx) return FSC_OK;
    if (!active(d, ctx)) {
        *dx = *dy;
        return FSC_OK;
    }
    int rc = fsc_alloc_like(ctx->arena, dy, dy->shape[dy->ndim - 1], dx);
    if (rc) return rc;
    int64_t rows = dy->shape[0];
    fsc_dropout_backward(dx->data, dy->data, d->p, fsc_dropout_key(ctx, d->layer_id), ctx->sample0,
                         rows, fsc_tensor_numel(dy) / rows);
    return FSC_OK;
}

static const fsc_module_ops dropout_ops = {"Dropout", dropout_forward, dropout_backward, NULL};

fsc_module *fsc_dropout_new(const char *name, float p, uint32_t layer_id) {
    if (!(p >= 0.f && p < 1.f)) {
        fsc_error(FSC_ERR_INVALID, "Dropout %s: p = %g must be in [0, 1)", name, (double)p);
        return NULL;
    }
    dropout *d = fsc_module_alloc(sizeof *d, &dropout_ops, name);
    if (!d) return NULL;
    d->p = p, d->layer_id = layer_id;
    return &d->base;
}
