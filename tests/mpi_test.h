/* Ending a cmocka program that runs under mpiexec: every rank exits non-zero
 * if any rank's tests failed, so the launcher reports the failure whichever
 * rank saw it. */
#ifndef FSC_TEST_MPI_TEST_H
#define FSC_TEST_MPI_TEST_H

#include "fsc/dist.h"

static int mpi_test_finish(int failed) {
    int any = failed;
    fsc_group_allreduce(fsc_group_world(), &any, 1, FSC_DTYPE_I32, FSC_REDUCE_MAX);
    fsc_dist_finalize();
    return any ? 1 : 0;
}

#endif
