/* Golden checks of the LLaMA layers against a hand-written PyTorch reference
 * (tests/reference/golden_llama.py: Hugging Face's semantics in plain torch
 * ops, since Debian's torch 1.13 has no LLaMA). Each layer is rebuilt in fsc
 * with the file's sizes, its parameters loaded by name, run forward and
 * backward, and every tensor (y, dx, each grad.<name>) compared element by
 * element with torch's fp32 result.
 *
 * Tolerance, per tensor, from measured noise: the file holds noise.<name>,
 * the largest |fp32 - fp64| of torch's own result (the same layer again in
 * float64 on the same inputs). Both sides are fp32 sums of the same terms
 * in different orders, so each carries an error of that size; fsc may sit
 * NOISE_K times torch's own worst error from torch, plus ULP_K units in the
 * last place of the tensor's largest element for tensors torch happens to
 * compute almost exactly (a rotation, a single product), where a
 * different but equally legal rounding of one or two operations (an FMA,
 * an exp polynomial) would otherwise fail. Observed on x86-64 (AVX-512):
 * see the "max |diff|/tol" lines the test prints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/io.h"
#include "golden_files.h"
#include "fsc/nn.h"
#include "test_main.h"
#include "nn/layers_internal.h" /* fsc_kv_cache */

static const double NOISE_K = 4.0, ULP_K = 8.0;

/* Sizes shared with tests/reference/golden_llama.py. */
enum { C = 16, FFN = 40, AC = 32, ANH = 4, AHD = 8 };
static const fsc_rope_scaling LLAMA31 = {.factor = 8.f,
                                         .low_freq_factor = 1.f,
                                         .high_freq_factor = 4.f,
                                         .original_max_position_embeddings = 8192};

#define MAX_REPORTED 5

typedef struct {
    double worst; /* largest |diff| / tol over the layer's tensors */
    int bad;
} layer_stats;

/* got against the file's `name` (same shape), at the tolerance its noise.<name> sets. */
static void compare(layer_stats *ls, const char *layer, fsc_st_file *f, const char *name,
                    const fsc_tensor *got) {
    fsc_tensor want = read_entry(f, name);
    assert_true(fsc_tensor_same_shape(&want, got));
    char noise_name[FSC_NAME_MAX * 2];
    snprintf(noise_name, sizeof noise_name, "noise.%s", name);
    fsc_tensor nt = read_entry(f, noise_name);
    double noise = ((float *)nt.data)[0], scale = 0, max_abs = 0;
    const float *a = got->data, *b = want.data;
    int64_t n = fsc_tensor_numel(got);
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    double tol = NOISE_K * noise + ULP_K * ldexp(scale, -24);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > max_abs || isnan(d)) max_abs = d;
        if (d <= tol) continue;
        if (bad++ < MAX_REPORTED)
            fprintf(stderr, "%s: %s[%lld] fsc %.9g torch %.9g |diff| %.3g > tol %.3g\n", layer,
                    name, (long long)i, (double)a[i], (double)b[i], d, tol);
    }
    printf("golden %-16s %-22s max |diff| %.3g, torch's own noise %.3g, max |diff|/tol %.3g\n",
           layer, name, max_abs, noise, max_abs / tol);
    if (max_abs / tol > ls->worst || isnan(max_abs)) ls->worst = max_abs / tol;
    ls->bad += bad;
    free(want.data);
    free(nt.data);
}

/* Opens golden_llama_<layer>.safetensors and binds m's parameters to its values. */
static fsc_st_file *load_layer(const char *layer, fsc_module *m, fsc_params *out) {
    fsc_params ps;
    fsc_st_file *f = open_golden_layer("golden_llama_", layer, m, &ps);
    for (int i = 0; i < ps.count; i++) {
        fsc_tensor t = fsc_param_tensor(ps.entries[i].param);
        int rc = fsc_st_read(f, ps.entries[i].name, &t);
        if (rc) fprintf(stderr, "loading parameter %s: %s\n", ps.entries[i].name, fsc_last_error());
        assert_int_equal(rc, FSC_OK);
    }
    int in_file = 0; /* a parameter fsc lacks or names differently fails */
    for (int i = 0; i < fsc_st_count(f); i++)
        in_file += strncmp(fsc_st_entry_at(f, i)->name, "grad.", 5) == 0;
    assert_int_equal(in_file, ps.count);
    *out = ps;
    return f;
}

/* Builds m's parameters from golden_llama_<layer>.safetensors, runs forward
 * and backward, compares y, dx and every grad.<name>. Takes ownership of m. */
static void check_layer(const char *layer, fsc_module *m) {
    fsc_params ps;
    fsc_st_file *f = load_layer(layer, m, &ps);
    fsc_tensor x = read_entry(f, "x");
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true};
    fsc_tensor y, dx;
    void *saved = NULL;
    int rc = fsc_module_forward(m, &ctx, &x, &y, &saved);
    if (rc) fprintf(stderr, "%s forward: %s\n", layer, fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    layer_stats ls = {0};
    compare(&ls, layer, f, "y", &y);
    fsc_tensor dy = read_entry(f, "dy");
    assert_true(fsc_tensor_same_shape(&dy, &y));
    fsc_params_zero_grad(&ps);
    rc = fsc_module_backward(m, &ctx, saved, &dy, &dx);
    if (rc) fprintf(stderr, "%s backward: %s\n", layer, fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    compare(&ls, layer, f, "dx", &dx);
    for (int i = 0; i < ps.count; i++) {
        char name[FSC_NAME_MAX * 3];
        snprintf(name, sizeof name, "grad.%s", ps.entries[i].name);
        fsc_tensor g = fsc_param_grad_tensor(ps.entries[i].param);
        compare(&ls, layer, f, name, &g);
    }
    printf("golden %-16s worst |diff|/tol %.3g (NOISE_K %g, ULP_K %g)\n", layer, ls.worst, NOISE_K,
           ULP_K);
    assert_int_equal(ls.bad, 0);
    free(dy.data);
    free(x.data);
    fsc_arena_free(arena);
    close_golden_layer(f, m, &ps);
}

static void test_rmsnorm(void **state) {
    (void)state;
    check_layer("rmsnorm", fsc_rmsnorm_new("norm", C, 1e-5f));
}

static void test_rope(void **state) {
    (void)state;
    check_layer("rope_llama31", fsc_rope_new("rope", ANH, AHD, 500000.f, &LLAMA31, 8000));
    check_layer("rope_plain", fsc_rope_new("rope", 1, C, 10000.f, NULL, 0));
}

static void test_swiglu(void **state) {
    (void)state;
    check_layer("swiglu", fsc_swiglu_mlp_new("mlp", C, FFN, 0.02f, 0.02f));
}

/* The attention layers golden_llama.py wrote: grouped-query (2 key/value
 * heads, biases, Llama 3.1's scaled rotary angles), else multi-query. */
static fsc_llama_attention_config attention_config(bool gqa) {
    if (!gqa) return (fsc_llama_attention_config){.d_model = AC, .n_heads = ANH, .n_kv_heads = 1};
    return (fsc_llama_attention_config){.d_model = AC,
                                        .n_heads = ANH,
                                        .n_kv_heads = 2,
                                        .qkv_bias = true,
                                        .rope_theta = 500000.f,
                                        .rope_scaling = LLAMA31};
}

static void test_attention(void **state) {
    (void)state;
    const fsc_llama_attention_config gqa = attention_config(true), mqa = attention_config(false);
    check_layer("attention_gqa", fsc_llama_attention_new("attn", &gqa));
    check_layer("attention_mqa", fsc_llama_attention_new("attn", &mqa));
}

/* Generation: each batch row decoded through fsc_ctx.kv in chunks of 3, 1
 * and 4 positions (rotated at the cache's length, attending over the KV
 * heads the cache holds) gives torch's full-sequence y, at the same
 * tolerance as the training forward. */
static void check_cached(const char *layer, fsc_module *m, int nkv) {
    fsc_params ps;
    fsc_st_file *f = load_layer(layer, m, &ps);
    fsc_tensor x = read_entry(f, "x");
    const int B = (int)x.shape[0], T = (int)x.shape[1], ck = nkv * AHD;
    fsc_tensor y = x; /* (B, T, AC) */
    y.data = calloc((size_t)fsc_tensor_numel(&x), sizeof(float));
    float *k = calloc((size_t)T * ck, sizeof(float)), *v = calloc((size_t)T * ck, sizeof(float));
    fsc_kv_cache kv = {.slots = 1, .T = T, .C = ck, .k = k, .v = v};
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .kv = &kv};
    const int chunks[3] = {3, 1, 4};
    for (int b = 0; b < B; b++) {
        kv.len = 0;
        for (int c = 0; c < 3; c++) {
            const int n = chunks[c];
            fsc_tensor xc = fsc_tensor_3d((float *)x.data + ((size_t)b * T + kv.len) * AC,
                                          FSC_DTYPE_F32, 1, n, AC);
            fsc_tensor yc;
            kv.next = 0;
            fsc_arena_reset(arena);
            int rc = fsc_module_forward(m, &ctx, &xc, &yc, NULL);
            if (rc) fprintf(stderr, "%s cached forward: %s\n", layer, fsc_last_error());
            assert_int_equal(rc, FSC_OK);
            memcpy((float *)y.data + ((size_t)b * T + kv.len) * AC, yc.data,
                   (size_t)n * AC * sizeof(float));
            kv.len += n;
        }
    }
    assert_int_equal(kv.len, T);
    /* a cache of the wrong width, or full, is refused */
    kv.C = AC, kv.len = 0, kv.next = 0;
    fsc_tensor x1 = fsc_tensor_3d(x.data, FSC_DTYPE_F32, 1, 1, AC), y1;
    assert_int_equal(fsc_module_forward(m, &ctx, &x1, &y1, NULL), FSC_ERR_INVALID);
    kv.C = ck, kv.len = T;
    assert_int_equal(fsc_module_forward(m, &ctx, &x1, &y1, NULL), FSC_ERR_INVALID);
    char where[64];
    snprintf(where, sizeof where, "%s_kv", layer);
    layer_stats ls = {0};
    compare(&ls, where, f, "y", &y);
    assert_int_equal(ls.bad, 0);
    free(k), free(v), free(y.data), free(x.data);
    fsc_arena_free(arena);
    close_golden_layer(f, m, &ps);
}

static void test_attention_kv_cache(void **state) {
    (void)state;
    const fsc_llama_attention_config gqa = attention_config(true), mqa = attention_config(false);
    check_cached("attention_gqa", fsc_llama_attention_new("attn", &gqa), 2);
    check_cached("attention_mqa", fsc_llama_attention_new("attn", &mqa), 1);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_rope),
              cmocka_unit_test(test_swiglu), cmocka_unit_test(test_attention),
              cmocka_unit_test(test_attention_kv_cache))
