/* Pipeline schedules as data: every generator at every small shape passes the
 * validator; the simulated makespans, bubbles and activation peaks equal the
 * closed forms of the literature exactly (unit costs, no communication time);
 * the validator refuses hand-broken tables with a message naming the action;
 * CSV round-trips, and malformed CSV is refused with its line and column.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/pipe_schedule.h"

#include "tmpdir.h"
#include "test_main.h"

static fsc_pipe_config cfg(int p, int v, int m, bool split) {
    return (fsc_pipe_config){.ranks = p, .chunks = v, .micros = m, .split_backward = split};
}

static fsc_pipe_schedule *make(fsc_pipe_kind kind, int p, int v, int m) {
    fsc_pipe_schedule *s = NULL;
    int rc = fsc_pipe_schedule_make(kind, p, v, m, &s);
    if (rc)
        fprintf(stderr, "make %s p%d v%d m%d: %s\n", fsc_pipe_kind_name(kind), p, v, m,
                fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    return s;
}

static fsc_pipe_stats stats_of(const fsc_pipe_schedule *s, const fsc_pipe_costs *c,
                               fsc_pipe_rank_stats *pr) {
    fsc_pipe_stats st;
    int rc = fsc_pipe_schedule_validate(s, c, &st, pr);
    if (rc) fprintf(stderr, "validate: %s\n", fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    return st;
}

/* What f holds from its start, NUL-terminated; closes f (caller frees). */
static char *slurp(FILE *f) {
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    rewind(f);
    char *buf = calloc(1, (size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return buf;
}

/* text must parse but fail validation, the message holding every string given. */
static void expect_invalid(const char *text, fsc_pipe_config c, ...) {
    fsc_pipe_schedule *s = NULL;
    assert_int_equal(fsc_pipe_schedule_parse(text, c, &s), FSC_OK);
    fsc_pipe_stats st = {.makespan = 12345};
    int rc = fsc_pipe_schedule_validate(s, NULL, &st, NULL);
    const char *msg = fsc_last_error();
    fprintf(stderr, "  refused: %s\n", msg);
    assert_int_equal(rc, FSC_ERR_INVALID);
    assert_int_equal(st.makespan, 12345); /* untouched on failure */
    va_list ap;
    va_start(ap, c);
    for (const char *want; (want = va_arg(ap, const char *));) {
        if (!strstr(msg, want)) fprintf(stderr, "  missing '%s'\n", want);
        assert_non_null(strstr(msg, want));
    }
    va_end(ap);
    /* the printer validates too, and prints nothing for a broken schedule */
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(fsc_pipe_schedule_print(s, f), FSC_ERR_INVALID);
    assert_int_equal(ftell(f), 0);
    fclose(f);
    fsc_pipe_schedule_free(s);
}

/* ---- text form ------------------------------------------------------------------------ */

static void test_action_text(void **state) {
    (void)state;
    const char *forms[] = {"0F3", "12B0", "4W7", "2SEND_F5", "3RECV_F5", "3SEND_B5", "2RECV_B5"};
    for (int op = 0; op < FSC_PIPE_OP_COUNT; op++) {
        fsc_pipe_action a;
        assert_int_equal(fsc_pipe_action_parse(forms[op], &a), FSC_OK);
        assert_int_equal(a.op, op);
        char buf[FSC_PIPE_ACTION_TEXT];
        assert_int_equal(fsc_pipe_action_format(a, buf, sizeof buf), (int)strlen(forms[op]));
        assert_string_equal(buf, forms[op]);
    }
    fsc_pipe_action a = {FSC_PIPE_RECV_B, 999999999, 999999999};
    char buf[FSC_PIPE_ACTION_TEXT], small[4];
    assert_true(fsc_pipe_action_format(a, buf, sizeof buf) > 0);
    assert_true(fsc_pipe_action_format(a, small, sizeof small) < 0);
    assert_string_equal(small, "");
    a.op = FSC_PIPE_OP_COUNT;
    assert_int_equal(fsc_pipe_action_format(a, buf, sizeof buf), FSC_ERR_INVALID);
    const char *bad[] = {"",     "F0",   "0F",           "0X1",    "0f1",       " 0F1", "0F1 ",
                         "0F1x", "-1F0", "1234567890F0", "0SEND1", "0SEND_F_1", "0FF1"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        assert_int_equal(fsc_pipe_action_parse(bad[k], &a), FSC_ERR_FORMAT);
        assert_non_null(strstr(fsc_last_error(), bad[k]));
    }
    assert_int_equal(fsc_pipe_action_parse(NULL, &a), FSC_ERR_INVALID);
}

static void test_kind_names(void **state) {
    (void)state;
    fsc_pipe_kind k;
    const char *names[] = {"gpipe", "1f1b", "interleaved", "zbh1"};
    for (int i = 0; i < FSC_PIPE_KIND_COUNT; i++) {
        assert_int_equal(fsc_pipe_kind_parse(names[i], &k), FSC_OK);
        assert_int_equal(k, i);
        assert_string_equal(fsc_pipe_kind_name(k), names[i]);
    }
    assert_int_equal(fsc_pipe_kind_parse("ZB1", &k), FSC_OK);
    assert_int_equal(k, FSC_PIPE_ZB_H1);
    k = FSC_PIPE_GPIPE;
    assert_int_equal(fsc_pipe_kind_parse("zbv", &k), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "zbv"));
    assert_int_equal(k, FSC_PIPE_GPIPE);
    assert_string_equal(fsc_pipe_kind_name((fsc_pipe_kind)99), "?");
}

/* ---- generators: every shape, exact figures -------------------------------------------- */

/* 1F1B's figures at (p, m), for comparing other kinds with it. */
static fsc_pipe_stats onef1b(int p, int m, fsc_pipe_rank_stats *pr) {
    fsc_pipe_schedule *s = make(FSC_PIPE_1F1B, p, 1, m);
    fsc_pipe_stats st = stats_of(s, NULL, pr);
    fsc_pipe_schedule_free(s);
    return st;
}

static void check_common(const fsc_pipe_schedule *s, fsc_pipe_stats st,
                         const fsc_pipe_rank_stats *pr, int p, int v, int m) {
    int S = p * v;
    /* one message per cross-rank edge and micro-batch, both directions */
    assert_int_equal(st.messages, p > 1 ? 2 * (S - 1) * m : 0);
    assert_true(fabs(st.bubble - st.theoretical_bubble) < 1e-12);
    long long work = 0;
    int total = 0, n;
    for (int r = 0; r < p; r++) {
        const fsc_pipe_action *a;
        assert_int_equal(fsc_pipe_schedule_actions(s, r, &a, &n), FSC_OK);
        total += n;
        assert_int_equal(pr[r].busy + pr[r].idle, st.makespan);
        assert_true(pr[r].end <= st.makespan);
        work += pr[r].busy;
    }
    assert_int_equal(work, 3LL * S * m); /* F + B (+ W) = 3 units per (stage, micro) */
    assert_int_equal(total, st.actions);
}

static void test_gpipe_1f1b(void **state) {
    (void)state;
    for (int p = 1; p <= 4; p++) {
        int ms[3] = {1, p, 2 * p + 1};
        for (int j = 0; j < 3; j++) {
            int m = ms[j];
            fsc_pipe_rank_stats pr[4], pr1[4];
            fsc_pipe_schedule *g = make(FSC_PIPE_GPIPE, p, 1, m);
            fsc_pipe_stats sg = stats_of(g, NULL, pr);
            fsc_pipe_stats s1 = onef1b(p, m, pr1);
            check_common(g, sg, pr, p, 1, m);
            /* bubble (p-1)/(m+p-1): makespan (m+p-1)(F+B), each rank idle (p-1)(F+B) */
            assert_int_equal(sg.makespan, 3 * (m + p - 1));
            assert_int_equal(s1.makespan, 3 * (m + p - 1));
            assert_true(fabs(sg.bubble - (double)(p - 1) / (m + p - 1)) < 1e-12);
            assert_true(fabs(s1.bubble - (double)(p - 1) / (m + p - 1)) < 1e-12);
            for (int r = 0; r < p; r++) {
                assert_int_equal(pr[r].idle, 3 * (p - 1));
                assert_int_equal(pr1[r].idle, 3 * (p - 1));
                assert_int_equal(pr[r].peak_inflight, m); /* GPipe holds every micro-batch */
                int want = p - r < m ? p - r : m;         /* 1F1B: min(p - r, m) */
                assert_int_equal(pr1[r].peak_inflight, want);
                assert_int_equal(pr1[r].peak_inflight_w, want);
            }
            assert_int_equal(s1.peak_inflight, p < m ? p : m);
            fsc_pipe_schedule_free(g);
        }
    }
}

static void test_interleaved(void **state) {
    (void)state;
    for (int p = 1; p <= 4; p++) {
        int ms[3] = {1, p, 2 * p + 1};
        for (int v = 2; v <= 3; v++) {
            for (int j = 0; j < 3; j++) {
                int m = ms[j];
                fsc_pipe_schedule *s = NULL;
                if (m % p) {
                    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_INTERLEAVED, p, v, m, &s),
                                     FSC_ERR_INVALID);
                    assert_non_null(strstr(fsc_last_error(), "multiple"));
                    assert_null(s);
                    continue;
                }
                s = make(FSC_PIPE_INTERLEAVED, p, v, m);
                fsc_pipe_rank_stats pr[4];
                fsc_pipe_stats st = stats_of(s, NULL, pr);
                check_common(s, st, pr, p, v, m);
                /* A chunk costs F = 1, B = 2: the pipeline fills and drains in p - 1 chunk
                 * steps instead of p - 1 stage steps, so the makespan is 3(vm + p - 1) and
                 * the bubble (p-1)/(vm+p-1), v times less idle than 1F1B running the same
                 * model as one stage of cost F = v, B = 2v per rank. */
                assert_int_equal(st.makespan, 3 * (v * m + p - 1));
                assert_true(fabs(st.bubble - (double)(p - 1) / (v * m + p - 1)) < 1e-12);
                fsc_pipe_schedule *o = make(FSC_PIPE_1F1B, p, 1, m);
                fsc_pipe_costs stage = {.f = v, .b = 2 * v};
                fsc_pipe_rank_stats pro[4];
                fsc_pipe_stats so = stats_of(o, &stage, pro);
                assert_int_equal(so.makespan, 3 * v * (m + p - 1));
                for (int r = 0; r < p; r++) assert_int_equal(pro[r].idle, v * pr[r].idle);
                if (p > 1) assert_true(st.bubble < so.bubble);
                fsc_pipe_schedule_free(o);
                fsc_pipe_schedule_free(s);
            }
        }
    }
}

static void test_zbh1(void **state) {
    (void)state;
    for (int p = 1; p <= 4; p++) {
        int ms[3] = {1, p, 2 * p + 1};
        for (int j = 0; j < 3; j++) {
            int m = ms[j];
            fsc_pipe_schedule *s = make(FSC_PIPE_ZB_H1, p, 1, m);
            fsc_pipe_config c;
            assert_int_equal(fsc_pipe_schedule_config(s, &c), FSC_OK);
            assert_true(c.split_backward);
            fsc_pipe_rank_stats pr[4], pr1[4];
            fsc_pipe_stats st = stats_of(s, NULL, pr), s1 = onef1b(p, m, pr1);
            check_common(s, st, pr, p, 1, m);
            /* F = B = W = 1 against 1F1B's B = 2 (the same work): the postponed W fill the
             * cool-down, leaving (p-1)(F+B-W) = p - 1 idle slots once m >= p. With m < p
             * rank 0 cannot start a B before 2p - 1, then has 2m units left. */
            long long want = m >= p ? 3 * m + p - 1 : 2 * m + 2 * p - 1;
            assert_int_equal(st.makespan, want);
            if (p > 1) assert_true(st.makespan < s1.makespan);
            if (p == 1) assert_int_equal(st.makespan, s1.makespan);
            assert_true(st.bubble <= s1.bubble);
            /* memory: each rank holds what it holds under 1F1B until B, and no rank more
             * than 1F1B's rank 0 (min(p, m)) until W */
            for (int r = 0; r < p; r++) {
                assert_int_equal(pr[r].peak_inflight, pr1[r].peak_inflight);
                assert_true(pr[r].peak_inflight_w <= s1.peak_inflight_w);
            }
            assert_int_equal(st.peak_inflight_w, s1.peak_inflight_w);
            assert_int_equal(st.peak_inflight, s1.peak_inflight);
            fsc_pipe_schedule_free(s);
        }
    }
}

/* The figures of the report, p = 4, m = 8, default costs. */
static void test_p4_m8(void **state) {
    (void)state;
    struct {
        fsc_pipe_kind kind;
        int v;
        long long makespan;
        int peak0, peak_w0, peak3, peak_w3;
    } rows[] = {
        {FSC_PIPE_GPIPE, 1, 33, 8, 8, 8, 8},
        {FSC_PIPE_1F1B, 1, 33, 4, 4, 1, 1},
        {FSC_PIPE_INTERLEAVED, 2, 57, 11, 11, 5, 5}, /* chunk activations (half a stage each) */
        {FSC_PIPE_ZB_H1, 1, 27, 4, 4, 1, 4},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        fsc_pipe_schedule *s = make(rows[i].kind, 4, rows[i].v, 8);
        fsc_pipe_rank_stats pr[4];
        fsc_pipe_stats st = stats_of(s, NULL, pr);
        fprintf(stderr, "  %-11s p4 v%d m8: makespan %lld, bubble %.4f, peak in-flight per rank",
                fsc_pipe_kind_name(rows[i].kind), rows[i].v, st.makespan, st.bubble);
        for (int r = 0; r < 4; r++)
            fprintf(stderr, " %d/%d", pr[r].peak_inflight, pr[r].peak_inflight_w);
        fprintf(stderr, "\n");
        assert_int_equal(st.makespan, rows[i].makespan);
        assert_int_equal(pr[0].peak_inflight, rows[i].peak0);
        assert_int_equal(pr[0].peak_inflight_w, rows[i].peak_w0);
        assert_int_equal(pr[3].peak_inflight, rows[i].peak3);
        assert_int_equal(pr[3].peak_inflight_w, rows[i].peak_w3);
        fsc_pipe_schedule_free(s);
    }
}

/* ---- lowering, peers and tags ---------------------------------------------------------- */

static void test_lowering(void **state) {
    (void)state;
    fsc_pipe_schedule *s = make(FSC_PIPE_1F1B, 2, 1, 2);
    assert_int_equal(fsc_pipe_schedule_write_csv(s, tmp("sched.csv")), FSC_OK);
    char *text = slurp(fopen(tmp("sched.csv"), "rb"));
    assert_string_equal(text, "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                              "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
    free(text);
    assert_int_equal(fsc_pipe_schedule_lower(s), FSC_ERR_INVALID); /* already lowered */
    fsc_pipe_schedule_free(s);

    /* a compute-only table built by hand: lowered on request, then valid */
    fsc_pipe_action r0[] = {{FSC_PIPE_F, 0, 0}, {FSC_PIPE_B, 0, 0}};
    fsc_pipe_action r1[] = {{FSC_PIPE_F, 1, 0}, {FSC_PIPE_B, 1, 0}};
    const fsc_pipe_action *acts[] = {r0, r1};
    int counts[] = {2, 2};
    assert_int_equal(fsc_pipe_schedule_new(cfg(2, 1, 1, false), counts, acts, &s), FSC_OK);
    assert_int_equal(fsc_pipe_schedule_validate(s, NULL, NULL, NULL), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "(0B0) needs 0RECV_B0"));
    assert_int_equal(fsc_pipe_schedule_lower(s), FSC_OK);
    assert_int_equal(fsc_pipe_schedule_validate(s, NULL, NULL, NULL), FSC_OK);
    fsc_pipe_schedule_free(s);
    counts[1] = -1;
    assert_int_equal(fsc_pipe_schedule_new(cfg(2, 1, 1, false), counts, acts, &s), FSC_ERR_INVALID);
}

/* Every send's peer holds the matching receive, whose peer is the sender, with
 * one tag on both sides and no tag used twice. */
static void check_messages(fsc_pipe_kind kind, int p, int v, int m) {
    fsc_pipe_schedule *s = make(kind, p, v, m);
    int S = p * v, seen = 0;
    char *used = calloc((size_t)(2 * S * m), 1);
    assert_non_null(used);
    for (int r = 0; r < p; r++) {
        const fsc_pipe_action *a;
        int n;
        assert_int_equal(fsc_pipe_schedule_actions(s, r, &a, &n), FSC_OK);
        for (int k = 0; k < n; k++) {
            int peer = fsc_pipe_action_peer(s, a[k]), tag = fsc_pipe_action_tag(s, a[k]);
            if (a[k].op <= FSC_PIPE_W) {
                assert_int_equal(fsc_pipe_stage_rank(s, a[k].stage), r);
                assert_int_equal(peer, -1);
                assert_int_equal(tag, -1);
                continue;
            }
            assert_true(peer >= 0 && peer < p && peer != r);
            assert_true(tag >= 0 && tag < 2 * S * m);
            if (a[k].op != FSC_PIPE_SEND_F && a[k].op != FSC_PIPE_SEND_B) continue;
            assert_int_equal(used[tag], 0);
            used[tag] = 1;
            seen++;
            fsc_pipe_action want = {a[k].op == FSC_PIPE_SEND_F ? FSC_PIPE_RECV_F : FSC_PIPE_RECV_B,
                                    a[k].op == FSC_PIPE_SEND_F ? a[k].stage + 1 : a[k].stage - 1,
                                    a[k].micro};
            const fsc_pipe_action *b;
            int nb, found = 0;
            assert_int_equal(fsc_pipe_schedule_actions(s, peer, &b, &nb), FSC_OK);
            for (int j = 0; j < nb; j++) {
                if (b[j].op == want.op && b[j].stage == want.stage && b[j].micro == want.micro) {
                    found++;
                    assert_int_equal(fsc_pipe_action_peer(s, b[j]), r);
                    assert_int_equal(fsc_pipe_action_tag(s, b[j]), tag);
                }
            }
            assert_int_equal(found, 1);
        }
    }
    assert_int_equal(seen, p > 1 ? 2 * (S - 1) * m : 0);
    free(used);
    fsc_pipe_schedule_free(s);
}

static void test_peers_tags(void **state) {
    (void)state;
    check_messages(FSC_PIPE_1F1B, 4, 1, 3);
    check_messages(FSC_PIPE_ZB_H1, 3, 1, 7);
    check_messages(FSC_PIPE_INTERLEAVED, 2, 3, 4);
    check_messages(FSC_PIPE_INTERLEAVED, 1, 2, 3); /* one rank: no messages */
    fsc_pipe_schedule *s = make(FSC_PIPE_INTERLEAVED, 2, 2, 2);
    assert_int_equal(fsc_pipe_stage_rank(s, 3), 1);
    assert_int_equal(fsc_pipe_stage_rank(s, 2), 0);
    assert_int_equal(fsc_pipe_stage_rank(s, 4), -1);
    assert_int_equal(fsc_pipe_stage_rank(NULL, 0), -1);
    fsc_pipe_action last = {FSC_PIPE_SEND_F, 3, 0}; /* nothing after the last stage */
    assert_int_equal(fsc_pipe_action_peer(s, last), -1);
    assert_int_equal(fsc_pipe_action_tag(s, last), -1);
    const fsc_pipe_action *a;
    int n;
    assert_int_equal(fsc_pipe_schedule_actions(s, 2, &a, &n), FSC_ERR_INVALID);
    fsc_pipe_schedule_free(s);
}

static void test_make_refusals(void **state) {
    (void)state;
    fsc_pipe_schedule *s = NULL;
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_1F1B, 4, 2, 8, &s), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "chunks"));
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_INTERLEAVED, 4, 1, 8, &s), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_GPIPE, 0, 1, 8, &s), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_GPIPE, 2, 1, 0, &s), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_KIND_COUNT, 2, 1, 2, &s), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_GPIPE, 2, 1, 2, NULL), FSC_ERR_INVALID);
    assert_null(s);
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_INTERLEAVED, 2, 0, 2, &s), FSC_OK);
    fsc_pipe_config c;
    assert_int_equal(fsc_pipe_schedule_config(s, &c), FSC_OK);
    assert_int_equal(c.chunks, 2); /* 0: the default */
    fsc_pipe_costs neg = {.f = -1};
    assert_int_equal(fsc_pipe_schedule_validate(s, &neg, NULL, NULL), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_validate(NULL, NULL, NULL, NULL), FSC_ERR_INVALID);
    fsc_pipe_schedule_free(s);
    fsc_pipe_schedule_free(NULL);
}

/* ---- the validator refuses broken tables ----------------------------------------------- */

static void test_refusals(void **state) {
    (void)state;
    /* 1F1B at p = 2, m = 2 as lowering writes it, then broken one way per row; NULL
     * keeps a rank's intact line */
    const char *row0 = "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n";
    const char *row1 = "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n";
    struct {
        const char *r0, *r1, *want[3];
    } cases[] = {
        /* a missing receive: the send names it */
        {NULL, "1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n", {"0SEND_F0", "1RECV_F0", "rank 1"}},
        /* a receive without its send */
        {NULL, "1RECV_F0,1F0,1B0,1RECV_F1,1F1,1B1,1SEND_B1\n", {"0RECV_B0", "1SEND_B0"}},
        /* a backward before its forward */
        {NULL,
         "1RECV_F0,1B0,1F0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n",
         {"1B0", "needs 1F0", "action 1"}},
        /* a send before the action producing its data */
        {"0SEND_F0,0F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n", NULL, {"0SEND_F0", "needs 0F0"}},
        /* a duplicated forward */
        {"0F0,0SEND_F0,0F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n", NULL, {"0F0", "twice"}},
        /* a missing backward */
        {"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1\n", NULL, {"0B1", "rank 0"}},
        /* an action on the wrong rank */
        {"1F0,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n",
         NULL,
         {"1F0", "runs on rank 1"}},
        /* a W when backward is not split */
        {"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0W0,0RECV_B1,0B1\n", NULL, {"0W0", "split"}},
        /* a message past the end of the pipeline */
        {NULL,
         "1RECV_F0,1F0,1SEND_F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n",
         {"1SEND_F0", "past the end"}},
    };
    char text[512];
    snprintf(text, sizeof text, "%s%s", row0, row1); /* the intact table is fine */
    fsc_pipe_schedule *s;
    assert_int_equal(fsc_pipe_schedule_parse(text, cfg(2, 1, 2, false), &s), FSC_OK);
    assert_int_equal(fsc_pipe_schedule_validate(s, NULL, NULL, NULL), FSC_OK);
    fsc_pipe_schedule_free(s);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(text, sizeof text, "%s%s", cases[i].r0 ? cases[i].r0 : row0,
                 cases[i].r1 ? cases[i].r1 : row1);
        expect_invalid(text, cfg(2, 1, 2, false), cases[i].want[0], cases[i].want[1],
                       cases[i].want[2], NULL);
    }
    /* a split schedule without its W; a W before its B */
    expect_invalid("0F0,0B0\n", cfg(1, 1, 1, true), "0W0", NULL);
    expect_invalid("0F0,0W0,0B0\n", cfg(1, 1, 1, true), "0W0", "needs 0B0", NULL);
    /* a message between stages on one rank (interleaved on one rank) */
    expect_invalid("0F0,0SEND_F0,1RECV_F0,1F0,1B0,0B0\n", cfg(1, 2, 1, false), "0SEND_F0",
                   "same rank", NULL);
    /* a send/receive cycle: rank 0 waits for a gradient before sending the activation
     * that would produce it; every list is locally fine */
    expect_invalid("0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", cfg(2, 1, 1, false),
                   "deadlock", "rank 0 is stuck at action 0 (0RECV_B0)", "waiting for 1SEND_B0",
                   "rank 1 is stuck at action 0 (1RECV_F0)", "waiting for 0SEND_F0", NULL);
    /* a longer cycle through three ranks: rank 0 waits for the gradient of micro-batch 0
     * before it sends that micro-batch's activation */
    expect_invalid("0F0,0RECV_B0,0B0,0F1,0SEND_F0,0SEND_F1,0RECV_B1,0B1\n"
                   "1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,1RECV_B0,1B0,1SEND_B0,1RECV_B1,"
                   "1B1,1SEND_B1\n"
                   "2RECV_F0,2F0,2B0,2SEND_B0,2RECV_F1,2F1,2B1,2SEND_B1\n",
                   cfg(3, 1, 2, false), "deadlock", "0RECV_B0", "1RECV_F0", "2RECV_F0", NULL);
}

/* ---- CSV ------------------------------------------------------------------------------- */

static void test_csv_round_trip(void **state) {
    (void)state;
    struct {
        fsc_pipe_kind kind;
        int p, v, m;
    } shapes[] = {{FSC_PIPE_GPIPE, 3, 1, 7},
                  {FSC_PIPE_1F1B, 4, 1, 9},
                  {FSC_PIPE_INTERLEAVED, 3, 2, 6},
                  {FSC_PIPE_ZB_H1, 4, 1, 4}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        fsc_pipe_schedule *s = make(shapes[i].kind, shapes[i].p, shapes[i].v, shapes[i].m), *t;
        fsc_pipe_config c;
        assert_int_equal(fsc_pipe_schedule_config(s, &c), FSC_OK);
        assert_int_equal(fsc_pipe_schedule_write_csv(s, tmp("rt.csv")), FSC_OK);
        assert_int_equal(fsc_pipe_schedule_read_csv(tmp("rt.csv"), c, &t), FSC_OK);
        for (int r = 0; r < c.ranks; r++) {
            const fsc_pipe_action *a, *b;
            int na, nb;
            assert_int_equal(fsc_pipe_schedule_actions(s, r, &a, &na), FSC_OK);
            assert_int_equal(fsc_pipe_schedule_actions(t, r, &b, &nb), FSC_OK);
            assert_int_equal(na, nb);
            for (int k = 0; k < na; k++) {
                assert_int_equal(a[k].op, b[k].op);
                assert_int_equal(a[k].stage, b[k].stage);
                assert_int_equal(a[k].micro, b[k].micro);
            }
        }
        fsc_pipe_stats x = stats_of(s, NULL, NULL), y = stats_of(t, NULL, NULL);
        assert_int_equal(x.makespan, y.makespan);
        assert_true(y.theoretical_bubble < 0); /* a user's table has no kind */
        fsc_pipe_schedule_free(t);
        fsc_pipe_schedule_free(s);
    }
}

static void test_csv_user_schedule(void **state) {
    (void)state;
    /* compute-only, hand-written GPipe with comments, blank lines, spaces and the empty
     * cells of a PyTorch grid: lowered and validated on the way in */
    const char *text = "# GPipe, 2 ranks, 2 micro-batches\n"
                       "0F0, 0F1,,, 0B1 ,0B0\r\n"
                       "\n"
                       ",1F0,1F1,1B1,1B0,\n";
    write_raw(tmp("user.csv"), text, strlen(text));
    fsc_pipe_schedule *s;
    assert_int_equal(fsc_pipe_schedule_read_csv(tmp("user.csv"), cfg(2, 1, 2, false), &s), FSC_OK);
    fsc_pipe_stats st = stats_of(s, NULL, NULL);
    assert_int_equal(st.makespan, 9);
    assert_int_equal(st.messages, 4);
    fsc_pipe_schedule_free(s);
    /* the same file read as a 3-rank schedule is refused, naming the file */
    assert_int_equal(fsc_pipe_schedule_read_csv(tmp("user.csv"), cfg(3, 1, 2, false), &s),
                     FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), "user.csv"));
    /* a table that parses but cannot run is refused by read_csv too */
    write_raw(tmp("bad.csv"), "0B0,0F0\n1F0,1B0\n", 16);
    assert_int_equal(fsc_pipe_schedule_read_csv(tmp("bad.csv"), cfg(2, 1, 1, false), &s),
                     FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "0B0"));
    assert_int_equal(fsc_pipe_schedule_read_csv(tmp("absent.csv"), cfg(2, 1, 1, false), &s),
                     FSC_ERR_IO);
}

static void expect_malformed(const char *text, fsc_pipe_config c, const char *a, const char *b,
                             const char *d) {
    fsc_pipe_schedule *s = NULL;
    assert_int_equal(fsc_pipe_schedule_parse(text, c, &s), FSC_ERR_FORMAT);
    assert_null(s);
    const char *msg = fsc_last_error();
    fprintf(stderr, "  refused: %s\n", msg);
    assert_non_null(strstr(msg, a));
    assert_non_null(strstr(msg, b));
    if (d) assert_non_null(strstr(msg, d));
}

static void test_csv_malformed(void **state) {
    (void)state;
    fsc_pipe_config c = cfg(2, 1, 2, false);
    expect_malformed("0F0,0F1,0B1,0B0\n1F0,1X1,1B1\n", c, "line 2", "column 5", "'1X1'");
    expect_malformed("0F0,0F1,0B1,0B0\n# note\n1F0,  1F 1\n", c, "line 3", "column 7", "'1F 1'");
    expect_malformed("0F0,0F1,0B1,0B0\n", c, "line 2", "missing line for rank 1", NULL);
    expect_malformed("0F0,0F1,0B1,0B0\n1F0,1F1,1B1,1B0\n2F0\n", c, "line 3", "extra line", NULL);
    expect_malformed("0F0,2F1\n1F0\n", c, "line 1, column 5", "stage 2", NULL);
    expect_malformed("0F0,0F5\n1F0\n", c, "line 1, column 5", "micro-batch 5", NULL);
    expect_malformed("0F0;0F1\n1F0\n", c, "line 1, column 1", "0F0;0F1", NULL);
    fsc_pipe_schedule *s;
    assert_int_equal(fsc_pipe_schedule_parse(NULL, c, &s), FSC_ERR_INVALID);
    assert_int_equal(fsc_pipe_schedule_parse("0F0\n", cfg(0, 1, 1, false), &s), FSC_ERR_INVALID);
}

/* ---- printing -------------------------------------------------------------------------- */

static char *printed(const fsc_pipe_schedule *s, bool grid) {
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(grid ? fsc_pipe_schedule_print(s, f) : fsc_pipe_schedule_print_list(s, f),
                     FSC_OK);
    return slurp(f);
}

static void test_print(void **state) {
    (void)state;
    fsc_pipe_schedule *s = make(FSC_PIPE_1F1B, 2, 1, 2);
    char *g = printed(s, true);
    fprintf(stderr, "%s", g);
    assert_non_null(strstr(g, "slot     0   1   2   3   4   5   6   7   8\n"
                              "pipe 0 0F0 0F1 .   .   0B0 ~   .   0B1 ~\n"
                              "pipe 1 .   1F0 1B0 ~   1F1 1B1 ~   .   .\nkey: sFm = "));
    assert_int_equal(g[strlen(g) - 1], '\n'); /* the key is one line, the last */
    free(g);
    char *l = printed(s, false);
    assert_string_equal(l, "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
                           "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n");
    free(l);
    fsc_pipe_schedule_free(s);
    s = make(FSC_PIPE_ZB_H1, 4, 1, 8);
    g = printed(s, true);
    fprintf(stderr, "%s", g);
    /* the paper's picture: rank 0 waits p - 1 = 3 slots for its first B and then never
     * again; rank 3 runs without a gap from its first F, its postponed W fill the tail */
    assert_non_null(strstr(g, "pipe 0 0F0 0F1 0F2 0F3 .   .   .   0B0 0W0 0F4 "));
    assert_non_null(strstr(g, "pipe 3 .   .   .   3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3W3 "));
    assert_non_null(strstr(g, "3B7 3W7 3W0 3W1 3W2\n"));
    free(g);
    assert_int_equal(fsc_pipe_schedule_print(s, NULL), FSC_ERR_INVALID);
    fsc_pipe_schedule_free(s);
}

FSC_TEST_MAIN(setup, teardown, cmocka_unit_test(test_action_text),
              cmocka_unit_test(test_kind_names), cmocka_unit_test(test_gpipe_1f1b),
              cmocka_unit_test(test_interleaved), cmocka_unit_test(test_zbh1),
              cmocka_unit_test(test_p4_m8), cmocka_unit_test(test_lowering),
              cmocka_unit_test(test_peers_tags), cmocka_unit_test(test_make_refusals),
              cmocka_unit_test(test_refusals), cmocka_unit_test(test_csv_round_trip),
              cmocka_unit_test(test_csv_user_schedule), cmocka_unit_test(test_csv_malformed),
              cmocka_unit_test(test_print))
