/* Internal to the library: a heap array that doubles as it fills (the
 * module's params and children, the safetensors writer's declarations and
 * metadata), grown in one place. */
#ifndef FSC_CORE_GROW_H
#define FSC_CORE_GROW_H

#include <stdlib.h>

#include "fsc/core.h"

/* Makes *arr (elements of elem bytes, *cap of them) hold at least need:
 * doubles from first (or *cap) until it does. On a failed realloc *arr and
 * *cap are kept and FSC_ERR_NOMEM is returned with the message oom. */
static inline int fsc_grow_array(void **arr, int *cap, int need, size_t elem, int first,
                                 const char *oom) {
    if (need <= *cap) return FSC_OK;
    int nc = *cap ? *cap * 2 : first;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return fsc_error(FSC_ERR_NOMEM, "%s", oom);
    *arr = p;
    *cap = nc;
    return FSC_OK;
}

#endif
