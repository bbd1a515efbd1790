/* Small allreduces that move beside the desync check (src/dist/eager.c), and
 * the runtime's refusal of out-of-range settings.
 *
 * What would be wrong if the early path were: results differing from the
 * ring's (bits, every dtype and op, counts around the message pieces); the
 * caller's buffer written before the check passed (a desynced rank's data
 * then leaks into it); early messages left undelivered after a desync (the
 * runtime would have to abandon them, and the world would be harmed). Runs
 * at 1, 2 and 4 ranks; the early path needs a power-of-two group of 2+.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/dist.h"
#include "dist/dist_internal.h" /* fsc_dist_rt: the algorithm thresholds, abandoned */

#define CHECK_RC(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) fail_msg("%s = %d: %s", #call, rc_, fsc_last_error());                            \
    } while (0)

static void expect_substr(const char *what) {
    if (!strstr(fsc_last_error(), what))
        fail_msg("rank %d: message lacks \"%s\": %s", fsc_dist_rank(), what, fsc_last_error());
}

/* Rank r's element i: inexact F32 values, so summation order shows in the bits. */
static void fill(void *buf, fsc_dtype dt, int64_t n, int r) {
    for (int64_t i = 0; i < n; i++) {
        double v = ((double)((r * 131 + i * 17) % 1000) - 500.0) / 7.0;
        if (dt == FSC_DTYPE_F32) ((float *)buf)[i] = (float)v;
        if (dt == FSC_DTYPE_I32) ((int32_t *)buf)[i] = (int32_t)(v * 7);
        if (dt == FSC_DTYPE_I64) /* times 2^20: a shift of a negative is undefined */
            ((int64_t *)buf)[i] = (int64_t)(v * 7) * ((int64_t)1 << 20);
    }
}

/* Counts (elements) around the pieces of 4000 bytes and the 16 KiB limit. */
static const int64_t COUNTS[] = {1, 999, 1000, 1001, 4096, 16383, 16384};

/* Element i of the reduction in recursive doubling's order (pairs, then
 * pairs of pairs), computed from every rank's input: what the early path
 * must give, bit for bit (at 2 ranks this is also the ring's order). */
static double reference(fsc_dtype dt, fsc_reduce_op op, int64_t i, int64_t n, int P) {
    double v[64];
    char one[8];
    float *f = (float *)one;
    for (int r = 0; r < P; r++) {
        void *tmp = malloc((size_t)n * 8);
        fill(tmp, dt, n, r);
        v[r] = dt == FSC_DTYPE_F32   ? ((float *)tmp)[i]
               : dt == FSC_DTYPE_I32 ? ((int32_t *)tmp)[i]
                                     : (double)((int64_t *)tmp)[i];
        free(tmp);
    }
    for (int s = 1; s < P; s *= 2)
        for (int r = 0; r + s < P; r += 2 * s) {
            if (op == FSC_REDUCE_MAX)
                v[r] = v[r] > v[r + s] ? v[r] : v[r + s];
            else if (dt == FSC_DTYPE_F32)
                *f = (float)v[r] + (float)v[r + s], v[r] = *f; /* F32 adds, as the wire does */
            else
                v[r] += v[r + s];
        }
    if (op == FSC_REDUCE_AVG && dt == FSC_DTYPE_F32) *f = (float)v[0] / (float)P, v[0] = *f;
    if (op == FSC_REDUCE_AVG && dt != FSC_DTYPE_F32) v[0] = (double)((int64_t)v[0] / P);
    return v[0];
}

static double get(const void *buf, fsc_dtype dt, int64_t i) {
    return dt == FSC_DTYPE_F32   ? ((const float *)buf)[i]
           : dt == FSC_DTYPE_I32 ? ((const int32_t *)buf)[i]
                                 : (double)((const int64_t *)buf)[i];
}

/* F32, I32 and I64, sum, avg and max: exactly recursive doubling's result,
 * and at 2 ranks the ring's bits too. */
static void test_exact_order(void **state) {
    (void)state;
    fsc_group *g = fsc_group_world();
    int P = fsc_dist_size();
    const fsc_dtype dts[3] = {FSC_DTYPE_F32, FSC_DTYPE_I32, FSC_DTYPE_I64};
    const fsc_reduce_op ops[3] = {FSC_REDUCE_SUM, FSC_REDUCE_AVG, FSC_REDUCE_MAX};
    int64_t eager_max = fsc_dist_rt.eager_max_bytes, ring_min = fsc_dist_rt.ring_min_bytes;
    for (size_t c = 0; c < sizeof COUNTS / sizeof *COUNTS; c++)
        for (int d = 0; d < 3; d++)
            for (int o = 0; o < 3; o++) {
                int64_t n = COUNTS[c];
                size_t bytes = (size_t)n * fsc_dtype_size(dts[d]);
                char *early = malloc(bytes), *ring = malloc(bytes);
                fill(early, dts[d], n, fsc_dist_rank());
                fill(ring, dts[d], n, fsc_dist_rank());
                fsc_dist_rt.eager_max_bytes = INT64_MAX;
                CHECK_RC(fsc_group_allreduce(g, early, n, dts[d], ops[o]));
                fsc_dist_rt.eager_max_bytes = 0, fsc_dist_rt.ring_min_bytes = 0;
                CHECK_RC(fsc_group_allreduce(g, ring, n, dts[d], ops[o]));
                fsc_dist_rt.eager_max_bytes = eager_max, fsc_dist_rt.ring_min_bytes = ring_min;
                for (int64_t i = 0; i < n; i += 1 + n / 97) {
                    double want = reference(dts[d], ops[o], i, n, P);
                    if (get(early, dts[d], i) != want)
                        fail_msg("count %lld %s op %d element %lld: %.9g, expected %.9g",
                                 (long long)n, fsc_dtype_name(dts[d]), (int)ops[o], (long long)i,
                                 get(early, dts[d], i), want);
                }
                if (P <= 2 && memcmp(early, ring, bytes))
                    fail_msg("count %lld %s op %d: the early path's bits differ from the ring's",
                             (long long)n, fsc_dtype_name(dts[d]), (int)ops[o]);
                free(early);
                free(ring);
            }
}

/* Many early allreduces in flight at once: each finds its own messages. */
static void test_many_in_flight(void **state) {
    (void)state;
    enum { K = 24, N = 1500 };
    fsc_group *g = fsc_group_world();
    float *x = malloc((size_t)K * N * sizeof *x);
    fsc_request *req[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++) x[k * N + i] = (float)(k * 1000 + i + fsc_dist_rank());
        CHECK_RC(fsc_group_iallreduce(g, x + k * N, N - k, FSC_DTYPE_F32, FSC_REDUCE_SUM, &req[k]));
    }
    for (int k = K - 1; k >= 0; k--) CHECK_RC(fsc_request_wait(&req[k]));
    int P = fsc_dist_size();
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N - k; i++) {
            float want = (float)P * (float)(k * 1000 + i) + (float)(P * (P - 1) / 2);
            if (x[k * N + i] != want)
                fail_msg("allreduce %d element %d: %g, expected %g", k, i, x[k * N + i], want);
        }
    free(x);
}

/* A desync between early allreduces of different sizes (one of several
 * pieces, one of one), or between an early allreduce and a broadcast, is
 * named on every rank; the caller's buffer is untouched (nothing was
 * reduced into it before the check); every early message was delivered
 * (nothing abandoned) and the world still works. */
static void desync_case(int64_t n_last, bool last_broadcasts) {
    if (fsc_dist_size() == 1) skip();
    fsc_group *g = NULL;
    CHECK_RC(fsc_group_split(fsc_group_world(), 0, fsc_dist_rank(), "early", &g));
    int P = fsc_dist_size(), me = fsc_dist_rank();
    bool last = me == P - 1;
    int64_t n = last ? n_last : 8;
    float *x = malloc((size_t)n_last * sizeof *x), *orig = malloc((size_t)n_last * sizeof *x);
    fill(x, FSC_DTYPE_F32, n_last, me);
    memcpy(orig, x, (size_t)n_last * sizeof *x);
    int rc = last && last_broadcasts ? fsc_group_broadcast(g, x, n, FSC_DTYPE_F32, 0)
                                     : fsc_group_allreduce(g, x, n, FSC_DTYPE_F32, FSC_REDUCE_SUM);
    assert_int_equal(rc, FSC_ERR_DESYNC);
    expect_substr("desync on group early");
    expect_substr("allreduce(F32, count 8, sum)");
    char other[64];
    snprintf(other, sizeof other,
             last_broadcasts ? "broadcast(F32, count %lld, root 0)"
                             : "allreduce(F32, count %lld, sum)",
             (long long)n_last);
    expect_substr(other);
    if (memcmp(x, orig, (size_t)n_last * sizeof *x))
        fail_msg("rank %d: the buffer was written although the check failed", me);
    assert_false(fsc_dist_rt.abandoned);
    fsc_group_free(g);
    CHECK_RC(fsc_group_barrier(fsc_group_world()));
    float y[3] = {1, 2, 3};
    CHECK_RC(fsc_group_allreduce(fsc_group_world(), y, 3, FSC_DTYPE_F32, FSC_REDUCE_SUM));
    assert_true(y[0] == (float)P && y[2] == 3.0f * (float)P);
    free(x);
    free(orig);
}

static void test_desync_sizes(void **state) {
    (void)state;
    desync_case(3001, false); /* 12004 bytes: four pieces against one */
}

static void test_desync_kinds(void **state) {
    (void)state;
    desync_case(3001, true); /* the broadcasting rank drains four pieces */
}

/* Out-of-range settings are refused before anything starts, with the range. */
static void test_settings_refused(void **state) {
    (void)state;
    const char *bad[][2] = {{"FSC_TIMEOUT_S", "0"},       {"FSC_TIMEOUT_S", "abc"},
                            {"FSC_TIMEOUT_S", "1e9"},     {"FSC_INIT_TIMEOUT_S", "-3"},
                            {"FSC_INIT_TIMEOUT_S", "5s"}, {"FSC_DESYNC_CHECK", "yes"},
                            {"FSC_HEARTBEAT_PROC", "2"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        assert_int_equal(fsc_dist_init(NULL, NULL, NULL), FSC_ERR_INVALID);
        expect_substr(bad[i][0]);
        expect_substr(bad[i][1]);
        expect_substr(strstr(bad[i][0], "TIMEOUT") ? "[0.1, 604800]" : "0 or 1");
        assert_int_equal(fsc_env_check(), FSC_ERR_INVALID);
        unsetenv(bad[i][0]);
    }
    double t = fsc_dist_rt.timeout_s;
    fsc_dist_options opt = {.timeout_s = -1};
    assert_int_equal(fsc_dist_init(NULL, NULL, &opt), FSC_ERR_INVALID);
    expect_substr("options.timeout_s = -1");
    opt = (fsc_dist_options){.init_timeout_s = 1e7};
    assert_int_equal(fsc_dist_init(NULL, NULL, &opt), FSC_ERR_INVALID);
    expect_substr("[0.1, 604800]");
    assert_true(fsc_dist_rt.timeout_s == t); /* a refused call changed nothing */
    setenv("FSC_TIMEOUT_S", "45.5", 1);
    opt = (fsc_dist_options){0}; /* the variable, read again */
    CHECK_RC(fsc_dist_init(NULL, NULL, &opt));
    assert_true(fsc_dist_rt.timeout_s == 45.5);
    unsetenv("FSC_TIMEOUT_S");
    opt = (fsc_dist_options){.timeout_s = t};
    CHECK_RC(fsc_dist_init(NULL, NULL, &opt));
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) {
        fprintf(stderr, "fsc_dist_init: %s\n", fsc_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_order),      cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_desync_sizes),     cmocka_unit_test(test_desync_kinds),
        cmocka_unit_test(test_settings_refused),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    int rc = fsc_dist_finalize();
    if (rc) fprintf(stderr, "fsc_dist_finalize: %s\n", fsc_last_error());
    return failed || rc ? 1 : 0;
}
