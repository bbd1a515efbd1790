/* The grad scaler: unscaled values bit-equal to torch's g * float(1/scale),
 * inf and NaN found wherever they sit (vector body, tail, OpenMP chunks, any
 * range), the scale's trajectory as torch's _amp_update_scale_ computes it by
 * hand, refusals that name the field, checkpoint state round trips, and the
 * header's usage example on a tiny GPT: the gradients of a scaled loss,
 * unscaled, are exactly the unscaled gradients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/gpt.h"
#include "fsc/grad_scaler.h"
#include "fsc/io.h"
#include "test_main.h"

/* Deterministic values of both signs spread over many binades. */
static void fill(float *g, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed * 40503u;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        float mant = 1.0f + (float)(h & 0xffff) / 65536.0f;
        int ex = (int)((h >> 16) % 40) - 20;
        g[i] = ldexpf((h >> 31) ? -mant : mant, ex) * 65536.0f;
    }
}

static fsc_grad_scaler *scaler_at(double scale) {
    fsc_grad_scaler *s = fsc_grad_scaler_new(&(fsc_grad_scaler_config){.init_scale = scale});
    assert_non_null(s);
    return s;
}

/* ---- unscale -------------------------------------------------------------- */

static void test_unscale_exact(void **state) {
    (void)state;
    /* lengths around the vector widths, and one past the OpenMP threshold */
    const int64_t lens[] = {1, 7, 15, 16, 17, 33, 1000, 100003};
    const double scales[] = {65536.0, 3.0, 1.0, 0.25, 1e-3, 12345.678, 3e30};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li];
        float *g = malloc(sizeof(float) * (size_t)n), *want = malloc(sizeof(float) * (size_t)n);
        for (size_t si = 0; si < sizeof scales / sizeof *scales; si++) {
            fsc_grad_scaler *s = scaler_at(scales[si]);
            const double scale = fsc_grad_scaler_get_scale(s);
            assert_true(scale == (double)(float)scales[si]); /* a float32 scale, as torch's */
            fill(g, n, (uint32_t)(li * 31 + si));
            const float inv = (float)(1.0 / scale); /* torch: scale.double().reciprocal().float() */
            for (int64_t i = 0; i < n; i++) want[i] = g[i] * inv;
            fsc_optim_range r = {.grad = g, .n = n};
            bool inf = true;
            assert_int_equal(fsc_grad_scaler_unscale(s, &r, 1, &inf), FSC_OK);
            assert_false(inf);
            assert_memory_equal(g, want, sizeof(float) * (size_t)n);
            assert_true(fsc_grad_scaler_get_scale(s) == scale); /* unscale leaves it */
            fsc_grad_scaler_free(s);
        }
        free(g);
        free(want);
    }
}

/* One non-finite value at every interesting position of ranges of many
 * lengths is found, and every other element is still unscaled. */
static void test_inf_nan_found(void **state) {
    (void)state;
    const int64_t lens[] = {1, 5, 15, 16, 17, 31, 33, 1000, 40000, 100003};
    const float bad[] = {INFINITY, -INFINITY, NAN};
    fsc_grad_scaler *s = scaler_at(1024.0);
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li];
        float *g = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
        /* first, last (the scalar tail when n is not a multiple of the vector
         * width), middle, and the start of the last vector */
        const int64_t where[] = {0, n - 1, n / 2, n - 1 - (n - 1) % 16};
        for (size_t w = 0; w < sizeof where / sizeof *where; w++)
            for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
                fill(ref, n, (uint32_t)n);
                ref[where[w]] = bad[b];
                memcpy(g, ref, sizeof(float) * (size_t)n);
                fsc_optim_range r = {.grad = g, .n = n};
                bool inf = false;
                assert_int_equal(fsc_grad_scaler_unscale(s, &r, 1, &inf), FSC_OK);
                if (!inf)
                    fprintf(stderr, "missed %g at %lld of %lld\n", (double)bad[b],
                            (long long)where[w], (long long)n);
                assert_true(inf);
                for (int64_t i = 0; i < n; i++)
                    if (i != where[w]) assert_true(g[i] == ref[i] * (1.0f / 1024.0f));
                assert_true(isnan(bad[b]) ? isnan(g[where[w]]) : g[where[w]] == bad[b]);
            }
        free(g);
        free(ref);
    }
    fsc_grad_scaler_free(s);
}

/* Several ranges, empty ones among them: an inf in any one is found, and a
 * clean call afterwards overwrites the flag with false. */
static void test_inf_in_any_range(void **state) {
    (void)state;
    enum { N = 300 };
    float a[N], b[37], c[N];
    fsc_grad_scaler *s = scaler_at(8.0);
    for (int k = 0; k < 3; k++) {
        fill(a, N, 1), fill(b, 37, 2), fill(c, N, 3);
        float *target = k == 0 ? a : k == 1 ? b : c;
        target[k == 1 ? 36 : N - 3] = NAN;
        fsc_optim_range r[4] = {{.grad = a, .n = N, .name = "a"},
                                {.grad = NULL, .n = 0, .name = "empty"},
                                {.grad = b, .n = 37, .name = "b"},
                                {.grad = c, .n = N, .name = "c"}};
        bool inf = false;
        assert_int_equal(fsc_grad_scaler_unscale(s, r, 4, &inf), FSC_OK);
        assert_true(inf);
        fill(a, N, 1), fill(b, 37, 2), fill(c, N, 3);
        assert_int_equal(fsc_grad_scaler_unscale(s, r, 4, &inf), FSC_OK);
        assert_false(inf);
    }
    bool inf = true;
    assert_int_equal(fsc_grad_scaler_unscale(s, NULL, 0, &inf), FSC_OK); /* owns nothing */
    assert_false(inf);
    fsc_grad_scaler_free(s);
}

/* With a scale below 1 unscaling multiplies: a finite gradient that overflows
 * then is reported (the check is on the unscaled values). */
static void test_overflow_when_unscaling(void **state) {
    (void)state;
    fsc_grad_scaler *s = scaler_at(0.5);
    float g[3] = {1.0f, FLT_MAX, -2.0f};
    fsc_optim_range r = {.grad = g, .n = 3};
    bool inf = false;
    assert_int_equal(fsc_grad_scaler_unscale(s, &r, 1, &inf), FSC_OK);
    assert_true(inf);
    assert_true(g[0] == 2.0f && isinf(g[1]) && g[2] == -4.0f);
    fsc_grad_scaler_free(s);
}

/* fp16 is what loss scaling is for: gradients ~1 scaled by 65536 no longer
 * fit fp16 (max 65504), round to inf there, and the scaler sees it. */
static void test_fp16_overflow_found(void **state) {
    (void)state;
    enum { N = 19 };
    float g[N];
    fsc_grad_scaler *s = fsc_grad_scaler_new(NULL);
    for (int i = 0; i < N; i++) {
        float v = (float)(0.25 + 0.05 * i) * (float)fsc_grad_scaler_get_scale(s);
        g[i] = fsc_f16_to_f32(fsc_f32_to_f16(v)); /* a gradient that travelled as fp16 */
    }
    assert_true(isinf(g[N - 1])); /* 1.15 * 65536 */
    assert_false(isinf(g[0]));    /* 0.25 * 65536 = 16384 fits */
    fsc_optim_range r = {.grad = g, .n = N};
    bool inf = false;
    assert_int_equal(fsc_grad_scaler_unscale(s, &r, 1, &inf), FSC_OK);
    assert_true(inf);
    assert_true(g[0] == 0.25f);
    assert_int_equal(fsc_grad_scaler_update(s, inf), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(s) == 32768.0);
    fsc_grad_scaler_free(s);
}

/* ---- update ----------------------------------------------------------------- */

/* A trajectory worked out by hand from torch's _amp_update_scale_ with
 * init_scale 1024, growth_factor 2, backoff_factor 0.5, growth_interval 3. */
static void test_update_trajectory(void **state) {
    (void)state;
    static const struct {
        bool inf;
        double scale;
        int64_t tracker, skipped;
    } steps[] = {
        {false, 1024, 1, 0}, {false, 1024, 2, 0}, {false, 2048, 0, 0}, /* 3 good: grow */
        {false, 2048, 1, 0}, {false, 2048, 2, 0}, {true, 1024, 0, 1},  /* inf: halve, reset */
        {false, 1024, 1, 1}, {true, 512, 0, 2},   {true, 256, 0, 3},   /* two infs in a row */
        {false, 256, 1, 3},  {false, 256, 2, 3},  {false, 512, 0, 3},  /* grows again */
        {false, 512, 1, 3},  {false, 512, 2, 3},  {false, 1024, 0, 3},
    };
    fsc_grad_scaler *s = fsc_grad_scaler_new(&(fsc_grad_scaler_config){
        .init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
    assert_non_null(s);
    assert_true(fsc_grad_scaler_get_scale(s) == 1024.0);
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        assert_int_equal(fsc_grad_scaler_update(s, steps[i].inf), FSC_OK);
        fsc_grad_scaler_state st = fsc_grad_scaler_get_state(s);
        if (st.scale != steps[i].scale || st.growth_tracker != steps[i].tracker)
            fprintf(stderr, "step %zu: scale %g tracker %lld, expected %g %lld\n", i, st.scale,
                    (long long)st.growth_tracker, steps[i].scale, (long long)steps[i].tracker);
        assert_true(st.scale == steps[i].scale);
        assert_int_equal(st.growth_tracker, steps[i].tracker);
        assert_int_equal(st.skipped_steps, steps[i].skipped);
    }
    fsc_grad_scaler_free(s);
}

static void test_defaults_and_float_scale(void **state) {
    (void)state;
    fsc_grad_scaler *s = fsc_grad_scaler_new(NULL);
    assert_non_null(s);
    fsc_grad_scaler_config c = fsc_grad_scaler_get_config(s);
    assert_true(c.init_scale == 65536.0 && c.growth_factor == 2.0 && c.backoff_factor == 0.5);
    assert_int_equal(c.growth_interval, 2000);
    for (int i = 0; i < 1999; i++) assert_int_equal(fsc_grad_scaler_update(s, false), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(s) == 65536.0);
    assert_int_equal(fsc_grad_scaler_update(s, false), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(s) == 131072.0);
    fsc_grad_scaler_free(s);

    /* factors that are not powers of two: the scale is rounded to float after
     * every change, as torch stores it (1000 * 1.1 = 1100.0000000000002 in
     * double, 1100 in float; * 0.3 = 330.00000000000006, 330 in float) */
    s = fsc_grad_scaler_new(&(fsc_grad_scaler_config){
        .init_scale = 1000, .growth_factor = 1.1, .backoff_factor = 0.3, .growth_interval = 1});
    assert_int_equal(fsc_grad_scaler_update(s, false), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(s) == 1100.0);
    assert_int_equal(fsc_grad_scaler_update(s, true), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(s) == 330.0);
    assert_int_equal(fsc_grad_scaler_update(s, false), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(s) == (double)(float)(330.0 * 1.1));
    fsc_grad_scaler_free(s);

    /* never grown past the largest float: torch keeps the old scale, the
     * tracker still resets */
    s = fsc_grad_scaler_new(&(fsc_grad_scaler_config){.init_scale = 0x1p127, .growth_interval = 1});
    assert_non_null(s);
    assert_int_equal(fsc_grad_scaler_update(s, false), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(s) == 0x1p127);
    assert_int_equal(fsc_grad_scaler_get_state(s).growth_tracker, 0);
    fsc_grad_scaler_free(s);
}

/* ---- refusals ----------------------------------------------------------------- */

static void expect_refused(fsc_grad_scaler_config c, const char *needle) {
    fsc_clear_error();
    fsc_grad_scaler *s = fsc_grad_scaler_new(&c);
    if (s || !strstr(fsc_last_error(), needle))
        fprintf(stderr, "expected refusal naming '%s', got '%s'\n", needle, fsc_last_error());
    assert_null(s);
    assert_non_null(strstr(fsc_last_error(), needle));
}

static void test_bad_configs_refused(void **state) {
    (void)state;
    expect_refused((fsc_grad_scaler_config){.growth_factor = 1.0}, "growth_factor");
    expect_refused((fsc_grad_scaler_config){.growth_factor = 0.5}, "growth_factor");
    expect_refused((fsc_grad_scaler_config){.growth_factor = INFINITY}, "growth_factor");
    expect_refused((fsc_grad_scaler_config){.growth_factor = NAN}, "growth_factor");
    expect_refused((fsc_grad_scaler_config){.backoff_factor = 1.0}, "backoff_factor");
    expect_refused((fsc_grad_scaler_config){.backoff_factor = 1.5}, "backoff_factor");
    expect_refused((fsc_grad_scaler_config){.backoff_factor = -0.5}, "backoff_factor");
    expect_refused((fsc_grad_scaler_config){.backoff_factor = NAN}, "backoff_factor");
    expect_refused((fsc_grad_scaler_config){.growth_interval = -1}, "growth_interval");
    expect_refused((fsc_grad_scaler_config){.init_scale = -1}, "init_scale");
    expect_refused((fsc_grad_scaler_config){.init_scale = INFINITY}, "init_scale");
    expect_refused((fsc_grad_scaler_config){.init_scale = NAN}, "init_scale");
    expect_refused((fsc_grad_scaler_config){.init_scale = 1e39}, "init_scale");  /* inf as float */
    expect_refused((fsc_grad_scaler_config){.init_scale = 1e-50}, "init_scale"); /* 0 as float */

    /* bad arguments change nothing */
    fsc_grad_scaler *s = scaler_at(4.0);
    float a[3] = {4, 8, 12};
    fsc_optim_range r[2] = {{.grad = a, .n = 3, .name = "wte.weight"},
                            {.grad = NULL, .n = 5, .name = "h.0.ln_1.bias"}};
    bool inf = false;
    assert_int_equal(fsc_grad_scaler_unscale(s, r, 2, &inf), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "h.0.ln_1.bias"));
    assert_true(a[0] == 4 && a[1] == 8 && a[2] == 12);
    r[1].grad = a, r[1].n = -2;
    assert_int_equal(fsc_grad_scaler_unscale(s, r, 2, &inf), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "n -2"));
    assert_int_equal(fsc_grad_scaler_unscale(s, NULL, 2, &inf), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "ranges"));
    assert_int_equal(fsc_grad_scaler_unscale(s, r, 1, NULL), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "found_inf"));
    assert_int_equal(fsc_grad_scaler_unscale(NULL, r, 1, &inf), FSC_ERR_INVALID);
    assert_int_equal(fsc_grad_scaler_update(NULL, false), FSC_ERR_INVALID);
    assert_true(isnan(fsc_grad_scaler_get_scale(NULL)));
    assert_true(a[0] == 4 && a[1] == 8 && a[2] == 12);
    assert_true(fsc_grad_scaler_get_scale(s) == 4.0);
    fsc_grad_scaler_free(s);
    fsc_grad_scaler_free(NULL);
}

/* ---- checkpoint state ---------------------------------------------------------- */

static void test_state_round_trip(void **state) {
    (void)state;
    const fsc_grad_scaler_config cfg = {.init_scale = 256, .growth_interval = 4};
    fsc_grad_scaler *a = fsc_grad_scaler_new(&cfg), *b = fsc_grad_scaler_new(&cfg);
    const bool pattern[] = {false, true, false, false, false, false, true, false, false};
    for (size_t i = 0; i < sizeof pattern / sizeof *pattern; i++)
        assert_int_equal(fsc_grad_scaler_update(a, pattern[i]), FSC_OK);
    fsc_grad_scaler_state saved = fsc_grad_scaler_get_state(a);
    assert_true(saved.scale == 128.0); /* 256 -> 128 -> 256 -> 128 */
    assert_int_equal(saved.growth_tracker, 2);
    assert_int_equal(saved.skipped_steps, 2);
    assert_int_equal(fsc_grad_scaler_set_state(b, &saved), FSC_OK);
    /* both continue identically */
    for (int i = 0; i < 12; i++) {
        bool inf = i == 7;
        fsc_grad_scaler_update(a, inf), fsc_grad_scaler_update(b, inf);
        fsc_grad_scaler_state x = fsc_grad_scaler_get_state(a), y = fsc_grad_scaler_get_state(b);
        assert_true(x.scale == y.scale);
        assert_int_equal(x.growth_tracker, y.growth_tracker);
        assert_int_equal(x.skipped_steps, y.skipped_steps);
    }

    /* refusals leave b as it was */
    const fsc_grad_scaler_state before = fsc_grad_scaler_get_state(b);
    const struct {
        fsc_grad_scaler_state st;
        const char *needle;
    } bad[] = {
        {{.scale = 0}, "scale"},
        {{.scale = -2}, "scale"},
        {{.scale = INFINITY}, "scale"},
        {{.scale = NAN}, "scale"},
        {{.scale = 1e39}, "scale"},
        {{.scale = 8, .growth_tracker = -1}, "growth_tracker"},
        {{.scale = 8, .growth_tracker = 4}, "growth_tracker"}, /* == growth_interval */
        {{.scale = 8, .skipped_steps = -3}, "skipped_steps"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(fsc_grad_scaler_set_state(b, &bad[i].st), FSC_ERR_INVALID);
        assert_non_null(strstr(fsc_last_error(), bad[i].needle));
        fsc_grad_scaler_state now = fsc_grad_scaler_get_state(b);
        assert_memory_equal(&now, &before, sizeof now);
    }
    assert_int_equal(fsc_grad_scaler_set_state(b, NULL), FSC_ERR_INVALID);
    /* a double scale is stored as the float torch would hold */
    assert_int_equal(fsc_grad_scaler_set_state(b, &(fsc_grad_scaler_state){.scale = 0.1}), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(b) == (double)0.1f);
    fsc_grad_scaler_free(a);
    fsc_grad_scaler_free(b);
}

/* ---- the header's example ------------------------------------------------------- */

static const fsc_gpt_config TINY = {
    .vocab = 64, .seq = 16, .layers = 2, .d_model = 32, .heads = 4, .dropout = 0.1f};

static void tiny_tokens(fsc_tokens *tk) {
    enum { N = 1024 };
    static int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7 + (i / 5) * 3) % TINY.vocab);
    assert_int_equal(fsc_tokens_from_i32(tok, N, TINY.vocab, tk), FSC_OK);
}

/* The usage example of fsc/grad_scaler.h on a tiny GPT: scaling the loss is
 * passing norm / scale, and since scaling by a power of two is exact in
 * floating point, the unscaled gradients equal those of the unscaled loss
 * bit for bit. An overflowing step is skipped and leaves the parameters. */
static void test_header_example(void **state) {
    (void)state;
    fsc_module *model = fsc_gpt_new(&TINY);
    assert_non_null(model);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(model, 5, true, &ps), FSC_OK);
    fsc_optim_range *r;
    int nr;
    assert_int_equal(fsc_optim_ranges_from_params(&ps, &r, &nr), FSC_OK);
    fsc_optim *opt = fsc_optim_new(&(fsc_optim_config){.kind = FSC_OPTIM_ADAMW, .lr = 1e-2}, r, nr);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_tokens tk;
    tiny_tokens(&tk);
    enum { B = 4, T = 16 };
    int32_t x[B * T], y[B * T];
    fsc_tokens_batch(&tk, 0, 0, 0, B, 1, 1, T, x, y);
    const fsc_ctx ctx = {.arena = arena, .training = true, .seed = 5, .keyed = true};
    const double global_targets = B * T;
    float loss, plain_loss;
    float *plain = malloc(sizeof(float) * (size_t)ps.numel);

    /* the reference: gradients of the unscaled loss */
    fsc_params_zero_grad(&ps);
    assert_int_equal(fsc_gpt_train_micro(model, &ctx, x, y, B, T, -1, global_targets, &plain_loss),
                     FSC_OK);
    memcpy(plain, ps.grad, sizeof(float) * (size_t)ps.numel);

    /* the example */
    fsc_grad_scaler *gs = fsc_grad_scaler_new(NULL);
    fsc_params_zero_grad(&ps);
    fsc_arena_reset(arena);
    double norm = global_targets / fsc_grad_scaler_get_scale(gs);
    assert_int_equal(fsc_gpt_train_micro(model, &ctx, x, y, B, T, -1, norm, &loss), FSC_OK);
    assert_true(fabs(loss / 65536.0 - plain_loss) <= 1e-6 * fabs(plain_loss));
    bool inf;
    assert_int_equal(fsc_grad_scaler_unscale(gs, r, nr, &inf), FSC_OK);
    assert_false(inf);
    assert_memory_equal(ps.grad, plain, sizeof(float) * (size_t)ps.numel);
    if (!inf) assert_int_equal(fsc_optim_step(opt), FSC_OK);
    assert_int_equal(fsc_grad_scaler_update(gs, inf), FSC_OK);
    assert_int_equal(fsc_optim_get_step(opt), 1);

    /* an overflowed step: skipped, parameters untouched, scale halved */
    float *params = malloc(sizeof(float) * (size_t)ps.numel);
    memcpy(params, ps.data, sizeof(float) * (size_t)ps.numel);
    ps.grad[ps.numel / 3] = INFINITY;
    assert_int_equal(fsc_grad_scaler_unscale(gs, r, nr, &inf), FSC_OK);
    assert_true(inf);
    if (!inf) assert_int_equal(fsc_optim_step(opt), FSC_OK);
    assert_int_equal(fsc_grad_scaler_update(gs, inf), FSC_OK);
    assert_memory_equal(ps.data, params, sizeof(float) * (size_t)ps.numel);
    assert_true(fsc_grad_scaler_get_scale(gs) == 32768.0);
    assert_int_equal(fsc_grad_scaler_get_state(gs).skipped_steps, 1);

    free(params);
    free(plain);
    fsc_grad_scaler_free(gs);
    fsc_tokens_free(&tk);
    fsc_arena_free(arena);
    fsc_optim_free(opt);
    fsc_optim_ranges_free(r);
    fsc_params_free(&ps);
    fsc_module_free(model);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_unscale_exact),
              cmocka_unit_test(test_inf_nan_found), cmocka_unit_test(test_inf_in_any_range),
              cmocka_unit_test(test_overflow_when_unscaling),
              cmocka_unit_test(test_fp16_overflow_found), cmocka_unit_test(test_update_trajectory),
              cmocka_unit_test(test_defaults_and_float_scale),
              cmocka_unit_test(test_bad_configs_refused), cmocka_unit_test(test_state_round_trip),
              cmocka_unit_test(test_header_example))
