/* Tensor-parallel linear layers (column- and row-parallel), and the
 * LayerNorm and dropout that run outside TP regions (on sequence shards under
 * sequence parallelism).
 *
 * Communication is only the region operations of tp_regions.c: a column
 * layer enters a region (copy / sequence gather), a row layer leaves it
 * (reduce / sequence reduce-scatter). Under sequence parallelism a column
 * layer keeps its input shard, not the gathered input, and gathers it again
 * in backward (Megatron does the same): activation memory stays a shard's. */
#include <string.h>

#include "nn/layers_internal.h"
#include "tp_internal.h"

/* The local GEMMs of either linear's backward, (N, in) x by (N, out) dy:
 * dx (may be NULL) now, and the weight's (and db's, may be NULL) gradient
 * now or, under ctx->defer, at the schedule's W. A frozen weight
 * (fine-tuning) costs no GEMM and no write. */
static int linear_grads(fsc_module *m, const fsc_ctx *ctx, float *dx, float *db,
                        const fsc_tensor *dy, const fsc_tensor *x, int in, int out,
                        fsc_weight_layout layout) {
    float *dw = m->params[0].frozen ? NULL : m->params[0].grad;
    const int N = (int)fsc_rows(x);
    const fsc_gemm_prec prec = fsc_ctx_prec(ctx);
    if (!ctx->defer) {
        fsc_matmul_backward_prec(dx, dw, db, dy->data, x->data, m->params[0].data, N, in, out,
                                 layout, prec);
        return FSC_OK;
    }
    fsc_matmul_backward_prec(dx, NULL, NULL, dy->data, x->data, m->params[0].data, N, in, out,
                             layout, prec);
    return fsc_deferred_matmul_prec(ctx->defer, dw, db, dy->data, x->data, m->params[0].data, N, in,
                                    out, (int)layout, prec);
}

/* ---- column-parallel linear ---------------------------------------------------- */
typedef struct {
    tp_module tp;
    int in, out_local;
    bool bias, gather;
    fsc_weight_layout layout;
} column;

static int column_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                          void **saved) {
    column *l = (column *)m;
    int rc = fsc_check_last(m, x, l->in);
    if (rc) return rc;
    fsc_tensor yl = *x;
    if (l->tp.sp) { /* the output is (B, T, out/t) for the gathered T */
        if (x->ndim != 3) return tp_shape_error(m, "sequence parallel input must be 3-d", x);
        yl.shape[1] *= l->tp.size;
    }
    yl.shape[yl.ndim - 1] = l->out_local;
    yl.data = fsc_arena_alloc(ctx->arena, fsc_tensor_nbytes(&yl));
    if (!yl.data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor xin;
    rc = tp_enter_forward(&l->tp, ctx->arena, x, &xin);
    if (rc) return rc;
    fsc_matmul_forward_prec(yl.data, xin.data, m->params[0].data,
                            l->bias ? m->params[1].data : NULL, (int)fsc_rows(&xin), l->in,
                            l->out_local, l->layout, fsc_ctx_prec(ctx));
    if (tp_lora_has(m) && (rc = tp_lora_column_forward(m, ctx, &xin, &yl))) return rc;
    fsc_arena_release(ctx->arena, mark); /* the gathered input, if any */
    rc = l->gather ? tp_last_gather(&l->tp, ctx->arena, &yl, y) : (*y = yl, FSC_OK);
    return rc ? rc : fsc_save_input(ctx->arena, x, saved);
}

static int column_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                           fsc_tensor *dx) {
    column *l = (column *)m;
    const fsc_tensor *x = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    fsc_tensor out = *x;
    if (l->tp.sp) out.shape[1] *= l->tp.size;
    if ((rc = fsc_check_dy_like(m, dy, &out, l->gather ? l->out_local * l->tp.size : l->out_local)))
        return rc;
    fsc_tensor dyl, dxin = {0}, xin, shard = {0};
    rc = l->gather ? tp_last_split(&l->tp, ctx->arena, dy, &dyl) : (dyl = *dy, FSC_OK);
    /* Under SP dx is the (B, T/t, in) shard of a whole-sequence partial sum:
     * the shard is placed first so that the sum, dead once scattered, goes
     * back to the arena with the gathered input (as row_forward does). */
    bool drop_full = dx && l->tp.sp && l->tp.size > 1 && !ctx->defer;
    if (!rc && drop_full) rc = fsc_alloc_like(ctx->arena, x, l->in, &shard);
    if (rc) return rc;
    fsc_arena_mark_t full_mark = fsc_arena_mark(ctx->arena);
    if (dx && (rc = fsc_alloc_like(ctx->arena, &out, l->in, &dxin))) return rc;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    if ((rc = tp_enter_forward(&l->tp, ctx->arena, x, &xin))) return rc;
    /* a frozen bias (fine-tuning) costs no write */
    float *db = l->bias && !m->params[1].frozen ? m->params[1].grad : NULL;
    rc =
        linear_grads(m, ctx, dx ? dxin.data : NULL, db, &dyl, &xin, l->in, l->out_local, l->layout);
    if (rc) return rc;
    /* the adapters' part of dx joins the base's before the region's sum */
    if (tp_lora_has(m) && (rc = tp_lora_column_backward(m, ctx, &xin, &dyl, dx ? &dxin : NULL)))
        return rc;
    if (!ctx->defer) fsc_arena_release(ctx->arena, mark);
    if (!dx) return FSC_OK;
    *dx = dxin;
    if ((rc = tp_enter_backward(&l->tp, ctx->arena, dx)) || !drop_full) return rc;
    memcpy(shard.data, dx->data, fsc_tensor_nbytes(&shard));
    fsc_arena_release(ctx->arena, full_mark);
    *dx = shard;
    return FSC_OK;
}

static const fsc_module_ops column_ops = {TP_KIND_COLUMN, column_forward, column_backward, NULL};

/* Declares weight (and bias) of a linear split along `split_out` (outputs) or
 * inputs: the local shapes and their shard records. */
static int declare_linear(tp_module *t, int in, int out, bool bias, fsc_weight_layout layout,
                          float init_std, bool split_out) {
    int t_in = split_out ? in : in / t->size, t_out = split_out ? out / t->size : out;
    bool in_out = layout == FSC_WEIGHT_IN_OUT;
    int64_t shape[2] = {in_out ? t_in : t_out, in_out ? t_out : t_in};
    if (fsc_module_add_param(&t->base, "weight", 2, shape, FSC_INIT_NORMAL, init_std) < 0)
        return FSC_ERR_INVALID;
    int wdim = (split_out == in_out) ? 1 : 0; /* the dim of the split size in the weight */
    t->shard[0] = (tp_shard){wdim, 1, split_out ? out : in, split_out ? t_out : t_in};
    if (!bias) return FSC_OK;
    if (fsc_module_add_param(&t->base, "bias", 1, (int64_t[]){split_out ? t_out : out},
                             FSC_INIT_ZEROS, 0) < 0)
        return FSC_ERR_INVALID;
    if (split_out) t->shard[1] = (tp_shard){0, 1, out, t_out};
    return FSC_OK;
}

static bool divisible(const char *kind, const char *name, const char *what, int n, int t) {
    if (n > 0 && t > 0 && n % t == 0) return true;
    fsc_error(FSC_ERR_INVALID,
              "%s %s: %s %d must be positive and divisible by the tensor-parallel "
              "size %d",
              kind, name ? name : "", what, n, t);
    return false;
}

/* Either linear of `size` bytes with its weight (and bias) declared, split
 * along the outputs (`split_out`, column) or the inputs (row); NULL with
 * the error naming the size that is not positive or does not divide. */
static void *linear_new(size_t size, const fsc_module_ops *ops, const char *name, int in, int out,
                        bool bias, fsc_weight_layout layout, float init_std, bool split_out,
                        const fsc_tp_options *tp) {
    tp_module *t = tp_module_alloc(size, ops, name, tp);
    if (!t) return NULL;
    const int whole = split_out ? in : out, split = split_out ? out : in;
    if (whole <= 0 || !divisible(ops->kind, name, split_out ? "out" : "in", split, t->size) ||
        declare_linear(t, in, out, bias, layout, init_std, split_out)) {
        if (whole <= 0)
            fsc_error(FSC_ERR_INVALID, "%s %s: %s %d must be positive", ops->kind, name ? name : "",
                      split_out ? "in" : "out", whole);
        fsc_module_free(&t->base);
        return NULL;
    }
    return t;
}

fsc_module *fsc_tp_column_linear_new(const char *name, int in, int out, bool bias,
                                     fsc_weight_layout layout, float init_std, bool gather_output,
                                     const fsc_tp_options *tp) {
    column *l = linear_new(sizeof *l, &column_ops, name, in, out, bias, layout, init_std, true, tp);
    if (!l) return NULL;
    l->in = in, l->out_local = out / l->tp.size, l->bias = bias, l->gather = gather_output;
    l->layout = layout;
    return &l->tp.base;
}

/* ---- row-parallel linear -------------------------------------------------------- */
/* The row layer's bias, added after the sum and summed from dy rows, in
 * plain loops: per-row fsc_add_inplace calls cost an OpenMP region entry
 * per row (~1% of a TP step at B*T = 1024 rows). Each element sees the
 * same additions in the same order as there. */
static void bias_add_rows(float *y, const float *b, int64_t rows, int n) {
    for (int64_t i = 0; i < rows; i++) {
        float *o = y + i * n;
#pragma omp simd
        for (int j = 0; j < n; j++) o[j] += b[j];
    }
}

static void bias_grad_rows(float *db, const float *dy, int64_t rows, int n) {
    for (int64_t i = 0; i < rows; i++) {
        const float *d = dy + i * n;
#pragma omp simd
        for (int j = 0; j < n; j++) db[j] += d[j];
    }
}

typedef struct {
    tp_module tp;
    int in_local, out;
    bool bias, input_parallel;
    fsc_weight_layout layout;
} row;

static int row_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    row *l = (row *)m;
    int rc = fsc_check_last(m, x, l->input_parallel ? l->in_local : l->in_local * l->tp.size);
    if (rc) return rc;
    fsc_tensor xl, part, shard = {0};
    rc = l->input_parallel ? (xl = *x, FSC_OK) : tp_last_split(&l->tp, ctx->arena, x, &xl);
    if (rc) return rc;
    /* Under SP the whole-sequence partial sums are dead once scattered: the
     * shard is placed first, so they go back to the arena (saving them would
     * cost the sequence parallelism its memory). */
    if (l->tp.sp && xl.ndim == 3 && xl.shape[1] % l->tp.size == 0) {
        shard = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3,
                                 (int64_t[]){xl.shape[0], xl.shape[1] / l->tp.size, l->out});
        if (!shard.data) return FSC_ERR_NOMEM;
    }
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    if ((rc = fsc_alloc_like(ctx->arena, &xl, l->out, &part))) return rc;
    fsc_matmul_forward_prec(part.data, xl.data, m->params[0].data, NULL, (int)fsc_rows(&xl),
                            l->in_local, l->out, l->layout, fsc_ctx_prec(ctx));
    /* the adapters' partial product joins the base's in the region's sum */
    if (tp_lora_has(m) && (rc = tp_lora_row_forward(m, ctx, &xl, &part))) return rc;
    if ((rc = tp_leave_forward(&l->tp, ctx->arena, &part, y))) return rc;
    if (shard.data) {
        memcpy(shard.data, y->data, fsc_tensor_nbytes(&shard));
        fsc_arena_release(ctx->arena, mark);
        *y = shard;
    }
    if (l->bias) /* after the sum: the bias is whole on every rank */
        bias_add_rows(y->data, m->params[1].data, fsc_rows(y), l->out);
    return fsc_save_input(ctx->arena, &xl, saved);
}

static int row_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    row *l = (row *)m;
    const fsc_tensor *xl = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    fsc_tensor out = *xl;
    if (l->tp.sp) out.shape[1] /= l->tp.size;
    if ((rc = fsc_check_dy_like(m, dy, &out, l->out))) return rc;
    if (l->bias) { /* dbias: rows of dy; under SP a shard's rows, summed over the group */
        float *part = m->params[1].grad;
        if (l->tp.sp && !(part = fsc_arena_calloc(ctx->arena, (size_t)l->out * sizeof(float))))
            return FSC_ERR_NOMEM;
        bias_grad_rows(part, dy->data, fsc_rows(dy), l->out);
        if (l->tp.sp && (rc = tp_accumulate_replicated(&l->tp, m->params[1].grad, part, l->out)))
            return rc;
    }
    /* dx first: under SP the gathered dy below is dead after the GEMMs */
    fsc_tensor dyf, dxl = {0};
    if (dx && (rc = fsc_alloc_like(ctx->arena, xl, l->in_local, &dxl))) return rc;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    if ((rc = tp_leave_backward(&l->tp, ctx->arena, dy, &dyf))) return rc;
    rc = linear_grads(m, ctx, dx ? dxl.data : NULL, NULL, &dyf, xl, l->in_local, l->out, l->layout);
    if (rc) return rc;
    if (tp_lora_has(m) && (rc = tp_lora_row_backward(m, ctx, xl, &dyf, dx ? &dxl : NULL)))
        return rc;
    if (!ctx->defer) fsc_arena_release(ctx->arena, mark);
    if (!dx) return FSC_OK;
    if (l->input_parallel) {
        *dx = dxl;
        return FSC_OK;
    }
    return tp_last_gather(&l->tp, ctx->arena, &dxl, dx);
}

static const fsc_module_ops row_ops = {TP_KIND_ROW, row_forward, row_backward, NULL};

fsc_module *fsc_tp_row_linear_new(const char *name, int in, int out, bool bias,
                                  fsc_weight_layout layout, float init_std, bool input_is_parallel,
                                  const fsc_tp_options *tp) {
    row *l = linear_new(sizeof *l, &row_ops, name, in, out, bias, layout, init_std, false, tp);
    if (!l) return NULL;
    l->in_local = in / l->tp.size, l->out = out, l->bias = bias;
    l->input_parallel = input_is_parallel, l->layout = layout;
    return &l->tp.base;
}

void tp_linear_dims(const fsc_module *m, int *in, int *out) {
    if (m->ops->kind == TP_KIND_COLUMN) {
        const column *l = (const column *)m;
        *in = l->in, *out = l->out_local * l->tp.size;
    } else {
        const row *l = (const row *)m;
        *in = l->in_local * l->tp.size, *out = l->out;
    }
}

/* ---- LayerNorm outside TP regions ------------------------------------------------ */
typedef struct {
    tp_module tp;
    int dim;
    float eps;
} tp_ln;

static int ln_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                      void **saved) {
    const tp_ln *l = (const tp_ln *)m;
    return fsc_layernorm_module_forward(m, ctx, x, y, saved, l->dim, l->eps);
}

/* Under SP this shard's parameter gradients are summed over the group first. */
static int ln_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                       fsc_tensor *dx) {
    tp_ln *l = (tp_ln *)m;
    if (!l->tp.sp)
        return fsc_layernorm_module_backward(m, ctx, saved, dy, dx, l->dim, m->params[0].grad,
                                             m->params[1].grad);
    float *part = fsc_arena_calloc(ctx->arena, 2 * (size_t)l->dim * sizeof(float));
    if (!part) return FSC_ERR_NOMEM;
    int rc = fsc_layernorm_module_backward(m, ctx, saved, dy, dx, l->dim, part, part + l->dim);
    if (!rc) rc = tp_allreduce(&l->tp, part, 2 * (int64_t)l->dim, true);
    if (rc) return rc;
    fsc_add_inplace(m->params[0].grad, part, l->dim);
    fsc_add_inplace(m->params[1].grad, part + l->dim, l->dim);
    return FSC_OK;
}

static const fsc_module_ops ln_ops = {TP_KIND_LAYERNORM, ln_forward, ln_backward, NULL};

fsc_module *fsc_tp_layernorm_new(const char *name, int dim, float eps, const fsc_tp_options *tp) {
    if (dim <= 0) {
        fsc_error(FSC_ERR_INVALID, "%s %s: dim %d must be positive", TP_KIND_LAYERNORM,
                  name ? name : "", dim);
        return NULL;
    }
    tp_ln *l = tp_module_alloc(sizeof *l, &ln_ops, name, tp);
    if (!l) return NULL;
    l->dim = dim;
    l->eps = eps > 0 ? eps : 1e-5f;
    if (fsc_module_add_param(&l->tp.base, "weight", 1, (int64_t[]){dim}, FSC_INIT_ONES, 0) < 0 ||
        fsc_module_add_param(&l->tp.base, "bias", 1, (int64_t[]){dim}, FSC_INIT_ZEROS, 0) < 0) {
        fsc_module_free(&l->tp.base);
        return NULL;
    }
    return &l->tp.base;
}

/* ---- dropout on whole tensors or sequence shards --------------------------------- */
typedef struct {
    tp_module tp;
    float p;
    uint32_t layer_id;
} tp_drop;

/* Element (b, t, c) of the whole (B, T, C) tensor is element t*C + c of
 * sample row sample0 + b; a sequence shard is rank * (T/t) * C onwards. */
static int drop_apply(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *in, fsc_tensor *out) {
    tp_drop *d = (tp_drop *)m;
    if (!ctx->keyed) {
        char path[FSC_NAME_MAX * 2];
        return fsc_error(FSC_ERR_INVALID,
                         "module '%s' (%s, p = %g): training forward with a ctx that is not "
                         "keyed: set seed, step and sample0 for each micro-batch and ctx.keyed",
                         fsc_module_path(m, path, sizeof path), m->ops->kind, (double)d->p);
    }
    int rc = fsc_alloc_like(ctx->arena, in, in->shape[in->ndim - 1], out);
    if (rc) return rc;
    if (ctx->seq && !d->tp.sp) /* context parallelism: runs of the sequence */
        return fsc_dropout_seq(ctx, out->data, in->data, d->p, fsc_dropout_key(ctx, d->layer_id),
                               in);
    int64_t rows = in->shape[0], len = fsc_tensor_numel(in) / rows;
    int64_t e0 = d->tp.sp ? (int64_t)d->tp.rank * len : 0;
    fsc_dropout_slice(out->data, in->data, d->p, fsc_dropout_key(ctx, d->layer_id), ctx->sample0,
                      rows, e0, len);
    return FSC_OK;
}

static int drop_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    (void)saved;
    tp_drop *d = (tp_drop *)m;
    if (x->dtype != FSC_DTYPE_F32 || x->ndim < 2 || (d->tp.sp && x->ndim != 3))
        return tp_shape_error(m,
                              "expected f32 (B, ...) activations, (B, T/t, C) under sequence "
                              "parallelism",
                              x);
    if (!ctx->training || d->p == 0.f) {
        *y = *x;
        return FSC_OK;
    }
    return drop_apply(m, ctx, x, y);
}

static int drop_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    (void)saved;
    tp_drop *d = (tp_drop *)m;
    if (!dx) return FSC_OK;
    if (!ctx->training || d->p == 0.f) {
        *dx = *dy;
        return FSC_OK;
    }
    return drop_apply(m, ctx, dy, dx);
}

static const fsc_module_ops drop_ops = {TP_KIND_DROPOUT, drop_forward, drop_backward, NULL};

fsc_module *fsc_tp_dropout_new(const char *name, float p, uint32_t layer_id,
                               const fsc_tp_options *tp) {
    if (!(p >= 0.f && p < 1.f)) {
        fsc_error(FSC_ERR_INVALID, "%s %s: p = %g must be in [0, 1)", TP_KIND_DROPOUT,
                  name ? name : "", (double)p);
        return NULL;
    }
    tp_drop *d = tp_module_alloc(sizeof *d, &drop_ops, name, tp);
    if (!d) return NULL;
    d->p = p, d->layer_id = layer_id;
    return &d->tp.base;
}
