/* The TP GPT's tied LM head fused with its vocab-parallel cross-entropy.
 *
 * Unfused, the head keeps a (B, T, V/t) logits tensor from forward to
 * backward (at GPT-2 sizes the largest activation of the step). Fused, the
 * head and loss run once (the TP GPT runs them at the start of its backward
 * in training) and the rows go through in chunks: each chunk's logits are
 * made, turned into d(loss)/d(logits) by the cross-entropy, and folded at
 * once into the input gradient and the weight gradient, so one chunk's
 * logits exist at a time. A chunk's logits
 * hold at most as many floats as the head's input (at least 32 rows, for the
 * GEMMs' sake). Per row the arithmetic is the unfused head's; only the
 * weight gradient's sum over rows runs in chunks (a summation order, like
 * micro-batches). */
#include <math.h>
#include <string.h>

#include "nn/layers_internal.h"
#include "tp_internal.h"

int tp_head_loss_keep(const tp_module *m, const fsc_ctx *ctx, int64_t n, int vocab,
                      fsc_head_loss *kept, fsc_tensor *y, float **loss) {
    const fsc_head_loss *hl = ctx->head_loss;
    if (!hl->targets)
        return fsc_error(FSC_ERR_INVALID, "%s: fused head and loss without targets", m->base.name);
    int rc = tp_check_targets(hl->targets, n, vocab, hl->ignore_index);
    if (rc) return rc;
    if (!(hl->norm > 0))
        return fsc_error(FSC_ERR_INVALID, "%s: loss normaliser %g must be > 0", m->base.name,
                         hl->norm);
    int32_t *targets = fsc_arena_alloc(ctx->arena, (size_t)n * sizeof *targets);
    *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 1, (int64_t[]){1});
    if (!targets || !y->data) return FSC_ERR_NOMEM;
    memcpy(targets, hl->targets, (size_t)n * sizeof *targets);
    *kept = *hl;
    kept->targets = targets;
    *loss = y->data;
    **loss = NAN;
    return FSC_OK;
}

int tp_head_loss_check_dy(const tp_module *m, const fsc_tensor *dy) {
    int rc = fsc_module_check_dy(&m->base, dy, 1, (int64_t[]){1});
    if (rc) return rc;
    if (*(const float *)dy->data != 1.f)
        return fsc_error(FSC_ERR_INVALID,
                         "%s: backward after a fused head and loss needs dy = 1, got %g",
                         m->base.name, (double)*(const float *)dy->data);
    return FSC_OK;
}

enum { MIN_CHUNK_ROWS = 32 };

static int64_t chunk_rows(int64_t N, int C, int vp) {
    int64_t n = N * C / (vp > 0 ? vp : 1);
    if (n < MIN_CHUNK_ROWS) n = MIN_CHUNK_ROWS;
    return n < N ? n : N;
}

int tp_head_loss(const tp_module *m, const fsc_ctx *ctx, const fsc_tensor *in, fsc_param *wte,
                 int first, int count, int vp, const struct fsc_head_loss *hl, double *loss_sum,
                 fsc_tensor *dfinal) {
    const bool grad = ctx->training;
    const int C = (int)in->shape[in->ndim - 1];
    if (grad && !wte->grad)
        return fsc_error(FSC_ERR_INVALID,
                         "TP GPT %s: the fused head needs wte's gradient bound "
                         "(fsc_tp_params_bind with with_grads)",
                         m->base.name);
    fsc_tensor dfull = {0};
    int rc = grad ? fsc_alloc_like(ctx->arena, in, C, dfinal) : FSC_OK;
    if (rc) return rc;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor fin;
    if ((rc = tp_enter_forward(m, ctx->arena, in, &fin))) return rc;
    const int64_t N = fsc_rows(&fin), nc = chunk_rows(N, C, vp);
    /* without SP the input gradient is all-reduced in place, in *dfinal */
    if (grad) rc = m->sp ? fsc_alloc_like(ctx->arena, &fin, C, &dfull) : (dfull = *dfinal, FSC_OK);
    float *logits = rc ? NULL : fsc_arena_alloc(ctx->arena, (size_t)(nc * vp) * sizeof(float));
    if (!logits) return rc ? rc : FSC_ERR_NOMEM;
    const float *x = fin.data;
    const fsc_gemm_prec prec = fsc_ctx_prec(ctx);
    for (int64_t r0 = 0; r0 < N; r0 += nc) {
        const int n = (int)(N - r0 < nc ? N - r0 : nc);
        fsc_matmul_forward_prec(logits, x + r0 * C, wte->data, NULL, n, C, vp, FSC_WEIGHT_OUT_IN,
                                prec);
        rc = tp_cross_entropy_rows(loss_sum, logits, hl->targets + r0, n, vp, first, count,
                                   hl->ignore_index, hl->norm, grad, m->g, ctx->arena);
        if (rc) return rc;
        if (grad)
            fsc_matmul_backward_prec((float *)dfull.data + r0 * C, wte->grad, NULL, logits,
                                     x + r0 * C, wte->data, n, C, vp, FSC_WEIGHT_OUT_IN, prec);
    }
    if (grad && (rc = tp_enter_backward(m, ctx->arena, &dfull))) return rc; /* f / scatter */
    if (grad && dfull.data != dfinal->data)
        memcpy(dfinal->data, dfull.data, fsc_tensor_nbytes(dfinal));
    fsc_arena_release(ctx->arena, mark);
    return FSC_OK;
}
