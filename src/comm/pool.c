/* A small cache of communication buffers (tag FSC_MEM_COMM): the rings'
 * scratch chunks.
 *
 * The one idea: a 100 MB collective should not map and fault in 100 MB of
 * fresh pages every call; the few buffers recently used are kept (and stay
 * counted under "comm") until fsc_dist_finalize. The runtime is FUNNELED
 * (one thread calls MPI), so the cache needs no lock.
 */
#include <stdlib.h>

#include "dist_internal.h"

#define POOL_SLOTS 4

static struct {
    void *p;
    size_t bytes;
} pool[POOL_SLOTS];

/* sizes of handed-out buffers, found again on put */
typedef struct out_buf {
    void *p;
    size_t bytes;
    struct out_buf *next;
} out_buf;
static out_buf *outstanding;

void *fsc_dist_buf_get(size_t bytes) {
    if (bytes == 0) bytes = 64;
    int best = -1;
    for (int i = 0; i < POOL_SLOTS; i++)
        if (pool[i].p && pool[i].bytes >= bytes && (best < 0 || pool[i].bytes < pool[best].bytes))
            best = i;
    out_buf *o = malloc(sizeof *o);
    if (!o) {
        fsc_error(FSC_ERR_NOMEM, "out of memory for a communication buffer");
        return NULL;
    }
    if (best >= 0) {
        o->p = pool[best].p;
        o->bytes = pool[best].bytes;
        pool[best].p = NULL;
    } else {
        o->p = fsc_mem_alloc(FSC_MEM_COMM, bytes);
        o->bytes = bytes;
        if (!o->p) {
            free(o);
            return NULL;
        }
    }
    o->next = outstanding;
    outstanding = o;
    return o->p;
}

void fsc_dist_buf_put(void *p) {
    if (!p) return;
    out_buf **link = &outstanding;
    while (*link && (*link)->p != p) link = &(*link)->next;
    if (!*link) return; /* not ours: a bug, but freeing a foreign pointer would be worse */
    out_buf *o = *link;
    *link = o->next;
    /* keep it in an empty slot, or in place of the smallest cached one */
    int slot = -1;
    for (int i = 0; i < POOL_SLOTS; i++) {
        if (!pool[i].p) {
            slot = i;
            break;
        }
        if (slot < 0 || pool[i].bytes < pool[slot].bytes) slot = i;
    }
    if (pool[slot].p && pool[slot].bytes >= o->bytes) {
        fsc_mem_free(o->p);
    } else {
        fsc_mem_free(pool[slot].p);
        pool[slot].p = o->p;
        pool[slot].bytes = o->bytes;
    }
    free(o);
}

void fsc_dist_buf_trim(void) {
    for (int i = 0; i < POOL_SLOTS; i++) {
        fsc_mem_free(pool[i].p);
        pool[i].p = NULL;
    }
}
