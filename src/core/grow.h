/* Internal to the library: a heap array that doubles as it fills (the
 * module's params and children, the safetensors writer's declarations and
 * metadata), grown in one place.
 *
 * The array is named by its own typed pointer: FSC_GROW_ARRAY assigns it
 * the pointer fsc_grow_realloc returns, so no caller casts `T **` to
 * `void **` and writes a `T *` through a `void *` lvalue (which strict
 * aliasing does not allow). */
#ifndef FSC_CORE_GROW_H
#define FSC_CORE_GROW_H

#include <stdlib.h>

#include "fsc/core.h"

/* Returns arr (elements of elem bytes, *cap of them) reallocated to hold at
 * least need, doubling from first (or *cap) until it does, and sets *cap;
 * arr itself when it already holds need. On a failed realloc returns arr
 * unchanged with *cap kept, after setting FSC_ERR_NOMEM's message to oom. */
static inline void *fsc_grow_realloc(void *arr, int *cap, int need, size_t elem, int first,
                                     const char *oom) {
    if (need <= *cap) return arr;
    int nc = *cap ? *cap * 2 : first;
    while (nc < need) nc *= 2;
    void *p = realloc(arr, (size_t)nc * elem);
    if (!p) {
        fsc_error(FSC_ERR_NOMEM, "%s", oom);
        return arr;
    }
    *cap = nc;
    return p;
}

/* Makes the typed pointer p (an lvalue; *cap elements of *p) hold at least
 * need, as fsc_grow_realloc: FSC_OK, or FSC_ERR_NOMEM with p and *cap kept.
 * p, cap and need are evaluated twice: pass them without side effects. */
#define FSC_GROW_ARRAY(p, cap, need, first, oom)                                                   \
    ((p) = fsc_grow_realloc((p), (cap), (need), sizeof *(p), (first), (oom)),                      \
     *(cap) >= (need) ? FSC_OK : FSC_ERR_NOMEM)

#endif
