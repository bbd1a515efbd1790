/* What the LLaMA layers share (not public): rotary tables from the arena and
 * the check of a rotary configuration. */
#ifndef FSC_NN_LLAMA_INTERNAL_H
#define FSC_NN_LLAMA_INTERNAL_H

#include <math.h>

#include "fsc/nn.h"

/* Allocates (T, hd/2) cos and sin tables from a and fills them for
 * positions pos0.. (fsc_rope_table). FSC_ERR_NOMEM when the arena is full. */
int fsc_rope_tables_alloc(fsc_arena *a, const float *inv_freq, int T, int hd, int pos0,
                          float **cos_t, float **sin_t);
/* FSC_OK, or FSC_ERR_INVALID naming the module (kind, name) for an odd or
 * non-positive head_dim, theta <= 0 or not finite, or a rope_scaling with
 * factor > 0 whose other fields break fsc_rope_scaling's rules. */
int fsc_rope_check_config(const char *kind, const char *name, int hd, float theta,
                          const fsc_rope_scaling *sc);

#endif
