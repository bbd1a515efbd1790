/* SwiGLU over projections a layout makes (llama_internal.h): the tensor-
 * parallel MLP (gate_proj and up_proj column-parallel, down_proj row-
 * parallel: the gated product is elementwise per column, so each rank's
 * F/t columns need nothing from the others), and, without down_proj, the
 * side of a pipeline cut that ends at the product. The one-process whole
 * MLP stays fsc_swiglu_mlp_new; this module runs the same operations in the
 * same order, so a layout changes only where sums are split.
 *
 * Under sequence parallelism x and y are sequence shards while the
 * projections' outputs are whole sequences: dy is checked against x. */
#include "layers_internal.h"
#include "llama_internal.h"

typedef struct {
    fsc_module base;
    int C, F;
    fsc_module *gate, *up, *down; /* down NULL: the product is the output */
} gated_mlp;

typedef struct {
    void *gate_rec, *up_rec, *down_rec;
    fsc_tensor x;    /* the input's shape (a sequence shard under SP) */
    fsc_tensor g, u; /* (B, T, F) */
} gated_saved;

static int gated_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                         void **saved) {
    gated_mlp *p = (gated_mlp *)m;
    int rc = fsc_check_last(m, x, p->C);
    if (rc) return rc;
    gated_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    s->x = *x;
    fsc_tensor h;
    rc = fsc_module_forward(p->gate, ctx, x, &s->g, &s->gate_rec);
    if (!rc) rc = fsc_module_forward(p->up, ctx, x, &s->u, &s->up_rec);
    if (!rc) rc = fsc_check_last(m, &s->g, p->F);
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->g, p->F, &h);
    if (rc) return rc;
    fsc_swiglu_forward(h.data, s->g.data, s->u.data, fsc_tensor_numel(&h));
    *saved = s;
    if (!p->down) {
        *y = h;
        return FSC_OK;
    }
    return fsc_module_forward(p->down, ctx, &h, y, &s->down_rec);
}

static int gated_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                          fsc_tensor *dx) {
    gated_mlp *p = (gated_mlp *)m;
    gated_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc)
        rc =
            p->down ? fsc_check_dy_like(m, dy, &s->x, p->C) : fsc_check_dy_like(m, dy, &s->g, p->F);
    if (rc) return rc;
    fsc_tensor dh, dg, du, dxu;
    if (p->down) { /* down's input gradient is ours: du overwrites it */
        rc = fsc_module_backward(p->down, ctx, s->down_rec, dy, &dh);
        du = dh;
    } else { /* dy is the caller's: du gets a buffer of its own */
        dh = *dy;
        rc = fsc_alloc_like(ctx->arena, &s->g, p->F, &du);
    }
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->g, p->F, &dg);
    if (rc) return rc;
    fsc_swiglu_backward(dg.data, du.data, dh.data, s->g.data, s->u.data, fsc_tensor_numel(&dg));
    rc = fsc_module_backward(p->gate, ctx, s->gate_rec, &dg, dx);
    if (!rc) rc = fsc_module_backward(p->up, ctx, s->up_rec, &du, dx ? &dxu : NULL);
    if (!rc && dx) fsc_add_inplace(dx->data, dxu.data, fsc_tensor_numel(dx));
    return rc;
}

static const fsc_module_ops gated_ops = {"GatedMLP", gated_forward, gated_backward, NULL};

fsc_module *llama_gated_mlp_new(const char *name, int C, int F_local, fsc_module *gate,
                                fsc_module *up, fsc_module *down) {
    fsc_module *kids[3] = {gate, up, down};
    const int n = down ? 3 : 2;
    gated_mlp *p =
        C > 0 && F_local > 0 && gate && up ? fsc_module_alloc(sizeof *p, &gated_ops, name) : NULL;
    if (!p) {
        if (C <= 0 || F_local <= 0)
            fsc_error(FSC_ERR_INVALID, "GatedMLP %s: sizes %d -> %d must be positive", name, C,
                      F_local);
        for (int i = 0; i < 3; i++) fsc_module_free(kids[i]);
        return NULL;
    }
    p->C = C, p->F = F_local, p->gate = gate, p->up = up, p->down = down;
    for (int i = 0; i < n; i++)
        if (fsc_module_add_child(&p->base, kids[i])) {
            for (int j = i; j < 3; j++) fsc_module_free(kids[j]); /* not adopted */
            fsc_module_free(&p->base);
            return NULL;
        }
    return &p->base;
}
