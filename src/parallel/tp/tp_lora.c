/* LoRA adapters on the tensor-parallel Linears (fsc_tp_lora_apply): the
 * one-process y = W x + scale * B A dropout(x) of src/nn/lora.c, split as
 * the base weight is split.
 *
 * The one idea: the adapter follows its base's side of the TP region, so it
 * costs one collective of N x r floats and no more, and every shard is the
 * slice of the one-process tensor under its name (checkpoints and PEFT
 * files stay layout-free).
 *  - Column-parallel (q/k/v, gate/up): lora_A (r, in) is replicated and
 *    lora_B (out, r) split by output rows as the weight is (QKV blocks
 *    included). Forward: h = A x on the region's input (gathered under SP),
 *    y_local += scale * B_local h. Backward: dh_r = B_local^T dz is rank r's
 *    part of the sum over the group; A^T dh_r joins the base's partial input
 *    gradient before the region's all-reduce, and dh is summed over the
 *    group (the one collective) before dA = dh^T x.
 *  - Row-parallel (o, down): lora_A (r, in) split by input columns as the
 *    weight is, lora_B (out, r) replicated. Forward: scale * B (A_r x_r) is
 *    added to the base's partial product before the region's all-reduce,
 *    which sums the low-rank partial products with it. Backward: h = sum of
 *    A_r x_r over the group (the one collective), dB = dz^T h, dh = B^T dz,
 *    dA_r = dh^T x_r, dx_r += A_r^T dh.
 * h is made again in backward rather than kept (N x r per layer saved and a
 * GEMM of the adapter's size spent). The TP Linear adopts lora_A, lora_B
 * and lora_dropout (the settings) as lora.c's Linear does, so the names are
 * PEFT's; tp_layers.c calls the four functions below where its own
 * forward and backward have the region's input and output gradient. */
#include <math.h>
#include <string.h>

#include "fsc/lora.h"
#include "nn/layers_internal.h"
#include "tp_internal.h"

enum { CHILD_A, CHILD_B, CHILD_DROP, NCHILD }; /* the adopted children, in this order */

typedef struct {
    fsc_module base;
    float p, scale;
    uint32_t layer_id;
    int rank;
} tp_lora;

static const fsc_module_ops settings_ops = {"TensorParallelLoRADropout", NULL, NULL, NULL};

static const tp_lora *settings_of(const fsc_module *m) {
    if (m->nchildren != NCHILD || m->children[CHILD_DROP]->ops != &settings_ops) return NULL;
    return (const tp_lora *)m->children[CHILD_DROP];
}

bool tp_lora_has(const fsc_module *m) {
    return settings_of(m) != NULL;
}

static bool drops(const tp_lora *st, const fsc_ctx *ctx) {
    return ctx->training && st->p > 0.f;
}

/* dropout in place on this rank's columns [c0, c0 + c) of every row of an
 * input whose whole rows are `width` wide: the one-process mask's slice
 * (element t * width + c0 + j of sample row b). Forward and backward alike. */
static void drop_columns(const tp_lora *st, const fsc_ctx *ctx, float *x, const fsc_tensor *shape,
                         int64_t width, int64_t c0) {
    const int64_t c = shape->shape[shape->ndim - 1], B = shape->shape[0];
    const int64_t T = fsc_tensor_numel(shape) / (B * c);
    const uint64_t key = fsc_dropout_key(ctx, st->layer_id);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            float *run = x + (b * T + t) * c;
            fsc_dropout_slice(run, run, st->p, key, ctx->sample0 + b, 1, t * width + c0, c);
        }
}

/* xd = dropout(x) in the arena, or x itself without dropout: drawn as one
 * process draws it for the whole input (rows are samples) when cols is NULL,
 * else on the columns of a row-parallel input that cols holds, as drop_columns. */
static int dropped(const tp_lora *st, const tp_module *cols, const fsc_ctx *ctx,
                   const fsc_tensor *x, fsc_tensor *xd) {
    *xd = *x;
    if (!drops(st, ctx)) return FSC_OK;
    if (!ctx->keyed)
        return fsc_error(
            FSC_ERR_INVALID,
            "LoRA dropout: a training forward needs a keyed ctx (seed, step, sample0)");
    const int64_t c = x->shape[x->ndim - 1];
    int rc = fsc_alloc_like(ctx->arena, x, c, xd);
    if (rc) return rc;
    if (cols) {
        memcpy(xd->data, x->data, fsc_tensor_nbytes(x));
        drop_columns(st, ctx, xd->data, x, c * cols->size, c * cols->rank);
    } else {
        fsc_dropout_forward(xd->data, x->data, st->p, fsc_dropout_key(ctx, st->layer_id),
                            ctx->sample0, x->shape[0], fsc_tensor_numel(x) / x->shape[0]);
    }
    return FSC_OK;
}

static float *arena_floats(fsc_arena *a, int64_t n) {
    return fsc_arena_alloc(a, (size_t)n * sizeof(float));
}

/* Weight gradients of a GEMM: now, or at W under a zero-bubble schedule
 * (the inputs then stay in the arena: the caller releases nothing). */
static int weight_grad(const fsc_ctx *ctx, fsc_param *w, const float *dy, const float *x, int N,
                       int in, int out) {
    if (w->frozen) return FSC_OK;
    if (ctx->defer)
        return fsc_deferred_matmul_prec(ctx->defer, w->grad, NULL, dy, x, w->data, N, in, out,
                                        FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    fsc_matmul_backward_prec(NULL, w->grad, NULL, dy, x, w->data, N, in, out, FSC_WEIGHT_OUT_IN,
                             fsc_ctx_prec(ctx));
    return FSC_OK;
}

/* ---- column-parallel ------------------------------------------------------------------------ */

/* y += scale * B (A xd) over the N rows of xd (this rank's columns of a
 * row-parallel input, or the whole input of a column-parallel one). */
static int add_low_rank(const tp_lora *st, fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xd,
                        float *y) {
    const fsc_param *A = &m->children[CHILD_A]->params[0], *B = &m->children[CHILD_B]->params[0];
    const int N = (int)fsc_rows(xd), in = (int)A->shape[1], r = st->rank;
    const int out = (int)B->shape[0];
    float *h = arena_floats(ctx->arena, (int64_t)N * r);
    float *z = h ? arena_floats(ctx->arena, (int64_t)N * out) : NULL;
    if (!z) return FSC_ERR_NOMEM;
    fsc_matmul_forward_prec(h, xd->data, A->data, NULL, N, in, r, FSC_WEIGHT_OUT_IN,
                            fsc_ctx_prec(ctx));
    fsc_matmul_forward_prec(z, h, B->data, NULL, N, r, out, FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    for (int64_t i = 0; i < (int64_t)N * out; i++) y[i] += st->scale * z[i];
    return FSC_OK;
}

/* Either backward's shared steps. The adapters' sizes and buffers; g->xd
 * (the dropped input) is the caller's. */
typedef struct {
    fsc_param *A, *B;
    int N, in, r, out;
    fsc_gemm_prec prec;
    fsc_tensor xd;
    float *h, *dh, *dz, *dxa; /* dxa: NULL without an input gradient */
} lora_grads;

/* The buffers, and h = A xd recomputed (forward kept nothing). */
static int grads_begin(lora_grads *g, fsc_module *m, const fsc_ctx *ctx, bool want_dx) {
    const tp_lora *st = settings_of(m);
    g->A = &m->children[CHILD_A]->params[0], g->B = &m->children[CHILD_B]->params[0];
    g->N = (int)fsc_rows(&g->xd), g->in = (int)g->A->shape[1], g->r = st->rank;
    g->out = (int)g->B->shape[0];
    g->prec = fsc_ctx_prec(ctx);
    const int64_t N = g->N;
    g->h = arena_floats(ctx->arena, N * g->r);
    g->dh = g->h ? arena_floats(ctx->arena, N * g->r) : NULL;
    g->dz = g->dh ? arena_floats(ctx->arena, N * g->out) : NULL;
    g->dxa = g->dz && want_dx ? arena_floats(ctx->arena, N * g->in) : NULL;
    if (!g->dz || (want_dx && !g->dxa)) return FSC_ERR_NOMEM;
    fsc_matmul_forward_prec(g->h, g->xd.data, g->A->data, NULL, g->N, g->in, g->r,
                            FSC_WEIGHT_OUT_IN, g->prec);
    return FSC_OK;
}

/* dz = scale dy, dh = B^T dz (this rank's share), and B's gradient. */
static int grads_b(lora_grads *g, const tp_lora *st, const fsc_ctx *ctx, const fsc_tensor *dy) {
    const float *d = dy->data;
    for (int64_t i = 0; i < (int64_t)g->N * g->out; i++) g->dz[i] = st->scale * d[i];
    fsc_matmul_backward_prec(g->dh, NULL, NULL, g->dz, g->h, g->B->data, g->N, g->r, g->out,
                             FSC_WEIGHT_OUT_IN, g->prec);
    return weight_grad(ctx, g->B, g->dz, g->h, g->N, g->r, g->out);
}

/* Either kind's forward: y += the adapter's output on x dropped as `dropped`. */
static int lora_forward(fsc_module *m, const tp_module *cols, const fsc_ctx *ctx,
                        const fsc_tensor *x, float *y) {
    const tp_lora *st = settings_of(m);
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor xd;
    int rc = dropped(st, cols, ctx, x, &xd);
    if (!rc) rc = add_low_rank(st, m, ctx, &xd, y);
    fsc_arena_release(ctx->arena, mark);
    return rc;
}

int tp_lora_column_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xin,
                           fsc_tensor *yl) {
    return lora_forward(m, NULL, ctx, xin, yl->data);
}

int tp_lora_column_backward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xin,
                            const fsc_tensor *dyl, fsc_tensor *dxin) {
    const tp_lora *st = settings_of(m);
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    lora_grads g;
    int rc = dropped(st, NULL, ctx, xin, &g.xd);
    if (!rc) rc = grads_begin(&g, m, ctx, dxin != NULL);
    if (!rc) rc = grads_b(&g, st, ctx, dyl);
    if (rc) return rc;
    if (dxin) { /* this rank's part of A^T dh, summed by the region's backward with the base's */
        fsc_matmul_backward_prec(g.dxa, NULL, NULL, g.dh, g.xd.data, g.A->data, g.N, g.in, g.r,
                                 FSC_WEIGHT_OUT_IN, g.prec);
        if (drops(st, ctx))
            fsc_dropout_backward(g.dxa, g.dxa, st->p, fsc_dropout_key(ctx, st->layer_id),
                                 ctx->sample0, xin->shape[0],
                                 fsc_tensor_numel(xin) / xin->shape[0]);
        fsc_add_inplace(dxin->data, g.dxa, (int64_t)g.N * g.in);
    }
    if ((rc = tp_allreduce(tp_module_of(m), g.dh, (int64_t)g.N * g.r, true))) return rc;
    if ((rc = weight_grad(ctx, g.A, g.dh, g.xd.data, g.N, g.in, g.r))) return rc;
    if (!ctx->defer) fsc_arena_release(ctx->arena, mark);
    return FSC_OK;
}

/* ---- row-parallel --------------------------------------------------------------------------- */

int tp_lora_row_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xl, fsc_tensor *part) {
    return lora_forward(m, tp_module_of(m), ctx, xl, part->data);
}

int tp_lora_row_backward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xl,
                         const fsc_tensor *dyf, fsc_tensor *dxl) {
    const tp_lora *st = settings_of(m);
    const tp_module *t = tp_module_of(m);
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    lora_grads g;
    int rc = dropped(st, t, ctx, xl, &g.xd);
    if (!rc) rc = grads_begin(&g, m, ctx, dxl != NULL);
    if (!rc) rc = tp_allreduce(t, g.h, (int64_t)g.N * g.r, false); /* h = sum of A_r x_r */
    if (!rc) rc = grads_b(&g, st, ctx, dyf);
    if (!rc) rc = weight_grad(ctx, g.A, g.dh, g.xd.data, g.N, g.in, g.r);
    if (rc) return rc;
    if (dxl) {
        fsc_matmul_backward_prec(g.dxa, NULL, NULL, g.dh, g.xd.data, g.A->data, g.N, g.in, g.r,
                                 FSC_WEIGHT_OUT_IN, g.prec);
        if (drops(st, ctx))
            drop_columns(st, ctx, g.dxa, xl, (int64_t)g.in * t->size, (int64_t)g.in * t->rank);
        fsc_add_inplace(dxl->data, g.dxa, (int64_t)g.N * g.in);
    }
    if (!ctx->defer) fsc_arena_release(ctx->arena, mark);
    return FSC_OK;
}

/* ---- adapting ------------------------------------------------------------------------------- */

/* Adapts TP Linear m (nn_lora_adapt_fn): 1 when adapted, 0 when m is not a
 * column- or row-parallel Linear. */
static int adapt(fsc_module *m, const fsc_lora_config *c, uint32_t layer_id) {
    tp_module *t = tp_module_of(m);
    const bool column = m->ops->kind == TP_KIND_COLUMN;
    char path[FSC_NAME_MAX * 2];
    if (t && m->ops->kind != TP_KIND_ROW && !column)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "LoRA under tensor parallelism: %s is a %s, not a Linear (adapters go on "
                         "column- and row-parallel Linears)",
                         fsc_module_path(m, path, sizeof path), m->ops->kind);
    if (!t) return 0;
    if (tp_lora_has(m))
        return fsc_error(FSC_ERR_INVALID, "LoRA: %s is adapted already",
                         fsc_module_path(m, path, sizeof path));
    int in, out;
    tp_linear_dims(m, &in, &out);
    const fsc_tp_options plain = {.group = t->g}; /* the adapters' own regions: no SP */
    const int r = c->rank;
    fsc_module *a = column ? fsc_linear_new("lora_A", in, r, false, FSC_WEIGHT_OUT_IN, 0.f)
                           : fsc_tp_row_linear_new("lora_A", in, r, false, FSC_WEIGHT_OUT_IN, 0.f,
                                                   true, &plain);
    fsc_module *b = column ? fsc_tp_column_linear_new("lora_B", r, out, false, FSC_WEIGHT_OUT_IN,
                                                      0.f, false, &plain)
                           : fsc_linear_new("lora_B", r, out, false, FSC_WEIGHT_OUT_IN, 0.f);
    tp_lora *st = fsc_module_alloc(sizeof *st, &settings_ops, "lora_dropout");
    if (!a || !b || !st) {
        fsc_module_free(a), fsc_module_free(b), fsc_module_free(st ? &st->base : NULL);
        return fsc_error(FSC_ERR_NOMEM, "LoRA: out of memory adapting %s",
                         fsc_module_path(m, path, sizeof path));
    }
    a->params[0].init = FSC_INIT_UNIFORM; /* kaiming_uniform_(a=sqrt(5)): bound 1/sqrt(in) */
    a->params[0].init_std = 1.f / sqrtf((float)in);
    b->params[0].init = FSC_INIT_ZEROS;
    /* the split adapter's rows (B) or columns (A) are the base weight's, blocks included */
    tp_shard s = t->shard[0];
    s.dim = column ? 0 : 1;
    tp_module_of(column ? b : a)->shard[0] = s;
    st->p = c->dropout;
    st->scale = (c->alpha > 0.f ? c->alpha : (float)r) / (float)r;
    st->layer_id = layer_id, st->rank = r;
    fsc_module *kids[NCHILD] = {a, b, &st->base};
    int rc = FSC_OK;
    for (int k = 0; k < NCHILD; k++) {
        if (!rc) rc = fsc_module_add_child(m, kids[k]);
        if (rc) fsc_module_free(kids[k]);
    }
    return rc ? rc : 1;
}

int fsc_tp_lora_apply(fsc_module *root, const fsc_lora_config *cfg, int *adapted) {
    return nn_lora_apply_with(root, cfg, adapt, adapted);
}
