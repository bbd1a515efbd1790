/* The tagged allocator (docs/architecture.md, decision 6). Each block carries a small
 * header with its tag and size, so fsc_mem_free needs only the pointer and the
 * per-tag counters stay exact. Counters are atomics: worker threads allocate.
 * Memory comes from calloc, which maps large blocks as untouched zero pages:
 * no memset pass, and RSS grows only with what is used. Blocks of HUGE_MIN
 * bytes or more (parameters, gradients, optimizer state, activation arenas)
 * are mapped directly, 2 MiB aligned, and asked for transparent huge pages:
 * a training step streams through them, and 4 KiB pages cost TLB misses. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fsc/core.h"

#define ALIGN 64

#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MIN ((size_t)4 << 20)

typedef struct {
    void *base;    /* what calloc or mmap returned */
    size_t mapped; /* mmap length, or 0 for calloc */
    size_t bytes;
    _Atomic size_t discarded; /* bytes given back by fsc_mem_discard, not counted */
    int tag;
    uint32_t magic;
} header;

#define MAGIC 0xF5C0A11Cu

static _Atomic size_t current[FSC_MEM_TAG_COUNT], peak[FSC_MEM_TAG_COUNT];
static _Atomic size_t total_current, total_peak;
static _Atomic size_t limit;   /* 0: none */
static _Atomic int limit_read; /* FSC_MEM_LIMIT_MB consulted */

/* FSC_MEM_LIMIT_MB into *bytes (0, no budget, when unset or empty; its range
 * is the environment table's); FSC_ERR_INVALID naming the value and the range
 * when it is not a number in it. */
static int limit_from_env(size_t *bytes) {
    double mb;
    int rc = fsc_env_double("FSC_MEM_LIMIT_MB", &mb);
    *bytes = rc ? 0 : (size_t)(mb * 1048576.0);
    return rc;
}

static _Atomic int env_invalid; /* FSC_MEM_LIMIT_MB was read and is invalid */

/* The budget, reading FSC_MEM_LIMIT_MB the first time (unless set already). */
static size_t budget(void) {
    if (!atomic_exchange(&limit_read, 1)) {
        size_t bytes;
        if (limit_from_env(&bytes))
            atomic_store(&env_invalid, 1);
        else if (bytes && !atomic_load(&limit))
            atomic_store(&limit, bytes);
    }
    return atomic_load(&limit);
}

void fsc_mem_set_limit(size_t bytes) {
    atomic_store(&limit_read, 1);
    atomic_store(&env_invalid, 0); /* an explicit budget replaces the variable */
    atomic_store(&limit, bytes);
}

size_t fsc_mem_get_limit(void) {
    return budget();
}

/* Checks that `bytes` more stay within the budget (a racy check: good enough
 * for a budget, which is a demonstration device, not a security boundary). */
static bool within_budget(size_t bytes, const char *what) {
    size_t cap = budget(), now = atomic_load(&total_current);
    if (atomic_load(&env_invalid)) { /* never run with a budget other than the one asked */
        size_t ignored;
        limit_from_env(&ignored); /* sets the message naming the value and the range */
        return false;
    }
    if (!cap || now + bytes <= cap) return true;
    fsc_error(FSC_ERR_NOMEM,
              "memory budget exceeded: %zu more bytes for %s on top of %zu would pass the "
              "budget of %zu bytes (%.1f MiB; FSC_MEM_LIMIT_MB)",
              bytes, what, now, cap, (double)cap / 1048576.0);
    return false;
}

static void raise_peak(_Atomic size_t *pk, size_t now) {
    size_t old = atomic_load(pk);
    while (now > old && !atomic_compare_exchange_weak(pk, &old, now)) {
    }
}

void *fsc_mem_alloc(fsc_mem_tag tag, size_t bytes) {
    if ((unsigned)tag >= FSC_MEM_TAG_COUNT) {
        fsc_error(FSC_ERR_INVALID, "fsc_mem_alloc: bad tag %d", (int)tag);
        return NULL;
    }
    if (bytes > SIZE_MAX - 4 * HUGE_PAGE) {
        fsc_error(FSC_ERR_NOMEM, "fsc_mem_alloc: %zu bytes is too large", bytes);
        return NULL;
    }
    if (!within_budget(bytes, fsc_mem_tag_name(tag))) return NULL;
    char *base, *user;
    size_t mapped = 0;
    if (bytes >= HUGE_MIN) {
        mapped = bytes + 2 * HUGE_PAGE;
        base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) base = NULL;
        user = base ? (char *)(((uintptr_t)base + HUGE_PAGE) & ~(uintptr_t)(HUGE_PAGE - 1)) : NULL;
#ifdef MADV_HUGEPAGE
        if (base) madvise(user, bytes, MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
    } else {
        base = calloc(1, bytes + ALIGN + sizeof(header));
        user =
            base
                ? (char *)(((uintptr_t)base + sizeof(header) + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1))
                : NULL;
    }
    if (!base) {
        fsc_error(FSC_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes,
                  fsc_mem_tag_name(tag));
        return NULL;
    }
    header *h = (header *)user - 1;
    h->base = base;
    h->mapped = mapped;
    h->bytes = bytes;
    atomic_store(&h->discarded, 0);
    h->tag = tag;
    h->magic = MAGIC;
    raise_peak(&peak[tag], atomic_fetch_add(&current[tag], bytes) + bytes);
    raise_peak(&total_peak, atomic_fetch_add(&total_current, bytes) + bytes);
    return user;
}

void fsc_mem_free(void *p) {
    if (!p) return;
    header *h = (header *)p - 1;
    if (h->magic != MAGIC) {
        fsc_log(FSC_LOG_ERROR, "fsc_mem_free: pointer %p was not allocated by fsc_mem_alloc", p);
        return;
    }
    h->magic = 0;
    size_t counted = h->bytes - atomic_load(&h->discarded);
    atomic_fetch_sub(&current[h->tag], counted);
    atomic_fetch_sub(&total_current, counted);
    if (h->mapped)
        munmap(h->base, h->mapped);
    else
        free(h->base);
}

static header *block_of(void *p, size_t offset, size_t bytes, const char *fn) {
    header *h = p ? (header *)p - 1 : NULL;
    if (!h || h->magic != MAGIC) {
        fsc_error(FSC_ERR_INVALID, "%s: %p was not allocated by fsc_mem_alloc", fn, p);
        return NULL;
    }
    if (offset > h->bytes || bytes > h->bytes - offset) {
        fsc_error(FSC_ERR_INVALID, "%s: range [%zu, %zu) outside the block's %zu bytes", fn, offset,
                  offset + bytes, h->bytes);
        return NULL;
    }
    return h;
}

int fsc_mem_discard(void *p, size_t offset, size_t bytes) {
    header *h = block_of(p, offset, bytes, "fsc_mem_discard");
    if (!h) return FSC_ERR_INVALID;
    char *lo = (char *)p + offset, *hi = lo + bytes;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *plo = (char *)(((uintptr_t)lo + page - 1) & ~(uintptr_t)(page - 1));
    char *phi = (char *)((uintptr_t)hi & ~(uintptr_t)(page - 1));
    /* whole pages of a mapped block go back to the system (and read as zero);
     * the ragged ends, and calloc'd blocks, are zeroed in place */
    if (h->mapped && phi > plo && madvise(plo, (size_t)(phi - plo), MADV_DONTNEED) == 0) {
        memset(lo, 0, (size_t)(plo - lo));
        memset(phi, 0, (size_t)(hi - phi));
    } else {
        memset(lo, 0, bytes);
    }
    atomic_fetch_add(&h->discarded, bytes);
    atomic_fetch_sub(&current[h->tag], bytes);
    atomic_fetch_sub(&total_current, bytes);
    return FSC_OK;
}

int fsc_mem_recommit(void *p, size_t offset, size_t bytes) {
    header *h = block_of(p, offset, bytes, "fsc_mem_recommit");
    if (!h) return FSC_ERR_INVALID;
    if (bytes > atomic_load(&h->discarded))
        return fsc_error(FSC_ERR_INVALID, "fsc_mem_recommit: %zu bytes, only %zu were discarded",
                         bytes, atomic_load(&h->discarded));
    if (!within_budget(bytes, fsc_mem_tag_name(h->tag))) return FSC_ERR_NOMEM;
    atomic_fetch_sub(&h->discarded, bytes);
    raise_peak(&peak[h->tag], atomic_fetch_add(&current[h->tag], bytes) + bytes);
    raise_peak(&total_peak, atomic_fetch_add(&total_current, bytes) + bytes);
    return FSC_OK;
}

size_t fsc_mem_current(fsc_mem_tag t) {
    return (unsigned)t < FSC_MEM_TAG_COUNT ? current[t] : 0;
}
size_t fsc_mem_peak(fsc_mem_tag t) {
    return (unsigned)t < FSC_MEM_TAG_COUNT ? peak[t] : 0;
}
size_t fsc_mem_current_total(void) {
    return total_current;
}
size_t fsc_mem_peak_total(void) {
    return total_peak;
}

void fsc_mem_reset_peaks(void) {
    for (int t = 0; t < FSC_MEM_TAG_COUNT; t++) atomic_store(&peak[t], atomic_load(&current[t]));
    atomic_store(&total_peak, atomic_load(&total_current));
}

const char *fsc_mem_tag_name(fsc_mem_tag t) {
    static const char *names[FSC_MEM_TAG_COUNT] = {"params", "grads", "optim",   "activ",
                                                   "comm",   "work",  "gathered"};
    return (unsigned)t < FSC_MEM_TAG_COUNT ? names[t] : "?";
}
