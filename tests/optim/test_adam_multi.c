/* The multi-tensor Adam/AdamW pass (src/optim/adam_multi.c), which
 * fsc_optim_step runs, against the per-range kernels fsc_adam_update and
 * fsc_adamw_update (held to PyTorch by test_optim's goldens): bit for bit,
 * over ranges whose sizes fall on and off the 512-element blocks, with
 * their own lr and weight decay, an empty (frozen) range among them, on one
 * thread and on two (the threads then split a tensor's blocks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/optim.h"
#include "frand.h"
#include "test_main.h"

#define NR 8
static const int64_t SIZES[NR] = {1, 511, 0, 512, 513, 70001, 3, 40000};

typedef struct {
    float *p[NR], *g[NR], *m[NR], *v[NR];
} arrays;

static void arrays_new(arrays *a) {
    for (int i = 0; i < NR; i++) {
        size_t n = (size_t)(SIZES[i] ? SIZES[i] : 1);
        a->p[i] = malloc(n * sizeof(float)), a->g[i] = malloc(n * sizeof(float));
        a->m[i] = calloc(n, sizeof(float)), a->v[i] = calloc(n, sizeof(float));
        assert_non_null(a->p[i]), assert_non_null(a->g[i]);
        assert_non_null(a->m[i]), assert_non_null(a->v[i]);
    }
}

static void arrays_free(arrays *a) {
    for (int i = 0; i < NR; i++) free(a->p[i]), free(a->g[i]), free(a->m[i]), free(a->v[i]);
}

/* Same start for both sides: parameters and gradients from one seed. */
static void fill(arrays *a, uint64_t seed) {
    for (int i = 0; i < NR; i++)
        for (int64_t j = 0; j < SIZES[i]; j++) a->p[i][j] = frand(&seed), a->g[i][j] = frand(&seed);
}

static void regrad(arrays *a, uint64_t seed) {
    for (int i = 0; i < NR; i++)
        for (int64_t j = 0; j < SIZES[i]; j++) a->g[i][j] = frand(&seed);
}

static void check(fsc_optim_kind kind, int threads) {
    fsc_set_num_threads(threads);
    const fsc_optim_config cfg = {
        .kind = kind, .lr = 3e-3, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
    arrays fused, ref;
    arrays_new(&fused), arrays_new(&ref);
    fill(&fused, 7), fill(&ref, 7);
    fsc_optim_range r[NR];
    for (int i = 0; i < NR; i++)
        r[i] = (fsc_optim_range){.param = fused.p[i],
                                 .grad = fused.g[i],
                                 .n = SIZES[i],
                                 .decay = i % 2 == 1,
                                 .lr_scale = i == 5 ? 0.25 : 0,
                                 .wd_set = i == 7,
                                 .wd = i == 7 ? 0.5 : 0};
    fsc_optim *o = fsc_optim_new(&cfg, r, NR);
    assert_non_null(o);
    for (int step = 1; step <= 4; step++) {
        regrad(&fused, 100 + (uint64_t)step), regrad(&ref, 100 + (uint64_t)step);
        assert_int_equal(fsc_optim_step(o), FSC_OK);
        for (int i = 0; i < NR; i++) {
            const double lr = cfg.lr * (r[i].lr_scale > 0 ? r[i].lr_scale : 1.0);
            const double wd = r[i].wd_set ? r[i].wd : r[i].decay ? cfg.weight_decay : 0.0;
            (kind == FSC_OPTIM_ADAMW ? fsc_adamw_update : fsc_adam_update)(
                ref.p[i], ref.g[i], ref.m[i], ref.v[i], SIZES[i], lr, cfg.beta1, cfg.beta2, cfg.eps,
                wd, step);
        }
        for (int i = 0; i < NR; i++) {
            float *m = NULL, *v = NULL;
            assert_int_equal(fsc_optim_state(o, i, 0, &m), FSC_OK);
            assert_int_equal(fsc_optim_state(o, i, 1, &v), FSC_OK);
            const size_t bytes = (size_t)SIZES[i] * sizeof(float);
            if (!bytes) continue;
            if (memcmp(fused.p[i], ref.p[i], bytes) || memcmp(m, ref.m[i], bytes) ||
                memcmp(v, ref.v[i], bytes))
                fail_msg("%s, %d thread(s), step %d: range %d (%lld elements) differs from the "
                         "per-range kernel",
                         kind == FSC_OPTIM_ADAMW ? "AdamW" : "Adam", threads, step, i,
                         (long long)SIZES[i]);
        }
    }
    fsc_optim_free(o);
    arrays_free(&fused), arrays_free(&ref);
    fsc_set_num_threads(1);
}

static void adamw_one_thread(void **state) {
    (void)state;
    check(FSC_OPTIM_ADAMW, 1);
}

static void adamw_two_threads(void **state) {
    (void)state;
    check(FSC_OPTIM_ADAMW, 2);
}

static void adam_two_threads(void **state) {
    (void)state;
    check(FSC_OPTIM_ADAM, 2);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(adamw_one_thread), cmocka_unit_test(adamw_two_threads),
              cmocka_unit_test(adam_two_threads))
