/* AdaScale's estimator (fsc/adascale.h) on constructed samples, where the
 * gain has a closed form: identical samples give 1, orthogonal samples of a
 * zero mean give S, Gaussian samples of known mean and variance give
 * (sigma^2 + mu^2) / (sigma^2 / S + mu^2) once averaged; FairScale's
 * averages (debiased EWMA, the paper's mean-then-EWMA, the rescale on a new
 * scale) are recomputed here by hand. With --replay it is the C side of
 * tests/reference/adascale_ref.py, FairScale's AdaScale re-derived in
 * PyTorch, on the same gradients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/adascale.h"

/* |a - b| <= tol (older cmocka has no assert_double_equal) */
#define assert_close(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

/* sum of ||g_i||^2 and ||mean||^2 of n samples of dimension D */
static void figures(const double *g, int n, int D, double *sum_sq, double *mean_sq) {
    *sum_sq = 0, *mean_sq = 0;
    for (int d = 0; d < D; d++) {
        double m = 0;
        for (int i = 0; i < n; i++) *sum_sq += g[i * D + d] * g[i * D + d], m += g[i * D + d];
        m /= n;
        *mean_sq += m * m;
    }
}

static void test_identical_samples_gain_one(void **state) {
    (void)state;
    for (int n = 2; n <= 8; n *= 2) {
        fsc_adascale a;
        assert_int_equal(fsc_adascale_init(&a, &(fsc_adascale_config){.scale = n}), FSC_OK);
        for (int s = 0; s < 5; s++) assert_int_equal(fsc_adascale_update(&a, n * 2.0, n, 2.0), 0);
        /* variance 0 (then clamped to 1e-6), mu^2 = 2: r = (2 + 1e-6) / (2 + 1e-6 / S) */
        assert_true(fabs(fsc_adascale_gain(&a) - (2 + 1e-6) / (2 + 1e-6 / n)) < 1e-12);
        assert_true(fsc_adascale_gain(&a) - 1 < 1e-6);
    }
}

static void test_orthogonal_noise_gain_s(void **state) {
    (void)state;
    enum { n = 4 };
    double g[n * n] = {0};
    for (int i = 0; i < n; i++) g[i * n + i] = 1; /* unit vectors: sum 4, mean^2 1/4 */
    double sum, mean;
    figures(g, n, n, &sum, &mean);
    fsc_adascale a;
    assert_int_equal(fsc_adascale_init(&a, &(fsc_adascale_config){0}), FSC_OK);
    assert_close(fsc_adascale_gain(&a), 1.0, 0); /* before any scale or update */
    assert_int_equal(fsc_adascale_set_scale(&a, n), FSC_OK);
    assert_int_equal(fsc_adascale_update(&a, sum, n, mean), FSC_OK);
    assert_close(a.smoothing, 1 - n / 1000.0, 1e-15); /* FairScale's default, from the samples */
    /* sigma^2 = (4 - 4 / 4) / 3 = 1, mu^2 = 1/4 - 1/4 = 0: r = 1 / (1/4) */
    assert_close(fsc_adascale_gain(&a), 4.0, 1e-12);
}

/* Box-Muller on a fixed LCG: reproducible Gaussians. */
static double gauss(uint64_t *st) {
    *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
    double u = ((*st >> 11) + 0.5) / 9007199254740992.0;
    *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
    double v = ((*st >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* g_i = mu + sigma z: the averaged estimate gives the closed-form gain
 * within 3% (the spread of 400 steps' estimates, smoothing 0.99). */
static void test_known_variance_closed_form(void **state) {
    (void)state;
    enum { n = 8, D = 64, STEPS = 400 };
    const double mu = 0.05, sigma = 0.2; /* mu^2 = D mu^2 = 0.16, sigma^2 = D sigma^2 = 2.56 */
    const double sqr = D * mu * mu, var = D * sigma * sigma;
    const double expect = (var + sqr) / (var / n + sqr);
    uint64_t rng = 42;
    static double g[n * D];
    fsc_adascale a;
    assert_int_equal(fsc_adascale_init(&a, &(fsc_adascale_config){.scale = n, .smoothing = 0.99}),
                     0);
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < n * D; i++) g[i] = mu + sigma * gauss(&rng);
        double sum, mean;
        figures(g, n, D, &sum, &mean);
        assert_int_equal(fsc_adascale_update(&a, sum, n, mean), FSC_OK);
    }
    double r = fsc_adascale_gain(&a);
    print_message("known variance: gain %.4f, closed form %.4f (S = %d)\n", r, expect, n);
    assert_true(fabs(r - expect) < 0.03 * expect);
    assert_true(r >= 1 && r <= n);
}

/* FairScale's two averages and its set_scale, by hand. */
static void test_averages_by_hand(void **state) {
    (void)state;
    const double sums[3] = {10, 7, 12}, means[3] = {1.5, 0.4, 2};
    const int n = 4;
    const double S = 6, f = 0.5; /* a scale other than the sample count */
    for (int paper = 0; paper < 2; paper++) {
        fsc_adascale a;
        assert_int_equal(
            fsc_adascale_init(
                &a, &(fsc_adascale_config){.scale = S, .smoothing = f, .paper_average = paper}),
            0);
        double bs = 0, bv = 0, w = 0, sq = 1, vr = 0, ts = 0, tv = 0;
        for (int s = 0; s < 3; s++) {
            assert_int_equal(fsc_adascale_update(&a, sums[s], n, means[s]), FSC_OK);
            double v = sums[s] * (S / n) / (n - 1) - means[s] * S / (n - 1);
            double q = means[s] - v / S;
            v = v < 1e-6 ? 1e-6 : v, q = q < 0 ? 0 : q;
            if (!paper) {
                bs = f * bs + (1 - f) * q, bv = f * bv + (1 - f) * v, w = f * w + (1 - f);
                sq = bs / w, vr = bv / w;
            } else if (s + 1 < 1 / (1 - f)) {
                ts += q, tv += v, sq = ts / (s + 1), vr = tv / (s + 1);
            } else {
                sq = f * sq + (1 - f) * q, vr = f * vr + (1 - f) * v;
            }
            assert_close(a.sqr_avg, sq, 1e-12);
            assert_close(a.var_avg, vr, 1e-12);
            assert_close(fsc_adascale_gain(&a), (vr + sq) / (vr / S + sq), 1e-12);
        }
        /* a new scale rescales the variance by old / new */
        assert_int_equal(fsc_adascale_set_scale(&a, 3), FSC_OK);
        assert_close(a.var_avg, vr * S / 3, 1e-12);
    }
}

static void test_scale_one_and_refusals(void **state) {
    (void)state;
    fsc_adascale a;
    assert_int_equal(fsc_adascale_init(&a, &(fsc_adascale_config){.scale = 1}), FSC_OK);
    assert_int_equal(fsc_adascale_update(&a, 5, 2, 0.1), FSC_OK);
    assert_true(fsc_adascale_gain(&a) == 1.0); /* exactly the wrapped optimizer */
    assert_int_equal(fsc_adascale_init(&a, &(fsc_adascale_config){.scale = 0.5}), FSC_ERR_INVALID);
    assert_int_equal(fsc_adascale_init(&a, &(fsc_adascale_config){.smoothing = 1}),
                     FSC_ERR_INVALID);
    assert_int_equal(fsc_adascale_init(&a, &(fsc_adascale_config){0}), FSC_OK);
    assert_int_equal(fsc_adascale_update(&a, 1, 2, 1), FSC_ERR_INVALID); /* no scale yet */
    assert_int_equal(fsc_adascale_set_scale(&a, 2), FSC_OK);
    assert_int_equal(fsc_adascale_update(&a, 1, 1, 1), FSC_ERR_INVALID); /* one sample */
    assert_int_equal(fsc_adascale_update(&a, NAN, 2, 1), FSC_ERR_INVALID);
    assert_int_equal(fsc_adascale_update(&a, 1, 2, -1), FSC_ERR_INVALID);
    assert_int_equal(a.updates, 0);
}

/* --replay GRADS SCALE SMOOTHING PAPER SWITCH NEW_SCALE: the cross-check
 * with tests/reference/adascale_ref.py. GRADS holds int32 T, N, D, then T
 * steps of N gradient samples of D float32s; each step's sum of squared
 * norms and squared norm of the mean go to the estimator, whose gain after
 * the step is printed (%.17g, a line a step). Before step SWITCH (0: never)
 * the scale becomes NEW_SCALE. SCALE 0 is the sample count N. */
static int replay(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s --replay GRADS SCALE SMOOTHING PAPER SWITCH NEW_SCALE\n",
                argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    int32_t hdr[3];
    if (!f || fread(hdr, sizeof hdr, 1, f) != 1 || hdr[0] < 1 || hdr[1] < 2 || hdr[2] < 1) {
        fprintf(stderr, "replay: %s: cannot read a header of T >= 1, N >= 2, D >= 1\n", argv[2]);
        if (f) fclose(f);
        return 1;
    }
    const int T = hdr[0], N = hdr[1], D = hdr[2], sw = atoi(argv[6]);
    fsc_adascale a;
    fsc_adascale_config cfg = {
        .scale = atof(argv[3]), .smoothing = atof(argv[4]), .paper_average = atoi(argv[5])};
    float *g = malloc(sizeof(float) * (size_t)N * D);
    double *gd = malloc(sizeof(double) * (size_t)N * D);
    int rc = !g || !gd || fsc_adascale_init(&a, &cfg) ||
             (cfg.scale == 0 && fsc_adascale_set_scale(&a, N));
    for (int t = 0; t < T && !rc; t++) {
        if (fread(g, sizeof(float), (size_t)N * D, f) != (size_t)N * D) {
            fprintf(stderr, "replay: %s: truncated at step %d\n", argv[2], t);
            rc = 1;
            break;
        }
        for (int i = 0; i < N * D; i++) gd[i] = g[i];
        double sum_sq, mean_sq;
        figures(gd, N, D, &sum_sq, &mean_sq);
        if (t + 1 == sw) rc = fsc_adascale_set_scale(&a, atof(argv[7]));
        if (!rc) rc = fsc_adascale_update(&a, sum_sq, N, mean_sq);
        if (!rc) printf("%.17g\n", fsc_adascale_gain(&a));
    }
    if (rc) fprintf(stderr, "replay: %s\n", fsc_last_error());
    free(g), free(gd);
    fclose(f);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--replay")) return replay(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_samples_gain_one),
        cmocka_unit_test(test_orthogonal_noise_gain_s),
        cmocka_unit_test(test_known_variance_closed_form),
        cmocka_unit_test(test_averages_by_hand),
        cmocka_unit_test(test_scale_one_and_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
