/* Bump allocator for a step's activations and saved state (DESIGN.md
 * decision 1: forward writes what backward needs into caller-provided memory).
 * After the first step has shown how much a step needs, reset leaves a single
 * block of that size, so steady-state steps never touch malloc. */
#include <stdlib.h>
#include <string.h>

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
    block *head; /* current block first */
    size_t used_before_head;
    size_t high_water;
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
    free(a);
}

void *fsc_arena_alloc(fsc_arena *a, size_t bytes) {
    size_t need = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (!a->head || a->head->size - a->head->used < need) {
        size_t size = need > a->block_bytes ? need : a->block_bytes;
        block *b = block_new(a->tag, size);
        if (!b) return NULL;
        if (a->head) a->used_before_head += a->head->used;
        b->next = a->head;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += need;
    size_t used = a->used_before_head + a->head->used;
    if (used > a->high_water) a->high_water = used;
    return p;
}

void *fsc_arena_calloc(fsc_arena *a, size_t bytes) {
    void *p = fsc_arena_alloc(a, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void fsc_arena_reset(fsc_arena *a) {
    if (!a->head) return;
    if (a->head->next) { /* several blocks: replace them by one of the high-water size */
        blocks_free(a->head);
        a->head = NULL;
        if (a->high_water > a->block_bytes) a->block_bytes = a->high_water;
        a->head = block_new(a->tag, a->block_bytes);
    }
    if (a->head) a->head->used = 0;
    a->used_before_head = 0;
}

size_t fsc_arena_used(const fsc_arena *a) {
    return a->head ? a->used_before_head + a->head->used : 0;
}

size_t fsc_arena_high_water(const fsc_arena *a) { return a->high_water; }
