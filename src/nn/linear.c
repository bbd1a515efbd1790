/* Linear: y = x W^T + b over the last dim, in torch's (out,in) layout or GPT-2
 * Conv1D's (in,out). Saves only a view of x for backward: it is the
 * producer's output, so a bf16 copy would add memory, not save it. Under
 * bf16 autocast the producer may have stored x in bf16 already
 * (fsc_ctx_bf16_act): the GEMMs then read it as is and backward reads the
 * same bf16 values, as PyTorch's autocast saves them. Its own output is
 * written in bf16 when its consumer asks (nn_linear_set_out_bf16: attention
 * reading q/k/v in bf16). */
#include "layers_internal.h"

typedef struct {
    fsc_module base;
    int in, out;
    bool bias;
    fsc_weight_layout layout;
    nn_bf16_out_fn out_bf16;    /* asks, per call, for y in bf16; or NULL */
    const fsc_module *consumer; /* what out_bf16 is asked about */
} linear;

/* x's dtype: f32, or bf16 when this call stores activations in bf16. */
static int check_input(const fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, int in) {
    if (x->dtype != FSC_DTYPE_BF16) return fsc_check_last(m, x, in);
    fsc_tensor f = *x;
    f.dtype = FSC_DTYPE_F32; /* the shape check's */
    int rc = fsc_check_last(m, &f, in);
    if (!rc && !fsc_ctx_bf16_act(ctx))
        rc = fsc_error(FSC_ERR_DTYPE,
                       "%s (%s): a bf16 input needs bf16 autocast with bf16 GEMMs running "
                       "(ctx->autocast %s)",
                       m->name, m->ops->kind, fsc_dtype_name(ctx->autocast));
    return rc;
}

static int linear_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                          void **saved) {
    linear *l = (linear *)m;
    /* not when LoRA adapted this Linear: it adds its fp32 update to y */
    const bool out_h = l->out_bf16 && nn_linear_is(m) && l->out_bf16(l->consumer, ctx, x);
    int rc = check_input(m, ctx, x, l->in);
    if (!rc)
        rc = fsc_alloc_like_dt(ctx->arena, x, l->out, out_h ? FSC_DTYPE_BF16 : FSC_DTYPE_F32, y);
    if (rc) return rc;
    const int64_t n = fsc_rows(x) * l->out;
    /* a bf16 y: the GEMM's fp32 result in this thread's narrowing scratch */
    float *yf = out_h ? fsc_bf16_narrow_scratch(n) : y->data;
    if (!yf) return FSC_ERR_NOMEM;
    const float *b = l->bias ? m->params[1].data : NULL;
    if (x->dtype == FSC_DTYPE_BF16)
        rc = fsc_matmul_forward_bf16_act(yf, x->data, m->params[0].data, b, (int)fsc_rows(x), l->in,
                                         l->out, l->layout);
    else
        fsc_matmul_forward_prec(yf, x->data, m->params[0].data, b, (int)fsc_rows(x), l->in, l->out,
                                l->layout, fsc_ctx_prec(ctx));
    if (out_h && !rc) fsc_narrow_bf16(y->data, yf, n);
    return rc ? rc : fsc_save_input(ctx->arena, x, saved);
}

static int linear_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                           fsc_tensor *dx) {
    linear *l = (linear *)m;
    const fsc_tensor *x = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, x, l->out);
    if (rc) return rc;
    float *dinp = NULL;
    if (dx) {
        rc = fsc_alloc_like(ctx->arena, x, l->in, dx);
        if (rc) return rc;
        dinp = dx->data;
    }
    /* a frozen weight or bias (fine-tuning) costs no GEMM and no write */
    float *dw = m->params[0].frozen ? NULL : m->params[0].grad;
    float *db = l->bias && !m->params[1].frozen ? m->params[1].grad : NULL;
    const fsc_gemm_prec prec = fsc_ctx_prec(ctx);
    const int64_t n = fsc_rows(x);
    const float *xf = x->data;
    if (x->dtype == FSC_DTYPE_BF16) {
        if (!ctx->defer)
            return fsc_matmul_backward_bf16_act(dinp, dw, db, dy->data, x->data, m->params[0].data,
                                                (int)n, l->in, l->out, l->layout);
        /* the deferred weight gradient reads x later: its exact widening,
         * kept in the arena as long as the deferred GEMM's other operands */
        float *w = fsc_arena_alloc(ctx->arena, (size_t)(n * l->in) * sizeof(float));
        if (!w) return FSC_ERR_NOMEM;
        fsc_widen_bf16(w, x->data, n * l->in);
        xf = w;
    }
    if (ctx->defer) { /* the input gradient now, the weight gradients at W */
        fsc_matmul_backward_prec(dinp, NULL, NULL, dy->data, xf, m->params[0].data, (int)n, l->in,
                                 l->out, l->layout, prec);
        return fsc_deferred_matmul_prec(ctx->defer, dw, db, dy->data, xf, m->params[0].data, (int)n,
                                        l->in, l->out, (int)l->layout, prec);
    }
    fsc_matmul_backward_prec(dinp, dw, db, dy->data, xf, m->params[0].data, (int)n, l->in, l->out,
                             l->layout, prec);
    return FSC_OK;
}

static const fsc_module_ops linear_ops = {"Linear", linear_forward, linear_backward, NULL};

bool nn_linear_is(const fsc_module *m) {
    return m && m->ops == &linear_ops;
}

void nn_linear_set_out_bf16(fsc_module *m, nn_bf16_out_fn want, const fsc_module *consumer) {
    linear *l = (linear *)m;
    l->out_bf16 = want, l->consumer = consumer;
}

fsc_weight_layout nn_linear_layout(const fsc_module *m) {
    return ((const linear *)m)->layout;
}

fsc_module *fsc_linear_new(const char *name, int in, int out, bool bias, fsc_weight_layout layout,
                           float init_std) {
    if (in <= 0 || out <= 0) {
        fsc_error(FSC_ERR_INVALID, "Linear %s: sizes %d -> %d must be positive", name, in, out);
        return NULL;
    }
    linear *l = fsc_module_alloc(sizeof *l, &linear_ops, name);
    if (!l) return NULL;
    l->in = in, l->out = out, l->bias = bias, l->layout = layout;
    int64_t shape[2] = {layout == FSC_WEIGHT_IN_OUT ? in : out,
                        layout == FSC_WEIGHT_IN_OUT ? out : in};
    if (fsc_module_add_param(&l->base, "weight", 2, shape, FSC_INIT_NORMAL, init_std) < 0 ||
        (bias &&
         fsc_module_add_param(&l->base, "bias", 1, (int64_t[]){out}, FSC_INIT_ZEROS, 0) < 0)) {
        fsc_module_free(&l->base);
        return NULL;
    }
    return &l->base;
}
