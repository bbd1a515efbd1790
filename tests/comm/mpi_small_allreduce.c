/* Allreduces whose first messages move beside the desync check
 * (src/comm/eager.c: recursive doubling, and the ring's first step), and the
 * runtime's refusal of out-of-range settings.
 *
 * What would be wrong if the early paths were: results differing from the
 * algorithm's own order (bits, every dtype and op, counts around the message
 * pieces and around every crossover between algorithms), or differing
 * between ranks; the caller's buffer written before the check passed (a
 * desynced rank's data then leaks into it); early messages left undelivered
 * after a desync, also between ranks on different algorithms (the runtime
 * would have to abandon them, and the world would be harmed); on two ranks,
 * an announcement sent beside the data that carries the signature, or a
 * desync of equal-sized messages let through, or a receive posted at issue
 * left in MPI (or a piece it took drained again) after a desync. Runs at 1,
 * 2, 3 and 4 ranks; recursive doubling needs a power-of-two group of 2+.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/dist.h"
#include "comm/dist_internal.h" /* fsc_dist_rt: the algorithm thresholds, abandoned */

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
static double value(fsc_dtype dt, int64_t i, int r) {
    double v = ((double)((r * 131 + i * 17) % 1000) - 500.0) / 7.0;
    if (dt == FSC_DTYPE_BF16) return fsc_bf16_to_f32(fsc_f32_to_bf16((float)v));
    if (dt == FSC_DTYPE_I32) return (int32_t)(v * 7);
    if (dt == FSC_DTYPE_I64) /* times 2^20: a shift of a negative is undefined */
        return (double)((int64_t)(v * 7) * ((int64_t)1 << 20));
    return (float)v;
}

static void fill(void *buf, fsc_dtype dt, int64_t n, int r) {
    for (int64_t i = 0; i < n; i++) {
        double v = value(dt, i, r);
        if (dt == FSC_DTYPE_F32) ((float *)buf)[i] = (float)v;
        if (dt == FSC_DTYPE_BF16) ((uint16_t *)buf)[i] = fsc_f32_to_bf16((float)v);
        if (dt == FSC_DTYPE_I32) ((int32_t *)buf)[i] = (int32_t)v;
        if (dt == FSC_DTYPE_I64) ((int64_t *)buf)[i] = (int64_t)v;
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
    (void)n;
    for (int r = 0; r < P; r++) v[r] = value(dt, i, r);
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
    return dt == FSC_DTYPE_F32    ? ((const float *)buf)[i]
           : dt == FSC_DTYPE_BF16 ? fsc_bf16_to_f32(((const uint16_t *)buf)[i])
           : dt == FSC_DTYPE_I32  ? ((const int32_t *)buf)[i]
                                  : (double)((const int64_t *)buf)[i];
}

/* F32, I32 and I64, sum, avg and max: exactly recursive doubling's result,
 * and at 2 ranks the ring's bits too. */
static void test_exact_order(void **state) {
    (void)state;
    fsc_group *g = fsc_group_world();
    int P = fsc_dist_size();
    if (P & (P - 1)) skip(); /* no recursive doubling: test_crossovers covers the ring */
    const fsc_dtype dts[3] = {FSC_DTYPE_F32, FSC_DTYPE_I32, FSC_DTYPE_I64};
    const fsc_reduce_op ops[3] = {FSC_REDUCE_SUM, FSC_REDUCE_AVG, FSC_REDUCE_MAX};
    int64_t eager_max = fsc_dist_rt.eager_max_bytes, ring_min = fsc_dist_rt.ring_min_bytes;
    int64_t eager_max_many = fsc_dist_rt.eager_max_many_bytes;
    for (size_t c = 0; c < sizeof COUNTS / sizeof *COUNTS; c++)
        for (int d = 0; d < 3; d++)
            for (int o = 0; o < 3; o++) {
                int64_t n = COUNTS[c];
                size_t bytes = (size_t)n * fsc_dtype_size(dts[d]);
                char *early = malloc(bytes), *ring = malloc(bytes);
                fill(early, dts[d], n, fsc_dist_rank());
                fill(ring, dts[d], n, fsc_dist_rank());
                fsc_dist_rt.eager_max_bytes = fsc_dist_rt.eager_max_many_bytes = INT64_MAX;
                CHECK_RC(fsc_group_allreduce(g, early, n, dts[d], ops[o]));
                fsc_dist_rt.eager_max_bytes = fsc_dist_rt.eager_max_many_bytes = 0;
                fsc_dist_rt.ring_min_bytes = 0;
                CHECK_RC(fsc_group_allreduce(g, ring, n, dts[d], ops[o]));
                fsc_dist_rt.eager_max_bytes = eager_max, fsc_dist_rt.ring_min_bytes = ring_min;
                fsc_dist_rt.eager_max_many_bytes = eager_max_many;
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

/* ---- every algorithm, around every crossover ------------------------------------------- */

enum { ALG_MPI, ALG_RD, ALG_RING };

/* gamma_{P-1} times the sum of element i's magnitudes over the P ranks
 * (u = FLT_EPSILON / 2): how far a float sum of them in any order can be from
 * the exact sum. */
static double sum_error_bound(fsc_dtype dt, int64_t i, int P) {
    double mag = 0;
    for (int r = 0; r < P; r++) mag += fabs(value(dt, i, r));
    const double u = FLT_EPSILON / 2;
    return (P - 1) * u / (1 - (P - 1) * u) * mag;
}

/* The algorithm the MPI backend picks (backend_mpi.c, eager.c). */
static int algorithm(int P, int64_t n, fsc_dtype dt) {
    int64_t bytes = n * (int64_t)fsc_dtype_size(dt);
    bool wide = dt != FSC_DTYPE_BF16 && dt != FSC_DTYPE_F16;
    int64_t rd_max = P == 2 ? fsc_dist_rt.eager_max_bytes : fsc_dist_rt.eager_max_many_bytes;
    if (P > 1 && !(P & (P - 1)) && wide && bytes <= rd_max) return ALG_RD;
    return wide && (bytes < fsc_dist_rt.ring_min_bytes || P == 1) ? ALG_MPI : ALG_RING;
}

/* a + b as the wire adds: F32 in F32, BF16 widened and rounded once. */
static double add(fsc_dtype dt, double a, double b) {
    if (dt == FSC_DTYPE_F32) return (float)a + (float)b;
    if (dt == FSC_DTYPE_BF16) return fsc_bf16_to_f32(fsc_f32_to_bf16((float)a + (float)b));
    return a + b;
}

/* Element i of a SUM in the ring's order: chunk c (even split) starts as
 * rank c+1's value and each rank round the ring adds its own, rank c last. */
static double ring_reference(fsc_dtype dt, int64_t i, int64_t n, int P) {
    int c = 0;
    for (int64_t end = 0; c < P; c++) {
        end += n / P + (c < n % P);
        if (i < end) break;
    }
    double acc = value(dt, i, (c + 1) % P);
    for (int k = 2; k <= P; k++) acc = add(dt, acc, value(dt, i, (c + k) % P));
    return acc;
}

/* The same bits on every rank: every rank's FNV-1a hash of buf, compared. */
static void expect_same_bits(const void *buf, size_t bytes, const char *what) {
    uint64_t h = 1469598103934665603ull, all[64];
    for (size_t k = 0; k < bytes; k++) h = (h ^ ((const unsigned char *)buf)[k]) * 1099511628211ull;
    MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 1; r < fsc_dist_size(); r++)
        if (all[r] != all[0]) fail_msg("%s: rank %d's bits differ from rank 0's", what, r);
}

/* F32, BF16 and I32 sums at counts just below, at and above each crossover
 * (MPI below ring_min_bytes, recursive doubling up to eager_max_bytes on two
 * ranks and eager_max_many_bytes on more, the
 * early ring up to early_max_bytes, the ring after the check above), each
 * against the sum in its algorithm's order, bit for bit, the same on every
 * rank, and the same bits with every early path off. */
static void test_crossovers(void **state) {
    (void)state;
    fsc_group *g = fsc_group_world();
    int P = fsc_dist_size(), me = fsc_dist_rank();
    int64_t saved_early = fsc_dist_rt.early_max_bytes; /* the default */
    const int64_t crossings[] = {fsc_dist_rt.ring_min_bytes, fsc_dist_rt.eager_max_bytes,
                                 fsc_dist_rt.eager_max_many_bytes, fsc_dist_rt.early_max_bytes};
    const fsc_dtype dts[3] = {FSC_DTYPE_F32, FSC_DTYPE_BF16, FSC_DTYPE_I32};
    for (int d = 0; d < 3; d++)
        for (int x = 0; x < 4; x++)
            for (int64_t delta = -1; delta <= 1; delta++) {
                fsc_dtype dt = dts[d];
                int64_t n = crossings[x] / (int64_t)fsc_dtype_size(dt) + delta;
                size_t bytes = (size_t)n * fsc_dtype_size(dt);
                char *early = malloc(bytes), *late = malloc(bytes);
                fill(early, dt, n, me);
                fill(late, dt, n, me);
                int alg = algorithm(P, n, dt);
                CHECK_RC(fsc_group_allreduce(g, early, n, dt, FSC_REDUCE_SUM));
                fsc_dist_rt.early_max_bytes = 0; /* the ring waits for the check */
                CHECK_RC(fsc_group_allreduce(g, late, n, dt, FSC_REDUCE_SUM));
                fsc_dist_rt.early_max_bytes = saved_early;
                for (int64_t i = 0; i < n; i += 1 + n / 997) {
                    double want = alg == ALG_RING ? ring_reference(dt, i, n, P)
                                                  : reference(dt, FSC_REDUCE_SUM, i, n, P);
                    double got = get(early, dt, i);
                    /* MPI's own order is its own: it and the reference's
                     * are both sums in some order, so they differ by at most
                     * twice sum_error_bound's arithmetic bound. */
                    bool ok = alg == ALG_MPI && dt == FSC_DTYPE_F32
                                  ? fabs(got - want) <= 2 * sum_error_bound(dt, i, P)
                                  : got == want;
                    if (!ok)
                        fail_msg("%d ranks, %s count %lld (algorithm %d) element %lld: %.9g, "
                                 "expected %.9g",
                                 P, fsc_dtype_name(dt), (long long)n, alg, (long long)i, got, want);
                }
                char what[96];
                snprintf(what, sizeof what, "%s count %lld", fsc_dtype_name(dt), (long long)n);
                if (alg != ALG_MPI) expect_same_bits(early, bytes, what);
                if (memcmp(early, late, bytes))
                    fail_msg("%s: the early path's bits differ from the checked-first ring's",
                             what);
                free(early);
                free(late);
            }
    fsc_dist_rt.early_max_bytes = saved_early;
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

/* What the ranks of one side of a desync issue. */
typedef struct side {
    int64_t n;
    fsc_dtype dt;
    fsc_reduce_op op;
    bool broadcast;
} side;

static side ar(int64_t n, fsc_dtype dt, fsc_reduce_op op) {
    return (side){.n = n, .dt = dt, .op = op};
}

static side sum(int64_t n) {
    return ar(n, FSC_DTYPE_F32, FSC_REDUCE_SUM);
}

static side bcast(int64_t n) {
    return (side){.n = n, .dt = FSC_DTYPE_F32, .broadcast = true};
}

/* As the desync message names it: "allreduce(F32, count 8, sum)". */
static void describe(side s, char *buf, size_t len) {
    static const char *ops[] = {"sum", "avg", "max"};
    if (s.broadcast)
        snprintf(buf, len, "broadcast(%s, count %lld, root 0)", fsc_dtype_name(s.dt),
                 (long long)s.n);
    else
        snprintf(buf, len, "allreduce(%s, count %lld, %s)", fsc_dtype_name(s.dt), (long long)s.n,
                 ops[s.op]);
}

/* A desync between early allreduces of different sizes (one of several
 * pieces, one of one), of equal sizes but other signatures (on two ranks
 * only the hash in the first message's tag tells them apart), or between an
 * early allreduce and a broadcast, is named on every rank with both sides'
 * collectives; the caller's buffer is untouched (nothing was reduced into
 * it before the check); every early message was delivered (nothing
 * abandoned) and the world still works. */
static void desync_case(side others, side last_side) {
    if (fsc_dist_size() == 1) skip();
    fsc_group *g = NULL;
    CHECK_RC(fsc_group_split(fsc_group_world(), 0, fsc_dist_rank(), "early", &g));
    int P = fsc_dist_size(), me = fsc_dist_rank();
    side mine = me == P - 1 ? last_side : others;
    size_t cap = (size_t)(last_side.n > others.n ? last_side.n : others.n) * 8;
    char *x = malloc(cap), *orig = malloc(cap);
    fill(x, FSC_DTYPE_F32, (int64_t)(cap / 4), me);
    memcpy(orig, x, cap);
    int rc = mine.broadcast ? fsc_group_broadcast(g, x, mine.n, mine.dt, 0)
                            : fsc_group_allreduce(g, x, mine.n, mine.dt, mine.op);
    assert_int_equal(rc, FSC_ERR_DESYNC);
    expect_substr("desync on group early");
    char name[96];
    describe(others, name, sizeof name);
    expect_substr(name);
    describe(last_side, name, sizeof name);
    expect_substr(name);
    if (memcmp(x, orig, cap))
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
    desync_case(sum(8), sum(3001)); /* 12004 bytes: four pieces against one */
}

static void test_desync_kinds(void **state) {
    (void)state;
    desync_case(sum(8), bcast(3001)); /* the broadcasting rank drains four pieces */
}

/* Ranks on different algorithms: the last one's early ring step goes to
 * rank 0, which expected recursive doubling's (2, 4 ranks) or MPI's own (3);
 * then early rings whose chunks differ by an element, in one piece and, with
 * messages cut to 7000 elements, in several; then a broadcast against them. */
static void test_desync_algorithms(void **state) {
    (void)state;
    desync_case(sum(8), sum(300001));
    desync_case(sum(100000), sum(100001));
    int64_t max_msg = fsc_dist_rt.max_msg;
    fsc_dist_rt.max_msg = 7000;
    desync_case(sum(100000), sum(100003));
    fsc_dist_rt.max_msg = max_msg;
    desync_case(sum(100000), bcast(4));
}

/* Messages of equal size, signatures that differ only in op or dtype: on
 * two ranks the first message's tag is all that tells them apart (recursive
 * doubling in one piece and in several, the early ring in F32 and BF16). */
static void test_desync_same_size(void **state) {
    (void)state;
    desync_case(sum(8), ar(8, FSC_DTYPE_F32, FSC_REDUCE_AVG));
    desync_case(sum(8), ar(8, FSC_DTYPE_I32, FSC_REDUCE_SUM));
    desync_case(sum(3000), ar(3000, FSC_DTYPE_F32, FSC_REDUCE_MAX));
    desync_case(sum(40000), ar(40000, FSC_DTYPE_F32, FSC_REDUCE_MAX));
    desync_case(ar(3000, FSC_DTYPE_BF16, FSC_REDUCE_SUM), ar(3000, FSC_DTYPE_BF16, FSC_REDUCE_AVG));
    desync_case(sum(16384), ar(16384, FSC_DTYPE_I32, FSC_REDUCE_MAX)); /* 64 KiB, one message */
}

/* One F32 allreduce of n elements, each rank's elements rank + 1, on g:
 * every element must come out as op over {1, 2}. */
static void allreduce_1_2(fsc_group *g, int64_t n, fsc_reduce_op op) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(fsc_dist_rank() + 1);
    CHECK_RC(fsc_group_allreduce(g, x, n, FSC_DTYPE_F32, op));
    float want = op == FSC_REDUCE_SUM ? 3.0f : op == FSC_REDUCE_AVG ? 1.5f : 2.0f;
    for (int64_t i = 0; i < n; i++)
        if (x[i] != want)
            fail_msg("rank %d, replayed allreduce of %lld element %lld: %g, expected %g",
                     fsc_dist_rank(), (long long)n, (long long)i, x[i], want);
    free(x);
}

/* Two ranks: recursive doubling posts its receives at issue under the
 * signed tag, and a desync must cancel them. One left posted would take the
 * next message under that tag: so the desynced collective is replayed, same
 * group and sequence number (the desync cleared by hand), once with each
 * rank's signature, and must complete with the right values; a stolen piece
 * leaves it waiting until the deadline instead. One piece and four. */
static void test_desync_cancels_receives(void **state) {
    (void)state;
    if (fsc_dist_size() != 2) skip();
    double timeout = fsc_dist_rt.timeout_s;
    fsc_dist_rt.timeout_s = 10; /* a stolen piece fails in seconds, not minutes */
    const int64_t n[2] = {8, 3001};
    const fsc_reduce_op other[2] = {FSC_REDUCE_AVG, FSC_REDUCE_MAX};
    for (int c = 0; c < 2; c++) {
        fsc_group *g = NULL;
        CHECK_RC(fsc_group_split(fsc_group_world(), 0, fsc_dist_rank(), "cancel", &g));
        fsc_reduce_op ops[2] = {FSC_REDUCE_SUM, other[c]};
        float *x = calloc((size_t)n[c], sizeof *x);
        int64_t seq = g->seq;
        assert_int_equal(fsc_group_allreduce(g, x, n[c], FSC_DTYPE_F32, ops[fsc_dist_rank()]),
                         FSC_ERR_DESYNC);
        assert_false(fsc_dist_rt.abandoned);
        for (int side = 0; side < 2; side++) {
            /* both ranks past the desync (or the last replay) first: a rank
             * that finished a replay must not issue the next under the same
             * sequence number while its peer still checks the last one */
            CHECK_RC(fsc_group_barrier(fsc_group_world()));
            g->broken = 0;
            g->seq = g->next_data = seq;
            allreduce_1_2(g, n[c], ops[side]);
        }
        free(x);
        fsc_group_free(g);
    }
    fsc_dist_rt.timeout_s = timeout;
    assert_false(fsc_dist_rt.abandoned);
}

/* Two ranks: rank 0's group breaks while its early allreduce waits for the
 * check, so it drains what rank 1 sent it, whose pieces its receives posted
 * at issue have (partly) taken already; those must not be drained again, or
 * the drain waits for pieces that never come and times out (abandoned).
 * Rank 1 issues only once rank 0's group is broken, and completes. */
static void test_broken_after_issue(void **state) {
    (void)state;
    if (fsc_dist_size() != 2) skip();
    double timeout = fsc_dist_rt.timeout_s;
    fsc_dist_rt.timeout_s = 10;
    fsc_group *g = NULL;
    CHECK_RC(fsc_group_split(fsc_group_world(), 0, fsc_dist_rank(), "broken", &g));
    int me = fsc_dist_rank(), token = 0;
    enum { N = 3001 }; /* four pieces */
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = (float)(me + 1);
    fsc_request *req = NULL;
    if (me == 1) MPI_Recv(&token, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    CHECK_RC(fsc_group_iallreduce(g, x, N, FSC_DTYPE_F32, FSC_REDUCE_SUM, &req));
    if (me == 0) {
        assert_int_equal(req->phase, REQ_CONTROL); /* rank 1 has sent nothing yet */
        g->broken = FSC_ERR_DESYNC;
        snprintf(g->broken_msg, sizeof g->broken_msg, "broken by the test");
        MPI_Send(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
        assert_int_equal(fsc_request_wait(&req), FSC_ERR_DESYNC);
        expect_substr("broken by the test");
        for (int i = 0; i < N; i++) assert_true(x[i] == 1.0f); /* not reduced into */
    } else {
        CHECK_RC(fsc_request_wait(&req));
        for (int i = 0; i < N; i++) assert_true(x[i] == 3.0f);
    }
    assert_false(fsc_dist_rt.abandoned);
    free(x);
    fsc_group_free(g);
    fsc_dist_rt.timeout_s = timeout;
    float y[3] = {1, 2, 3};
    CHECK_RC(fsc_group_allreduce(fsc_group_world(), y, 3, FSC_DTYPE_F32, FSC_REDUCE_SUM));
    assert_true(y[0] == 2.0f && y[2] == 6.0f);
}

/* Announcements one allreduce sends (fsc_dist_rt.announcements), its sum of
 * rank + 1 checked. */
static int64_t announcements(int64_t n, fsc_dtype dt) {
    int P = fsc_dist_size();
    size_t esz = fsc_dtype_size(dt);
    char *x = malloc((size_t)n * esz);
    for (int64_t i = 0; i < n; i++) {
        float v = (float)(fsc_dist_rank() + 1);
        if (dt == FSC_DTYPE_F32) ((float *)x)[i] = v;
        if (dt == FSC_DTYPE_BF16) ((uint16_t *)x)[i] = fsc_f32_to_bf16(v);
    }
    int64_t before = fsc_dist_rt.announcements;
    CHECK_RC(fsc_group_allreduce(fsc_group_world(), x, n, dt, FSC_REDUCE_SUM));
    int64_t sent = fsc_dist_rt.announcements - before;
    for (int64_t i = 0; i < n; i += 1 + n / 101)
        if (get(x, dt, i) != (double)(P * (P + 1) / 2))
            fail_msg("%s count %lld element %lld: %g, expected %d", fsc_dtype_name(dt),
                     (long long)n, (long long)i, get(x, dt, i), P * (P + 1) / 2);
    free(x);
    return sent;
}

/* On two ranks an early allreduce sends its peer one message, the data
 * carrying the signature, and no announcement: recursive doubling in pieces
 * and whole, the early ring in F32 and BF16. Announced as before: a ring
 * after the check, a ring whose chunk would be empty (count 1), any
 * allreduce under the full check, and every allreduce on other groups. */
static void test_signed_one_message(void **state) {
    (void)state;
    int P = fsc_dist_size();
    int64_t each = P == 2 ? 0 : P - 1;
    bool full = fsc_dist_rt.full_check; /* FSC_DESYNC_CHECK may be set */
    fsc_dist_rt.full_check = false;
    assert_int_equal(announcements(1, FSC_DTYPE_F32), each);
    assert_int_equal(announcements(3001, FSC_DTYPE_F32), each);
    assert_int_equal(announcements(16384, FSC_DTYPE_F32), each);
    assert_int_equal(announcements(40000, FSC_DTYPE_F32), each);
    assert_int_equal(announcements(3000, FSC_DTYPE_BF16), each);
    assert_int_equal(announcements(1, FSC_DTYPE_BF16), P - 1);
    assert_int_equal(announcements(300000, FSC_DTYPE_F32), P - 1);
    fsc_dist_rt.full_check = true;
    assert_int_equal(announcements(3001, FSC_DTYPE_F32), P - 1);
    fsc_dist_rt.full_check = full;
}

/* Early allreduces of both algorithms and dtypes in flight at once, waited
 * in reverse: each finds its first message behind the others'. */
static void test_mixed_in_flight(void **state) {
    (void)state;
    enum { K = 12 };
    const int64_t counts[3] = {40000, 1500, 3000}; /* ring, rd, BF16 ring */
    const fsc_dtype dts[3] = {FSC_DTYPE_F32, FSC_DTYPE_F32, FSC_DTYPE_BF16};
    fsc_group *g = fsc_group_world();
    int P = fsc_dist_size();
    void *x[K];
    fsc_request *req[K];
    for (int k = 0; k < K; k++) {
        int64_t n = counts[k % 3];
        fsc_dtype dt = dts[k % 3];
        x[k] = malloc((size_t)n * fsc_dtype_size(dt));
        for (int64_t i = 0; i < n; i++) {
            float v = (float)(fsc_dist_rank() + 1);
            if (dt == FSC_DTYPE_F32) ((float *)x[k])[i] = v;
            if (dt == FSC_DTYPE_BF16) ((uint16_t *)x[k])[i] = fsc_f32_to_bf16(v);
        }
        CHECK_RC(fsc_group_iallreduce(g, x[k], n, dt, FSC_REDUCE_SUM, &req[k]));
    }
    for (int k = K - 1; k >= 0; k--) CHECK_RC(fsc_request_wait(&req[k]));
    double want = (double)(P * (P + 1) / 2);
    for (int k = 0; k < K; k++) {
        for (int64_t i = 0; i < counts[k % 3]; i++)
            if (get(x[k], dts[k % 3], i) != want)
                fail_msg("allreduce %d element %lld: %g, expected %g", k, (long long)i,
                         get(x[k], dts[k % 3], i), want);
        free(x[k]);
    }
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
        cmocka_unit_test(test_exact_order),        cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_crossovers),         cmocka_unit_test(test_desync_sizes),
        cmocka_unit_test(test_desync_kinds),       cmocka_unit_test(test_desync_algorithms),
        cmocka_unit_test(test_desync_same_size),   cmocka_unit_test(test_signed_one_message),
        cmocka_unit_test(test_mixed_in_flight),    cmocka_unit_test(test_desync_cancels_receives),
        cmocka_unit_test(test_broken_after_issue), cmocka_unit_test(test_settings_refused),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    int rc = fsc_dist_finalize();
    if (rc) fprintf(stderr, "fsc_dist_finalize: %s\n", fsc_last_error());
    return failed || rc ? 1 : 0;
}
