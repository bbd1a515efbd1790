/* bf16 views of fp32 arrays: where a caller already holds the bf16 rounding
 * of some fp32 values, bf16 GEMMs read it instead of rounding again.
 *
 * FSDP gathers a unit's parameters in bf16 and widens them for the fp32
 * consumers (LayerNorm, biases, embeddings); the Linear GEMMs would round
 * the widened weights straight back. Registering the gathered bf16 buffer as
 * the view of the widened one lets fsc_matmul_*_prec find it by the weight's
 * address. The table holds only what the registrant vouches for while it
 * vouches for it: a view is removed before its fp32 values can change (FSDP:
 * on release), so nothing here can go stale by itself. A handful of entries
 * live at once (the units gathered), so a short locked scan serves. */
#include <pthread.h>
#include <stdint.h>

#include "fsc/core.h"
#include "fsc/kernels.h"

typedef struct {
    uintptr_t lo, hi; /* fp32 bytes [lo, hi) */
    const uint16_t *bf16;
} view;

static struct {
    pthread_mutex_t lock;
    view v[FSC_BF16_VIEWS_MAX];
    int n;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

int fsc_bf16_view_add(const float *fp32, const uint16_t *bf16, int64_t n) {
    if (!fp32 || !bf16 || n <= 0)
        return fsc_error(FSC_ERR_INVALID,
                         "bf16 view: fp32 %p, bf16 %p, %lld elements: expected "
                         "two arrays and n > 0",
                         (const void *)fp32, (const void *)bf16, (long long)n);
    uintptr_t lo = (uintptr_t)fp32, hi = lo + (uintptr_t)n * sizeof(float);
    int rc = FSC_OK;
    pthread_mutex_lock(&g.lock);
    for (int i = 0; i < g.n && !rc; i++)
        if (lo < g.v[i].hi && g.v[i].lo < hi)
            rc = fsc_error(FSC_ERR_INVALID,
                           "bf16 view: fp32 %p (%lld elements) overlaps one "
                           "already registered",
                           (const void *)fp32, (long long)n);
    if (!rc && g.n == FSC_BF16_VIEWS_MAX)
        rc = fsc_error(FSC_ERR_NOMEM, "bf16 view: all %d entries in use", FSC_BF16_VIEWS_MAX);
    if (!rc) g.v[g.n++] = (view){lo, hi, bf16};
    pthread_mutex_unlock(&g.lock);
    return rc;
}

void fsc_bf16_view_remove(const float *fp32) {
    pthread_mutex_lock(&g.lock);
    for (int i = 0; i < g.n; i++)
        if (g.v[i].lo == (uintptr_t)fp32) {
            g.v[i] = g.v[--g.n];
            break;
        }
    pthread_mutex_unlock(&g.lock);
}

const uint16_t *fsc_bf16_view_find(const float *p, int64_t n) {
    uintptr_t lo = (uintptr_t)p, hi = lo + (uintptr_t)(n > 0 ? n : 0) * sizeof(float);
    const uint16_t *found = NULL;
    pthread_mutex_lock(&g.lock);
    for (int i = 0; i < g.n && !found; i++)
        if (g.v[i].lo <= lo && hi <= g.v[i].hi && n > 0)
            found = g.v[i].bf16 + (lo - g.v[i].lo) / sizeof(float);
    pthread_mutex_unlock(&g.lock);
    return found;
}
