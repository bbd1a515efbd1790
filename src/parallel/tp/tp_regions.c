/* The communication of tensor parallelism, in a few named conjugate pairs
 * (STYLE.md, after Megatron's mappings): entering a TP region is a copy
 * (forward identity, backward all-reduce) or, under sequence parallelism, a
 * sequence gather (backward reduce-scatter); leaving one is a reduce
 * (forward all-reduce, backward identity) or a sequence reduce-scatter
 * (backward gather). The layers contain no collectives of their own beyond
 * these names, so a reader checks a layer's communication by its calls.
 *
 * Sequence shards are (B, T/t, C): rank r holds tokens [r*T/t, (r+1)*T/t) of
 * every sample. Collectives move rank-major chunks, so with B > 1 a gather is
 * followed (and a reduce-scatter preceded) by a permute between (t, B, T/t, C)
 * and (B, T, C); with B = 1 the two layouts are the same and nothing moves. */
#include <string.h>

#include "core/fault.h"
#include "tp_internal.h"

int tp_allreduce(const tp_module *m, float *buf, int64_t n, bool grad) {
    if (m->size == 1) return FSC_OK;
    /* test-only: the last rank's share of a gradient reduction is lost */
    if (grad && fsc_fault_is(FSC_FAULT_DROP_GRAD) && m->rank == m->size - 1)
        memset(buf, 0, (size_t)n * sizeof(float));
    int rc = fsc_group_allreduce(m->g, buf, n, FSC_DTYPE_F32, FSC_REDUCE_SUM);
    return rc ? fsc_error_context(rc, "tensor parallel %s: ", m->base.name) : FSC_OK;
}

/* (t, B, S, C) <-> (B, t*S, C): chunk r of a rank-major buffer is rank r's
 * sequence shard of every sample. */
static void rank_major_to_seq(float *dst, const float *src, int t, int64_t B, int64_t S,
                              int64_t C) {
    for (int r = 0; r < t; r++)
        for (int64_t b = 0; b < B; b++)
            memcpy(dst + (b * t + r) * S * C, src + ((int64_t)r * B + b) * S * C,
                   (size_t)(S * C) * sizeof(float));
}

static void seq_to_rank_major(float *dst, const float *src, int t, int64_t B, int64_t S,
                              int64_t C) {
    for (int r = 0; r < t; r++)
        for (int64_t b = 0; b < B; b++)
            memcpy(dst + ((int64_t)r * B + b) * S * C, src + (b * t + r) * S * C,
                   (size_t)(S * C) * sizeof(float));
}

int tp_shape_error(const fsc_module *m, const char *what, const fsc_tensor *x) {
    char path[FSC_NAME_MAX * 2];
    return fsc_error(FSC_ERR_SHAPE, "module '%s' (%s): %s; got a %s tensor of %d dims (%lld, ...)",
                     fsc_module_path(m, path, sizeof path), m->ops->kind, what,
                     fsc_dtype_name(x->dtype), x->ndim, (long long)(x->ndim ? x->shape[0] : 0));
}

int tp_seq_gather(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y) {
    if (x->ndim != 3 || x->dtype != FSC_DTYPE_F32)
        return tp_shape_error(&m->base, "sequence parallelism needs f32 (B, T/t, C) shards", x);
    if (m->size == 1) {
        *y = *x;
        return FSC_OK;
    }
    int64_t B = x->shape[0], S = x->shape[1], C = x->shape[2], n = B * S * C;
    *y = fsc_tensor_arena(a, FSC_DTYPE_F32, 3, (int64_t[]){B, S * m->size, C});
    if (!y->data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(a);
    float *buf = B == 1 ? y->data : fsc_arena_alloc(a, (size_t)(n * m->size) * sizeof(float));
    if (!buf) return FSC_ERR_NOMEM;
    int rc = fsc_group_allgather(m->g, x->data, buf, n, FSC_DTYPE_F32);
    if (rc) return fsc_error_context(rc, "sequence gather in %s: ", m->base.name);
    if (B > 1) rank_major_to_seq(y->data, buf, m->size, B, S, C);
    fsc_arena_release(a, mark);
    return FSC_OK;
}

int tp_seq_reduce_scatter(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y) {
    if (x->ndim != 3 || x->dtype != FSC_DTYPE_F32 || x->shape[1] % m->size)
        return tp_shape_error(&m->base,
                              "sequence parallelism needs f32 (B, T, C) with T divisible by the "
                              "tensor-parallel size",
                              x);
    if (m->size == 1) {
        *y = *x;
        return FSC_OK;
    }
    int64_t B = x->shape[0], S = x->shape[1] / m->size, C = x->shape[2], n = B * S * C;
    *y = fsc_tensor_arena(a, FSC_DTYPE_F32, 3, (int64_t[]){B, S, C});
    if (!y->data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(a);
    const float *src = x->data;
    if (B > 1) {
        float *buf = fsc_arena_alloc(a, (size_t)(n * m->size) * sizeof(float));
        if (!buf) return FSC_ERR_NOMEM;
        seq_to_rank_major(buf, x->data, m->size, B, S, C);
        src = buf;
    }
    int rc = fsc_group_reduce_scatter(m->g, src, y->data, n, FSC_DTYPE_F32, FSC_REDUCE_SUM);
    fsc_arena_release(a, mark);
    return rc ? fsc_error_context(rc, "sequence reduce-scatter in %s: ", m->base.name) : FSC_OK;
}

int tp_last_gather(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y) {
    if (m->size == 1) {
        *y = *x;
        return FSC_OK;
    }
    int64_t c = x->shape[x->ndim - 1], N = fsc_tensor_numel(x) / c, t = m->size;
    *y = *x;
    y->shape[y->ndim - 1] = c * t;
    y->data = fsc_arena_alloc(a, fsc_tensor_nbytes(y));
    if (!y->data) return FSC_ERR_NOMEM;
    fsc_arena_mark_t mark = fsc_arena_mark(a);
    float *buf = fsc_arena_alloc(a, (size_t)(N * c * t) * sizeof(float));
    if (!buf) return FSC_ERR_NOMEM;
    int rc = fsc_group_allgather(m->g, x->data, buf, N * c, FSC_DTYPE_F32);
    if (rc) return fsc_error_context(rc, "gather of the last dim in %s: ", m->base.name);
    float *out = y->data;
    for (int64_t r = 0; r < t; r++)
        for (int64_t i = 0; i < N; i++)
            memcpy(out + i * c * t + r * c, buf + (r * N + i) * c, (size_t)c * sizeof(float));
    fsc_arena_release(a, mark);
    return FSC_OK;
}

int tp_last_split(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y) {
    if (m->size == 1) {
        *y = *x;
        return FSC_OK;
    }
    int64_t full = x->shape[x->ndim - 1], c = full / m->size, N = fsc_tensor_numel(x) / full;
    *y = *x;
    y->shape[y->ndim - 1] = c;
    y->data = fsc_arena_alloc(a, fsc_tensor_nbytes(y));
    if (!y->data) return FSC_ERR_NOMEM;
    const float *src = x->data;
    float *dst = y->data;
    for (int64_t i = 0; i < N; i++)
        memcpy(dst + i * c, src + i * full + m->rank * c, (size_t)c * sizeof(float));
    return FSC_OK;
}

int tp_enter_forward(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y) {
    if (m->sp) return tp_seq_gather(m, a, x, y);
    *y = *x; /* copy: the input is already replicated */
    return FSC_OK;
}

int tp_enter_backward(const tp_module *m, fsc_arena *a, fsc_tensor *dx) {
    if (m->sp) {
        fsc_tensor part = *dx;
        return tp_seq_reduce_scatter(m, a, &part, dx);
    }
    return tp_allreduce(m, dx->data, fsc_tensor_numel(dx), true);
}

int tp_leave_forward(const tp_module *m, fsc_arena *a, fsc_tensor *x, fsc_tensor *y) {
    if (m->sp) return tp_seq_reduce_scatter(m, a, x, y);
    *y = *x;
    return tp_allreduce(m, x->data, fsc_tensor_numel(x), false);
}

int tp_leave_backward(const tp_module *m, fsc_arena *a, const fsc_tensor *dy, fsc_tensor *dx) {
    if (m->sp) return tp_seq_gather(m, a, dy, dx);
    *dx = *dy; /* the output gradient is replicated already */
    return FSC_OK;
}

int tp_accumulate_replicated(const tp_module *m, float *grad, float *part, int64_t n) {
    if (m->sp) {
        int rc = tp_allreduce(m, part, n, true);
        if (rc) return rc;
    }
    fsc_add_inplace(grad, part, n);
    return FSC_OK;
}
