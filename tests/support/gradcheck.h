/* Finite-difference gradient check for any fsc module.
 *
 * The kernels are fp32; the check evaluates L = sum_i w_i * y_i with fixed
 * random w, accumulated in double, and compares central differences
 * (L(p+h) - L(p-h)) / 2h against backward's gradients for a sample of
 * elements of every parameter and of the input. With fp32 outputs the
 * difference quotient carries ~1e-7/h noise, hence h = 1e-2 and a combined
 * tolerance |a - n| <= atol + rtol * max(|a|, |n|). */
#ifndef FSC_TEST_GRADCHECK_H
#define FSC_TEST_GRADCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/nn.h"

typedef struct {
    double atol, rtol, h;
    int samples; /* elements checked per tensor */
} gradcheck_opts;

static double gc_objective(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, const float *w) {
    fsc_arena_reset(ctx->arena);
    fsc_tensor y;
    if (fsc_module_forward(m, ctx, x, &y, NULL)) return NAN;
    double s = 0;
    const float *yd = y.data;
    for (int64_t i = 0; i < fsc_tensor_numel(&y); i++) s += (double)w[i] * yd[i];
    return s;
}

/* The largest |analytic - numeric| / tolerance of the comparisons so far
 * (<= 1 passes), for tests that report their margin. */
static double gc_worst_ratio;

static int gc_compare(const char *what, int64_t idx, double analytic, double numeric,
                      const gradcheck_opts *o) {
    double tol = o->atol + o->rtol * fmax(fabs(analytic), fabs(numeric));
    if (fabs(analytic - numeric) / tol > gc_worst_ratio)
        gc_worst_ratio = fabs(analytic - numeric) / tol;
    if (fabs(analytic - numeric) <= tol) return 0;
    fprintf(stderr, "gradcheck %s[%lld]: analytic %.8g numeric %.8g\n", what, (long long)idx,
            analytic, numeric);
    return 1;
}

/* Returns the number of mismatching elements (0 = pass). x must be f32 unless
 * check_input is false. w has numel(y) elements. */
static int gradcheck_module(fsc_module *m, fsc_params *ps, fsc_ctx *ctx, fsc_tensor *x,
                            const float *w, int64_t y_numel, bool check_input,
                            const gradcheck_opts *o) {
    int bad = 0;
    /* analytic gradients */
    fsc_params_zero_grad(ps);
    fsc_arena_reset(ctx->arena);
    fsc_tensor y, dx;
    void *saved;
    if (fsc_module_forward(m, ctx, x, &y, &saved)) return -1;
    if (fsc_tensor_numel(&y) != y_numel) return -1;
    fsc_tensor dy = y;
    dy.data = fsc_arena_alloc(ctx->arena, (size_t)y_numel * sizeof(float));
    memcpy(dy.data, w, (size_t)y_numel * sizeof(float));
    if (fsc_module_backward(m, ctx, saved, &dy, check_input ? &dx : NULL)) return -1;
    /* copy analytic results out of the arena before FD evaluations reset it */
    int64_t xn = fsc_tensor_numel(x);
    float *dx_copy = NULL;
    if (check_input) {
        dx_copy = malloc((size_t)xn * sizeof(float));
        memcpy(dx_copy, dx.data, (size_t)xn * sizeof(float));
    }
    float *grads = malloc((size_t)ps->numel * sizeof(float));
    memcpy(grads, ps->grad, (size_t)ps->numel * sizeof(float));

    for (int i = 0; i < ps->count; i++) {
        fsc_param *p = ps->entries[i].param;
        int64_t step = p->numel > o->samples ? p->numel / o->samples : 1;
        for (int64_t j = (i * 7) % step; j < p->numel; j += step) {
            float orig = p->data[j];
            p->data[j] = orig + (float)o->h;
            double lp = gc_objective(m, ctx, x, w);
            p->data[j] = orig - (float)o->h;
            double lm = gc_objective(m, ctx, x, w);
            p->data[j] = orig;
            bad += gc_compare(ps->entries[i].name, j, grads[ps->entries[i].offset + j],
                              (lp - lm) / (2 * o->h), o);
        }
    }
    if (check_input) {
        float *xd = x->data;
        int64_t step = xn > o->samples ? xn / o->samples : 1;
        for (int64_t j = 0; j < xn; j += step) {
            float orig = xd[j];
            xd[j] = orig + (float)o->h;
            double lp = gc_objective(m, ctx, x, w);
            xd[j] = orig - (float)o->h;
            double lm = gc_objective(m, ctx, x, w);
            xd[j] = orig;
            bad += gc_compare("input", j, dx_copy[j], (lp - lm) / (2 * o->h), o);
        }
    }
    free(dx_copy);
    free(grads);
    return bad;
}

/* The options of the module checks (test_gradcheck.c, test_llama_layers.c):
 * h = 1e-2 keeps the fp32 noise of the difference quotient (~1e-7 / h) well
 * under atol; rtol covers the O(h^2) truncation of the central difference
 * on these smooth layers. */
static const gradcheck_opts GC_OPTS = {.atol = 2e-3, .rtol = 2e-2, .h = 1e-2, .samples = 24};

/* x[0..n) drawn from N(0, std^2), keyed by seed: inputs and output weights. */
static inline void gc_fill(float *x, int64_t n, uint64_t seed, float std) {
    fsc_rng_normal_fill(x, n, 0, fsc_rng_key(seed, "gradcheck"), 0.f, std);
}

/* A check's input: n such values (seed 5, std 1), malloc'ed. */
static inline float *gc_input(int64_t n) {
    float *x = malloc((size_t)n * sizeof(float));
    if (x) gc_fill(x, n, 5, 1.f);
    return x;
}

/* Non-trivial parameter values: N(0, 0.3) keyed by name, plus 1 for those
 * initialised to ones (norm weights 1 + N(0, 0.3), not all 1). */
static inline void gc_randomize(fsc_params *ps) {
    for (int i = 0; i < ps->count; i++) {
        fsc_param *p = ps->entries[i].param;
        fsc_rng_normal_fill(p->data, p->numel, 0, fsc_rng_key(11, ps->entries[i].name), 0.f, 0.3f);
        if (p->init == FSC_INIT_ONES)
            for (int64_t j = 0; j < p->numel; j++) p->data[j] += 1.f;
    }
}

#endif
