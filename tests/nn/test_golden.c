/* Golden checks against PyTorch (docs/architecture.md, "How correctness is shown").
 *
 * tests/reference/golden_layers.py and golden_train.py wrote, with fixed
 * seeds, the inputs, parameters (under fsc's full names), upstream gradient,
 * outputs and gradients of every layer, a 2-layer GPT, and 20 AdamW steps of
 * that GPT into tests/data/golden_*.safetensors. Here each layer is rebuilt in
 * fsc with the same sizes, loaded by name, run forward and backward, and every
 * tensor compared element by element with |a - b| <= atol + rtol * |b|.
 *
 * Tolerances: fp32 on both sides, summed in different orders (OpenBLAS here,
 * torch's own kernels there). Observed on x86-64 (AVX-512): every layer and
 * the GPT within 8e-6 absolute, at most 0.3 of the stated tolerance; the 20
 * training losses within 1.2e-7 relative (tolerance 1e-4); the final
 * parameters within 1e-6 (0.09 of the tolerance), except the key bias, see
 * TRAIN_KEY_BIAS_ATOL. A failure prints the tensor, element and both values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/gpt.h"
#include "fsc/io.h"
#include "golden_files.h"
#include "fsc/optim.h"
#include "test_main.h"

/* Single layers: output and gradients. */
static const double LAYER_ATOL = 1e-5, LAYER_RTOL = 1e-4;
/* Composite graphs (block, 2-layer GPT). */
static const double DEEP_ATOL = 1e-5, DEEP_RTOL = 1e-4;
/* Training: per-step loss, relative; final parameters after 20 AdamW steps. */
static const double TRAIN_LOSS_RTOL = 1e-4;
static const double TRAIN_PARAM_ATOL = 1e-5, TRAIN_PARAM_RTOL = 1e-4;
/* The key slice of c_attn.bias has an identically zero gradient (adding a
 * constant to every key score of a row leaves its softmax unchanged), so
 * either side moves it only by rounding noise that Adam divides by
 * sqrt(v) + eps: at most lr * noise / eps per step, ~1e-6 here in both
 * frameworks, with unrelated signs. Only its size can be compared. */
static const double TRAIN_KEY_BIAS_ATOL = 5e-5;

/* Sizes shared with tests/reference/golden_layers.py and golden_train.py. */
enum { B = 2, T = 8, C = 16, NH = 4, LIN_OUT = 24, CE_N = 12, CE_V = 20 };
enum { GPT_B = 2, GPT_T = 16, GPT_V = 64, GPT_C = 32, GPT_NH = 4, GPT_L = 2 };
enum { TR_B = 4, TR_T = 16, TR_STEPS = 20 };

#define MAX_REPORTED 5 /* mismatching elements printed per tensor */

/* ---- files ------------------------------------------------------------------ */

/* Reads `name` into a new malloc'd f32 buffer whose shape must equal `like`'s. */
static float *read_like(fsc_st_file *f, const char *name, const fsc_tensor *like) {
    fsc_tensor t = *like;
    t.dtype = FSC_DTYPE_F32;
    t.data = malloc((size_t)fsc_tensor_numel(&t) * sizeof(float) + 1);
    assert_non_null(t.data);
    int rc = fsc_st_read(f, name, &t);
    if (rc) fprintf(stderr, "golden tensor %s: %s\n", name, fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    return t.data;
}

/* Overwrites every bound parameter with the file's tensor of the same full name
 * (prefix + name), and checks the file has exactly one grad.<name> per parameter
 * when grads is true, so a parameter fsc lacks or names differently fails. */
static void load_params(fsc_st_file *f, fsc_params *ps, const char *prefix, bool grads) {
    for (int i = 0; i < ps->count; i++) {
        char name[FSC_NAME_MAX * 3];
        snprintf(name, sizeof name, "%s%s", prefix, ps->entries[i].name);
        fsc_tensor t = fsc_param_tensor(ps->entries[i].param);
        int rc = fsc_st_read(f, name, &t);
        if (rc) fprintf(stderr, "loading parameter %s: %s\n", name, fsc_last_error());
        assert_int_equal(rc, FSC_OK);
    }
    if (!grads) return;
    int in_file = 0;
    for (int i = 0; i < fsc_st_count(f); i++)
        if (strncmp(fsc_st_entry_at(f, i)->name, "grad.", 5) == 0) in_file++;
    if (in_file != ps->count)
        fprintf(stderr, "golden has %d parameter gradients, fsc's module has %d parameters\n",
                in_file, ps->count);
    assert_int_equal(in_file, ps->count);
}

/* ---- comparison ---------------------------------------------------------------- */

typedef struct {
    double atol, rtol;
    double max_abs;   /* largest |a - b| seen */
    double max_ratio; /* largest |a - b| / (atol + rtol |b|): <= 1 passes */
    int bad;          /* mismatching elements */
} cmp_stats;

/* Compares got[0..n) against want, element by element; prints the tensor, index
 * and both values of the first mismatches. */
static void compare_range(cmp_stats *s, const char *where, const char *what, const float *got,
                          const float *want, int64_t first, int64_t n) {
    int bad = 0;
    for (int64_t i = first; i < first + n; i++) {
        double a = got[i], b = want[i], d = fabs(a - b), tol = s->atol + s->rtol * fabs(b);
        if (d > s->max_abs || isnan(d)) s->max_abs = d;
        if (d / tol > s->max_ratio || isnan(d)) s->max_ratio = d / tol;
        if (d <= tol) continue;
        if (bad++ < MAX_REPORTED)
            fprintf(stderr, "%s: %s[%lld] fsc %.9g torch %.9g |diff| %.3g > tol %.3g\n", where,
                    what, (long long)i, a, b, d, tol);
    }
    if (bad > MAX_REPORTED)
        fprintf(stderr, "%s: %s: %d of %lld elements differ\n", where, what, bad, (long long)n);
    s->bad += bad;
}

static void compare(cmp_stats *s, const char *where, const char *what, const float *got,
                    const float *want, int64_t n) {
    compare_range(s, where, what, got, want, 0, n);
}

/* Reads `name` shaped like `got` and compares. */
static void compare_named(cmp_stats *s, const char *where, fsc_st_file *f, const char *name,
                          const fsc_tensor *got) {
    float *want = read_like(f, name, got);
    compare(s, where, name, got->data, want, fsc_tensor_numel(got));
    free(want);
}

static void compare_grads(cmp_stats *s, const char *where, fsc_st_file *f, fsc_params *ps) {
    for (int i = 0; i < ps->count; i++) {
        char name[FSC_NAME_MAX * 3];
        snprintf(name, sizeof name, "grad.%s", ps->entries[i].name);
        fsc_tensor g = fsc_param_grad_tensor(ps->entries[i].param);
        compare_named(s, where, f, name, &g);
    }
}

static void report(const char *where, const cmp_stats *s) {
    printf("golden %-14s max |diff| %.3g, max |diff|/tol %.3g (atol %g, rtol %g)\n", where,
           s->max_abs, s->max_ratio, s->atol, s->rtol);
}

/* ---- layers ------------------------------------------------------------------- */

/* Builds m's parameters from golden_<layer>.safetensors, runs forward with x and
 * backward with dy, and compares y, dx (when the input is differentiable) and
 * every grad.<name>. Takes ownership of m. */
static void check_layer(const char *layer, fsc_module *m, double atol, double rtol) {
    fsc_params ps;
    fsc_st_file *f = open_golden_layer("golden_", layer, m, &ps);
    load_params(f, &ps, "", true);
    fsc_tensor x = read_entry(f, "x");
    bool has_dx = fsc_st_find(f, "dx") != NULL;

    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {
        .arena = arena, .training = true, .seed = 1, .step = 0, .sample0 = 0, .keyed = true};
    fsc_tensor y, dx;
    void *saved = NULL;
    int rc = fsc_module_forward(m, &ctx, &x, &y, &saved);
    if (rc) fprintf(stderr, "%s forward: %s\n", layer, fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    cmp_stats s = {.atol = atol, .rtol = rtol};
    compare_named(&s, layer, f, "y", &y);

    fsc_tensor dy = y;
    dy.data = read_like(f, "dy", &y);
    fsc_params_zero_grad(&ps);
    rc = fsc_module_backward(m, &ctx, saved, &dy, has_dx ? &dx : NULL);
    if (rc) fprintf(stderr, "%s backward: %s\n", layer, fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    if (has_dx) compare_named(&s, layer, f, "dx", &dx);
    compare_grads(&s, layer, f, &ps);
    report(layer, &s);
    assert_int_equal(s.bad, 0);

    free(dy.data);
    free(x.data);
    fsc_arena_free(arena);
    close_golden_layer(f, m, &ps);
}

static void test_linear(void **state) {
    (void)state;
    check_layer("linear_torch", fsc_linear_new("fc", C, LIN_OUT, true, FSC_WEIGHT_OUT_IN, 0.02f),
                LAYER_ATOL, LAYER_RTOL);
    check_layer("linear_conv1d", fsc_linear_new("fc", C, LIN_OUT, true, FSC_WEIGHT_IN_OUT, 0.02f),
                LAYER_ATOL, LAYER_RTOL);
}

static void test_layernorm(void **state) {
    (void)state;
    check_layer("layernorm", fsc_layernorm_new("ln", C, 1e-5f), LAYER_ATOL, LAYER_RTOL);
}

static void test_activations(void **state) {
    (void)state;
    check_layer("gelu", fsc_gelu_new("gelu"), LAYER_ATOL, LAYER_RTOL);
    check_layer("relu", fsc_relu_new("relu"), LAYER_ATOL, LAYER_RTOL);
}

static void test_attention(void **state) {
    (void)state;
    check_layer("attention", fsc_attention_new("attn", C, NH, 0.f, 1, 0.02f, 0.02f), LAYER_ATOL,
                LAYER_RTOL);
}

static void test_mlp(void **state) {
    (void)state;
    check_layer("mlp", fsc_mlp_new("mlp", C, 0.f, 2, 0.02f, 0.02f), LAYER_ATOL, LAYER_RTOL);
}

static void test_block(void **state) {
    (void)state;
    check_layer("block", fsc_block_new("block", C, NH, 0.f, 0, 2), DEEP_ATOL, DEEP_RTOL);
}

/* ---- loss ---------------------------------------------------------------------- */

static void test_cross_entropy(void **state) {
    (void)state;
    fsc_st_file *f = open_golden("golden_cross_entropy.safetensors");
    fsc_tensor logits = read_entry(f, "logits"), targets = read_entry(f, "targets");
    assert_int_equal(logits.ndim, 2);
    assert_int_equal(logits.shape[0], CE_N);
    assert_int_equal(logits.shape[1], CE_V);
    assert_int_equal(targets.dtype, FSC_DTYPE_I32);
    int64_t count = 0;
    for (int i = 0; i < CE_N; i++) count += ((int32_t *)targets.data)[i] != -100;
    float losses[CE_N];
    int64_t bad = 0;
    int64_t counted = fsc_crossentropy_fused(losses, logits.data, targets.data, CE_N, CE_V, -100,
                                             (float)(1.0 / (double)count), &bad);
    assert_int_equal(counted, count);
    assert_int_equal(bad, -1);
    double sum = 0;
    for (int i = 0; i < CE_N; i++) sum += losses[i];
    float loss = (float)(sum / (double)count);
    cmp_stats s = {.atol = LAYER_ATOL, .rtol = LAYER_RTOL};
    fsc_tensor l1 = fsc_tensor_1d(&loss, FSC_DTYPE_F32, 1);
    compare_named(&s, "cross_entropy", f, "loss", &l1);
    compare_named(&s, "cross_entropy", f, "dlogits", &logits); /* overwritten by the gradient */
    report("cross_entropy", &s);
    assert_int_equal(s.bad, 0);
    free(logits.data);
    free(targets.data);
    fsc_st_close(f);
}

/* ---- GPT --------------------------------------------------------------------------- */

static fsc_module *new_gpt(void) {
    fsc_gpt_config cfg = {.vocab = GPT_V,
                          .seq = GPT_T,
                          .layers = GPT_L,
                          .d_model = GPT_C,
                          .heads = GPT_NH,
                          .dropout = 0.f};
    fsc_module *m = fsc_gpt_new(&cfg);
    assert_non_null(m);
    return m;
}

/* Logits of the module's forward, then loss and every parameter gradient of
 * fsc_gpt_train_micro (mean over non-ignored targets, two of them ignored). */
static void test_gpt(void **state) {
    (void)state;
    fsc_module *m = new_gpt();
    fsc_params ps;
    fsc_st_file *f = open_golden_layer("golden_", "gpt", m, &ps);
    load_params(f, &ps, "", true);
    fsc_tensor x = read_entry(f, "x"), y = read_entry(f, "targets");
    assert_int_equal(x.shape[0], GPT_B);
    assert_int_equal(x.shape[1], GPT_T);
    int64_t count = 0;
    for (int i = 0; i < GPT_B * GPT_T; i++) count += ((int32_t *)y.data)[i] != -100;

    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true};
    cmp_stats s = {.atol = DEEP_ATOL, .rtol = DEEP_RTOL};
    fsc_tensor logits;
    void *saved = NULL;
    assert_int_equal(fsc_module_forward(m, &ctx, &x, &logits, &saved), FSC_OK);
    compare_named(&s, "gpt", f, "logits", &logits);

    fsc_arena_reset(arena);
    fsc_params_zero_grad(&ps);
    float loss = 0.f;
    int rc = fsc_gpt_train_micro(m, &ctx, x.data, y.data, GPT_B, GPT_T, -100, (double)count, &loss);
    if (rc) fprintf(stderr, "gpt train_micro: %s\n", fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    fsc_tensor l1 = fsc_tensor_1d(&loss, FSC_DTYPE_F32, 1);
    compare_named(&s, "gpt", f, "loss", &l1);
    compare_grads(&s, "gpt", f, &ps);
    report("gpt", &s);
    assert_int_equal(s.bad, 0);

    free(x.data);
    free(y.data);
    fsc_arena_free(arena);
    close_golden_layer(f, m, &ps);
}

/* 20 steps of AdamW(lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
 * >= 2-dim parameters) from torch's initial weights on torch's batches. */
static void test_train(void **state) {
    (void)state;
    fsc_module *m = new_gpt();
    fsc_params ps;
    fsc_st_file *f = open_golden_layer("golden_", "train", m, &ps);
    load_params(f, &ps, "", false);
    fsc_tensor xs = read_entry(f, "x"), ys = read_entry(f, "y"), want = read_entry(f, "losses");
    assert_int_equal(xs.ndim, 3);
    assert_int_equal(xs.shape[0], TR_STEPS);
    assert_int_equal(xs.shape[1], TR_B);
    assert_int_equal(xs.shape[2], TR_T);
    assert_true(fsc_tensor_same_shape(&xs, &ys));
    assert_int_equal(fsc_tensor_numel(&want), TR_STEPS);

    fsc_optim_range *r = NULL;
    int nr = 0;
    assert_int_equal(fsc_optim_ranges_from_params(&ps, &r, &nr), FSC_OK);
    fsc_optim_config cfg = {.kind = FSC_OPTIM_ADAMW,
                            .lr = 1e-3,
                            .beta1 = 0.9,
                            .beta2 = 0.95,
                            .eps = 1e-8,
                            .weight_decay = 0.1};
    fsc_optim *opt = fsc_optim_new(&cfg, r, nr);
    assert_non_null(opt);

    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true};
    const int32_t *x = xs.data, *y = ys.data;
    const float *losses = want.data;
    double max_rel = 0;
    int bad = 0;
    for (int step = 0; step < TR_STEPS; step++) {
        fsc_arena_reset(arena);
        fsc_optim_zero_grad(opt);
        ctx.step = step;
        float loss = 0.f;
        int64_t off = (int64_t)step * TR_B * TR_T;
        int rc = fsc_gpt_train_micro(m, &ctx, x + off, y + off, TR_B, TR_T, -100,
                                     (double)(TR_B * TR_T), &loss);
        if (rc) fprintf(stderr, "train step %d: %s\n", step, fsc_last_error());
        assert_int_equal(rc, FSC_OK);
        assert_int_equal(fsc_optim_step(opt), FSC_OK);
        double rel = fabs((double)loss - losses[step]) / fabs((double)losses[step]);
        if (rel > max_rel || isnan(rel)) max_rel = rel;
        if (!(rel <= TRAIN_LOSS_RTOL)) {
            bad++;
            fprintf(stderr, "train: loss of step %d: fsc %.9g torch %.9g rel diff %.3g > %.3g\n",
                    step, (double)loss, (double)losses[step], rel, TRAIN_LOSS_RTOL);
        }
    }
    printf("golden %-14s %d losses (%.4f -> %.4f), max rel diff %.3g (tol %g)\n", "train", TR_STEPS,
           (double)losses[0], (double)losses[TR_STEPS - 1], max_rel, TRAIN_LOSS_RTOL);

    cmp_stats s = {.atol = TRAIN_PARAM_ATOL, .rtol = TRAIN_PARAM_RTOL};
    cmp_stats key = {.atol = TRAIN_KEY_BIAS_ATOL, .rtol = 0};
    for (int i = 0; i < ps.count; i++) {
        const char *pname = ps.entries[i].name;
        char name[FSC_NAME_MAX * 3];
        snprintf(name, sizeof name, "final.%s", pname);
        fsc_tensor p = fsc_param_tensor(ps.entries[i].param);
        float *w = read_like(f, name, &p);
        size_t len = strlen(pname), suffix = strlen("attn.c_attn.bias");
        if (len >= suffix && strcmp(pname + len - suffix, "attn.c_attn.bias") == 0) {
            compare_range(&s, "train", name, p.data, w, 0, GPT_C);         /* q */
            compare_range(&key, "train", name, p.data, w, GPT_C, GPT_C);   /* k */
            compare_range(&s, "train", name, p.data, w, 2 * GPT_C, GPT_C); /* v */
        } else {
            compare(&s, "train", name, p.data, w, fsc_tensor_numel(&p));
        }
        free(w);
    }
    report("train params", &s);
    report("train key bias", &key);
    assert_int_equal(bad, 0);
    assert_int_equal(s.bad, 0);
    assert_int_equal(key.bad, 0);

    free(xs.data);
    free(ys.data);
    free(want.data);
    fsc_arena_free(arena);
    fsc_optim_free(opt);
    fsc_optim_ranges_free(r);
    fsc_params_free(&ps);
    fsc_module_free(m);
    fsc_st_close(f);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_linear), cmocka_unit_test(test_layernorm),
              cmocka_unit_test(test_activations), cmocka_unit_test(test_attention),
              cmocka_unit_test(test_mlp), cmocka_unit_test(test_block),
              cmocka_unit_test(test_cross_entropy), cmocka_unit_test(test_gpt),
              cmocka_unit_test(test_train))
