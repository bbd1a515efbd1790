/* Cross-entropy loss for language models: the fused softmax + cross-entropy
 * kernel, with the global-batch normaliser and checked targets. Logits in
 * bf16 (the head's under bf16 autocast) get their gradient back in bf16. */
#include "fsc/profile.h"
#include "layers_internal.h"

int fsc_cross_entropy(float *loss_out, fsc_tensor *logits, const fsc_tensor *targets,
                      int ignore_index, double norm, fsc_arena *arena) {
    const bool half = logits->dtype == FSC_DTYPE_BF16;
    if ((logits->dtype != FSC_DTYPE_F32 && !half) || logits->ndim < 1)
        return fsc_error(FSC_ERR_SHAPE,
                         "cross_entropy: logits must be f32 or bf16 (..., V), got %s",
                         fsc_dtype_name(logits->dtype));
    int64_t V = logits->shape[logits->ndim - 1], N = fsc_rows(logits);
    if (targets->dtype != FSC_DTYPE_I32 || fsc_tensor_numel(targets) != N)
        return fsc_error(FSC_ERR_SHAPE, "cross_entropy: expected %lld int32 targets, got %lld %s",
                         (long long)N, (long long)fsc_tensor_numel(targets),
                         fsc_dtype_name(targets->dtype));
    if (!(norm > 0)) return fsc_error(FSC_ERR_INVALID, "cross_entropy: norm %g must be > 0", norm);
    float *losses = fsc_arena_alloc(arena, (size_t)N * sizeof(float));
    if (!losses) return FSC_ERR_NOMEM;
    const int32_t *y = targets->data;
    int64_t bad = -1;
    FSC_PROF_BEGIN(FSC_PROF_LOSS, "cross_entropy");
    if (half)
        fsc_crossentropy_fused_bf16(losses, logits->data, y, (int)N, (int)V, ignore_index,
                                    (float)(1.0 / norm), &bad);
    else
        fsc_crossentropy_fused(losses, logits->data, y, (int)N, (int)V, ignore_index,
                               (float)(1.0 / norm), &bad);
    /* logits read, dlogits written */
    if (fsc_prof_enabled) fsc_prof_end(0, (half ? 4.0 : 8.0) * (double)N * (double)V);
    if (bad >= 0)
        return fsc_error(FSC_ERR_INVALID,
                         "cross_entropy: target %d at position %lld outside [0,%lld)", y[bad],
                         (long long)bad, (long long)V);
    double sum = 0;
    for (int64_t i = 0; i < N; i++) sum += losses[i];
    *loss_out = (float)(sum / norm);
    return FSC_OK;
}
