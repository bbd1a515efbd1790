/* What the collective tests share: element i of a buffer of any dtype as a
 * double, both ways; a return-code check that prints the error first; and
 * their main, which runs the tests on the world and on its even / odd
 * halves. Include after cmocka.h. */
#ifndef FSC_TESTS_COLLECTIVES_TEST_H
#define FSC_TESTS_COLLECTIVES_TEST_H

#include <stdint.h>
#include <stdio.h>

#include "fsc/dist.h"
#include "mpi_test.h"

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

static fsc_group *halves; /* even / odd world ranks, made before the first test */

static int ct_setup(void **state) {
    (void)state;
    if (!fsc_group_split(fsc_group_world(), fsc_dist_rank() % 2, fsc_dist_rank(), "halves",
                         &halves))
        return 0;
    fprintf(stderr, "split: %s\n", fsc_last_error());
    return -1;
}

static int ct_teardown(void **state) {
    (void)state;
    fsc_group_free(halves);
    return 0;
}

/* A collectives test's main: MPI up, the cmocka array `tests` with halves
 * made around it, then one verdict for every rank. */
#define ct_run_tests(argcp, argvp, tests)                                                          \
    (fsc_dist_init((argcp), (argvp), NULL)                                                         \
         ? (fprintf(stderr, "fsc_dist_init: %s\n", fsc_last_error()), 1)                           \
         : mpi_test_finish(cmocka_run_group_tests(tests, ct_setup, ct_teardown)))

#endif
