/* What the FSDP tests share (tests/parallel/fsdp/mpi_fsdp.c,
 * tests/parallel/zero/mpi_frozen_shards.c). Include after cmocka.h. */
#ifndef FSC_TEST_FSDP_TEST_H
#define FSC_TEST_FSDP_TEST_H

#include <stdlib.h>
#include <string.h>

#include "fsc/fsdp.h"

/* f's full parameters (gathered, then released), laid out as fsc_params_bind
 * would lay out m's: *numel floats, the caller frees them. */
static inline float *fsdp_full_params(fsc_fsdp *f, fsc_module *m, int64_t *numel) {
    fsc_params layout;
    assert_int_equal(fsc_params_collect(m, &layout), FSC_OK);
    float *out = calloc((size_t)layout.numel, sizeof(float));
    assert_non_null(out);
    assert_int_equal(fsc_fsdp_summon_full_params(f), FSC_OK);
    for (int e = 0; e < layout.count; e++)
        memcpy(out + layout.entries[e].offset, layout.entries[e].param->data,
               sizeof(float) * (size_t)layout.entries[e].param->numel);
    assert_int_equal(fsc_fsdp_release_full_params(f, false), FSC_OK);
    *numel = layout.numel;
    free(layout.entries);
    return out;
}

#endif
