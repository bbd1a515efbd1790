/* FSDP's transient buffers: full-size parameters and gradients, the
 * half-precision staging of a bf16/fp16 gather or reduce-scatter, and the
 * conversions between them.
 *
 * Each gather and reduce-scatter needs a few buffers of a unit's size for
 * the length of one unit's compute. A fresh mapping costs a page fault and a
 * zeroed page for every 4 KiB (or 2 MiB): for the fp32 buffers that measured
 * 15% of an FSDP step, and for the half-precision ones, allocated fresh on
 * every gather and reduce-scatter, 18-20% of a bf16 FSDP step (what fp32
 * FSDP does not pay). So released buffers go to small caches and come back
 * from them; a cached buffer keeps its tag (FSC_MEM_GATHERED, FSC_MEM_COMM),
 * which then shows what gathering holds, in use or ready. */
#include <string.h>

#include "fsc/kernels.h"
#include "fsdp_internal.h"

void fsdp_widen(float *dst, const void *src, int64_t n, fsc_dtype dt, bool add) {
    if (dt == FSC_DTYPE_F32) {
        const float *s = src;
        if (add)
            for (int64_t i = 0; i < n; i++) dst[i] += s[i];
        else
            memcpy(dst, s, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (dt == FSC_DTYPE_BF16) { /* bf16 is the top half of an f32: a shift, vectorised */
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)h[i] << 16;
            float v;
            memcpy(&v, &bits, sizeof v);
            dst[i] = add ? dst[i] + v : v;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = add ? dst[i] + fsc_f16_to_f32(h[i]) : fsc_f16_to_f32(h[i]);
}

void fsdp_narrow(void *dst, const float *src, int64_t n, fsc_dtype dt) {
    if (dt == FSC_DTYPE_BF16) { /* fsc_tensor_convert's rounding, vectorised */
        fsc_narrow_bf16(dst, src, n);
        return;
    }
    fsc_tensor s = fsc_tensor_1d((void *)src, FSC_DTYPE_F32, n), d = fsc_tensor_1d(dst, dt, n);
    fsc_tensor_convert(&s, &d);
}

float *fsdp_buf_get(fsc_fsdp *f, int64_t n, bool zero, int64_t *cap) {
    int best = -1;
    for (int i = 0; i < FSDP_CACHE; i++)
        if (f->cache[i] && f->cache_n[i] >= n && (best < 0 || f->cache_n[i] < f->cache_n[best]))
            best = i;
    *cap = best < 0 ? n : f->cache_n[best];
    if (best < 0) {
        f->stats.buffer_allocs++;
        return fsc_mem_alloc(FSC_MEM_GATHERED, (size_t)n * sizeof(float));
    }
    float *p = f->cache[best];
    f->cache[best] = NULL;
    if (zero) memset(p, 0, (size_t)n * sizeof(float));
    return p;
}

void fsdp_buf_put(fsc_fsdp *f, float *p, int64_t cap) {
    if (!p) return;
    for (int i = 0; i < FSDP_CACHE; i++)
        if (!f->cache[i]) {
            f->cache[i] = p, f->cache_n[i] = cap;
            return;
        }
    fsc_mem_free(p);
}

/* Half-precision buffers are matched exactly (tag and size): a unit asks
 * for the same few sizes every step. */
void *fsdp_half_get(fsc_fsdp *f, fsc_mem_tag tag, size_t bytes) {
    for (int i = 0; i < FSDP_HALF_CACHE; i++)
        if (f->half[i] && f->half_tag[i] == tag && f->half_bytes[i] == bytes) {
            void *p = f->half[i];
            f->half[i] = NULL;
            return p;
        }
    f->stats.buffer_allocs++;
    return fsc_mem_alloc(tag, bytes);
}

void fsdp_half_put(fsc_fsdp *f, void *p, fsc_mem_tag tag, size_t bytes) {
    if (!p) return;
    for (int i = 0; i < FSDP_HALF_CACHE; i++)
        if (!f->half[i]) {
            f->half[i] = p, f->half_tag[i] = tag, f->half_bytes[i] = bytes;
            return;
        }
    fsc_mem_free(p);
}

void fsdp_buffers_free(fsc_fsdp *f) {
    for (int i = 0; i < FSDP_CACHE; i++) fsc_mem_free(f->cache[i]), f->cache[i] = NULL;
    for (int i = 0; i < FSDP_HALF_CACHE; i++) fsc_mem_free(f->half[i]), f->half[i] = NULL;
}
