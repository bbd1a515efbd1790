/* What the collective tests share: element i of a buffer of any dtype as a
 * double, both ways, and a return-code check that prints the error first. */
#ifndef FSC_TESTS_COLLECTIVES_TEST_H
#define FSC_TESTS_COLLECTIVES_TEST_H

#include <stdint.h>
#include <stdio.h>

#include "fsc/dist.h"

static inline void put(void *buf, fsc_dtype dt, int64_t i, double v) {
    switch (dt) {
    case FSC_DTYPE_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case FSC_DTYPE_BF16:
        ((uint16_t *)buf)[i] = fsc_f32_to_bf16((float)v);
        break;
    case FSC_DTYPE_F16:
        ((uint16_t *)buf)[i] = fsc_f32_to_f16((float)v);
        break;
    case FSC_DTYPE_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    default:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    }
}

static inline double get(const void *buf, fsc_dtype dt, int64_t i) {
    switch (dt) {
    case FSC_DTYPE_F32:
        return ((const float *)buf)[i];
    case FSC_DTYPE_BF16:
        return fsc_bf16_to_f32(((const uint16_t *)buf)[i]);
    case FSC_DTYPE_F16:
        return fsc_f16_to_f32(((const uint16_t *)buf)[i]);
    case FSC_DTYPE_I32:
        return ((const int32_t *)buf)[i];
    default:
        return (double)((const int64_t *)buf)[i];
    }
}

#define CHECK_RC(rc)                                                                               \
    do {                                                                                           \
        int rc_ = (rc);                                                                            \
        if (rc_) fprintf(stderr, "rank %d: %s\n", fsc_dist_rank(), fsc_last_error());              \
        assert_int_equal(rc_, FSC_OK);                                                             \
    } while (0)

#endif
