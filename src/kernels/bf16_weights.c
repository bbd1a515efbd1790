/* bf16 copies of weights, rounded once per weights version.
 *
 * Under bf16 autocast every Linear GEMM reads its weight in bf16, and
 * without this each call rounds it again: the forward and the input
 * gradient of every micro-batch, although the weight changes only when the
 * optimizer steps. Here the weights' rounding is kept by address and length
 * with the weights version it was made at; a lookup at a later version
 * rounds again in place. Correctness rests on one rule: whoever writes
 * parameters bumps the version (fsc_weights_changed): the optimizer's step,
 * weights loads, broadcasts, and the trainer before every step (which covers
 * what runs between steps: averaging, a resume). The cache is off unless
 * turned on (the trainer does, under bf16 autocast, where parameters stay
 * in place: not where FSDP gathers them into reused buffers, whose own bf16
 * views serve instead), so code that writes weights directly is unaffected. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "kernels/gemm_bf16_internal.h"

#define ENTRIES 1024 /* weights cached at once; beyond, calls round per call */

typedef struct {
    const float *w;
    int64_t n;
    uint64_t version; /* the version w was rounded at */
    uint16_t *bf16;
} entry;

static struct {
    pthread_mutex_t lock;
    _Atomic uint64_t version; /* starts at 1: an entry at 0 was never rounded */
    _Atomic bool on;
    entry e[ENTRIES];
    int n;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .version = 1};

void fsc_weights_changed(void) {
    atomic_fetch_add(&g.version, 1);
}

uint64_t fsc_weights_version(void) {
    return atomic_load(&g.version);
}

static void drop_all(void) {
    for (int i = 0; i < g.n; i++) fsc_mem_free(g.e[i].bf16);
    g.n = 0;
}

void fsc_bf16_weight_cache_set(bool on) {
    pthread_mutex_lock(&g.lock);
    atomic_store(&g.on, on);
    if (!on) drop_all();
    pthread_mutex_unlock(&g.lock);
}

bool fsc_bf16_weight_cache_on(void) {
    return atomic_load(&g.on);
}

/* The entry of (w, n), made if there is room; NULL otherwise. Under g.lock. */
static entry *find(const float *w, int64_t n) {
    for (int i = 0; i < g.n; i++)
        if (g.e[i].w == w) {
            if (g.e[i].n == n) return &g.e[i];
            fsc_mem_free(g.e[i].bf16); /* the address now holds another array */
            g.e[i] = g.e[--g.n];
            break;
        }
    uint16_t *h = g.n < ENTRIES ? fsc_mem_alloc(FSC_MEM_WORK, (size_t)n * sizeof *h) : NULL;
    if (!h) return NULL;
    g.e[g.n] = (entry){.w = w, .n = n, .version = 0, .bf16 = h};
    return &g.e[g.n++];
}

const uint16_t *fsc_bf16_weight_find(const float *w, int64_t n) {
    const uint16_t *view = fsc_bf16_view_find(w, n);
    /* no copies where the GEMMs run on sgemm (no native bf16, mode off) */
    if (view || !w || n <= 0 || !atomic_load(&g.on) || !fsc_bf16_gemm_wanted()) return view;
    pthread_mutex_lock(&g.lock);
    entry *e = atomic_load(&g.on) ? find(w, n) : NULL;
    /* the version read before rounding: a write during it leaves the entry
     * older than the weights, so the next lookup rounds again */
    const uint64_t v = atomic_load(&g.version);
    if (e && e->version != v) {
        fsc_narrow_bf16(e->bf16, w, n);
        e->version = v;
    }
    pthread_mutex_unlock(&g.lock);
    return e ? e->bf16 : NULL;
}
