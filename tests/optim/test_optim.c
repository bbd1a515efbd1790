/* Optimizers and clipping: goldens from PyTorch 1.13, exact state
 * accounting, and the property sharding relies on (a range split in two steps
 * exactly as the whole).
 *
 * Goldens: tests/data/optim_golden.json, written by tests/reference/optim_ref.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "golden_json.h"
#include "test_main.h"

/* Parameters after each of 10 steps: float32 element-wise math in torch's
 * order, fused multiply-adds where torch fuses, so on a CPU with FMA the
 * results are bit-identical (FSC_TEST_VERBOSE=1 prints the worst relative
 * error); the tolerance leaves room for a CPU without FMA. */
static const double STEP_RTOL = 1e-6, STEP_ATOL = 1e-7;
static const double CLIP_RTOL = 1e-6, CLIP_ATOL = 1e-8;

#define MAX_TENSORS 8

/* ---- golden file ------------------------------------------------------------ */

static cJSON *golden;

static int load_golden(void **state) {
    (void)state;
    golden = golden_json("optim_golden.json");
    return golden ? 0 : -1;
}

static int free_golden(void **state) {
    (void)state;
    cJSON_Delete(golden);
    return 0;
}

static cJSON *field(const cJSON *obj, const char *name) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!v) fprintf(stderr, "golden: field '%s' missing\n", name);
    assert_non_null(v);
    return v;
}

static double num_or(const cJSON *obj, const char *name, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static bool bool_or(const cJSON *obj, const char *name, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* Reads a JSON array of n numbers into out. */
static void read_floats(const cJSON *arr, float *out, int64_t n) {
    assert_true(cJSON_IsArray(arr));
    assert_int_equal(cJSON_GetArraySize(arr), n);
    int64_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) out[i++] = (float)v->valuedouble;
}

/* The golden's tensors laid out in one flat buffer, one range per tensor. */
typedef struct {
    int count;
    int64_t numel[MAX_TENSORS], offset[MAX_TENSORS], total;
    bool decay[MAX_TENSORS];
    float *param, *grad, *expect;
    fsc_optim_range ranges[MAX_TENSORS];
} layout;

static void layout_make(layout *L) {
    memset(L, 0, sizeof *L);
    const cJSON *t;
    cJSON_ArrayForEach(t, field(golden, "tensors")) {
        assert_true(L->count < MAX_TENSORS);
        int64_t n = 1;
        const cJSON *d;
        cJSON_ArrayForEach(d, field(t, "shape")) n *= (int64_t)d->valuedouble;
        L->numel[L->count] = n;
        L->offset[L->count] = L->total;
        L->decay[L->count] = cJSON_IsTrue(field(t, "decay"));
        L->total += n;
        L->count++;
    }
    L->param = calloc((size_t)L->total, sizeof(float));
    L->grad = calloc((size_t)L->total, sizeof(float));
    L->expect = calloc((size_t)L->total, sizeof(float));
    assert_true(L->param && L->grad && L->expect);
    for (int i = 0; i < L->count; i++)
        L->ranges[i] = (fsc_optim_range){.param = L->param + L->offset[i],
                                         .grad = L->grad + L->offset[i],
                                         .n = L->numel[i],
                                         .decay = L->decay[i]};
}

static void layout_free(layout *L) {
    free(L->param);
    free(L->grad);
    free(L->expect);
}

/* Reads a list of per-tensor arrays (the golden's [tensor][element]) into buf. */
static void read_tensors(const layout *L, const cJSON *list, float *buf) {
    assert_int_equal(cJSON_GetArraySize(list), L->count);
    for (int i = 0; i < L->count; i++)
        read_floats(cJSON_GetArrayItem(list, i), buf + L->offset[i], L->numel[i]);
}

/* Returns the number of elements outside atol + rtol * |expect|, printing a few. */
static int compare(const char *what, int step, const float *got, const float *expect, int64_t n,
                   double rtol, double atol, double *worst_rel) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)expect[i]);
        double rel = d / fmax(fabs((double)expect[i]), 1e-30);
        if (worst_rel && rel > *worst_rel) *worst_rel = rel;
        if (!(d <= atol + rtol * fabs((double)expect[i]))) {
            if (bad < 5)
                fprintf(stderr, "%s step %d [%lld]: got %.9g expected %.9g\n", what, step,
                        (long long)i, (double)got[i], (double)expect[i]);
            bad++;
        }
    }
    return bad;
}

static fsc_optim_config config_from(const cJSON *c) {
    const char *kind = field(c, "kind")->valuestring;
    fsc_optim_config cfg = {0};
    cfg.kind = strcmp(kind, "sgd") == 0    ? FSC_OPTIM_SGD
               : strcmp(kind, "adam") == 0 ? FSC_OPTIM_ADAM
                                           : FSC_OPTIM_ADAMW;
    cfg.lr = field(c, "lr")->valuedouble;
    cfg.momentum = num_or(c, "momentum", 0);
    cfg.dampening = num_or(c, "dampening", 0);
    cfg.nesterov = bool_or(c, "nesterov", false);
    cfg.weight_decay = num_or(c, "weight_decay", 0);
    cfg.beta1 = num_or(c, "beta1", 0); /* 0: the default, 0.9 */
    cfg.beta2 = num_or(c, "beta2", 0);
    cfg.eps = num_or(c, "eps", 0);
    cfg.decay_all = bool_or(c, "decay_all", false);
    return cfg;
}

/* ---- goldens --------------------------------------------------------------- */

static void test_steps_match_torch(void **state) {
    (void)state;
    layout L;
    layout_make(&L);
    const cJSON *grads = field(golden, "grads");
    const cJSON *c;
    int ncases = 0;
    cJSON_ArrayForEach(c, field(golden, "cases")) {
        const char *name = field(c, "name")->valuestring;
        fsc_optim_config cfg = config_from(c);
        read_tensors(&L, field(golden, "init"), L.param);
        fsc_optim *o = fsc_optim_new(&cfg, L.ranges, L.count);
        if (!o) fprintf(stderr, "%s: %s\n", name, fsc_last_error());
        assert_non_null(o);
        const cJSON *lrs = cJSON_GetObjectItemCaseSensitive(c, "lrs");
        const cJSON *params = field(c, "params");
        int nsteps = cJSON_GetArraySize(params);
        assert_true(nsteps >= 10);
        double worst = 0;
        int bad = 0;
        for (int s = 0; s < nsteps; s++) {
            read_tensors(&L, cJSON_GetArrayItem(grads, s), L.grad);
            if (lrs)
                assert_int_equal(fsc_optim_set_lr(o, cJSON_GetArrayItem(lrs, s)->valuedouble), 0);
            assert_int_equal(fsc_optim_step(o), FSC_OK);
            assert_int_equal(fsc_optim_get_step(o), s + 1);
            read_tensors(&L, cJSON_GetArrayItem(params, s), L.expect);
            bad += compare(name, s + 1, L.param, L.expect, L.total, STEP_RTOL, STEP_ATOL, &worst);
        }
        if (getenv("FSC_TEST_VERBOSE")) fprintf(stderr, "%-24s worst rel %.3g\n", name, worst);
        assert_int_equal(bad, 0);
        fsc_optim_free(o);
        ncases++;
    }
    assert_true(ncases >= 8);
    layout_free(&L);
}

static void test_clip_matches_torch(void **state) {
    (void)state;
    layout L;
    layout_make(&L);
    const cJSON *c;
    int ncases = 0;
    cJSON_ArrayForEach(c, field(golden, "clip")) {
        float max_norm = (float)field(c, "max_norm")->valuedouble;
        bool inf = cJSON_IsString(field(c, "norm_type"));
        read_tensors(&L, field(c, "grads_in"), L.grad);
        float total = -1.f;
        int rc = inf ? fsc_clip_grad_norm_inf(L.ranges, L.count, max_norm, &total)
                     : fsc_clip_grad_norm(L.ranges, L.count, max_norm, &total);
        assert_int_equal(rc, FSC_OK);
        double want = field(c, "total_norm")->valuedouble;
        float want_f = (float)want;
        assert_int_equal(
            compare("clip norm", ncases, &total, &want_f, 1, CLIP_RTOL, CLIP_ATOL, NULL), 0);
        read_tensors(&L, field(c, "grads_out"), L.expect);
        assert_int_equal(
            compare("clip grads", ncases, L.grad, L.expect, L.total, CLIP_RTOL, CLIP_ATOL, NULL),
            0);
        ncases++;
    }
    assert_int_equal(ncases, 4);
    layout_free(&L);
}

/* ---- state accounting ----------------------------------------------------------- */

static void test_state_bytes_exact(void **state) {
    (void)state;
    enum { N1 = 1000, N2 = 37, N3 = 0 };
    static float p[N1 + N2], g[N1 + N2];
    fsc_optim_range r[3] = {{.param = p, .grad = g, .n = N1, .decay = true},
                            {.param = p + N1, .grad = g + N1, .n = N2},
                            {.param = NULL, .grad = NULL, .n = N3}};
    const fsc_optim_config cfgs[] = {
        {.kind = FSC_OPTIM_SGD, .lr = 0.1},
        {.kind = FSC_OPTIM_SGD, .lr = 0.1, .momentum = 0.9},
        {.kind = FSC_OPTIM_ADAM, .lr = 1e-3},
        {.kind = FSC_OPTIM_ADAMW, .lr = 1e-3, .weight_decay = 0.1},
    };
    const int K[] = {0, 1, 2, 2};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(fsc_optim_state_count(&cfgs[i]), K[i]);
        size_t before = fsc_mem_current(FSC_MEM_OPTIM);
        fsc_optim *o = fsc_optim_new(&cfgs[i], r, 3);
        assert_non_null(o);
        size_t want = (size_t)K[i] * sizeof(float) * (N1 + N2 + N3);
        assert_int_equal(fsc_optim_state_bytes(o), want);
        assert_int_equal(fsc_mem_current(FSC_MEM_OPTIM) - before, want);
        /* state views: range i at its own offset, n floats, zero before any step */
        for (int which = 0; which < K[i]; which++) {
            float *s0 = NULL, *s1 = NULL;
            assert_int_equal(fsc_optim_state(o, 0, which, &s0), FSC_OK);
            assert_int_equal(fsc_optim_state(o, 1, which, &s1), FSC_OK);
            assert_ptr_equal(s1, s0 + N1);
            for (int j = 0; j < N1; j++) assert_true(s0[j] == 0.0f);
        }
        float *none = (float *)1;
        assert_int_equal(fsc_optim_state(o, 0, K[i], &none), FSC_ERR_INVALID);
        assert_null(none);
        assert_non_null(strstr(fsc_last_error(), "which"));
        assert_int_equal(fsc_optim_state(o, 3, 0, &none), FSC_ERR_INVALID);
        assert_non_null(strstr(fsc_last_error(), "range_index"));
        fsc_optim_free(o);
        assert_int_equal(fsc_mem_current(FSC_MEM_OPTIM), before);
    }
    /* an optimizer over nothing (a rank that owns no shard) holds nothing */
    size_t before = fsc_mem_current(FSC_MEM_OPTIM);
    fsc_optim *o = fsc_optim_new(&cfgs[3], NULL, 0);
    assert_non_null(o);
    assert_int_equal(fsc_optim_state_bytes(o), 0);
    assert_int_equal(fsc_mem_current(FSC_MEM_OPTIM), before);
    assert_int_equal(fsc_optim_step(o), FSC_OK);
    fsc_optim_free(o);
    fsc_optim_free(NULL);
}

/* ---- sharding property -------------------------------------------------------- */

static void fill(float *x, int64_t n, uint64_t key, float std) {
    fsc_rng_normal_fill(x, n, 0, key, 0.0f, std);
}

/* An optimizer over two ranges that are the halves of one tensor steps exactly
 * as one over the whole tensor: what OSS and FSDP rely on. */
static void test_halves_equal_whole(void **state) {
    (void)state;
    enum { N = 40001, CUT = 12347, STEPS = 4 };
    const fsc_optim_config cfgs[] = {
        {.kind = FSC_OPTIM_ADAMW, .lr = 1e-2, .weight_decay = 0.1},
        {.kind = FSC_OPTIM_ADAM, .lr = 1e-2, .weight_decay = 0.01},
        {.kind = FSC_OPTIM_SGD,
         .lr = 0.05,
         .momentum = 0.9,
         .nesterov = true,
         .weight_decay = 0.01},
    };
    float *pw = malloc(N * sizeof(float)), *ph = malloc(N * sizeof(float));
    float *g = malloc(N * sizeof(float));
    assert_true(pw && ph && g);
    for (int c = 0; c < 3; c++) {
        fill(pw, N, 11, 1.0f);
        memcpy(ph, pw, N * sizeof(float));
        fsc_optim_range whole = {.param = pw, .grad = g, .n = N, .decay = true, .name = "w"};
        fsc_optim_range halves[2] = {
            {.param = ph, .grad = g, .n = CUT, .decay = true, .name = "w[0:cut]"},
            {.param = ph + CUT, .grad = g + CUT, .n = N - CUT, .decay = true, .name = "w[cut:]"},
        };
        fsc_optim *ow = fsc_optim_new(&cfgs[c], &whole, 1);
        fsc_optim *oh = fsc_optim_new(&cfgs[c], halves, 2);
        assert_true(ow && oh);
        assert_string_equal(fsc_optim_get_range(oh, 1)->name, "w[cut:]");
        assert_null(fsc_optim_get_range(oh, 2));
        for (int s = 0; s < STEPS; s++) {
            fill(g, N, 100 + (uint64_t)s, 0.1f);
            assert_int_equal(fsc_optim_step(ow), FSC_OK);
            assert_int_equal(fsc_optim_step(oh), FSC_OK);
        }
        assert_memory_equal(pw, ph, N * sizeof(float));
        for (int which = 0; which < fsc_optim_state_count(&cfgs[c]); which++) {
            float *sw, *s0, *s1;
            assert_int_equal(fsc_optim_state(ow, 0, which, &sw), FSC_OK);
            assert_int_equal(fsc_optim_state(oh, 0, which, &s0), FSC_OK);
            assert_int_equal(fsc_optim_state(oh, 1, which, &s1), FSC_OK);
            assert_memory_equal(sw, s0, CUT * sizeof(float));
            assert_memory_equal(sw + CUT, s1, (N - CUT) * sizeof(float));
        }
        fsc_optim_free(ow);
        fsc_optim_free(oh);
    }

    /* split clipping: local sums of squares combined, then each half scaled by
     * the global norm, equals clipping the whole */
    fill(g, N, 7, 0.1f);
    memcpy(pw, g, N * sizeof(float)); /* pw: a copy of the gradient */
    fsc_optim_range whole = {.param = ph, .grad = pw, .n = N};
    fsc_optim_range halves[2] = {{.param = ph, .grad = g, .n = CUT},
                                 {.param = ph + CUT, .grad = g + CUT, .n = N - CUT}};
    float total_whole;
    assert_int_equal(fsc_clip_grad_norm(&whole, 1, 1.0f, &total_whole), FSC_OK);
    double sq = fsc_grad_norm_sq(&halves[0], 1) + fsc_grad_norm_sq(&halves[1], 1);
    float total = (float)sqrt(sq);
    assert_true(fabsf(total - total_whole) <= 1e-6f * total_whole);
    assert_true(total > 1.0f); /* so the clip is exercised */
    assert_int_equal(fsc_clip_grads_scale(&halves[0], 1, 1.0f, total_whole), FSC_OK);
    assert_int_equal(fsc_clip_grads_scale(&halves[1], 1, 1.0f, total_whole), FSC_OK);
    assert_memory_equal(g, pw, N * sizeof(float));
    /* inf-norm: the max of local maxima */
    float m0 = fsc_grad_max_abs(&halves[0], 1), m1 = fsc_grad_max_abs(&halves[1], 1);
    assert_true(fmaxf(m0, m1) == fsc_grad_max_abs(&whole, 1));
    free(pw);
    free(ph);
    free(g);
}

static void test_nonfinite_norm_leaves_grads(void **state) {
    (void)state;
    float g[5] = {1, 2, NAN, 3, 4}, p[5] = {0};
    fsc_optim_range r = {.param = p, .grad = g, .n = 5};
    float total = 0;
    assert_int_equal(fsc_clip_grad_norm(&r, 1, 1.0f, &total), FSC_ERR_NUMERIC);
    assert_true(isnan(total));
    assert_true(g[0] == 1.0f && g[4] == 4.0f);
    assert_int_equal(fsc_clip_grad_norm_inf(&r, 1, 1.0f, &total), FSC_ERR_NUMERIC);
    assert_true(isnan(total));
    g[2] = INFINITY;
    assert_int_equal(fsc_clip_grad_norm_inf(&r, 1, 1.0f, &total), FSC_ERR_NUMERIC);
    assert_true(isinf(total));
    assert_true(g[1] == 2.0f);
    assert_int_equal(fsc_clip_grad_norm(&r, 1, -1.0f, &total), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "max_norm"));
}

/* ---- configuration and accessors -------------------------------------------- */

static void expect_refused(fsc_optim_config cfg, const fsc_optim_range *r, int n,
                           const char *needle) {
    fsc_clear_error();
    fsc_optim *o = fsc_optim_new(&cfg, r, n);
    if (o || !strstr(fsc_last_error(), needle))
        fprintf(stderr, "expected refusal naming '%s', got '%s'\n", needle, fsc_last_error());
    assert_null(o);
    assert_non_null(strstr(fsc_last_error(), needle));
}

static void test_bad_configs_refused(void **state) {
    (void)state;
    float p[4] = {0}, g[4] = {0};
    fsc_optim_range r = {.param = p, .grad = g, .n = 4, .name = "h.0.mlp.c_fc.weight"};
    const fsc_optim_config adam = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-3};
    const fsc_optim_config sgd = {.kind = FSC_OPTIM_SGD, .lr = 0.1};
    fsc_optim_config c;

    c = adam, c.lr = -1e-3;
    expect_refused(c, &r, 1, "lr");
    c = adam, c.lr = NAN;
    expect_refused(c, &r, 1, "lr");
    c = adam, c.beta1 = 1.0;
    expect_refused(c, &r, 1, "beta1");
    c = adam, c.beta2 = -0.5;
    expect_refused(c, &r, 1, "beta2");
    c = adam, c.beta2 = 1.5;
    expect_refused(c, &r, 1, "beta2");
    c = adam, c.eps = -1e-8;
    expect_refused(c, &r, 1, "eps");
    c = adam, c.weight_decay = -0.1;
    expect_refused(c, &r, 1, "weight_decay");
    c = adam, c.kind = (fsc_optim_kind)42;
    expect_refused(c, &r, 1, "kind");
    c = sgd, c.nesterov = true;
    expect_refused(c, &r, 1, "nesterov");
    c = sgd, c.nesterov = true, c.momentum = 0.9, c.dampening = 0.1;
    expect_refused(c, &r, 1, "dampening");
    c = sgd, c.momentum = -0.9;
    expect_refused(c, &r, 1, "momentum");

    /* bad ranges */
    fsc_optim_range nograd = r;
    nograd.grad = NULL;
    expect_refused(adam, &nograd, 1, "h.0.mlp.c_fc.weight");
    fsc_optim_range negative = r;
    negative.n = -4;
    expect_refused(adam, &negative, 1, "n -4");
    expect_refused(adam, NULL, 2, "ranges");

    /* defaults filled in; fields of the other kind ignored */
    fsc_optim_config resolved;
    c = adam, c.momentum = 0.9;
    assert_int_equal(fsc_optim_config_resolve(&c, &resolved), FSC_OK);
    assert_true(resolved.beta1 == 0.9 && resolved.beta2 == 0.999 && resolved.eps == 1e-8);
    assert_true(resolved.momentum == 0.0);

    /* accessors */
    fsc_optim *o = fsc_optim_new(&adam, &r, 1);
    assert_non_null(o);
    assert_int_equal(fsc_optim_num_ranges(o), 1);
    assert_true(fsc_optim_get_range(o, 0)->name != r.name); /* copied */
    assert_string_equal(fsc_optim_get_range(o, 0)->name, r.name);
    assert_int_equal(fsc_optim_set_lr(o, -1.0), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "lr"));
    assert_int_equal(fsc_optim_set_lr(o, 5e-4), FSC_OK);
    assert_true(fsc_optim_get_lr(o) == 5e-4);
    assert_true(fsc_optim_get_config(o).lr == 5e-4);
    assert_int_equal(fsc_optim_set_step(o, -2), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "step"));
    assert_int_equal(fsc_optim_set_step(o, 41), FSC_OK);
    assert_int_equal(fsc_optim_step(o), FSC_OK);
    assert_int_equal(fsc_optim_get_step(o), 42);
    g[0] = 1.0f;
    fsc_optim_zero_grad(o);
    assert_true(g[0] == 0.0f);
    fsc_optim_free(o);
}

/* Resuming: an optimizer given the saved state and step continues exactly as
 * the one that kept running. */
static void test_resume_from_state(void **state) {
    (void)state;
    enum { N = 300 };
    float pa[N], pb[N], g[N];
    const fsc_optim_config cfgs[] = {
        {.kind = FSC_OPTIM_ADAMW, .lr = 1e-2, .weight_decay = 0.1},
        {.kind = FSC_OPTIM_SGD, .lr = 0.05, .momentum = 0.9, .dampening = 0.2},
    };
    for (int c = 0; c < 2; c++) {
        fill(pa, N, 3, 1.0f);
        fsc_optim_range ra = {.param = pa, .grad = g, .n = N, .decay = true};
        fsc_optim *a = fsc_optim_new(&cfgs[c], &ra, 1);
        assert_non_null(a);
        for (int s = 0; s < 3; s++) {
            fill(g, N, 50 + (uint64_t)s, 0.1f);
            assert_int_equal(fsc_optim_step(a), FSC_OK);
        }
        memcpy(pb, pa, sizeof pa);
        fsc_optim_range rb = {.param = pb, .grad = g, .n = N, .decay = true};
        fsc_optim *b = fsc_optim_new(&cfgs[c], &rb, 1);
        assert_non_null(b);
        for (int which = 0; which < fsc_optim_state_count(&cfgs[c]); which++) {
            float *sa, *sb;
            assert_int_equal(fsc_optim_state(a, 0, which, &sa), FSC_OK);
            assert_int_equal(fsc_optim_state(b, 0, which, &sb), FSC_OK);
            memcpy(sb, sa, N * sizeof(float));
        }
        assert_int_equal(fsc_optim_set_step(b, fsc_optim_get_step(a)), FSC_OK);
        for (int s = 3; s < 6; s++) {
            fill(g, N, 50 + (uint64_t)s, 0.1f);
            assert_int_equal(fsc_optim_step(a), FSC_OK);
            assert_int_equal(fsc_optim_step(b), FSC_OK);
        }
        assert_memory_equal(pa, pb, sizeof pa);
        fsc_optim_free(a);
        fsc_optim_free(b);
    }
}

static void test_ranges_from_params(void **state) {
    (void)state;
    fsc_module *lin = fsc_linear_new("fc", 5, 3, true, FSC_WEIGHT_OUT_IN, 0.02f);
    assert_non_null(lin);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(lin, 1, true, &ps), FSC_OK);
    fsc_optim_range *r = NULL;
    int n = 0;
    assert_int_equal(fsc_optim_ranges_from_params(&ps, &r, &n), FSC_OK);
    assert_int_equal(n, ps.count);
    assert_int_equal(n, 2);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const fsc_param *p = ps.entries[i].param;
        assert_ptr_equal(r[i].param, p->data);
        assert_ptr_equal(r[i].grad, p->grad);
        assert_int_equal(r[i].n, p->numel);
        assert_int_equal(r[i].decay, p->weight_decay);
        assert_string_equal(r[i].name, ps.entries[i].name);
        total += r[i].n;
    }
    assert_int_equal(total, 5 * 3 + 3);
    assert_true(r[0].decay != r[1].decay); /* weight decays, bias does not */
    fsc_optim_config cfg = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-3, .weight_decay = 0.1};
    fsc_optim *o = fsc_optim_new(&cfg, r, n);
    assert_non_null(o);
    assert_int_equal(fsc_optim_state_bytes(o), 2 * sizeof(float) * (size_t)total);
    fsc_optim_free(o);
    fsc_optim_ranges_free(r);
    fsc_optim_ranges_free(NULL);

    fsc_params_free(&ps);
    fsc_module_free(lin);

    /* parameters with no storage bound are refused, naming the parameter */
    fsc_module *unbound = fsc_linear_new("fc", 5, 3, true, FSC_WEIGHT_OUT_IN, 0.02f);
    fsc_params listed;
    assert_int_equal(fsc_params_collect(unbound, &listed), FSC_OK);
    assert_int_equal(fsc_optim_ranges_from_params(&listed, &r, &n), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "weight"));
    assert_null(r);
    fsc_params_free(&listed);
    fsc_module_free(unbound);
}

FSC_TEST_MAIN(load_golden, free_golden, cmocka_unit_test(test_steps_match_torch),
              cmocka_unit_test(test_clip_matches_torch), cmocka_unit_test(test_state_bytes_exact),
              cmocka_unit_test(test_halves_equal_whole),
              cmocka_unit_test(test_nonfinite_norm_leaves_grads),
              cmocka_unit_test(test_bad_configs_refused), cmocka_unit_test(test_resume_from_state),
              cmocka_unit_test(test_ranges_from_params))
