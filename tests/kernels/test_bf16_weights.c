/* The bf16 weight cache: a weight is rounded once per weights version, and
 * every writer of parameters moves the version, so a GEMM never reads the
 * rounding of weights that have since changed.
 *
 * Each writer is checked the same way: the cache is filled from weights W,
 * the writer puts other values in place, and the copy the GEMMs would read
 * must then be the rounding of the new values, bit for bit. A writer that
 * forgot to move the version leaves the rounding of W there and fails (take
 * fsc_weights_changed out of fsc_optim_step and test_optimizer_step fails).
 * A Linear forward and backward through the cache must equal, bit for bit,
 * the same calls with the cache off, before and after an optimizer step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/dist.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/weights.h"

/* Skips the calling test unless bf16 GEMMs run on oneDNN here (the cache
 * makes copies only then); says why. */
#define NEED_ONEDNN()                                                                              \
    do {                                                                                           \
        fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);                                                  \
        if (!fsc_bf16_gemm_available()) {                                                          \
            print_message("skipped: no oneDNN bf16 path here (%s)\n", fsc_last_error());           \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static void fill(float *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = -1.f + 2.f * (float)(seed >> 8) / 16777216.0f;
    }
}

/* The cached copy of w is exactly w's rounding now. */
static void assert_follows(const float *w, int64_t n) {
    const uint16_t *h = fsc_bf16_weight_find(w, n);
    assert_non_null(h);
    for (int64_t i = 0; i < n; i++)
        if (h[i] != fsc_f32_to_bf16(w[i]))
            fail_msg("element %lld: copy 0x%04x, weights round to 0x%04x", (long long)i, h[i],
                     fsc_f32_to_bf16(w[i]));
}

static int cache_off(void **state) {
    (void)state;
    fsc_bf16_weight_cache_set(false);
    return 0;
}

/* Off (the default): nothing is cached; a registered view is found either way. */
static void test_off_by_default(void **state) {
    (void)state;
    NEED_ONEDNN();
    float w[64];
    uint16_t h[64] = {0};
    fill(w, 64, 1);
    assert_false(fsc_bf16_weight_cache_on());
    assert_null(fsc_bf16_weight_find(w, 64));
    assert_int_equal(fsc_bf16_view_add(w, h, 64), FSC_OK);
    assert_ptr_equal(fsc_bf16_weight_find(w, 64), h);
    fsc_bf16_weight_cache_set(true);
    assert_ptr_equal(fsc_bf16_weight_find(w, 64), h); /* the view, not a copy */
    fsc_bf16_view_remove(w);
    /* FSC_BF16_GEMM=off: the GEMMs run on sgemm, so no copy is made */
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_OFF);
    assert_null(fsc_bf16_weight_find(w, 64));
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
}

/* One rounding per version: the same copy until the version moves, even if
 * the weights change behind the cache's back (the promise the writers keep). */
static void test_rounded_once_per_version(void **state) {
    (void)state;
    NEED_ONEDNN();
    enum { N = 1000 };
    float w[N];
    fill(w, N, 2);
    fsc_bf16_weight_cache_set(true);
    const uint16_t *h = fsc_bf16_weight_find(w, N);
    assert_follows(w, N);
    const uint16_t old = h[7];
    w[7] = -4 * w[7] + 1;
    assert_ptr_equal(fsc_bf16_weight_find(w, N), h);
    assert_int_equal(h[7], old); /* not rounded again: no writer said so */
    const uint64_t v = fsc_weights_version();
    fsc_weights_changed();
    assert_true(fsc_weights_version() > v);
    assert_follows(w, N);
    /* the same address with another length is another array */
    assert_follows(w, N / 2);
}

/* fsc_optim_step (AdamW here) writes every parameter of its ranges. */
static void test_optimizer_step(void **state) {
    (void)state;
    NEED_ONEDNN();
    enum { N = 4096 };
    float *w = malloc(N * 4), *g = malloc(N * 4);
    fill(w, N, 3), fill(g, N, 4);
    fsc_bf16_weight_cache_set(true);
    assert_follows(w, N);
    fsc_optim_config cfg = {.kind = FSC_OPTIM_ADAMW, .lr = 0.05, .weight_decay = 0.1};
    fsc_optim_range r = {.param = w, .grad = g, .n = N, .decay = true, .name = "w"};
    fsc_optim *o = fsc_optim_new(&cfg, &r, 1);
    assert_non_null(o);
    assert_int_equal(fsc_optim_step(o), FSC_OK);
    assert_follows(w, N);
    fsc_optim_free(o);
    free(w), free(g);
}

/* fsc_weights_load writes the file's values into the parameters. */
static void test_weights_load(void **state) {
    (void)state;
    NEED_ONEDNN();
    fsc_module *lin = fsc_linear_new("fc", 24, 40, true, FSC_WEIGHT_OUT_IN, 0.5f);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(lin, 7, false, &ps), FSC_OK);
    char path[] = "/tmp/fsc_bf16_weights_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(fsc_weights_save(path, &ps, 0, NULL, NULL), FSC_OK);
    float *w = lin->params[0].data;
    const int64_t n = lin->params[0].numel;
    float *saved = malloc((size_t)n * 4);
    memcpy(saved, w, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) w[i] = 3 * w[i] + 0.25f; /* other weights, cached */
    fsc_bf16_weight_cache_set(true);
    assert_follows(w, n);
    assert_int_equal(fsc_weights_load(path, &ps, NULL), FSC_OK);
    assert_memory_equal(w, saved, (size_t)n * 4);
    assert_follows(w, n);
    unlink(path);
    free(saved);
    fsc_params_free(&ps);
    fsc_module_free(lin);
}

/* A broadcast (DDP's first weights, OSS's updated shards) and a gather
 * (ZeRO's shards) write parameters; on a world of one the values are the
 * caller's, so the test writes them as a receive would and checks that the
 * call moved the version. */
static void test_broadcast_and_gather(void **state) {
    (void)state;
    NEED_ONEDNN();
    enum { N = 512 };
    float w[N], shard[N];
    fill(w, N, 5);
    fsc_bf16_weight_cache_set(true);
    assert_follows(w, N);
    fill(w, N, 6);
    assert_int_equal(fsc_group_broadcast(fsc_group_world(), w, N, FSC_DTYPE_F32, 0), FSC_OK);
    assert_follows(w, N);
    fill(shard, N, 7);
    assert_int_equal(fsc_group_allgather(fsc_group_world(), shard, w, N, FSC_DTYPE_F32), FSC_OK);
    assert_memory_equal(w, shard, sizeof w);
    assert_follows(w, N);
}

/* A Linear through the cache computes what it computes without it, bit for
 * bit, before and after the optimizer changes its weight. */
static void test_linear_same_as_uncached(void **state) {
    (void)state;
    NEED_ONEDNN();
    enum { N = 64, C = 96, OC = 80 };
    float *x = malloc(N * C * 4), *w = malloc(C * OC * 4), *b = malloc(OC * 4);
    float *dy = malloc(N * OC * 4), *gw = calloc(C * OC, 4);
    float *y[2], *dx[2], *dw[2];
    fill(x, N * C, 8), fill(w, C * OC, 9), fill(b, OC, 10), fill(dy, N * OC, 11);
    fsc_optim_config cfg = {.kind = FSC_OPTIM_ADAMW, .lr = 0.1};
    fsc_optim_range r = {.param = w, .grad = gw, .n = C * OC, .name = "w"};
    fsc_optim *o = fsc_optim_new(&cfg, &r, 1);
    assert_non_null(o);
    for (int k = 0; k < 2; k++)
        y[k] = malloc(N * OC * 4), dx[k] = malloc(N * C * 4), dw[k] = calloc(C * OC, 4);
    for (int step = 0; step < 2; step++) {
        for (int k = 0; k < 2; k++) { /* k = 0: cache off, 1: on */
            fsc_bf16_weight_cache_set(k == 1);
            memset(dw[k], 0, C * OC * 4);
            fsc_matmul_forward_prec(y[k], x, w, b, N, C, OC, FSC_WEIGHT_IN_OUT, FSC_GEMM_BF16);
            fsc_matmul_backward_prec(dx[k], dw[k], NULL, dy, x, w, N, C, OC, FSC_WEIGHT_IN_OUT,
                                     FSC_GEMM_BF16);
        }
        assert_memory_equal(y[0], y[1], N * OC * 4);
        assert_memory_equal(dx[0], dx[1], N * C * 4);
        assert_memory_equal(dw[0], dw[1], C * OC * 4);
        memcpy(gw, dw[0], C * OC * 4);
        assert_int_equal(fsc_optim_step(o), FSC_OK); /* with the cache on */
    }
    fsc_optim_free(o);
    for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]), free(dw[k]);
    free(x), free(w), free(b), free(dy), free(gw);
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) {
        fprintf(stderr, "%s\n", fsc_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_off_by_default, cache_off),
        cmocka_unit_test_teardown(test_rounded_once_per_version, cache_off),
        cmocka_unit_test_teardown(test_optimizer_step, cache_off),
        cmocka_unit_test_teardown(test_weights_load, cache_off),
        cmocka_unit_test_teardown(test_broadcast_and_gather, cache_off),
        cmocka_unit_test_teardown(test_linear_same_as_uncached, cache_off),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fsc_dist_finalize();
    return rc;
}
