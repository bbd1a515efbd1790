/* SwiGLU MLP (LLaMA's): down_proj(silu(gate_proj(x)) * up_proj(x)), three
 * bias-free nn.Linear children under Hugging Face's names. Saves the
 * children's records and the two projections; the gated product lives on
 * as down_proj's saved input, in bf16 under bf16 autocast (the rounding
 * down_proj's GEMM would make: fsc_ctx_bf16_act) unless down_proj is
 * LoRA-adapted. Under bf16 autocast the two projections are stored in bf16
 * as well (as PyTorch's autocast keeps them), unless either is
 * LoRA-adapted: the product and its derivatives are then taken at the
 * stored values. */
#include "layers_internal.h"

typedef struct {
    fsc_module base;
    int C, F;
    fsc_module *gate, *up, *down;
} swiglu_mlp;

typedef struct {
    void *gate_rec, *up_rec, *down_rec;
    fsc_tensor g, u; /* (..., F) */
} swiglu_saved;

static int swiglu_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                          void **saved) {
    swiglu_mlp *p = (swiglu_mlp *)m;
    int rc = fsc_check_last(m, x, p->C);
    if (rc) return rc;
    swiglu_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    fsc_tensor h;
    rc = fsc_module_forward(p->gate, ctx, x, &s->g, &s->gate_rec);
    if (!rc) rc = fsc_module_forward(p->up, ctx, x, &s->u, &s->up_rec);
    const bool h_bf16 = fsc_ctx_bf16_act(ctx) && nn_linear_is(p->down);
    if (!rc)
        rc =
            fsc_alloc_like_dt(ctx->arena, &s->g, p->F, h_bf16 ? FSC_DTYPE_BF16 : FSC_DTYPE_F32, &h);
    if (rc) return rc;
    const int64_t n = fsc_tensor_numel(&h);
    /* gate and up bf16 together (swiglu_reads_bf16 asks for both) */
    if (s->g.dtype == FSC_DTYPE_BF16 && h_bf16)
        fsc_swiglu_forward_bf16_io(h.data, s->g.data, s->u.data, n);
    else if (s->g.dtype == FSC_DTYPE_BF16)
        fsc_swiglu_forward_bf16_in(h.data, s->g.data, s->u.data, n);
    else if (h_bf16)
        fsc_swiglu_forward_bf16(h.data, s->g.data, s->u.data, n);
    else
        fsc_swiglu_forward(h.data, s->g.data, s->u.data, n);
    rc = fsc_module_forward(p->down, ctx, &h, y, &s->down_rec);
    *saved = s;
    return rc;
}

static int swiglu_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                           fsc_tensor *dx) {
    swiglu_mlp *p = (swiglu_mlp *)m;
    swiglu_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, &s->g, p->C);
    if (rc) return rc;
    fsc_tensor dh, dg, du, dxu;
    rc = fsc_module_backward(p->down, ctx, s->down_rec, dy, &dh);
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->g, p->F, &dg);
    if (rc) return rc;
    du = dh; /* dup overwrites dh in place: each element is read before it is written */
    if (s->g.dtype == FSC_DTYPE_BF16)
        fsc_swiglu_backward_bf16_in(dg.data, du.data, dh.data, s->g.data, s->u.data,
                                    fsc_tensor_numel(&dg));
    else
        fsc_swiglu_backward(dg.data, du.data, dh.data, s->g.data, s->u.data,
                            fsc_tensor_numel(&dg));
    rc = fsc_module_backward(p->gate, ctx, s->gate_rec, &dg, dx);
    if (!rc) rc = fsc_module_backward(p->up, ctx, s->up_rec, &du, dx ? &dxu : NULL);
    if (!rc && dx) fsc_add_inplace(dx->data, dxu.data, fsc_tensor_numel(dx));
    return rc;
}

static const fsc_module_ops swiglu_ops = {"SwiGLUMLP", swiglu_forward, swiglu_backward, NULL};

/* gate_proj's and up_proj's nn_bf16_out_fn: both in bf16 or neither (a
 * LoRA-adapted projection writes fp32). */
static bool swiglu_reads_bf16(const fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x) {
    (void)x;
    const swiglu_mlp *p = (const swiglu_mlp *)m;
    return fsc_ctx_bf16_act(ctx) && nn_linear_is(p->gate) && nn_linear_is(p->up);
}

fsc_module *fsc_swiglu_mlp_new(const char *name, int C, int F, float init_std, float proj_std) {
    if (C <= 0 || F <= 0) {
        fsc_error(FSC_ERR_INVALID, "SwiGLUMLP %s: sizes %d -> %d must be positive", name, C, F);
        return NULL;
    }
    swiglu_mlp *p = fsc_module_alloc(sizeof *p, &swiglu_ops, name);
    if (!p) return NULL;
    p->C = C, p->F = F;
    p->gate = fsc_linear_new("gate_proj", C, F, false, FSC_WEIGHT_OUT_IN, init_std);
    p->up = fsc_linear_new("up_proj", C, F, false, FSC_WEIGHT_OUT_IN, init_std);
    p->down = fsc_linear_new("down_proj", F, C, false, FSC_WEIGHT_OUT_IN, proj_std);
    fsc_module *kids[3] = {p->gate, p->up, p->down};
    for (int i = 0; i < 3; i++)
        if (fsc_module_add_child(&p->base, kids[i])) {
            for (int j = i; j < 3; j++) fsc_module_free(kids[j]); /* not adopted */
            fsc_module_free(&p->base);
            return NULL;
        }
    nn_linear_set_out_bf16(p->gate, swiglu_reads_bf16, &p->base);
    nn_linear_set_out_bf16(p->up, swiglu_reads_bf16, &p->base);
    return &p->base;
}
