/* The pipeline executor beyond equivalence, on stages of known duration.
 *
 * The measured bubble (fsc_pipe_run_stats: wait_s / span_s on each rank)
 * against a known idle structure: stages that sleep a fixed time
 * in forward and twice that in backward follow the validator's cost model
 * (F = 1, B = 2) closely, so each rank's measured bubble must be the one the
 * validator predicts for that rank, and wait + compute must account for the
 * whole span. The schedules are chosen so that the ranks' bubbles differ in
 * where they fall (warm-up on later ranks, drain on earlier ones) and in
 * size (m = 1: (p-1)/p; m = 4: (p-1)/(m+p-1)): counting only the receives,
 * missing the drain, or dividing by another rank's span would each be off by
 * more than the tolerance. Sleeps, not arithmetic, so a loaded machine moves
 * the figures little.
 *
 * The evaluation pass (fsc_pipe_eval): the loss of a training run's
 * forwards exactly, with the gradients, the figures of that run and its
 * trace left as they were, under 1F1B, ZB-H1 and interleaved shapes.
 *
 * The trace of the last run (fsc_pipe_write_trace) read back as JSON: one
 * named row per rank holding that rank's schedule in order, boxes that do
 * not overlap and last at least their sleeps; a path it cannot open fails
 * on every rank, naming it.
 *
 * A hand-written schedule whose last stage sends micro-batch 1's gradient
 * before micro-batch 0's, while the first stage receives 0's first: valid
 * (sends never block), and it trains to generated 1F1B's loss and
 * gradients, where waiting for 1's send before going on would hang. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fsc/pipe.h"
#include "mpi_test.h"

/* 32 KiB activations: past MPI's eager limits, so a send completes only once
 * its receive is posted, as a real model's do */
enum { UNIT_MS = 30, ROWS = 2, COLS = 4096 };

static int rank, world;
static const fsc_optim_config SGD = {.kind = FSC_OPTIM_SGD, .lr = 1e-3};

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t)) continue;
}

/* How late this process wakes: the mean overshoot of a few 2 ms sleeps, in
 * seconds. A loaded machine wakes a waiting rank late too. */
static double wake_latency(void) {
    double late = 0;
    for (int i = 0; i < 5; i++) {
        double t0 = fsc_now();
        sleep_ms(2);
        late += (fsc_now() - t0 - 2e-3) / 5;
    }
    return late;
}

/* y = w * x, taking UNIT_MS in forward and 2 UNIT_MS in backward. */
typedef struct {
    fsc_module base;
} sleeper;

static int sleeper_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                           void **saved) {
    *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, x->ndim, x->shape);
    fsc_tensor *keep = fsc_arena_alloc(ctx->arena, sizeof *keep);
    if (!y->data || !keep) return FSC_ERR_NOMEM;
    const float w = m->params[0].data[0], *in = x->data;
    float *out = y->data;
    for (int64_t i = 0; i < fsc_tensor_numel(x); i++) out[i] = w * in[i];
    *keep = *x;
    *saved = keep;
    sleep_ms(UNIT_MS);
    return FSC_OK;
}

static int sleeper_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                            fsc_tensor *dx) {
    const fsc_tensor *x = saved;
    int rc = fsc_module_check_dy(m, dy, x->ndim, x->shape);
    if (rc) return rc;
    const float w = m->params[0].data[0], *in = x->data, *g = dy->data;
    for (int64_t i = 0; i < fsc_tensor_numel(x); i++) m->params[0].grad[0] += g[i] * in[i];
    if (dx) {
        *dx = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, x->ndim, x->shape);
        if (!dx->data) return FSC_ERR_NOMEM;
        float *out = dx->data;
        for (int64_t i = 0; i < fsc_tensor_numel(x); i++) out[i] = w * g[i];
    }
    sleep_ms(2 * UNIT_MS);
    return FSC_OK;
}

static const fsc_module_ops sleeper_ops = {"Sleeper", sleeper_forward, sleeper_backward, NULL};

/* One sleeper per layer, each with its own parameter name (h<layer>.w). */
static fsc_module *make_stage(void *user, int first, int end) {
    (void)user;
    fsc_module *kids[8];
    int n = 0;
    for (int l = first; l < end && n < 8; l++, n++) {
        sleeper *s = calloc(1, sizeof *s);
        if (!s) return NULL;
        char name[16];
        snprintf(name, sizeof name, "h%d", l);
        fsc_module_init(&s->base, &sleeper_ops, name);
        if (fsc_module_add_param(&s->base, "w", 1, (int64_t[]){1}, FSC_INIT_ONES, 0) < 0)
            return NULL;
        kids[n] = &s->base;
    }
    return fsc_sequential_new("stage", n, kids);
}

static float xs[ROWS * COLS];

static int input(void *user, int micro, fsc_tensor *x) {
    (void)user, (void)micro;
    for (int i = 0; i < ROWS * COLS; i++) xs[i] = 0.25f * (float)(i % 5);
    *x = fsc_tensor_2d(xs, FSC_DTYPE_F32, ROWS, COLS);
    return FSC_OK;
}

static int loss(void *user, int micro, fsc_tensor *y, fsc_arena *arena, float *out) {
    (void)user, (void)micro, (void)arena;
    float *v = y->data, sum = 0;
    for (int64_t i = 0; i < fsc_tensor_numel(y); i++) sum += v[i], v[i] = 1e-3f;
    *out = 1e-3f * sum;
    return FSC_OK;
}

static int64_t sample0(void *user, int micro) {
    (void)user;
    return micro;
}

/* The pipeline of sched over the world: `layers` stages of make_stage's
 * (ROWS, COLS) activations, SGD; fails the test when refused. */
static fsc_pipe *pipe_of(fsc_pipe_schedule *sched, int layers) {
    fsc_pipe_options opt = {.layers = layers,
                            .make_stage = make_stage,
                            .act_ndim = 2,
                            .act_shape = {ROWS, COLS},
                            .seed = 5};
    fsc_pipe *p = fsc_pipe_new(fsc_group_world(), sched, &SGD, &opt);
    if (!p) fail_msg("fsc_pipe_new: %s", fsc_last_error());
    return p;
}

/* One attempt: `kind` with m micro-batches run twice, the second run's
 * figures checked on this rank. When the machine keeps time (every rank's
 * compute within 10% of its nominal 3 m units, sleeps waking within 0.5 ms)
 * the accounting must hold (wait + compute = span on every rank, within 2%),
 * the spans must be one window and the bubble the validator's: a
 * loaded machine wakes ranks late, which is real idle time the model does
 * not have. Returns 1 when compared and equal, 0 when the machine was too
 * loaded to compare, -1 when off (the same on every rank). */
static int bubble_attempt(fsc_pipe_kind kind, int m) {
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(kind, world, 1, m, &sched), FSC_OK);
    fsc_pipe_rank_stats *per = calloc((size_t)world, sizeof *per);
    assert_int_equal(fsc_pipe_schedule_validate(sched, &(fsc_pipe_costs){1, 2, 1}, NULL, per),
                     FSC_OK);
    const double want = per[rank].bubble;
    fsc_pipe *p = pipe_of(sched, world);
    fsc_pipe_io io = {.input = input, .loss = loss, .sample0 = sample0};
    const double latency = wake_latency();
    for (int s = 0; s < 2; s++) {
        fsc_ctx ctx = {.training = true, .seed = 5, .step = s};
        float l;
        fsc_pipe_zero_grad(p);
        if (fsc_pipe_run(p, &ctx, &io, &l)) fail_msg("rank %d: %s", rank, fsc_last_error());
    }
    const fsc_pipe_run_stats st = fsc_pipe_get_stats(p);
    const double got = st.wait_s / st.span_s, rest = st.span_s - st.wait_s - st.compute_s;
    fprintf(stderr,
            "%s, %d ranks, m %d, rank %d: span %.1f ms, compute %.1f ms, wait %.1f ms, "
            "unaccounted %.1f ms; bubble measured %.3f, predicted %.3f (wakes %.2f ms late)\n",
            fsc_pipe_kind_name(kind), world, m, rank, 1e3 * st.span_s, 1e3 * st.compute_s,
            1e3 * st.wait_s, 1e3 * rest, got, want, 1e3 * latency);
    /* every moment of the span is compute or wait (a few copies and posts aside) */
    const bool unaccounted = fabs(rest) > 0.02 * st.span_s + 1e-3;
    if (unaccounted)
        fprintf(stderr, "ERROR: rank %d: %.1f ms of %.1f ms neither compute nor wait\n", rank,
                1e3 * rest, 1e3 * st.span_s);
    /* then, if the sleeps kept time: the spans are one window (the ranks start
     * together too), the schedule's makespan of (m + p - 1) (F + B) units, and
     * the bubble the validator's for this rank */
    float *spans = calloc((size_t)world, sizeof *spans), mine = (float)st.span_s;
    assert_int_equal(fsc_group_allgather(fsc_group_world(), &mine, spans, 1, FSC_DTYPE_F32),
                     FSC_OK);
    bool apart = false;
    for (int q = 0; q < world; q++) apart = apart || fabs(spans[q] - mine) > 0.03 * mine + 2e-3;
    const double makespan = 3e-3 * UNIT_MS * (m + world - 1), nominal = 3e-3 * UNIT_MS * m;
    float f[3] = {unaccounted, st.compute_s > 1.1 * nominal || latency > 5e-4,
                  apart || fabs(st.span_s - makespan) > 0.2 * makespan || fabs(got - want) > 0.08};
    assert_int_equal(fsc_group_allreduce(fsc_group_world(), f, 3, FSC_DTYPE_F32, FSC_REDUCE_MAX),
                     FSC_OK);
    /* the accounting is judged like the bubble, over attempts: a rank
     * preempted between the executor's clock reads shows the stolen time as
     * neither (16 ms of 709 once, at load 8 on 2 cores, with every sleep on
     * time), while a wrong executor is off in every attempt */
    fsc_pipe_free(p);
    fsc_pipe_schedule_free(sched);
    free(per), free(spans);
    return f[1] ? 0 : f[0] || f[2] ? -1 : 1;
}

static void expect_bubble(fsc_pipe_kind kind, int m) {
    int loaded = 0;
    for (int attempt = 0; attempt < 4; attempt++) {
        int got = bubble_attempt(kind, m);
        if (got == 1) return;
        loaded += got == 0;
    }
    /* An attempt that ran off the model while another caught late sleeps
     * says the machine is loaded, not that the schedule is wrong: a wrong
     * executor is off in every attempt with sleeps on time. */
    if (loaded) { /* the model and the accounting could not be compared */
        fprintf(stderr,
                "%s, m %d: sleeps ran late in %d of 4 attempts (a loaded machine), none "
                "matched: bubble not compared with the validator\n",
                fsc_pipe_kind_name(kind), m, loaded);
        return;
    }
    fail_msg("rank %d: %s, m %d: in every attempt the accounting, the measured bubble or the "
             "span was off (see the figures above)",
             rank, fsc_pipe_kind_name(kind), m);
}

/* Trains one step's forwards and backwards (no update), then evaluates. */
static void expect_eval(fsc_pipe_kind kind, int chunks, int m) {
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(kind, world, chunks, m, &sched), FSC_OK);
    fsc_pipe *p = pipe_of(sched, world * (chunks ? chunks : 1));
    fsc_pipe_io io = {.input = input, .loss = loss, .sample0 = sample0};
    fsc_ctx ctx = {.training = true, .seed = 5};
    float trained, evaluated = -1;
    fsc_pipe_zero_grad(p);
    if (fsc_pipe_run(p, &ctx, &io, &trained)) fail_msg("rank %d: %s", rank, fsc_last_error());
    const fsc_pipe_run_stats st = fsc_pipe_get_stats(p);
    float grads[8] = {0};
    for (int c = 0; c < fsc_pipe_chunks(p); c++) grads[c] = fsc_pipe_chunk_params(p, c)->grad[0];
    assert_int_equal(fsc_pipe_eval(p, &ctx, &io, &evaluated), FSC_ERR_INVALID); /* training */
    ctx.training = false;
    if (fsc_pipe_eval(p, &ctx, &io, &evaluated)) fail_msg("rank %d: %s", rank, fsc_last_error());
    /* the same forwards, summed in the same order */
    if (evaluated != trained)
        fail_msg("%s v %d m %d, rank %d: eval loss %.9g, the training forwards' %.9g",
                 fsc_pipe_kind_name(kind), chunks, m, rank, evaluated, trained);
    for (int c = 0; c < fsc_pipe_chunks(p); c++)
        assert_true(fsc_pipe_chunk_params(p, c)->grad[0] == grads[c]);
    const fsc_pipe_run_stats after = fsc_pipe_get_stats(p);
    assert_true(after.wait_s == st.wait_s && after.span_s == st.span_s &&
                after.compute_s == st.compute_s && after.messages == st.messages &&
                after.peak_inflight == st.peak_inflight);
    fsc_pipe_free(p);
    fsc_pipe_schedule_free(sched);
}

static void test_eval(void **state) {
    (void)state;
    if (world < 2) skip();
    /* a forward-only schedule cannot train */
    fsc_pipe_schedule *fwd;
    assert_int_equal(fsc_pipe_schedule_make_forward(world, 1, 2, &fwd), FSC_OK);
    fsc_pipe_options opt = {
        .layers = world, .make_stage = make_stage, .act_ndim = 2, .act_shape = {ROWS, COLS}};
    assert_null(fsc_pipe_new(fsc_group_world(), fwd, &SGD, &opt));
    assert_non_null(strstr(fsc_last_error(), "forward only"));
    fsc_pipe_schedule_free(fwd);
    expect_eval(FSC_PIPE_1F1B, 1, 3);
    expect_eval(FSC_PIPE_ZB_H1, 1, 2 * world);
    expect_eval(FSC_PIPE_INTERLEAVED, 2, world);
}

/* Row r of a trace: its "rank r" name once, then one box per action of r's
 * schedule in order, each named as fsc_pipe_action_format names it, none
 * starting before the one before ended (a rank runs its actions one at a
 * time), F at least UNIT_MS and B at least 2 UNIT_MS long (their sleeps; a
 * loaded machine only lengthens them; 1 us for truncation). */
static void expect_trace_row(const cJSON *events, const fsc_pipe_schedule *sched, int r) {
    const fsc_pipe_action *acts;
    int n, k = 0, named = 0;
    assert_int_equal(fsc_pipe_schedule_actions(sched, r, &acts, &n), FSC_OK);
    double end = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *tid = cJSON_GetObjectItem(e, "tid"), *ph = cJSON_GetObjectItem(e, "ph"),
                    *name = cJSON_GetObjectItem(e, "name");
        assert_true(cJSON_IsNumber(tid) && cJSON_IsString(ph) && cJSON_IsString(name));
        if (tid->valueint != r) continue;
        if (!strcmp(ph->valuestring, "M")) {
            const cJSON *args = cJSON_GetObjectItem(e, "args");
            char want[32];
            snprintf(want, sizeof want, "rank %d", r);
            assert_string_equal(name->valuestring, "thread_name");
            assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(args, "name")), want);
            named++;
            continue;
        }
        assert_string_equal(ph->valuestring, "X");
        if (k >= n) fail_msg("row %d: more than its schedule's %d actions", r, n);
        char want[FSC_PIPE_ACTION_TEXT];
        assert_true(fsc_pipe_action_format(acts[k], want, sizeof want) > 0);
        const double ts = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "ts")),
                     dur = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "dur"));
        if (strcmp(name->valuestring, want) || ts < end || dur < 0)
            fail_msg("row %d, box %d: %s at %.0f us for %.0f us; expected %s from %.0f us on", r, k,
                     name->valuestring, ts, dur, want, end);
        const double least = acts[k].op == FSC_PIPE_F   ? 1e3 * UNIT_MS
                             : acts[k].op == FSC_PIPE_B ? 2e3 * UNIT_MS
                                                        : 0;
        if (dur < least - 1)
            fail_msg("row %d: %s lasted %.0f us, it sleeps %.0f", r, want, dur, least);
        end = ts + dur, k++;
    }
    assert_int_equal(named, 1);
    if (k != n) fail_msg("row %d: %d boxes, its schedule has %d actions", r, k, n);
}

/* Two 1F1B runs, then the trace: rank 0's file holds every rank's row of
 * the last run alone (the first run's boxes too would double each row). */
static void test_trace(void **state) {
    (void)state;
    if (world < 2) skip();
    char dir[64], path[128];
    assert_int_equal(mpi_scratch_dir(dir, "fsc_pipe_trace"), 0);
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_1F1B, world, 1, 2, &sched), FSC_OK);
    fsc_pipe *p = pipe_of(sched, world);
    fsc_pipe_io io = {.input = input, .loss = loss, .sample0 = sample0};
    for (int s = 0; s < 2; s++) {
        fsc_ctx ctx = {.training = true, .seed = 5, .step = s};
        float l;
        fsc_pipe_zero_grad(p);
        if (fsc_pipe_run(p, &ctx, &io, &l)) fail_msg("rank %d: %s", rank, fsc_last_error());
    }
    snprintf(path, sizeof path, "%s/trace.json", dir);
    if (fsc_pipe_write_trace(p, path)) fail_msg("rank %d: %s", rank, fsc_last_error());
    if (rank == 0) {
        long len = 0;
        char *text = (char *)mpi_read_file(path, &len);
        assert_non_null(text);
        cJSON *trace = cJSON_ParseWithLength(text, (size_t)len);
        if (!trace) fail_msg("%s is not JSON:\n%s", path, text);
        const cJSON *events = cJSON_GetObjectItem(trace, "traceEvents");
        assert_true(cJSON_IsArray(events));
        int rows = 0;
        for (int r = 0; r < world; r++) {
            const fsc_pipe_action *acts;
            int n;
            assert_int_equal(fsc_pipe_schedule_actions(sched, r, &acts, &n), FSC_OK);
            rows += 1 + n;
            expect_trace_row(events, sched, r);
        }
        assert_int_equal(cJSON_GetArraySize(events), rows); /* no row of another rank */
        cJSON_Delete(trace);
        free(text);
    }
    /* a directory that is not there: every rank fails, naming the path */
    snprintf(path, sizeof path, "%s/missing/trace.json", dir);
    assert_int_equal(fsc_pipe_write_trace(p, path), FSC_ERR_IO);
    if (!strstr(fsc_last_error(), path)) fail_msg("rank %d: \"%s\"", rank, fsc_last_error());
    fsc_pipe_free(p);
    fsc_pipe_schedule_free(sched);
    assert_int_equal(mpi_scratch_dir_remove(dir), 0);
}

/* Rank 1 releases micro-batch 1 after sending its gradient; rank 0 takes
 * that message only after micro-batch 0's, which rank 1 sends later. */
static void test_reversed_backwards(void **state) {
    (void)state;
    if (world != 2) skip();
    static const char *csv = "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                             "1RECV_F0,1F0,1RECV_F1,1F1,1B1,1SEND_B1,1B0,1SEND_B0\n";
    fsc_pipe_schedule *scheds[2];
    const fsc_pipe_config cfg = {.ranks = 2, .chunks = 1, .micros = 2};
    assert_int_equal(fsc_pipe_schedule_parse(csv, cfg, &scheds[0]), FSC_OK);
    if (fsc_pipe_schedule_validate(scheds[0], NULL, NULL, NULL))
        fail_msg("the hand-written schedule: %s", fsc_last_error());
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_1F1B, 2, 1, 2, &scheds[1]), FSC_OK);
    fsc_pipe_io io = {.input = input, .loss = loss, .sample0 = sample0};
    float losses[2], grads[2];
    for (int k = 0; k < 2; k++) {
        fsc_pipe *p = pipe_of(scheds[k], 2);
        fsc_ctx ctx = {.training = true, .seed = 5};
        fsc_pipe_zero_grad(p);
        if (fsc_pipe_run(p, &ctx, &io, &losses[k]))
            fail_msg("rank %d, %s schedule: %s", rank, k ? "generated" : "hand-written",
                     fsc_last_error());
        grads[k] = fsc_pipe_chunk_params(p, 0)->grad[0];
        fsc_pipe_free(p);
        fsc_pipe_schedule_free(scheds[k]);
    }
    /* two micro-batches' gradients add up alike in either order */
    assert_true(losses[0] == losses[1]);
    assert_true(grads[0] == grads[1]);
}

static void test_measured_bubble(void **state) {
    (void)state;
    if (world < 2) skip();
    expect_bubble(FSC_PIPE_1F1B, 1);
    expect_bubble(FSC_PIPE_1F1B, 4);
    expect_bubble(FSC_PIPE_GPIPE, 4);
}

MPI_TEST_MAIN(cmocka_unit_test(test_measured_bubble), cmocka_unit_test(test_eval),
              cmocka_unit_test(test_trace), cmocka_unit_test(test_reversed_backwards))
