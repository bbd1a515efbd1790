/* Process-wide knobs: thread count for fsc's OpenMP loops, and a clock. */
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
        int n; /* 1 when unset; an invalid value is said at first use, and 1 is used */
        if (fsc_env_int("FSC_NUM_THREADS", &n))
            fsc_log(FSC_LOG_ERROR, "%s; using 1", fsc_last_error());
        fsc_set_num_threads(n);
    }
    return num_threads;
}

double fsc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
