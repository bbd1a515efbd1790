/* Containers: Sequential (y = f_n(...f_1(x))) and Residual (y = x + f(x)).
 * Their saved records hold the children's records; children are always called
 * through fsc_module_forward/backward so hooks fire at every level. */
#include <string.h>

#include "layers_internal.h"

static int seq_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    void **child_saved = fsc_arena_alloc(ctx->arena, sizeof(void *) * (size_t)(m->nchildren + 1));
    if (!child_saved) return FSC_ERR_NOMEM;
    fsc_tensor cur = *x;
    for (int i = 0; i < m->nchildren; i++) {
        fsc_tensor next;
        int rc = fsc_module_forward(m->children[i], ctx, &cur, &next, &child_saved[i]);
        if (rc) return rc;
        cur = next;
    }
    *y = cur;
    *saved = child_saved;
    return FSC_OK;
}

static int seq_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    void **child_saved = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    fsc_tensor cur = *dy;
    for (int i = m->nchildren - 1; i >= 0; i--) {
        fsc_tensor next;
        bool want = i > 0 || dx;
        rc = fsc_module_backward(m->children[i], ctx, child_saved[i], &cur, want ? &next : NULL);
        if (rc) return rc;
        if (want) cur = next;
    }
    if (dx) *dx = cur;
    return FSC_OK;
}

static const fsc_module_ops seq_ops = {"Sequential", seq_forward, seq_backward, NULL};

fsc_module *fsc_sequential_new(const char *name, int n, fsc_module **children) {
    fsc_module *m = fsc_module_alloc(sizeof *m, &seq_ops, name);
    if (!m) {
        for (int i = 0; i < n; i++) fsc_module_free(children[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (fsc_module_add_child(m, children[i])) {
            for (int j = i; j < n; j++) fsc_module_free(children[j]);
            fsc_module_free(m);
            return NULL;
        }
    return m;
}

static int res_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    fsc_tensor fx;
    int rc = fsc_module_forward(m->children[0], ctx, x, &fx, saved);
    if (rc) return rc;
    if (!fsc_tensor_same_shape(x, &fx))
        return fsc_error(FSC_ERR_SHAPE, "Residual %s: inner module changed the shape", m->name);
    rc = fsc_alloc_like(ctx->arena, x, x->shape[x->ndim - 1], y);
    if (rc) return rc;
    fsc_add(y->data, x->data, fx.data, fsc_tensor_numel(x));
    return FSC_OK;
}

static int res_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    fsc_tensor dinner;
    int rc = fsc_module_backward(m->children[0], ctx, saved, dy, dx ? &dinner : NULL);
    if (rc || !dx) return rc;
    rc = fsc_alloc_like(ctx->arena, dy, dy->shape[dy->ndim - 1], dx);
    if (rc) return rc;
    fsc_add(dx->data, dy->data, dinner.data, fsc_tensor_numel(dy));
    return FSC_OK;
}

static const fsc_module_ops res_ops = {"Residual", res_forward, res_backward, NULL};

fsc_module *fsc_residual_new(const char *name, fsc_module *inner) {
    if (!inner) {
        fsc_error(FSC_ERR_INVALID, "Residual %s: NULL inner module", name);
        return NULL;
    }
    fsc_module *m = fsc_module_alloc(sizeof *m, &res_ops, name);
    if (!m || fsc_module_add_child(m, inner)) {
        fsc_module_free(inner);
        free(m);
        return NULL;
    }
    return m;
}
