/* Forward-only schedules (an evaluation pass through a pipeline): at every
 * small shape the generated table is valid, holds one F per (stage, micro)
 * and only activation messages, and the simulation gives the forward
 * pipeline's closed form (makespan v m + p - 1 with F = 1: the last rank
 * starts p - 1 late and is then never idle) with nothing held for a
 * backward; the validator refuses any backward piece in such a table, a
 * missing forward, and a schedule whose order cannot run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/pipe_schedule.h"

static const fsc_pipe_config FWD2 = {.ranks = 2, .chunks = 1, .micros = 2, .forward_only = true};

static void test_generated(void **state) {
    (void)state;
    for (int p = 1; p <= 4; p++)
        for (int v = 1; v <= 3; v++)
            for (int m = 1; m <= 5; m++) {
                fsc_pipe_schedule *s = NULL;
                int rc = fsc_pipe_schedule_make_forward(p, v, m, &s);
                if (rc) fail_msg("p %d v %d m %d: %s", p, v, m, fsc_last_error());
                fsc_pipe_config c;
                assert_int_equal(fsc_pipe_schedule_config(s, &c), FSC_OK);
                assert_true(c.forward_only && !c.split_backward);
                fsc_pipe_stats st;
                fsc_pipe_rank_stats pr[4];
                assert_int_equal(fsc_pipe_schedule_validate(s, NULL, &st, pr), FSC_OK);
                /* the last rank starts p - 1 late; with whole groups of p micro-batches
                 * it never idles after that */
                const int S = p * v;
                if (m % p == 0 || v == 1) assert_int_equal(st.makespan, v * m + p - 1);
                assert_true(st.makespan >= (long long)v * m + p - 1);
                assert_int_equal(st.peak_inflight, 0);
                assert_true(st.theoretical_bubble < 0); /* not a training kind */
                int forwards = 0;
                for (int r = 0; r < p; r++) {
                    const fsc_pipe_action *a;
                    int n;
                    assert_int_equal(fsc_pipe_schedule_actions(s, r, &a, &n), FSC_OK);
                    assert_int_equal(pr[r].busy, (long long)v * m);
                    for (int k = 0; k < n; k++) {
                        assert_true(a[k].op == FSC_PIPE_F || a[k].op == FSC_PIPE_SEND_F ||
                                    a[k].op == FSC_PIPE_RECV_F);
                        forwards += a[k].op == FSC_PIPE_F;
                    }
                }
                assert_int_equal(forwards, S * m);
                /* one message per stage boundary that crosses ranks, per micro-batch */
                assert_int_equal(st.messages, p > 1 ? (S - 1) * m : 0);
                fsc_pipe_schedule_free(s);
            }
}

/* text must parse as a forward-only table and fail validation naming `want`. */
static void expect_invalid(const char *text, const char *want) {
    fsc_pipe_schedule *s = NULL;
    assert_int_equal(fsc_pipe_schedule_parse(text, FWD2, &s), FSC_OK);
    assert_int_equal(fsc_pipe_schedule_validate(s, NULL, NULL, NULL), FSC_ERR_INVALID);
    if (!strstr(fsc_last_error(), want)) fail_msg("expected '%s' in: %s", want, fsc_last_error());
    fsc_pipe_schedule_free(s);
}

static void test_refusals(void **state) {
    (void)state;
    /* the generated table, written by hand, is valid */
    const char *good = "0F0,0SEND_F0,0F1,0SEND_F1\n1RECV_F0,1F0,1RECV_F1,1F1\n";
    fsc_pipe_schedule *s = NULL;
    assert_int_equal(fsc_pipe_schedule_parse(good, FWD2, &s), FSC_OK);
    assert_int_equal(fsc_pipe_schedule_validate(s, NULL, NULL, NULL), FSC_OK);
    fsc_pipe_schedule_free(s);
    /* a backward, its gradient message, a W: none belongs in an evaluation pass */
    expect_invalid("0F0,0SEND_F0,0F1,0SEND_F1\n1RECV_F0,1F0,1B0,1RECV_F1,1F1\n",
                   "1B0): a forward-only schedule has no backward");
    expect_invalid("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0\n1RECV_F0,1F0,1RECV_F1,1F1\n",
                   "0RECV_B0): a forward-only schedule has no backward");
    /* a missing forward */
    expect_invalid("0F0,0SEND_F0\n1RECV_F0,1F0\n", "rank 0 has no 0F1");
    /* an order that cannot run: rank 0 takes stage 2's input before sending stage 0's
     * output, which rank 1 needs before it can produce that input */
    const fsc_pipe_config two = {.ranks = 2, .chunks = 2, .micros = 1, .forward_only = true};
    assert_int_equal(fsc_pipe_schedule_parse("2RECV_F0,2F0,2SEND_F0,0F0,0SEND_F0\n"
                                             "1RECV_F0,1F0,1SEND_F0,3RECV_F0,3F0\n",
                                             two, &s),
                     FSC_OK);
    assert_int_equal(fsc_pipe_schedule_validate(s, NULL, NULL, NULL), FSC_ERR_INVALID);
    if (!strstr(fsc_last_error(), "deadlock") || !strstr(fsc_last_error(), "2RECV_F0"))
        fail_msg("expected a deadlock at 2RECV_F0: %s", fsc_last_error());
    fsc_pipe_schedule_free(s);
    assert_int_equal(fsc_pipe_schedule_make_forward(0, 1, 2, &s), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_make_forward(2, 65, 2, &s), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_make_forward(2, 1, 0, &s), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_make_forward(2, 1, 2, NULL), FSC_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_generated),
                                       cmocka_unit_test(test_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
