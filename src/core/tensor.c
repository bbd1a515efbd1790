/* Tensor views: contiguous, row-major, up to FSC_MAX_DIMS dims, never owning. */
#include <string.h>

#include "fsc/core.h"

fsc_tensor fsc_tensor_make(void *data, fsc_dtype dt, int ndim, const int64_t *shape) {
    fsc_tensor t = {.data = data, .dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim && i < FSC_MAX_DIMS; i++) t.shape[i] = shape[i];
    return t;
}

fsc_tensor fsc_tensor_1d(void *d, fsc_dtype dt, int64_t d0) {
    return fsc_tensor_make(d, dt, 1, (int64_t[]){d0});
}
fsc_tensor fsc_tensor_2d(void *d, fsc_dtype dt, int64_t d0, int64_t d1) {
    return fsc_tensor_make(d, dt, 2, (int64_t[]){d0, d1});
}
fsc_tensor fsc_tensor_3d(void *d, fsc_dtype dt, int64_t d0, int64_t d1, int64_t d2) {
    return fsc_tensor_make(d, dt, 3, (int64_t[]){d0, d1, d2});
}
fsc_tensor fsc_tensor_4d(void *d, fsc_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return fsc_tensor_make(d, dt, 4, (int64_t[]){d0, d1, d2, d3});
}

int64_t fsc_tensor_numel(const fsc_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t fsc_tensor_nbytes(const fsc_tensor *t) {
    return (size_t)fsc_tensor_numel(t) * fsc_dtype_size(t->dtype);
}

int fsc_tensor_reshape(const fsc_tensor *t, int ndim, const int64_t *shape, fsc_tensor *out) {
    if (ndim < 1 || ndim > FSC_MAX_DIMS)
        return fsc_error(FSC_ERR_SHAPE, "reshape: %d dims (1..%d allowed)", ndim, FSC_MAX_DIMS);
    fsc_tensor r = fsc_tensor_make(t->data, t->dtype, ndim, shape);
    if (fsc_tensor_numel(&r) != fsc_tensor_numel(t))
        return fsc_error(FSC_ERR_SHAPE, "reshape: %lld elements cannot become %lld",
                         (long long)fsc_tensor_numel(t), (long long)fsc_tensor_numel(&r));
    *out = r;
    return FSC_OK;
}

int fsc_tensor_narrow0(const fsc_tensor *t, int64_t start, int64_t count, fsc_tensor *out) {
    if (t->ndim < 1 || start < 0 || count < 0 || start + count > t->shape[0])
        return fsc_error(FSC_ERR_SHAPE, "narrow: rows [%lld,%lld) outside [0,%lld)",
                         (long long)start, (long long)(start + count),
                         (long long)(t->ndim ? t->shape[0] : 0));
    fsc_tensor r = *t;
    size_t row = fsc_tensor_nbytes(t) / (size_t)(t->shape[0] ? t->shape[0] : 1);
    r.data = (char *)t->data + (size_t)start * row;
    r.shape[0] = count;
    *out = r;
    return FSC_OK;
}

fsc_tensor fsc_tensor_arena(fsc_arena *a, fsc_dtype dt, int ndim, const int64_t *shape) {
    fsc_tensor t = fsc_tensor_make(NULL, dt, ndim, shape);
    t.data = fsc_arena_alloc(a, fsc_tensor_nbytes(&t));
    return t;
}

bool fsc_tensor_same_shape(const fsc_tensor *a, const fsc_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

int fsc_tensor_convert(const fsc_tensor *src, fsc_tensor *dst) {
    int64_t n = fsc_tensor_numel(src);
    if (n != fsc_tensor_numel(dst))
        return fsc_error(FSC_ERR_SHAPE, "convert: %lld elements into %lld", (long long)n,
                         (long long)fsc_tensor_numel(dst));
    if (src->dtype == dst->dtype) {
        memmove(dst->data, src->data, fsc_tensor_nbytes(src));
        return FSC_OK;
    }
    const float *sf = src->data;
    float *df = dst->data;
    const uint16_t *sh = src->data;
    uint16_t *dh = dst->data;
    if (src->dtype == FSC_DTYPE_F32 && dst->dtype == FSC_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) dh[i] = fsc_f32_to_bf16(sf[i]);
    else if (src->dtype == FSC_DTYPE_F32 && dst->dtype == FSC_DTYPE_F16)
        for (int64_t i = 0; i < n; i++) dh[i] = fsc_f32_to_f16(sf[i]);
    else if (src->dtype == FSC_DTYPE_BF16 && dst->dtype == FSC_DTYPE_F32)
        for (int64_t i = 0; i < n; i++) df[i] = fsc_bf16_to_f32(sh[i]);
    else if (src->dtype == FSC_DTYPE_F16 && dst->dtype == FSC_DTYPE_F32)
        for (int64_t i = 0; i < n; i++) df[i] = fsc_f16_to_f32(sh[i]);
    else
        return fsc_error(FSC_ERR_DTYPE, "convert: %s to %s is not supported",
                         fsc_dtype_name(src->dtype), fsc_dtype_name(dst->dtype));
    return FSC_OK;
}
