/* Vocabulary parallelism: the embedding whose table rows are split over the
 * TP group, and the cross-entropy that never gathers the logits.
 *
 * Padding rule (fsc_tp_vocab_range): every rank holds Vp = ceil(V/t) rows,
 * rank r the rows [r*Vp, r*Vp + count), count = clamp(V - r*Vp, 0, Vp); the
 * rest are padding, zero and skipped here: an id never selects one and the
 * softmax never sees one (fsc_fast_expf clamps, so a -inf logit would not be
 * a zero, hence skipping instead of masking). */
#include <math.h>
#include <string.h>

#include "kernels/fastmath.h"
#include "nn/layers_internal.h"
#include "tp_internal.h"

void tp_vocab_lookup(float *y, const int32_t *ids, int64_t N, const float *table, int first,
                     int count, int C) {
    for (int64_t i = 0; i < N; i++) {
        int64_t row = (int64_t)ids[i] - first;
        float *o = y + i * C;
        if (row >= 0 && row < count)
            memcpy(o, table + row * C, (size_t)C * sizeof(float));
        else
            memset(o, 0, (size_t)C * sizeof(float));
    }
}

void tp_vocab_lookup_backward(float *dtable, const float *dy, const int32_t *ids, int64_t N,
                              int first, int count, int C) {
    for (int64_t i = 0; i < N; i++) {
        int64_t row = (int64_t)ids[i] - first;
        if (row >= 0 && row < count) fsc_add_inplace(dtable + row * C, dy + i * C, C);
    }
}

/* ---- the embedding module --------------------------------------------------------- */
typedef struct {
    tp_module tp;
    int num, dim, first, count;
} vocab_embedding;

static int check_ids(const fsc_module *m, const fsc_tensor *x, int num) {
    if (x->dtype != FSC_DTYPE_I32 || x->ndim != 2)
        return tp_shape_error(m, "expected int32 (B,T) ids", x);
    return nn_check_ids_below(m, x, num);
}

static int emb_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    vocab_embedding *e = (vocab_embedding *)m;
    int rc = check_ids(m, x, e->num);
    if (rc) return rc;
    fsc_tensor part = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3,
                                       (int64_t[]){x->shape[0], x->shape[1], e->dim});
    if (!part.data) return FSC_ERR_NOMEM;
    tp_vocab_lookup(part.data, x->data, fsc_tensor_numel(x), m->params[0].data, e->first, e->count,
                    e->dim);
    rc = tp_leave_forward(&e->tp, ctx->arena, &part, y);
    return rc ? rc : fsc_save_input(ctx->arena, x, saved);
}

static int emb_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    vocab_embedding *e = (vocab_embedding *)m;
    const fsc_tensor *x = saved;
    if (dx) return fsc_error(FSC_ERR_INVALID, "%s %s: ids have no gradient", m->ops->kind, m->name);
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    int64_t S = e->tp.sp ? x->shape[1] / e->tp.size : x->shape[1];
    if ((rc = fsc_module_check_dy(m, dy, 3, (int64_t[]){x->shape[0], S, e->dim}))) return rc;
    fsc_tensor full;
    if ((rc = tp_leave_backward(&e->tp, ctx->arena, dy, &full))) return rc;
    tp_vocab_lookup_backward(m->params[0].grad, full.data, x->data, fsc_tensor_numel(x), e->first,
                             e->count, e->dim);
    return FSC_OK;
}

static const fsc_module_ops emb_ops = {TP_KIND_EMBEDDING, emb_forward, emb_backward, NULL};

fsc_module *fsc_tp_embedding_new(const char *name, int num, int dim, float init_std,
                                 const fsc_tp_options *tp) {
    if (num <= 0 || dim <= 0) {
        fsc_error(FSC_ERR_INVALID, "%s %s: sizes %d x %d must be positive", TP_KIND_EMBEDDING,
                  name ? name : "", num, dim);
        return NULL;
    }
    vocab_embedding *e = tp_module_alloc(sizeof *e, &emb_ops, name, tp);
    if (!e) return NULL;
    int vp = 0;
    fsc_tp_vocab_range(num, e->tp.size, e->tp.rank, &e->first, &e->count, &vp);
    e->num = num, e->dim = dim;
    if (fsc_module_add_param(&e->tp.base, "weight", 2, (int64_t[]){vp, dim}, FSC_INIT_NORMAL,
                             init_std) < 0) {
        fsc_module_free(&e->tp.base);
        return NULL;
    }
    e->tp.shard[0] = (tp_shard){0, 1, num, vp};
    return &e->tp.base;
}

/* ---- cross-entropy over vocabulary shards ------------------------------------------ */
static int reduce(fsc_group *g, float *buf, int64_t n, fsc_reduce_op op) {
    if (fsc_group_size(g) == 1) return FSC_OK;
    int rc = fsc_group_allreduce(g, buf, n, FSC_DTYPE_F32, op);
    return rc ? fsc_error_context(rc, "vocab-parallel cross-entropy: ") : FSC_OK;
}

int tp_check_targets(const int32_t *y, int64_t N, int vocab, int ignore_index) {
    for (int64_t i = 0; i < N; i++) /* targets are replicated: every rank fails alike */
        if (y[i] != ignore_index && (y[i] < 0 || y[i] >= vocab))
            return fsc_error(FSC_ERR_INVALID,
                             "cross_entropy: target %d at position %lld outside [0,%d)", y[i],
                             (long long)i, vocab);
    return FSC_OK;
}

int tp_cross_entropy_rows(double *sum, float *x, const int32_t *y, int64_t N, int vp, int first,
                          int count, int ignore_index, double norm, bool grad, fsc_group *g,
                          fsc_arena *arena) {
    fsc_arena_mark_t mark = fsc_arena_mark(arena);
    float *mx = fsc_arena_alloc(arena, 3 * (size_t)N * sizeof(float));
    if (!mx) return FSC_ERR_NOMEM;
    float *tl = mx + N, *se = tl + N; /* target logit, sum of exps: adjacent, one all-reduce */
    for (int64_t i = 0; i < N; i++) {
        const float *r = x + i * vp;
        float m = -INFINITY;
        for (int v = 0; v < count; v++) m = r[v] > m ? r[v] : m;
        mx[i] = m;
    }
    int rc = reduce(g, mx, N, FSC_REDUCE_MAX);
    if (rc) return rc;
    for (int64_t i = 0; i < N; i++) {
        float *r = x + i * vp, m = mx[i], s = 0.f;
        int64_t local = (int64_t)y[i] - first;
        tl[i] = 0.f, se[i] = 0.f;
        if (y[i] == ignore_index) continue;
        if (local >= 0 && local < count) tl[i] = r[local];
#pragma omp simd reduction(+ : s)
        for (int v = 0; v < count; v++) {
            r[v] = fsc_fast_expf(r[v] - m);
            s += r[v];
        }
        se[i] = s;
    }
    if ((rc = reduce(g, tl, 2 * N, FSC_REDUCE_SUM))) return rc;
    const float scale = (float)(1.0 / norm);
    for (int64_t i = 0; i < N; i++) {
        float *r = x + i * vp;
        if (y[i] == ignore_index) {
            if (grad) memset(r, 0, (size_t)vp * sizeof(float));
            continue;
        }
        *sum += logf(se[i]) - (tl[i] - mx[i]);
        if (!grad) continue;
        float gs = scale / se[i];
#pragma omp simd
        for (int v = 0; v < count; v++) r[v] *= gs;
        for (int v = count; v < vp; v++) r[v] = 0.f; /* padding */
        int64_t local = (int64_t)y[i] - first;
        if (local >= 0 && local < count) r[local] -= scale;
    }
    fsc_arena_release(arena, mark);
    return FSC_OK;
}

int fsc_tp_cross_entropy(float *loss_out, fsc_tensor *logits, const fsc_tensor *targets, int vocab,
                         int ignore_index, double norm, fsc_group *g, fsc_arena *arena) {
    if (!loss_out || !logits || !targets || !arena)
        return fsc_error(FSC_ERR_INVALID, "tp cross_entropy: NULL argument");
    if (!g) g = fsc_group_self();
    int first, count, vp;
    int rc = fsc_tp_vocab_range(vocab, fsc_group_size(g), fsc_group_rank(g), &first, &count, &vp);
    if (rc) return rc;
    if (logits->dtype != FSC_DTYPE_F32 || logits->ndim < 1 || logits->shape[logits->ndim - 1] != vp)
        return fsc_error(FSC_ERR_SHAPE,
                         "tp cross_entropy: logits must be f32 (..., %d): this rank's %d rows of "
                         "the vocabulary of %d over %d ranks",
                         vp, vp, vocab, fsc_group_size(g));
    int64_t N = fsc_rows(logits);
    if (targets->dtype != FSC_DTYPE_I32 || fsc_tensor_numel(targets) != N)
        return fsc_error(FSC_ERR_SHAPE,
                         "tp cross_entropy: expected %lld int32 targets, got %lld %s", (long long)N,
                         (long long)fsc_tensor_numel(targets), fsc_dtype_name(targets->dtype));
    if (!(norm > 0))
        return fsc_error(FSC_ERR_INVALID, "tp cross_entropy: norm %g must be > 0", norm);
    const int32_t *y = targets->data;
    if ((rc = tp_check_targets(y, N, vocab, ignore_index))) return rc;
    double sum = 0;
    if ((rc = tp_cross_entropy_rows(&sum, logits->data, y, N, vp, first, count, ignore_index, norm,
                                    true, g, arena)))
        return rc;
    *loss_out = (float)(sum / norm);
    return FSC_OK;
}
