/* Distributed runtime: every collective x dtype x op against a locally
 * computed expectation, on the world and on split groups, blocking and not;
 * uneven layouts with empty chunks; messages cut into pieces; send/recv; the
 * device mesh; the desync guard; statistics; bad arguments.
 *
 * Runs under mpiexec with 1, 2 and 4 ranks (tests/CMakeLists.txt). Every rank
 * can compute every rank's input from a formula, so each checks its own
 * result without extra communication. Inputs are small integers, exact in
 * BF16 and F16 and in sums over a few ranks, so results compare exactly.
 * Half-precision sums of inexact values: mpi_collectives_half.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/dist.h"
#include "collectives_test.h"
#include "comm/dist_internal.h" /* fsc_dist_rt.max_msg, to exercise message splitting */

static const fsc_dtype DTYPES[] = {FSC_DTYPE_F32, FSC_DTYPE_BF16, FSC_DTYPE_F16, FSC_DTYPE_I32,
                                   FSC_DTYPE_I64};
#define NDT 5
static const fsc_reduce_op OPS[] = {FSC_REDUCE_SUM, FSC_REDUCE_AVG, FSC_REDUCE_MAX};
/* 70001 elements: over the ring threshold for every dtype (halves always take it) */
static const int64_t COUNTS[] = {0, 1, 13, 70001};
#define NCOUNTS 4

/* Rank r's element i of input number `salt`. */
static double val(int r, int64_t i, int salt) {
    return (double)((r * 7 + i * 3 + salt * 5) % 11) - 5.0;
}

static bool is_int(fsc_dtype dt) {
    return dt == FSC_DTYPE_I32 || dt == FSC_DTYPE_I64;
}

/* What op over the P ranks' inputs gives, as stored in dt. */
static double expected(int P, int64_t i, int salt, fsc_reduce_op op, fsc_dtype dt) {
    double s = 0, m = -1e300;
    for (int r = 0; r < P; r++) {
        s += val(r, i, salt);
        if (val(r, i, salt) > m) m = val(r, i, salt);
    }
    double v = op == FSC_REDUCE_MAX ? m : s;
    if (op == FSC_REDUCE_AVG)
        v = is_int(dt) ? (double)((int64_t)s / P) : (double)((float)s / (float)P);
    uint64_t tmp;
    put(&tmp, dt, 0, v);
    return get(&tmp, dt, 0);
}

static void *fill(fsc_dtype dt, int64_t n, int r, int salt) {
    void *p = calloc((size_t)(n > 0 ? n : 1), fsc_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) put(p, dt, i, val(r, i, salt));
    return p;
}

/* ---- allreduce / reduce / broadcast --------------------------------------------------- */

static void allreduce_on(fsc_group *g, bool nonblocking) {
    int P = fsc_group_size(g), me = fsc_group_rank(g);
    for (int d = 0; d < NDT; d++)
        for (int o = 0; o < 3; o++)
            for (int c = 0; c < NCOUNTS; c++) {
                fsc_dtype dt = DTYPES[d];
                int64_t n = COUNTS[c];
                void *buf = fill(dt, n, me, d + o);
                if (nonblocking) {
                    fsc_request *req = NULL;
                    CHECK_RC(fsc_group_iallreduce(g, buf, n, dt, OPS[o], &req));
                    bool done = false;
                    while (!done) CHECK_RC(fsc_request_test(&req, &done));
                    assert_null(req);
                } else {
                    CHECK_RC(fsc_group_allreduce(g, buf, n, dt, OPS[o]));
                }
                for (int64_t i = 0; i < n; i++)
                    if (get(buf, dt, i) != expected(P, i, d + o, OPS[o], dt))
                        fail_msg("allreduce %s op %d n %lld on %s: [%lld] = %g, want %g",
                                 fsc_dtype_name(dt), o, (long long)n, fsc_group_name(g),
                                 (long long)i, get(buf, dt, i), expected(P, i, d + o, OPS[o], dt));
                free(buf);
            }
}

static void test_allreduce(void **state) {
    (void)state;
    allreduce_on(fsc_group_world(), false);
    allreduce_on(halves, false);
    allreduce_on(fsc_group_world(), true);
}

static void test_reduce_broadcast(void **state) {
    (void)state;
    fsc_group *groups[2] = {fsc_group_world(), halves};
    for (int k = 0; k < 2; k++) {
        fsc_group *g = groups[k];
        int P = fsc_group_size(g), me = fsc_group_rank(g);
        for (int root = 0; root < P; root++)
            for (int d = 0; d < NDT; d++) {
                fsc_dtype dt = DTYPES[d];
                int64_t n = 1001;
                for (int o = 0; o < 3; o++) {
                    void *buf = fill(dt, n, me, o);
                    CHECK_RC(fsc_group_reduce(g, buf, n, dt, OPS[o], root));
                    if (me == root)
                        for (int64_t i = 0; i < n; i++)
                            assert_true(get(buf, dt, i) == expected(P, i, o, OPS[o], dt));
                    free(buf);
                    /* the non-blocking form, completed by wait; 5000 elements take the
                     * ring path for every dtype */
                    int64_t n2 = 5000;
                    buf = fill(dt, n2, me, o);
                    fsc_request *r = NULL;
                    CHECK_RC(fsc_group_ireduce(g, buf, n2, dt, OPS[o], root, &r));
                    CHECK_RC(fsc_request_wait(&r));
                    if (me == root)
                        for (int64_t i = 0; i < n2; i++)
                            assert_true(get(buf, dt, i) == expected(P, i, o, OPS[o], dt));
                    free(buf);
                }
                void *buf = fill(dt, n, me, 3);
                CHECK_RC(fsc_group_broadcast(g, buf, n, dt, root));
                for (int64_t i = 0; i < n; i++) {
                    uint64_t want;
                    put(&want, dt, 0, val(root, i, 3));
                    assert_true(get(buf, dt, i) == get(&want, dt, 0));
                }
                /* non-blocking broadcast of the U16 dtype (moved, not reduced) */
                fsc_request *req = NULL;
                uint16_t *u = calloc((size_t)n, 2);
                if (me == root)
                    for (int64_t i = 0; i < n; i++) u[i] = (uint16_t)(i * 31 + root);
                CHECK_RC(fsc_group_ibroadcast(g, u, n, FSC_DTYPE_U16, root, &req));
                CHECK_RC(fsc_request_wait(&req));
                for (int64_t i = 0; i < n; i++) assert_int_equal(u[i], (uint16_t)(i * 31 + root));
                free(u);
                free(buf);
            }
    }
}

/* ---- allgather / reduce-scatter ------------------------------------------------------- */

/* An uneven layout: some ranks empty, chunks stored in reverse rank order
 * with a gap of 3 elements after each. Returns the extent. */
static int64_t uneven_layout(int P, int64_t *counts, int64_t *displs) {
    int64_t off = 0;
    for (int r = P - 1; r >= 0; r--) {
        counts[r] = (r % 3 == 1) ? 0 : 5 + 17 * r;
        displs[r] = off;
        off += counts[r] + 3;
    }
    return off;
}

static void gather_scatter_on(fsc_group *g, bool even, bool nonblocking) {
    int P = fsc_group_size(g), me = fsc_group_rank(g);
    int64_t counts[64], displs[64], extent;
    for (int c = 0; c < NCOUNTS; c++) {
        if (even) {
            for (int r = 0; r < P; r++) {
                counts[r] = COUNTS[c];
                displs[r] = r * COUNTS[c];
            }
            extent = P * COUNTS[c];
        } else {
            if (c > 0) break; /* one uneven layout */
            extent = uneven_layout(P, counts, displs);
        }
        for (int d = 0; d < NDT; d++) {
            fsc_dtype dt = DTYPES[d];
            size_t esz = fsc_dtype_size(dt);
            /* allgather: rank r contributes val(r, i) for its chunk */
            void *in = fill(dt, counts[me], me, 1);
            char *out = calloc((size_t)extent + 1, esz);
            if (nonblocking) {
                fsc_request *req = NULL;
                CHECK_RC(fsc_group_iallgather(g, in, out, counts[0], dt, &req));
                fsc_group_progress(g);
                CHECK_RC(fsc_request_wait(&req));
            } else if (even) {
                CHECK_RC(fsc_group_allgather(g, in, out, counts[0], dt));
            } else {
                CHECK_RC(fsc_group_allgatherv(g, in, out, counts, displs, dt));
            }
            for (int r = 0; r < P; r++)
                for (int64_t i = 0; i < counts[r]; i++) {
                    uint64_t want;
                    put(&want, dt, 0, val(r, i, 1));
                    assert_true(get(out + displs[r] * (int64_t)esz, dt, i) == get(&want, dt, 0));
                }
            free(in);
            free(out);
            /* reduce-scatter: every rank's input is the whole layout */
            for (int o = 0; o < 3; o++) {
                void *full = fill(dt, extent, me, 2 + o);
                void *mine = calloc((size_t)counts[me] + 1, esz);
                if (nonblocking) {
                    fsc_request *req = NULL;
                    CHECK_RC(fsc_group_ireduce_scatter(g, full, mine, counts[0], dt, OPS[o], &req));
                    bool done = false;
                    while (!done) {
                        fsc_group_progress(g);
                        CHECK_RC(fsc_request_test(&req, &done));
                    }
                } else if (even) {
                    CHECK_RC(fsc_group_reduce_scatter(g, full, mine, counts[0], dt, OPS[o]));
                } else {
                    CHECK_RC(fsc_group_reduce_scatterv(g, full, mine, counts, displs, dt, OPS[o]));
                }
                for (int64_t i = 0; i < counts[me]; i++)
                    if (get(mine, dt, i) != expected(P, displs[me] + i, 2 + o, OPS[o], dt))
                        fail_msg("reduce_scatter%s %s op %d on %s: [%lld] = %g, want %g",
                                 even ? "" : "v", fsc_dtype_name(dt), o, fsc_group_name(g),
                                 (long long)i, get(mine, dt, i),
                                 expected(P, displs[me] + i, 2 + o, OPS[o], dt));
                free(full);
                free(mine);
            }
        }
    }
}

static void test_allgather_reduce_scatter(void **state) {
    (void)state;
    fsc_group *groups[2] = {fsc_group_world(), halves};
    for (int k = 0; k < 2; k++) {
        gather_scatter_on(groups[k], true, false);
        gather_scatter_on(groups[k], false, false);
        gather_scatter_on(groups[k], true, true);
    }
}

/* ---- alltoall, barrier, send/recv --------------------------------------------------- */

static void test_alltoall_barrier_sendrecv(void **state) {
    (void)state;
    fsc_group *groups[2] = {fsc_group_world(), halves};
    for (int k = 0; k < 2; k++) {
        fsc_group *g = groups[k];
        int P = fsc_group_size(g), me = fsc_group_rank(g);
        int64_t n = 37;
        int64_t *in = malloc((size_t)(P * n) * sizeof *in),
                *out = malloc((size_t)(P * n) * sizeof *out);
        for (int r = 0; r < P; r++)
            for (int64_t i = 0; i < n; i++) in[r * n + i] = me * 1000000 + r * 1000 + i;
        CHECK_RC(fsc_group_alltoall(g, in, out, n, FSC_DTYPE_I64));
        for (int r = 0; r < P; r++)
            for (int64_t i = 0; i < n; i++)
                assert_int_equal(out[r * n + i], r * 1000000 + me * 1000 + i);
        CHECK_RC(fsc_group_barrier(g));
        /* a ring of sends: pass to the right, receive from the left */
        float msg[5], got[5];
        for (int i = 0; i < 5; i++) msg[i] = (float)(me * 10 + i);
        int right = (me + 1) % P, left = (me + P - 1) % P;
        if (P == 1) {
            memcpy(got, msg, sizeof got);
        } else if (me % 2 == 0) {
            CHECK_RC(fsc_group_send(g, msg, 5, FSC_DTYPE_F32, right, 7));
            CHECK_RC(fsc_group_recv(g, got, 5, FSC_DTYPE_F32, left, 7));
        } else {
            CHECK_RC(fsc_group_recv(g, got, 5, FSC_DTYPE_F32, left, 7));
            CHECK_RC(fsc_group_send(g, msg, 5, FSC_DTYPE_F32, right, 7));
        }
        for (int i = 0; i < 5; i++) assert_true(got[i] == (float)(left * 10 + i));
        free(in);
        free(out);
    }
}

/* ---- non-blocking point-to-point: a pipeline's traffic ------------------------------------ */

/* Every rank posts its receives first (tags in the reverse order of the
 * sends, so matching is by tag, not by order), then its sends, then waits:
 * with blocking calls this pattern would deadlock. */
static void test_isend_irecv(void **state) {
    (void)state;
    fsc_group *g = fsc_group_world();
    int P = fsc_group_size(g), me = fsc_group_rank(g);
    if (P == 1) skip();
    enum { K = 3, N = 1000 };
    int right = (me + 1) % P, left = (me + P - 1) % P;
    static float out[K][N], in[K][N];
    fsc_request *rreq[K], *sreq[K];
    for (int k = K - 1; k >= 0; k--)
        CHECK_RC(fsc_group_irecv(g, in[k], N, FSC_DTYPE_F32, left, 100 + k, &rreq[k]));
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++) out[k][i] = (float)(me * 100000 + k * 1000 + i);
        CHECK_RC(fsc_group_isend(g, out[k], N, FSC_DTYPE_F32, right, 100 + k, &sreq[k]));
    }
    for (int k = 0; k < K; k++) {
        CHECK_RC(fsc_request_wait(&rreq[k]));
        CHECK_RC(fsc_request_wait(&sreq[k]));
        for (int i = 0; i < N; i++) assert_true(in[k][i] == (float)(left * 100000 + k * 1000 + i));
    }
    fsc_request *r = (fsc_request *)1;
    assert_int_equal(fsc_group_isend(g, out[0], N, FSC_DTYPE_F32, P, 1, &r), FSC_ERR_INVALID);
    assert_null(r);
    assert_int_equal(fsc_group_irecv(g, in[0], N, FSC_DTYPE_F32, left, 1, NULL), FSC_ERR_INVALID);
}

/* ---- several non-blocking requests in flight ------------------------------------------ */

static void test_many_in_flight(void **state) {
    (void)state;
    fsc_group *g = fsc_group_world();
    int P = fsc_group_size(g), me = fsc_group_rank(g);
    enum { K = 6 };
    int64_t n[K] = {100000, 3, 0, 70001, 5000, 1};
    float *buf[K];
    fsc_request *req[K];
    for (int k = 0; k < K; k++) {
        buf[k] = fill(FSC_DTYPE_F32, n[k], me, k);
        CHECK_RC(fsc_group_iallreduce(g, buf[k], n[k], FSC_DTYPE_F32, FSC_REDUCE_SUM, &req[k]));
        fsc_group_progress(g);
    }
    /* wait out of order: later requests must not block earlier ones */
    for (int k = K - 1; k >= 0; k--) {
        CHECK_RC(fsc_request_wait(&req[k]));
        assert_null(req[k]);
        for (int64_t i = 0; i < n[k]; i++)
            assert_true(buf[k][i] == expected(P, i, k, FSC_REDUCE_SUM, FSC_DTYPE_F32));
        free(buf[k]);
    }
}

/* ---- messages cut into pieces (as for > INT_MAX elements) --------------------------------- */

static void test_message_pieces(void **state) {
    (void)state;
    int64_t saved = fsc_dist_rt.max_msg;
    fsc_dist_rt.max_msg = 7;
    allreduce_on(fsc_group_world(), false);
    gather_scatter_on(fsc_group_world(), false, false);
    test_reduce_broadcast(state);
    test_alltoall_barrier_sendrecv(state);
    fsc_dist_rt.max_msg = saved;
}

/* ---- mesh ---------------------------------------------------------------------------- */

static void check_mesh(int dp, int pp, int tp) {
    fsc_mesh *m = NULL;
    CHECK_RC(fsc_mesh_new(dp, pp, tp, &m));
    int w = fsc_dist_rank();
    int sizes[3] = {dp, pp, tp};
    int d = fsc_mesh_coord(m, FSC_MESH_DP), p = fsc_mesh_coord(m, FSC_MESH_PP),
        t = fsc_mesh_coord(m, FSC_MESH_TP);
    assert_int_equal(w, (d * pp + p) * tp + t);
    for (int k = 0; k < 3; k++) {
        fsc_group *g = fsc_mesh_group(m, (fsc_mesh_dim)k);
        assert_non_null(g);
        assert_int_equal(fsc_mesh_size(m, (fsc_mesh_dim)k), sizes[k]);
        assert_int_equal(fsc_group_size(g), sizes[k]);
        assert_int_equal(fsc_group_rank(g), fsc_mesh_coord(m, (fsc_mesh_dim)k));
        for (int r = 0; r < sizes[k]; r++) {
            int c[3] = {d, p, t};
            c[k] = r;
            assert_int_equal(fsc_group_world_rank(g, r), (c[0] * pp + c[1]) * tp + c[2]);
        }
        /* the group works: sum of the members' world ranks */
        int64_t x = w, want = 0;
        for (int r = 0; r < sizes[k]; r++) want += fsc_group_world_rank(g, r);
        CHECK_RC(fsc_group_allreduce(g, &x, 1, FSC_DTYPE_I64, FSC_REDUCE_SUM));
        assert_int_equal(x, want);
    }
    /* tp groups are runs of adjacent world ranks */
    fsc_group *tpg = fsc_mesh_group(m, FSC_MESH_TP);
    for (int r = 1; r < tp; r++)
        assert_int_equal(fsc_group_world_rank(tpg, r), fsc_group_world_rank(tpg, r - 1) + 1);
    assert_string_equal(fsc_group_name(tpg), "tp");
    /* the replica: every (p, t) with this rank's d, ranked p * tp + t */
    fsc_group *rep = fsc_mesh_replica(m);
    assert_int_equal(fsc_group_size(rep), pp * tp);
    assert_int_equal(fsc_group_rank(rep), p * tp + t);
    for (int r = 0; r < pp * tp; r++)
        assert_int_equal(fsc_group_world_rank(rep, r), d * pp * tp + r);
    /* a subgroup along pp: the first and last stage (a tied parameter's
     * holders), ranked by stage; NULL on the stages between */
    const uint64_t ends = 1u | (uint64_t)1 << (pp - 1);
    fsc_group *sub = NULL;
    CHECK_RC(fsc_mesh_subgroup(m, FSC_MESH_PP, ends, "ends", &sub));
    if (p != 0 && p != pp - 1) {
        assert_null(sub);
    } else {
        assert_non_null(sub);
        assert_int_equal(fsc_group_size(sub), pp > 1 ? 2 : 1);
        assert_int_equal(fsc_group_rank(sub), p == 0 ? 0 : 1);
        assert_int_equal(fsc_group_world_rank(sub, 0), (d * pp + 0) * tp + t);
        fsc_group_free(sub);
    }
    assert_int_equal(fsc_mesh_subgroup(m, FSC_MESH_DIMS, ends, "bad", &sub), FSC_ERR_INVALID);
    assert_null(sub);
    fsc_mesh_free(m);
}

static void test_mesh(void **state) {
    (void)state;
    int W = fsc_dist_size();
    for (int dp = 1; dp <= W; dp++)
        for (int pp = 1; pp <= W; pp++)
            if (W % (dp * pp) == 0) check_mesh(dp, pp, W / (dp * pp));
    fsc_mesh *m = NULL;
    assert_int_equal(fsc_mesh_new(3, 1, 2, &m), FSC_ERR_INVALID);
    assert_null(m);
    char want[128];
    snprintf(want, sizeof want, "dp 3 x pp 1 x tp 2 = 6 does not match the world size %d", W);
    assert_non_null(strstr(fsc_last_error(), want));
    assert_int_equal(fsc_mesh_new(0, 1, W, &m), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "dp 0"));
}

/* A mesh over a group lays out the group's ranks as fsc_mesh_new lays out
 * the world's (dp 0: the rest of the group); ep is refused above 1. */
static void test_mesh_over_group(void **state) {
    (void)state;
    const int W = fsc_dist_size(), w = fsc_dist_rank();
    fsc_group *half = NULL; /* the world's even or odd ranks, in order */
    CHECK_RC(fsc_group_split(fsc_group_world(), w % 2, w, "half", &half));
    const int n = fsc_group_size(half), tp = n % 2 ? 1 : 2;
    fsc_mesh *m = NULL;
    CHECK_RC(fsc_mesh_new_over(half, (fsc_mesh_shape){.tp = tp}, &m));
    assert_ptr_equal(fsc_mesh_parent(m), half);
    assert_int_equal(fsc_mesh_size(m, FSC_MESH_DP), n / tp);
    assert_int_equal(fsc_mesh_size(m, FSC_MESH_PP), 1);
    const int d = fsc_mesh_coord(m, FSC_MESH_DP), t = fsc_mesh_coord(m, FSC_MESH_TP);
    assert_int_equal(fsc_group_rank(half), d * tp + t);
    fsc_group *tpg = fsc_mesh_group(m, FSC_MESH_TP);
    for (int r = 0; r < tp; r++) /* the group's ranks d * tp + r: world ranks 2 apart */
        assert_int_equal(fsc_group_world_rank(tpg, r), fsc_group_world_rank(half, d * tp + r));
    fsc_mesh_free(m);
    m = NULL;
    assert_int_equal(fsc_mesh_new_over(NULL, (fsc_mesh_shape){.dp = 1, .tp = W, .cp = 2}, &m),
                     FSC_ERR_INVALID);
    assert_null(m);
    assert_non_null(strstr(fsc_last_error(), "x cp 2 = "));
    assert_int_equal(fsc_mesh_new_over(NULL, (fsc_mesh_shape){.ep = 2}, &m), FSC_ERR_UNSUPPORTED);
    assert_non_null(strstr(fsc_last_error(), "(ep 2)"));
    assert_int_equal(fsc_mesh_new_over(half, (fsc_mesh_shape){.dp = n + 1}, &m), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "does not match the group's size"));
    fsc_group_free(half);
}

/* cp sits between pp and tp: rank = ((d * pp + p) * cp + c) * tp + t; the
 * cp group is a line of ranks tp apart, and dp x cp every rank with this
 * rank's pp and tp coordinates, ranked d * cp + c. */
static void test_mesh_cp(void **state) {
    (void)state;
    const int W = fsc_dist_size(), w = fsc_dist_rank();
    if (W % 2) skip();
    const int tp = W % 4 ? 1 : 2, cp = 2, dp = W / (tp * cp);
    fsc_mesh *m = NULL;
    CHECK_RC(fsc_mesh_new_over(NULL, (fsc_mesh_shape){.tp = tp, .cp = cp}, &m));
    assert_int_equal(fsc_mesh_size(m, FSC_MESH_CP), cp);
    assert_int_equal(fsc_mesh_size(m, FSC_MESH_DP), dp);
    const int d = fsc_mesh_coord(m, FSC_MESH_DP), c = fsc_mesh_coord(m, FSC_MESH_CP);
    const int t = fsc_mesh_coord(m, FSC_MESH_TP);
    assert_int_equal(w, (d * cp + c) * tp + t);
    fsc_group *cpg = fsc_mesh_group(m, FSC_MESH_CP), *dc = fsc_mesh_dp_cp(m);
    assert_int_equal(fsc_group_size(cpg), cp);
    assert_int_equal(fsc_group_rank(cpg), c);
    for (int r = 0; r < cp; r++)
        assert_int_equal(fsc_group_world_rank(cpg, r), (d * cp + r) * tp + t);
    assert_int_equal(fsc_group_size(dc), dp * cp);
    assert_int_equal(fsc_group_rank(dc), d * cp + c);
    for (int r = 0; r < dp * cp; r++) assert_int_equal(fsc_group_world_rank(dc, r), r * tp + t);
    assert_int_equal(fsc_group_size(fsc_mesh_replica(m)), tp);
    fsc_mesh_free(m);
    CHECK_RC(fsc_mesh_new(W, 1, 1, &m)); /* cp 1: dp x cp is the dp group itself */
    assert_ptr_equal(fsc_mesh_dp_cp(m), fsc_mesh_group(m, FSC_MESH_DP));
    fsc_mesh_free(m);
}

/* ---- desync guard ---------------------------------------------------------------------- */

static void expect_substr(const char *what) {
    if (!strstr(fsc_last_error(), what))
        fail_msg("rank %d: message lacks \"%s\": %s", fsc_dist_rank(), what, fsc_last_error());
}

static void test_desync_kind(void **state) {
    (void)state;
    if (fsc_dist_size() == 1) skip();
    fsc_group *g = NULL;
    CHECK_RC(fsc_group_split(fsc_group_world(), 0, fsc_dist_rank(), "victim", &g));
    float x[8] = {0};
    CHECK_RC(fsc_group_allreduce(g, x, 8, FSC_DTYPE_F32, FSC_REDUCE_SUM)); /* #0 agrees */
    int rc = fsc_dist_rank() == 0 ? fsc_group_allreduce(g, x, 8, FSC_DTYPE_F32, FSC_REDUCE_SUM)
                                  : fsc_group_broadcast(g, x, 8, FSC_DTYPE_F32, 0);
    assert_int_equal(rc, FSC_ERR_DESYNC);
    expect_substr("desync on group victim");
    expect_substr("collective #1");
    expect_substr("rank 0 #1 allreduce(F32, count 8, sum)");
    expect_substr("rank 1 #1 broadcast(F32, count 8, root 0)");
    /* the group is unusable afterwards, with a message saying why */
    assert_int_equal(fsc_group_barrier(g), FSC_ERR_DESYNC);
    expect_substr("unusable");
    fsc_group_free(g);
    CHECK_RC(fsc_group_barrier(fsc_group_world())); /* the world is unharmed */
}

static void test_desync_count(void **state) {
    (void)state;
    if (fsc_dist_size() == 1) skip();
    fsc_group *g = NULL;
    CHECK_RC(fsc_group_split(fsc_group_world(), 0, fsc_dist_rank(), "victim2", &g));
    int32_t x[16] = {0};
    int n = fsc_dist_rank() == fsc_dist_size() - 1 ? 16 : 8;
    assert_int_equal(fsc_group_allreduce(g, x, n, FSC_DTYPE_I32, FSC_REDUCE_MAX), FSC_ERR_DESYNC);
    expect_substr("collective #0");
    expect_substr("allreduce(I32, count 8, max)");
    expect_substr("allreduce(I32, count 16, max)");
    char last[32];
    snprintf(last, sizeof last, "rank %d #0", fsc_dist_size() - 1);
    expect_substr(last);
    fsc_group_free(g);
}

/* ---- statistics and bad arguments ------------------------------------------------------- */

static void test_stats_and_errors(void **state) {
    (void)state;
    fsc_group *g = NULL;
    CHECK_RC(fsc_group_split(fsc_group_world(), 0, 0, "stats", &g));
    int64_t seq0 = fsc_group_seq(g);
    float x[10] = {0};
    CHECK_RC(fsc_group_allreduce(g, x, 10, FSC_DTYPE_F32, FSC_REDUCE_SUM));
    CHECK_RC(fsc_group_allreduce(g, x, 10, FSC_DTYPE_F32, FSC_REDUCE_SUM));
    CHECK_RC(fsc_group_broadcast(g, x, 10, FSC_DTYPE_F32, 0));
    fsc_group_stats s = fsc_group_get_stats(g);
    assert_int_equal(s.count[FSC_COLL_ALLREDUCE], 2);
    assert_int_equal(s.count[FSC_COLL_BROADCAST], 1);
    assert_int_equal(s.bytes, 3 * 10 * 4);
    assert_true(s.wait_s >= 0);
    assert_int_equal(fsc_group_seq(g), seq0 + 3);
    fsc_group_reset_stats(g);
    assert_int_equal(fsc_group_get_stats(g).count[FSC_COLL_ALLREDUCE], 0);

    /* refused locally, before any communication: every rank refuses the same way */
    assert_int_equal(fsc_group_broadcast(g, x, 10, FSC_DTYPE_F32, 99), FSC_ERR_INVALID);
    expect_substr("root 99 is outside group stats");
    assert_int_equal(fsc_group_allreduce(g, x, 5, FSC_DTYPE_U16, FSC_REDUCE_SUM), FSC_ERR_DTYPE);
    expect_substr("U16");
    assert_int_equal(fsc_group_allreduce(g, x, -1, FSC_DTYPE_F32, FSC_REDUCE_SUM), FSC_ERR_INVALID);
    expect_substr("count -1");
    assert_int_equal(fsc_group_allreduce(NULL, x, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM),
                     FSC_ERR_INVALID);
    assert_int_equal(fsc_group_send(g, x, 1, FSC_DTYPE_F32, 0, -3), FSC_ERR_INVALID);
    expect_substr("tag -3");
    assert_int_equal(fsc_group_seq(g), seq0 + 3); /* refused calls take no sequence number */
    /* color < 0: this rank joins no group */
    fsc_group *none = (fsc_group *)1;
    CHECK_RC(fsc_group_split(g, -1, 0, "none", &none));
    assert_null(none);
    fsc_group_free(g);
    assert_int_equal(fsc_dist_local_size() >= 1, 1);
    assert_true(fsc_dist_local_rank() >= 0 && fsc_dist_local_rank() < fsc_dist_local_size());
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_reduce_broadcast),
        cmocka_unit_test(test_allgather_reduce_scatter),
        cmocka_unit_test(test_alltoall_barrier_sendrecv),
        cmocka_unit_test(test_isend_irecv),
        cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_message_pieces),
        cmocka_unit_test(test_mesh),
        cmocka_unit_test(test_mesh_over_group),
        cmocka_unit_test(test_mesh_cp),
        cmocka_unit_test(test_desync_kind),
        cmocka_unit_test(test_desync_count),
        cmocka_unit_test(test_stats_and_errors),
    };
    return ct_run_tests(&argc, &argv, tests);
}
