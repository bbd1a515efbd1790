/* Process-wide knobs: thread count for fsc's OpenMP loops, and a clock. */
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fsc/core.h"

static int num_threads = 0; /* 0: not decided yet */

void fsc_set_num_threads(int n) {
    num_threads = n > 0 ? n : 1;
#ifdef _OPENMP
    omp_set_num_threads(num_threads);
#endif
}

int fsc_get_num_threads(void) {
    if (num_threads == 0) {
        const char *env = getenv("FSC_NUM_THREADS");
        fsc_set_num_threads(env ? atoi(env) : 1);
    }
    return num_threads;
}

double fsc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
