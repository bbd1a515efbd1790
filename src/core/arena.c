/* Bump allocator for a step's activations and saved state (docs/architecture.md,
 * decision 1: forward writes what backward needs into caller-provided memory).
 *
 * Blocks come from the tagged allocator. Allocation bumps within the newest
 * block and chains a new one when it is full; mark/release give back
 * everything allocated after a mark (released blocks wait on a spare list for
 * reuse). Reset leaves a single block of what the last step used at most, so a
 * steady-state training loop never touches malloc; it touches that block's
 * pages there too, so their faults land between steps, not in the next one. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/core.h"

#define ALIGN 64

typedef struct block {
    struct block *next;
    size_t size, used;
    char *data;
} block;

struct fsc_arena {
    fsc_mem_tag tag;
    size_t block_bytes;
    block *head;             /* newest block first */
    block *spare;            /* released blocks, empty, for reuse */
    size_t used_before_head; /* bytes used in the blocks after head */
    size_t high_water;       /* ever */
    size_t step_high;        /* since the last reset */
};

static block *block_new(fsc_mem_tag tag, size_t size) {
    block *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->data = fsc_mem_alloc(tag, size);
    if (!b->data) {
        free(b);
        return NULL;
    }
    b->size = size;
    return b;
}

static void blocks_free(block *b) {
    while (b) {
        block *n = b->next;
        fsc_mem_free(b->data);
        free(b);
        b = n;
    }
}

fsc_arena *fsc_arena_new(fsc_mem_tag tag, size_t block_bytes) {
    fsc_arena *a = calloc(1, sizeof *a);
    if (!a) {
        fsc_error(FSC_ERR_NOMEM, "out of memory creating an arena");
        return NULL;
    }
    a->tag = tag;
    a->block_bytes = block_bytes ? block_bytes : (size_t)1 << 20;
    return a;
}

void fsc_arena_free(fsc_arena *a) {
    if (!a) return;
    blocks_free(a->head);
    blocks_free(a->spare);
    free(a);
}

/* A spare block with room for `need`, unlinked from the spare list, or NULL. */
static block *take_spare(fsc_arena *a, size_t need) {
    for (block **p = &a->spare; *p; p = &(*p)->next)
        if ((*p)->size >= need) {
            block *b = *p;
            *p = b->next;
            return b;
        }
    return NULL;
}

void *fsc_arena_alloc(fsc_arena *a, size_t bytes) {
    size_t need = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (!a->head || a->head->size - a->head->used < need) {
        block *b = take_spare(a, need);
        if (!b) b = block_new(a->tag, need > a->block_bytes ? need : a->block_bytes);
        if (!b) return NULL;
        if (a->head) a->used_before_head += a->head->used;
        b->next = a->head;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += need;
    size_t used = a->used_before_head + a->head->used;
    if (used > a->high_water) a->high_water = used;
    if (used > a->step_high) a->step_high = used;
    return p;
}

void *fsc_arena_calloc(fsc_arena *a, size_t bytes) {
    void *p = fsc_arena_alloc(a, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

fsc_arena_mark_t fsc_arena_mark(const fsc_arena *a) {
    return (fsc_arena_mark_t){a->head, a->head ? a->head->used : 0};
}

void fsc_arena_release(fsc_arena *a, fsc_arena_mark_t m) {
    while (a->head && a->head != m.block) { /* blocks chained after the mark */
        block *b = a->head;
        a->head = b->next;
        if (a->head) a->used_before_head -= a->head->used;
        b->used = 0;
        b->next = a->spare;
        a->spare = b;
    }
    if (a->head && m.used <= a->head->used) a->head->used = m.used;
}

/* Faults in the first `bytes` of a fresh block, one write a page. Its pages
 * are zero already; the writes only map them. Untouched, they would be mapped
 * (and zeroed by the kernel) one fault at a time inside the next step: after
 * the first step's reset that was hundreds of MB, which on a pipeline's last
 * stage showed up as a doubled bubble. Only what the last step used, all of
 * which it touched, so no page is mapped that a step would not map. */
static void prefault(block *b, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    volatile char *p = b->data;
    for (size_t i = 0; i < bytes && i < b->size; i += page) p[i] = 0;
}

void fsc_arena_reset(fsc_arena *a) {
    /* Nothing allocated since the last reset: it is one still, and keeps its
     * block (a second reset must not shrink it to block_bytes). */
    if (!a->step_high) return;
    /* Several blocks, or one much larger than the last step needed: replace
     * them by one block of what the last step used. */
    size_t need = a->step_high > a->block_bytes ? a->step_high : a->block_bytes;
    if (a->spare || (a->head && (a->head->next || a->head->size > need + need / 4))) {
        blocks_free(a->head);
        blocks_free(a->spare);
        a->spare = NULL;
        a->head = block_new(a->tag, need); /* NULL is fine: the next alloc retries */
        if (a->head) prefault(a->head, a->step_high);
    }
    if (a->head) a->head->used = 0;
    a->used_before_head = 0;
    a->step_high = 0;
}

size_t fsc_arena_used(const fsc_arena *a) {
    return a->head ? a->used_before_head + a->head->used : 0;
}

size_t fsc_arena_high_water(const fsc_arena *a) {
    return a->high_water;
}
