/* Dropout with masks keyed by meaning: (seed, layer, step) names the draw and
 * (global sample index, element) the element (docs/architecture.md, decision 5), so any
 * split of the batch over micro-batches, threads or ranks, and any
 * recomputation, drops the same elements. Nothing is saved for backward.
 *
 * The flip side of keying by meaning: a caller who never sets step and
 * sample0 gets the same masks at every step, and nothing looks wrong. So a
 * training forward refuses a ctx whose keyed flag the caller did not set;
 * (0, 0) itself is the first micro-batch's legitimate key, so the values
 * alone cannot tell. Under context parallelism (fsc_ctx.seq) a row holds
 * some runs of the sequence, each masked as that slice of the whole row. */
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

int fsc_dropout_seq(const fsc_ctx *ctx, float *out, const float *in, float p, uint64_t key,
                    const fsc_tensor *x) {
    const fsc_seq_split *q = ctx->seq;
    const int64_t rows = x->shape[0], n = x->ndim == 3 ? x->shape[1] : 0;
    if (n != (int64_t)q->runs * q->len)
        return fsc_error(FSC_ERR_SHAPE,
                         "dropout under context parallelism: expected (B, %d, W) activations "
                         "(%d runs of %d positions), got %d dimensions of %lld rows",
                         q->runs * q->len, q->runs, q->len, x->ndim, (long long)n);
    const int64_t w = x->shape[2], row = n * w, run = (int64_t)q->len * w;
    for (int64_t b = 0; b < rows; b++)
        for (int r = 0; r < q->runs; r++) {
            const int64_t at = b * row + r * run;
            fsc_dropout_slice(out + at, in + at, p, key, ctx->sample0 + b, 1, q->pos0[r] * w, run);
        }
    return FSC_OK;
}

/* y = mask(x): the whole rows, or under context parallelism the runs of
 * global positions this rank holds (fsc_ctx.seq). */
static int apply(const fsc_module *m, const fsc_ctx *ctx, fsc_tensor *y, const fsc_tensor *x) {
    const dropout *d = (const dropout *)m;
    const uint64_t key = fsc_dropout_key(ctx, d->layer_id);
    if (ctx->seq) return fsc_dropout_seq(ctx, y->data, x->data, d->p, key, x);
    int64_t rows = x->shape[0];
    fsc_dropout_forward(y->data, x->data, d->p, key, ctx->sample0, rows,
                        fsc_tensor_numel(x) / rows);
    return FSC_OK;
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
    return apply(m, ctx, y, x);
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
    return apply(m, ctx, dx, dy); /* the same mask and scale */
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
