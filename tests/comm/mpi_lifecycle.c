/* The heartbeat (src/comm/heartbeat.c): every rank answers it, and when one
 * rank is stopped (SIGSTOP) mid-run every other rank fails with one verdict
 * naming that rank, the operation and the collective number, while the
 * stopped rank, once continued, reports the same text.
 *
 * Runs with 1, 2 and 4 ranks (the verdict needs 2). With
 * FSC_TEST_STALL_FINALIZE=R in the environment, rank R instead stops itself
 * just before fsc_dist_finalize: the others must end in MPI_Finalize's
 * deadline (status FSC_DIST_DEADLINE_EXIT, a message naming rank R), which
 * tests/tools/watchdog_faults.py checks; that mode is not a cmocka run.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/heartbeat.h"
#include "fsc/dist.h"
#include "mpi_test.h"

#define TIMEOUT_S 2.0

/* Every rank answers a probe; this rank is in the run phase. */
static void test_everyone_answers(void **state) {
    (void)state;
    int n = fsc_dist_size();
    if (n == 1) skip();
    hb_peer *st = calloc((size_t)n, sizeof *st);
    assert_non_null(st);
    assert_true(fsc_hb_probe(st, 5.0));
    for (int q = 0; q < n; q++) {
        if (!st[q].alive) fail_msg("rank %d: rank %d did not answer", fsc_dist_rank(), q);
        assert_int_equal(st[q].phase, FSC_HB_RUN);
    }
    char text[512] = "";
    assert_int_equal(fsc_hb_describe(st, n, NULL, text, sizeof text, 0.0, false), 0);
    free(st);
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK);
}

/* The last rank is stopped by rank 0 while the others wait in a barrier. */
static void test_stopped_rank_named(void **state) {
    (void)state;
    int n = fsc_dist_size(), me = fsc_dist_rank(), victim = n - 1;
    if (n == 1) skip();
    fsc_group *g = NULL;
    assert_int_equal(fsc_group_split(fsc_group_world(), 0, me, "hb", &g), FSC_OK);
    int32_t pid = (int32_t)getpid(), vpid = pid;
    assert_int_equal(fsc_group_broadcast(g, &vpid, 1, FSC_DTYPE_I32, victim), FSC_OK);
    char want[96];
    snprintf(want, sizeof want, "world rank %d is lost: no heartbeat, and its process (pid %d",
             victim, vpid);
    if (me == 0) kill(vpid, SIGSTOP);
    int rc = fsc_group_barrier(g); /* the victim's returns only after SIGCONT */
    if (me == 0) kill(vpid, SIGCONT);
    assert_int_equal(rc, FSC_ERR_TIMEOUT);
    const char *msg = fsc_last_error();
    fprintf(stderr, "rank %d: %s\n", me, msg);
    if (me != victim && !strstr(msg, want))
        fail_msg("rank %d: message lacks \"%s\": %s", me, want, msg);
    if (!strstr(msg, "on group hb") || !strstr(msg, "is lost"))
        fail_msg("rank %d: message lacks the group or the verdict: %s", me, msg);
    char mine[900] = "";
    snprintf(mine, sizeof mine, "%s", msg);
    assert_int_equal(fsc_group_barrier(g), FSC_ERR_TIMEOUT); /* every later call: the verdict */
    if (strcmp(fsc_last_error(), mine) != 0)
        fail_msg("rank %d: a later call says something else: %s", me, fsc_last_error());
    /* one text on every rank (compared over plain MPI: every fsc collective now fails) */
    char *all = calloc((size_t)n, sizeof mine);
    assert_non_null(all);
    assert_int_equal(
        MPI_Allgather(mine, sizeof mine, MPI_CHAR, all, sizeof mine, MPI_CHAR, MPI_COMM_WORLD),
        MPI_SUCCESS);
    for (int q = 0; q < n; q++)
        if (strcmp(all + (size_t)q * sizeof mine, mine) != 0)
            fail_msg("rank %d says \"%s\" but rank %d says \"%s\"", me, mine, q,
                     all + (size_t)q * sizeof mine);
    free(all);
}

static int stall_finalize(int argc, char **argv) {
    fsc_dist_options opt = {.timeout_s = TIMEOUT_S, .init_timeout_s = TIMEOUT_S};
    if (fsc_dist_init(&argc, &argv, &opt)) return 1;
    int rc = fsc_group_barrier(fsc_group_world());
    if (fsc_dist_rank() == atoi(getenv("FSC_TEST_STALL_FINALIZE"))) raise(SIGSTOP);
    rc = rc ? rc : fsc_dist_finalize();
    printf("rank %d: fsc_dist_finalize returned %d\n", fsc_dist_rank(), rc);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (getenv("FSC_TEST_STALL_FINALIZE")) return stall_finalize(argc, argv);
    if (mpi_test_init_timeout(&argc, &argv, TIMEOUT_S)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_everyone_answers),
        cmocka_unit_test(test_stopped_rank_named),
    };
    return mpi_test_finish_faulted(cmocka_run_group_tests(tests, NULL, NULL));
}
