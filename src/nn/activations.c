/* Parameter-free point-wise modules: GELU (tanh form) and ReLU. Both save a view
 * of their input and recompute what backward needs from it. Under bf16
 * autocast a GELU that feeds a plain Linear (the MLP's c_proj) writes its
 * output in bf16, as that GEMM would round it: the same product, and the
 * widest activation the MLP keeps costs half. Its input may be bf16 too
 * (c_fc's output, nn_gelu_reads_bf16): GELU is then evaluated at that
 * stored value, and backward differentiates at the same value, as PyTorch's
 * autocast runs GELU on c_fc's bf16 output. */
#include "layers_internal.h"

typedef void (*pointwise_fwd)(float *out, const float *inp, int64_t n);
typedef void (*pointwise_bwd)(float *dinp, const float *inp, const float *dout, int64_t n);

static const fsc_module_ops gelu_ops;

typedef struct {
    fsc_module base;
    pointwise_fwd fwd;
    pointwise_bwd bwd;
    const fsc_module *feeds; /* GELU: the Linear its output goes to, or NULL */
} pointwise;

static int pw_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                      void **saved) {
    pointwise *p = (pointwise *)m;
    const bool in_h = x->dtype == FSC_DTYPE_BF16;
    if (in_h && !nn_gelu_reads_bf16(m, ctx, x))
        return fsc_error(FSC_ERR_DTYPE,
                         "%s %s: a bf16 input needs a GELU under bf16 autocast with bf16 GEMMs "
                         "running (ctx->autocast %s)",
                         m->ops->kind, m->name, fsc_dtype_name(ctx->autocast));
    if (x->dtype != FSC_DTYPE_F32 && !in_h)
        return fsc_error(FSC_ERR_DTYPE, "%s %s: expected f32 input, got %s", m->ops->kind, m->name,
                         fsc_dtype_name(x->dtype));
    const bool out_h = p->feeds && nn_linear_is(p->feeds) && fsc_ctx_bf16_act(ctx);
    int rc = fsc_alloc_like_dt(ctx->arena, x, x->shape[x->ndim - 1],
                               out_h ? FSC_DTYPE_BF16 : FSC_DTYPE_F32, y);
    if (rc) return rc;
    const int64_t n = fsc_tensor_numel(x);
    if (in_h && out_h)
        fsc_gelu_forward_bf16_io(y->data, x->data, n);
    else if (in_h)
        fsc_gelu_forward_bf16_in(y->data, x->data, n);
    else if (out_h)
        fsc_gelu_forward_bf16(y->data, x->data, n);
    else
        p->fwd(y->data, x->data, n);
    return fsc_save_input(ctx->arena, x, saved);
}

static int pw_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                       fsc_tensor *dx) {
    pointwise *p = (pointwise *)m;
    const fsc_tensor *x = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, x, x->shape[x->ndim - 1]);
    if (rc || !dx) return rc;
    rc = fsc_alloc_like(ctx->arena, x, x->shape[x->ndim - 1], dx);
    if (rc) return rc;
    if (x->dtype == FSC_DTYPE_BF16) /* GELU's: the derivative where forward evaluated it */
        fsc_gelu_backward_bf16_in(dx->data, x->data, dy->data, fsc_tensor_numel(x));
    else
        p->bwd(dx->data, x->data, dy->data, fsc_tensor_numel(x));
    return FSC_OK;
}

static const fsc_module_ops gelu_ops = {"GELU", pw_forward, pw_backward, NULL};
static const fsc_module_ops relu_ops = {"ReLU", pw_forward, pw_backward, NULL};

static fsc_module *pointwise_new(const char *name, const fsc_module_ops *ops, pointwise_fwd f,
                                 pointwise_bwd b) {
    pointwise *p = fsc_module_alloc(sizeof *p, ops, name);
    if (!p) return NULL;
    p->fwd = f, p->bwd = b;
    return &p->base;
}

fsc_module *fsc_gelu_new(const char *name) {
    return pointwise_new(name, &gelu_ops, fsc_gelu_forward, fsc_gelu_backward);
}

bool nn_gelu_reads_bf16(const fsc_module *gelu, const fsc_ctx *ctx, const fsc_tensor *x) {
    (void)x;
    return gelu->ops == &gelu_ops && fsc_ctx_bf16_act(ctx);
}

void nn_gelu_set_feeds(fsc_module *gelu, const fsc_module *linear) {
    ((pointwise *)gelu)->feeds = linear;
}

fsc_module *fsc_relu_new(const char *name) {
    return pointwise_new(name, &relu_ops, fsc_relu_forward, fsc_relu_backward);
}
