/* Internal to the kernels: the tile sizes and per-tile steps that flash
 * attention's forward (attention_flash.c) and backward
 * (attention_flash_backward.c) share, so that backward recomputes exactly
 * the probabilities forward normalised. */
#ifndef FSC_KERNELS_ATTENTION_FLASH_INTERNAL_H
#define FSC_KERNELS_ATTENTION_FLASH_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "fsc/kernels.h"

/* Query rows x key columns of one tile. 64 x 128 fp32 scores are 32 KiB and
 * a 128-key block of K and V at hd = 64 another 64 KiB: the working set of
 * a tile stays in a core's L2 (512 KiB and up on the CPUs measured). */
#define FSC_FLASH_BR 64
#define FSC_FLASH_BC 128

/* Keys [0, n) of this call that query row r (of the call) can see: key j is
 * visible when k_pos0 + j <= q_pos0 + r. Clamped to [0, Tk]. */
static inline int fsc_flash_visible(const fsc_attn_dims *d, int r) {
    int64_t n = d->q_pos0 + r - d->k_pos0 + 1;
    return n < 0 ? 0 : n > d->Tk ? d->Tk : (int)n;
}

/* Checks a call's dimensions; false (error logged, naming the field) when
 * they cannot be run. */
bool fsc_flash_dims_ok(const fsc_attn_dims *d, const char *who);

#endif
