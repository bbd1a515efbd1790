/* The profiler's recorder (fsc/profile.h): nesting, self times by category,
 * ops and memory rows, the trace events it writes, and what it must not
 * record (when off, on another thread, inside an OpenMP region). */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <omp.h>
#include <pthread.h>

#include "fsc/core.h"
#include "fsc/profile.h"
#include "test_main.h"

static void spin(double seconds) {
    const double t = fsc_now();
    while (fsc_now() - t < seconds) {
    }
}

static const fsc_prof_op *op_named(const char *name) {
    const fsc_prof_op *ops;
    int n = fsc_prof_get_ops(&ops);
    for (int i = 0; i < n; i++)
        if (!strcmp(ops[i].name, name)) return &ops[i];
    return NULL;
}

/* A step holding a GEMM inside a module, then an optimizer span. */
static void one_step(void) {
    FSC_PROF_BEGIN(FSC_PROF_STEP, "step");
    fsc_prof_begin_mem(FSC_PROF_ELEMENTWISE, "Block forward", "h.0", 1000);
    spin(2e-3);
    fsc_prof_gemm_begin(FSC_PROF_GEMM_F32, false, true, 8, 16, 32);
    spin(3e-3);
    fsc_prof_end(2.0 * 8 * 16 * 32, 0);
    fsc_prof_end_mem(1640, 0, 4096);
    FSC_PROF_BEGIN(FSC_PROF_OPTIM, "optimizer step");
    spin(1e-3);
    FSC_PROF_END();
    FSC_PROF_END();
}

static void test_self_times_add_up(void **state) {
    (void)state;
    assert_int_equal(fsc_prof_start(), FSC_OK);
    one_step();
    one_step();
    fsc_prof_stop();
    fsc_prof_totals t = fsc_prof_get_totals();
    assert_int_equal(t.steps, 2);
    double sum = 0;
    for (int c = 0; c < FSC_PROF_CAT_COUNT; c++) sum += t.cat_s[c], assert_true(t.cat_s[c] >= 0);
    /* self times telescope: the categories are the steps' time, to rounding */
    assert_true(fabs(sum - t.step_s) <= 1e-9 * 16);
    const fsc_prof_op *g = op_named("sgemm 8x16x32 NT"), *blk = op_named("Block forward"),
                      *opt = op_named("optimizer step"), *step = op_named("step");
    assert_non_null(g), assert_non_null(blk), assert_non_null(opt), assert_non_null(step);
    assert_int_equal(g->calls, 2);
    assert_true(g->flops == 2 * 2.0 * 8 * 16 * 32);
    assert_true(g->self_s == g->total_s && g->self_s >= 2 * 3e-3); /* a leaf; spun at least */
    /* a parent's own time is its length less its children's */
    assert_true(fabs(blk->total_s - blk->self_s - g->total_s) <= 1e-9 * 4);
    assert_true(fabs(step->total_s - step->self_s - blk->total_s - opt->total_s) <= 1e-9 * 8);
    assert_true(t.cat_s[FSC_PROF_GEMM_F32] == g->self_s);
    assert_true(t.cat_s[FSC_PROF_ELEMENTWISE] == blk->self_s);
    assert_true(t.cat_s[FSC_PROF_OPTIM] == opt->self_s);
    assert_true(t.cat_s[FSC_PROF_STEP] == step->self_s && t.step_s == step->total_s);
    assert_true(blk->bytes == 2 * 4096.0);
    const fsc_prof_mem_row *rows;
    assert_int_equal(fsc_prof_get_mem(&rows), 1);
    assert_string_equal(rows[0].module, "h.0");
    assert_int_equal(rows[0].calls[0], 2);
    assert_int_equal(rows[0].bytes[0], 2 * 640);
    fsc_prof_free();
}

/* The events parse as JSON, every X event lies inside its parent or after
 * it, and there is one "arena bytes" counter per memory span. */
static void test_events_nest(void **state) {
    (void)state;
    assert_int_equal(fsc_prof_start(), FSC_OK);
    one_step();
    FSC_PROF_BEGIN(FSC_PROF_CKPT, "checkpoint write"); /* outside any step */
    FSC_PROF_END();
    fsc_prof_stop();
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fputc('[', f);
    assert_int_equal(fsc_prof_write_events(f, 3), 6);
    fputc(']', f);
    fclose(f);
    cJSON *arr = cJSON_Parse(text);
    assert_non_null(arr);
    int x = 0, counters = 0;
    double end[8];
    int depth = 0;
    /* events are written as spans close: children first; reorder by start */
    int n = cJSON_GetArraySize(arr);
    double ts[8], dur[8];
    int order[8], nx = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_GetArrayItem(arr, i);
        assert_int_equal(cJSON_GetObjectItem(e, "pid")->valueint, 3);
        if (!strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "C")) {
            counters++;
            assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "used")->valueint,
                             1640);
            continue;
        }
        ts[nx] = cJSON_GetObjectItem(e, "ts")->valuedouble;
        dur[nx] = cJSON_GetObjectItem(e, "dur")->valuedouble;
        order[nx] = nx, nx++, x++;
    }
    for (int i = 0; i < nx; i++) /* by start, the longer first */
        for (int j = i + 1; j < nx; j++)
            if (ts[order[j]] < ts[order[i]] ||
                (ts[order[j]] == ts[order[i]] && dur[order[j]] > dur[order[i]])) {
                int k = order[i];
                order[i] = order[j], order[j] = k;
            }
    for (int i = 0; i < nx; i++) {
        const double t0 = ts[order[i]], t1 = t0 + dur[order[i]];
        while (depth > 0 && t0 >= end[depth - 1]) depth--;
        if (depth > 0) assert_true(t1 <= end[depth - 1]);
        end[depth++] = t1;
    }
    assert_int_equal(x, 5);
    assert_int_equal(counters, 1);
    fsc_prof_totals t = fsc_prof_get_totals();
    assert_true(t.outside_s[FSC_PROF_CKPT] > 0);
    assert_true(t.cat_s[FSC_PROF_CKPT] == 0);
    cJSON_Delete(arr);
    free(text);
    fsc_prof_free();
}

static void *other_thread(void *arg) {
    (void)arg;
    FSC_PROF_BEGIN(FSC_PROF_OTHER, "not mine");
    FSC_PROF_END();
    return NULL;
}

/* Nothing off, nothing from another thread, nothing inside an OpenMP
 * region (its enclosing span holds the time), too-deep spans dropped
 * without unbalancing the stack. */
static void test_what_is_not_recorded(void **state) {
    (void)state;
    FSC_PROF_BEGIN(FSC_PROF_OTHER, "off");
    FSC_PROF_END();
    assert_int_equal(fsc_prof_start(), FSC_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, NULL), 0);
    pthread_join(th, NULL);
    FSC_PROF_BEGIN(FSC_PROF_ATTENTION, "attention");
#pragma omp parallel num_threads(2)
    {
        FSC_PROF_BEGIN(FSC_PROF_GEMM_F32, "inside");
        FSC_PROF_END();
    }
    FSC_PROF_END();
    for (int i = 0; i < FSC_PROF_MAX_DEPTH + 5; i++) FSC_PROF_BEGIN(FSC_PROF_OTHER, "deep");
    for (int i = 0; i < FSC_PROF_MAX_DEPTH + 5; i++) FSC_PROF_END();
    FSC_PROF_BEGIN(FSC_PROF_OTHER, "after");
    FSC_PROF_END();
    fsc_prof_stop();
    assert_null(op_named("off"));
    assert_null(op_named("not mine"));
    assert_null(op_named("inside"));
    assert_non_null(op_named("attention"));
    assert_int_equal(op_named("deep")->calls, FSC_PROF_MAX_DEPTH);
    assert_int_equal(op_named("after")->calls, 1);
    /* every span closed: "after" is a root, not a child of a "deep" */
    assert_true(fsc_prof_get_totals().outside_s[FSC_PROF_OTHER] > 0);
    fsc_prof_free();
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_self_times_add_up),
              cmocka_unit_test(test_events_nest), cmocka_unit_test(test_what_is_not_recorded))
