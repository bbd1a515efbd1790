/* Half precision in the distributed runtime: the inlined conversions
 * against core's, sums of inexact BF16/F16 values checked against the same
 * arithmetic done here (F32 adds, one rounding per hop, in ring order) and
 * against the exact sum within the stated bound, and their bytes on the wire
 * against F32's. Runs under mpiexec with 1, 2 and 4 ranks, on the world and
 * on even / odd halves. */
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
#include "comm/dist_internal.h" /* fsc_dist_rt: bytes sent, the ring threshold */

/* ---- half precision: conversions, per-hop rounding, bytes on the wire ------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The runtime's inlined conversions agree bit for bit with core's: every half
 * value widened; narrowed, every widened value, its F32 neighbours one ulp
 * either side, and the point halfway up to the next half value (where
 * rounding to nearest even decides). */
static void test_half_conversions(void **state) {
    (void)state;
    fsc_dtype dts[2] = {FSC_DTYPE_BF16, FSC_DTYPE_F16};
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h), *back = malloc(4 * N * sizeof *back);
    float *wide = malloc(N * sizeof *wide), *f = malloc(4 * N * sizeof *f);
    for (int d = 0; d < 2; d++) {
        fsc_dtype dt = dts[d];
        uint32_t half_ulp = dt == FSC_DTYPE_BF16 ? 0x8000u : 0x1000u; /* for normal values */
        for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
        fsc_dist_to_f32(wide, h, N, dt);
        for (int i = 0; i < N; i++) {
            float want = dt == FSC_DTYPE_BF16 ? fsc_bf16_to_f32(h[i]) : fsc_f16_to_f32(h[i]);
            if (f32_bits(wide[i]) != f32_bits(want))
                fail_msg("%s %04x widens to %08x, core says %08x", fsc_dtype_name(dt), i,
                         f32_bits(wide[i]), f32_bits(want));
            uint32_t u = f32_bits(wide[i]), w[4] = {u, u + 1, u - 1, u + half_ulp};
            memcpy(&f[4 * i], w, sizeof w);
        }
        fsc_dist_from_f32(back, f, 4 * N, dt);
        for (int i = 0; i < 4 * N; i++) {
            uint16_t want = dt == FSC_DTYPE_BF16 ? fsc_f32_to_bf16(f[i]) : fsc_f32_to_f16(f[i]);
            if (back[i] != want)
                fail_msg("F32 %08x narrows to %s %04x, core says %04x", f32_bits(f[i]),
                         fsc_dtype_name(dt), back[i], want);
        }
    }
    free(h);
    free(back);
    free(wide);
    free(f);
}

/* An inexact input: rank r's element i of input `salt`, already a half value
 * (so the reference starts from exactly what the rank sends). Magnitudes
 * span 2^-3 .. 2^4, signs mixed, so sums round at every hop. */
static float half_input(fsc_dtype dt, int r, int64_t i, int salt) {
    int64_t k = (r * 7919 + i * 104729 + salt * 31) % 2003;
    float v = (float)(k - 1001) / 61.f * (float)(1 + (i + r) % 7) / 4.f;
    return dt == FSC_DTYPE_BF16 ? fsc_bf16_to_f32(fsc_f32_to_bf16(v))
                                : fsc_f16_to_f32(fsc_f32_to_f16(v));
}

static float round_half(fsc_dtype dt, float v) {
    return dt == FSC_DTYPE_BF16 ? fsc_bf16_to_f32(fsc_f32_to_bf16(v))
                                : fsc_f16_to_f32(fsc_f32_to_f16(v));
}

/* The reference "computed the same way": the ring reduces chunk c starting
 * from rank c+1's input, each next rank adding its own in F32 and rounding
 * once to the half type, rank c last. */
static float ring_sum(fsc_dtype dt, int P, int c, int64_t i, int salt) {
    float acc = half_input(dt, (c + 1) % P, i, salt);
    for (int k = 2; k <= P; k++) acc = round_half(dt, acc + half_input(dt, (c + k) % P, i, salt));
    return acc;
}

/* The bound any order of per-hop rounding meets: |got - exact| <=
 * (P-1) * u * sum |x|, u the unit roundoff (2^-8 BF16, 2^-11 F16). */
static void check_bound(fsc_dtype dt, int P, int64_t i, int salt, float got, const char *what) {
    double exact = 0, mag = 0;
    for (int r = 0; r < P; r++) {
        exact += half_input(dt, r, i, salt);
        mag += fabs(half_input(dt, r, i, salt));
    }
    double u = dt == FSC_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048;
    if (fabs(got - exact) > (P - 1) * u * mag)
        fail_msg("%s %s [%lld]: %.8g is %.3g from the exact sum %.8g (bound %.3g)", what,
                 fsc_dtype_name(dt), (long long)i, got, fabs(got - exact), exact,
                 (P - 1) * u * mag);
}

static void half_sums_on(fsc_group *g) {
    int P = fsc_group_size(g), me = fsc_group_rank(g);
    fsc_dtype dts[2] = {FSC_DTYPE_BF16, FSC_DTYPE_F16};
    const int64_t ns[2] = {13, 70001};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 2; k++) {
            fsc_dtype dt = dts[d];
            int64_t n = ns[k];
            /* allreduce: chunks as the backend splits them (the first n % P one longer) */
            uint16_t *buf = malloc((size_t)n * 2), *all = malloc((size_t)(n * P) * 2);
            for (int64_t i = 0; i < n; i++) put(buf, dt, i, half_input(dt, me, i, 1));
            CHECK_RC(fsc_group_allreduce(g, buf, n, dt, FSC_REDUCE_SUM));
            int64_t lo = 0;
            for (int c = 0; c < P; c++) {
                int64_t hi = lo + n / P + (c < n % P);
                for (int64_t i = lo; i < hi; i++) {
                    float got = (float)get(buf, dt, i), want = ring_sum(dt, P, c, i, 1);
                    if (f32_bits(got) != f32_bits(want))
                        fail_msg("allreduce %s n %lld on %s: [%lld] = %.8g, per-hop reference "
                                 "%.8g",
                                 fsc_dtype_name(dt), (long long)n, fsc_group_name(g), (long long)i,
                                 got, want);
                    check_bound(dt, P, i, 1, got, "allreduce");
                }
                lo = hi;
            }
            /* bit-identical on every rank */
            CHECK_RC(fsc_group_allgather(g, buf, all, n, FSC_DTYPE_U16));
            for (int r = 0; r < P; r++) assert_memory_equal(all + r * n, buf, (size_t)n * 2);
            free(all);
            /* reduce to the last rank: the ring of one chunk, the root's */
            int root = P - 1;
            for (int64_t i = 0; i < n; i++) put(buf, dt, i, half_input(dt, me, i, 2));
            CHECK_RC(fsc_group_reduce(g, buf, n, dt, FSC_REDUCE_SUM, root));
            if (me == root)
                for (int64_t i = 0; i < n; i++) {
                    float got = (float)get(buf, dt, i), want = ring_sum(dt, P, root, i, 2);
                    if (f32_bits(got) != f32_bits(want))
                        fail_msg("reduce %s n %lld: [%lld] = %.8g, per-hop reference %.8g",
                                 fsc_dtype_name(dt), (long long)n, (long long)i, got, want);
                    check_bound(dt, P, i, 2, got, "reduce");
                }
            free(buf);
            /* reduce-scatter: n elements per rank; this rank's chunk is chunk `me` */
            uint16_t *full = malloc((size_t)(n * P) * 2), *mine = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n * P; i++) put(full, dt, i, half_input(dt, me, i, 3));
            fsc_request *req = NULL;
            CHECK_RC(fsc_group_ireduce_scatter(g, full, mine, n, dt, FSC_REDUCE_SUM, &req));
            CHECK_RC(fsc_request_wait(&req));
            for (int64_t i = 0; i < n; i++) {
                float got = (float)get(mine, dt, i), want = ring_sum(dt, P, me, me * n + i, 3);
                if (f32_bits(got) != f32_bits(want))
                    fail_msg("reduce_scatter %s n %lld: [%lld] = %.8g, per-hop reference %.8g",
                             fsc_dtype_name(dt), (long long)n, (long long)i, got, want);
                check_bound(dt, P, me * n + i, 3, got, "reduce_scatter");
            }
            free(full);
            free(mine);
        }
}

/* BF16/F16 sums: exactly the per-hop arithmetic (tolerance 0 against the
 * reference above, which is deterministic), within the order-free bound of
 * the exact sum, and bit-identical on every rank after an allreduce. */
static void test_half_sums(void **state) {
    (void)state;
    half_sums_on(fsc_group_world());
    half_sums_on(halves);
}

/* Halves travel as halves: the payload a BF16/F16 reduction hands to the
 * wire (the group's statistics) is half that of F32 with the same element
 * count, and so are the bytes the rings really send (70001 elements: the
 * ring for every dtype; at 1 rank nothing is sent). */
static void test_half_bytes_on_wire(void **state) {
    (void)state;
    fsc_group *g = fsc_group_world();
    int P = fsc_group_size(g);
    const int64_t ns[2] = {13, 70001};
    const fsc_dtype dts[3] = {FSC_DTYPE_F32, FSC_DTYPE_BF16, FSC_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        int64_t n = ns[k];
        float *in = calloc((size_t)(n * P), 4), *out = calloc((size_t)n, 4);
        int64_t ar[3], rs[3], rd[3], sent[3][3];
        for (int d = 0; d < 3; d++) {
            int64_t s0 = fsc_dist_rt.sent_bytes;
            fsc_group_reset_stats(g);
            CHECK_RC(fsc_group_allreduce(g, in, n, dts[d], FSC_REDUCE_SUM));
            ar[d] = fsc_group_get_stats(g).bytes;
            sent[0][d] = fsc_dist_rt.sent_bytes - s0;
            s0 = fsc_dist_rt.sent_bytes;
            fsc_group_reset_stats(g);
            CHECK_RC(fsc_group_reduce_scatter(g, in, out, n, dts[d], FSC_REDUCE_AVG));
            rs[d] = fsc_group_get_stats(g).bytes;
            sent[1][d] = fsc_dist_rt.sent_bytes - s0;
            s0 = fsc_dist_rt.sent_bytes;
            fsc_group_reset_stats(g);
            fsc_request *req = NULL;
            CHECK_RC(fsc_group_ireduce(g, in, n, dts[d], FSC_REDUCE_SUM, 0, &req));
            CHECK_RC(fsc_request_wait(&req));
            rd[d] = fsc_group_get_stats(g).bytes;
            sent[2][d] = fsc_dist_rt.sent_bytes - s0;
        }
        assert_int_equal(ar[0], n * 4);
        assert_int_equal(rs[0], P * n * 4);
        assert_int_equal(rd[0], n * 4);
        for (int d = 1; d < 3; d++) {
            assert_int_equal(2 * ar[d], ar[0]);
            assert_int_equal(2 * rs[d], rs[0]);
            assert_int_equal(2 * rd[d], rd[0]);
        }
        if (n * 4 >= fsc_dist_rt.ring_min_bytes) /* F32 takes the ring too */
            for (int c = 0; c < 3; c++) {
                if (P > 1 && (c < 2 || fsc_group_rank(g) != 0)) /* reduce's root only receives */
                    assert_true(sent[c][0] > 0);
                for (int d = 1; d < 3; d++)
                    if (2 * sent[c][d] != sent[c][0])
                        fail_msg("collective %d: %s sent %lld bytes, F32 %lld", c,
                                 fsc_dtype_name(dts[d]), (long long)sent[c][d],
                                 (long long)sent[c][0]);
            }
        free(in);
        free(out);
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_half_sums),
        cmocka_unit_test(test_half_bytes_on_wire),
    };
    return ct_run_tests(&argc, &argv, tests);
}
