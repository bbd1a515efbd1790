/* Ending a cmocka program that runs under mpiexec: every rank exits non-zero
 * if any rank's tests failed, so the launcher reports the failure whichever
 * rank saw it. */
#ifndef FSC_TEST_MPI_TEST_H
#define FSC_TEST_MPI_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/dist.h"

/* One scratch directory for the whole world: rank 0 makes it, every rank
 * learns its name (cmocka group fixtures; dir holds 64 bytes). */
static inline int mpi_scratch_dir(char *dir, const char *prefix) {
    int32_t buf[16] = {0};
    if (fsc_dist_rank() == 0) {
        snprintf(dir, 64, "/tmp/%s_XXXXXX", prefix);
        if (!mkdtemp(dir)) return -1;
        memcpy(buf, dir, 64);
    }
    if (fsc_group_broadcast(fsc_group_world(), buf, 16, FSC_DTYPE_I32, 0)) return -1;
    memcpy(dir, buf, 64);
    return 0;
}

/* Every rank is done with it; rank 0 removes it. */
static inline int mpi_scratch_dir_remove(const char *dir) {
    fsc_group_barrier(fsc_group_world());
    if (fsc_dist_rank() != 0) return 0;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) ? -1 : 0;
}

/* A whole file in memory (malloc'ed; *n its size), NULL if it cannot be read. */
static inline unsigned char *mpi_read_file(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *b = NULL;
    if (!fseek(f, 0, SEEK_END) && (*n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (b = malloc((size_t)*n + 1)) && fread(b, 1, (size_t)*n, f) != (size_t)*n)
        free(b), b = NULL;
    fclose(f);
    return b;
}

/* ---- one scratch directory for a program's tests (cmocka group fixtures) ---- */

static char *mpi_scratch;              /* the program's directory (64 bytes) */
static const char *mpi_scratch_prefix; /* /tmp/<prefix>_XXXXXX */

static inline int mpi_scratch_setup(void **state) {
    (void)state;
    return mpi_scratch_dir(mpi_scratch, mpi_scratch_prefix);
}

static inline int mpi_scratch_teardown(void **state) {
    (void)state;
    return mpi_scratch_dir_remove(mpi_scratch);
}

/* Runs the cmocka array `tests` with one scratch directory for the world in
 * dir (64 bytes; /tmp/<prefix>_XXXXXX, made before the first test and
 * removed after the last); cmocka's count of failed tests on this rank. */
#define mpi_run_tests_in_scratch(tests, prefix, dir)                                               \
    (mpi_scratch_prefix = (prefix), mpi_scratch = (dir),                                           \
     cmocka_run_group_tests(tests, mpi_scratch_setup, mpi_scratch_teardown))

static inline int mpi_test_finish(int failed) {
    int any = failed;
    fsc_group_allreduce(fsc_group_world(), &any, 1, FSC_DTYPE_I32, FSC_REDUCE_MAX);
    fsc_dist_finalize();
    return any ? 1 : 0;
}

/* main() of an MPI test program, whose file-scope `rank` and `world` it
 * sets once MPI is up: `init` runs, the entries (cmocka_unit_test(...)) run
 * as one group (`run`, cmocka's count of failures), `fini` runs, then one
 * verdict for every rank (mpi_test_finish). The _IN_SCRATCH forms run them
 * with one scratch directory for the world in dir, as
 * mpi_run_tests_in_scratch does. */
#define MPI_TEST_MAIN_WITH(init, run, fini, ...)                                                   \
    int main(int argc, char **argv) {                                                              \
        if (fsc_dist_init(&argc, &argv, NULL)) return 1;                                           \
        rank = fsc_dist_rank(), world = fsc_dist_size();                                           \
        init;                                                                                      \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                           \
        const int failed = run;                                                                    \
        fini;                                                                                      \
        return mpi_test_finish(failed);                                                            \
    }
#define MPI_TEST_MAIN_RUN(run, ...) MPI_TEST_MAIN_WITH((void)0, run, (void)0, __VA_ARGS__)
#define MPI_TEST_MAIN(...) MPI_TEST_MAIN_RUN(cmocka_run_group_tests(tests, NULL, NULL), __VA_ARGS__)
#define MPI_TEST_MAIN_IN_SCRATCH(prefix, dir, ...)                                                 \
    MPI_TEST_MAIN_RUN(mpi_run_tests_in_scratch(tests, prefix, dir), __VA_ARGS__)

/* main() of an equivalence test (equivalence.h): MPI_TEST_MAIN's, with the
 * test-only fault named by FSC_TEST_FAULT switched on first, so that the
 * fault matrix (tests/CMakeLists.txt) can run the same program. */
#define MPI_EQ_MAIN(...)                                                                           \
    MPI_TEST_MAIN_WITH(eq_fault_from_env(), cmocka_run_group_tests(tests, NULL, NULL), (void)0,    \
                       __VA_ARGS__)
#define MPI_EQ_MAIN_IN_SCRATCH(prefix, dir, ...)                                                   \
    MPI_TEST_MAIN_WITH(eq_fault_from_env(), mpi_run_tests_in_scratch(tests, prefix, dir), (void)0, \
                       __VA_ARGS__)

/* The end of a program whose tests leave a peer out of a collective on
 * purpose (the watchdog's): no verdict exchange (a peer may be gone), and a
 * finalize that times out is expected; any other failure of it counts. */
static inline int mpi_test_finish_faulted(int failed) {
    int rc = fsc_dist_finalize();
    if (rc && rc != FSC_ERR_TIMEOUT) {
        fprintf(stderr, "fsc_dist_finalize: %s\n", fsc_last_error());
        failed++;
    }
    return failed ? 1 : 0;
}

/* MPI up with every collective's deadline timeout_s (the watchdog tests'
 * short one); non-zero, said on stderr, when it did not start. */
static inline int mpi_test_init_timeout(int *argc, char ***argv, double timeout_s) {
    fsc_dist_options opt = {.timeout_s = timeout_s};
    if (!fsc_dist_init(argc, argv, &opt)) return 0;
    fprintf(stderr, "fsc_dist_init: %s\n", fsc_last_error());
    return 1;
}

/* main() of such a program: MPI up with timeout_s (mpi_test_init_timeout),
 * the entries (cmocka_unit_test(...)) run as one group, then
 * mpi_test_finish_faulted's verdict. */
#define MPI_TEST_MAIN_FAULTED(timeout_s, ...)                                                      \
    int main(int argc, char **argv) {                                                              \
        if (mpi_test_init_timeout(&argc, &argv, timeout_s)) return 1;                              \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                           \
        return mpi_test_finish_faulted(cmocka_run_group_tests(tests, NULL, NULL));                 \
    }

#endif
