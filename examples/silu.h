/* SiLU (x * sigmoid(x)) as a module of the user's own: examples/custom_module.c
 * shows how it is written, examples/user_journey.c trains it under every
 * strategy. The module contract (include/fsc/nn.h): forward allocates its
 * output from the step's arena and returns a saved-state record for
 * backward; the module itself keeps no per-call state. */
#ifndef FSC_EXAMPLES_SILU_H
#define FSC_EXAMPLES_SILU_H
#include <math.h>
#include <stdlib.h>

#include "fsc/fsc.h"

/* ---- the custom module ---------------------------------------------------- */
typedef struct {
    fsc_module base; /* first member: an fsc_module* is a silu* */
} silu;

static inline int silu_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x,
                               fsc_tensor *y, void **saved) {
    (void)m;
    *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, x->ndim, x->shape);
    fsc_tensor *keep = fsc_arena_alloc(ctx->arena, sizeof *keep);
    if (!y->data || !keep) return FSC_ERR_NOMEM;
    const float *in = x->data;
    float *out = y->data;
    for (int64_t i = 0; i < fsc_tensor_numel(x); i++) out[i] = in[i] / (1.0f + expf(-in[i]));
    *keep = *x; /* backward needs only the input */
    *saved = keep;
    return FSC_OK;
}

static inline int silu_backward(fsc_module *m, const fsc_ctx *ctx, void *saved,
                                const fsc_tensor *dy, fsc_tensor *dx) {
    (void)m;
    const fsc_tensor *x = saved;
    if (!dx) return FSC_OK; /* no parameters, so nothing else to do */
    *dx = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, x->ndim, x->shape);
    if (!dx->data) return FSC_ERR_NOMEM;
    const float *in = x->data, *g = dy->data;
    float *out = dx->data;
    for (int64_t i = 0; i < fsc_tensor_numel(x); i++) {
        float s = 1.0f / (1.0f + expf(-in[i]));
        out[i] = g[i] * s * (1.0f + in[i] * (1.0f - s));
    }
    return FSC_OK;
}

static const fsc_module_ops silu_ops = {"SiLU", silu_forward, silu_backward, NULL};

static inline fsc_module *silu_new(const char *name) {
    silu *s = calloc(1, sizeof *s);
    if (s) fsc_module_init(&s->base, &silu_ops, name);
    return &s->base;
}

#endif
