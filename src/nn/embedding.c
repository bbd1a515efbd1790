/* Embedding: int32 ids (B,T) -> rows of the (num, dim) table. */
#include "layers_internal.h"

typedef struct {
    fsc_module base;
    int num, dim;
} embedding;

int nn_check_ids_below(const fsc_module *m, const fsc_tensor *x, int num) {
    const int32_t *ids = x->data;
    for (int64_t i = 0; i < fsc_tensor_numel(x); i++)
        if (ids[i] < 0 || ids[i] >= num)
            return fsc_error(FSC_ERR_INVALID, "%s %s: id %d at position %lld outside [0,%d)",
                             m->ops->kind, m->name, ids[i], (long long)i, num);
    return FSC_OK;
}

static int check_ids(const fsc_module *m, const fsc_tensor *x, int num) {
    if (x->dtype != FSC_DTYPE_I32 || x->ndim != 2)
        return fsc_error(FSC_ERR_SHAPE,
                         "Embedding %s: expected int32 (B,T) ids, got %s with %d dims", m->name,
                         fsc_dtype_name(x->dtype), x->ndim);
    return nn_check_ids_below(m, x, num);
}

static int embedding_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                             void **saved) {
    embedding *e = (embedding *)m;
    int rc = check_ids(m, x, e->num);
    if (rc) return rc;
    *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3,
                          (int64_t[]){x->shape[0], x->shape[1], e->dim});
    if (!y->data) return FSC_ERR_NOMEM;
    fsc_encoder_forward(y->data, x->data, m->params[0].data, NULL, (int)x->shape[0],
                        (int)x->shape[1], e->dim);
    return fsc_save_input(ctx->arena, x, saved);
}

static int embedding_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                              fsc_tensor *dx) {
    (void)ctx;
    embedding *e = (embedding *)m;
    const fsc_tensor *x = saved;
    if (dx) return fsc_error(FSC_ERR_INVALID, "Embedding %s: ids have no gradient", m->name);
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_module_check_dy(m, dy, 3, (int64_t[]){x->shape[0], x->shape[1], e->dim});
    if (rc) return rc;
    if (m->params[0].frozen) return FSC_OK; /* fine-tuning: nothing to accumulate */
    fsc_encoder_backward(m->params[0].grad, NULL, dy->data, x->data, (int)x->shape[0],
                         (int)x->shape[1], e->dim);
    return FSC_OK;
}

static const fsc_module_ops embedding_ops = {"Embedding", embedding_forward, embedding_backward,
                                             NULL};

fsc_module *fsc_embedding_new(const char *name, int num, int dim, float init_std) {
    if (num <= 0 || dim <= 0) {
        fsc_error(FSC_ERR_INVALID, "Embedding %s: sizes %d x %d must be positive", name, num, dim);
        return NULL;
    }
    embedding *e = fsc_module_alloc(sizeof *e, &embedding_ops, name);
    if (!e) return NULL;
    e->num = num, e->dim = dim;
    if (fsc_module_add_param(&e->base, "weight", 2, (int64_t[]){num, dim}, FSC_INIT_NORMAL,
                             init_std) < 0) {
        fsc_module_free(&e->base);
        return NULL;
    }
    return &e->base;
}
