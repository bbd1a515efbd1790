/* What the ShardedDDP tests share (tests/parallel/zero/mpi_sdp.c,
 * mpi_frozen_shards.c, tests/parallel/shard/mpi_grad_scaler.c): the end of a
 * run, its parameters kept and everything else freed. */
#ifndef FSC_TEST_ZERO_TEST_H
#define FSC_TEST_ZERO_TEST_H

#include <stdlib.h>
#include <string.h>

#include "fsc/io.h"
#include "fsc/zero.h"

/* A copy of ps's flat values (the caller frees it). */
static inline float *params_copy(const fsc_params *ps) {
    float *out = malloc(sizeof(float) * (size_t)ps->numel);
    if (!out) abort();
    memcpy(out, ps->data, sizeof(float) * (size_t)ps->numel);
    return out;
}

/* Frees a ShardedDDP run: the wrapper before the optimizer it steps, the
 * parameters before the model they bind (tk may be NULL). */
static inline void sdp_run_free(fsc_arena *arena, fsc_module *sdp, fsc_oss *oss, fsc_params *ps,
                                fsc_tokens *tk, fsc_module *m) {
    fsc_arena_free(arena);
    fsc_module_free(sdp);
    fsc_oss_free(oss);
    fsc_params_free(ps);
    if (tk) fsc_tokens_free(tk);
    fsc_module_free(m);
}

#endif
