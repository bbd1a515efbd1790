/* The flat-shard layout's checks and its JSON form (flat_layout.c), shared
 * with the shard files' save, load and consolidation (flat_shards.c). */
#ifndef FSC_IO_FLAT_LAYOUT_H
#define FSC_IO_FLAT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "fsc/flat_shards.h"

#define LAYOUT_VERSION 1
#define MAX_ELEMS ((int64_t)1 << 53) /* a JSON number (double) holds every count exactly */

/* Element count of a shape, or -1 if a dim is negative or above MAX_ELEMS, or
 * the count (with no zero dim) is above MAX_ELEMS. */
int64_t flat_shape_numel(int ndim, const int64_t *shape);
/* "[a, b, ...]" into buf (truncated to cap). */
void flat_fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape);
/* L as the JSON text stored in each shard (malloc'ed; NULL, error set, on failure). */
char *flat_layout_json(const fsc_flat_layout *L);
/* Parses and checks a stored layout strictly; errors name path. */
int flat_layout_parse(const char *path, const char *text, fsc_flat_layout *L);

#endif
