/* The MoE MLP with every expert in this process: outputs, l_aux, drop counts
 * and every gradient against a dense PyTorch evaluation of the same rules
 * (tests/reference/moe_ref.py -> tests/data/moe_golden.json), with and
 * without capacity drops; routing by sequence, so a batch split into
 * micro-batches trains as one; the MoE GPT's names and parameter count
 * (GPT-2's, and the LLaMA family's Mixtral layout);
 * bad options refused by name, and cfg->moe by the builders of dense
 * MLPs only (pipeline stages, tensor parallelism). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "equivalence.h"
#include "golden_json.h"
#include "fsc/checkpoint_wrapper.h"
#include "fsc/gpt.h"
#include "fsc/moe_parallel.h"
#include "fsc/tp.h"

/* fp32 on both sides, different summation orders (BLAS vs torch): a few
 * ulps of the largest terms. */
static const double ATOL = 2e-5, RTOL = 1e-4;

static cJSON *golden;

static int load_golden(void **state) {
    (void)state;
    golden = golden_json("moe_golden.json");
    return golden ? 0 : -1;
}

static int free_golden(void **state) {
    (void)state;
    cJSON_Delete(golden);
    return 0;
}

static int num(const cJSON *c, const char *key) {
    return cJSON_GetObjectItem(c, key)->valueint;
}

/* Copies golden array `key` of c into dst (n floats, checked). */
static void read_floats(const cJSON *c, const char *key, float *dst, int64_t n) {
    const cJSON *a = cJSON_GetObjectItem(c, key);
    assert_non_null(a);
    assert_int_equal(cJSON_GetArraySize(a), n);
    int64_t i = 0;
    for (const cJSON *v = a->child; v; v = v->next) dst[i++] = (float)v->valuedouble;
}

/* Every element of got within tolerance of golden array `key`. */
static void expect_close(const char *what, const cJSON *c, const char *key, const float *got,
                         int64_t n) {
    float *want = malloc(sizeof(float) * (size_t)n);
    read_floats(c, key, want, n);
    int64_t bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        worst = fmax(worst, d);
        if (d > ATOL + RTOL * fabs(want[i])) {
            if (!bad)
                fprintf(stderr, "%s %s[%lld]: fsc %.9g torch %.9g\n", what, key, (long long)i,
                        got[i], want[i]);
            bad++;
        }
    }
    if (getenv("FSC_TEST_VERBOSE")) fprintf(stderr, "%s %s: max |diff| %.2e\n", what, key, worst);
    free(want);
    assert_int_equal(bad, 0);
}

static const char *EXPERT_KEYS[4] = {"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"};

static void golden_case(const cJSON *c) {
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    const int B = num(c, "B"), T = num(c, "T"), C = num(c, "C"), E = num(c, "E"), H = num(c, "H");
    fsc_moe_options o = {.experts = E,
                         .capacity_factor = (float)cJSON_GetObjectItem(c, "factor")->valuedouble,
                         .aux_coef = (float)cJSON_GetObjectItem(c, "aux")->valuedouble,
                         .hidden = H};
    fsc_module *m = fsc_moe_new("mlp", C, &o, 0.f, 0, 0.02f, 0.02f);
    assert_non_null(m);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 1, true, &ps), FSC_OK);
    assert_false(fsc_moe_params_sharded(&ps)); /* one process: experts are plain parameters */
    read_floats(c, "gate", fsc_params_find(&ps, "gate.weight")->param->data, (int64_t)E * C);
    const cJSON *experts = cJSON_GetObjectItem(c, "experts");
    for (int e = 0; e < E; e++)
        for (int k = 0; k < 4; k++) {
            char full[96];
            snprintf(full, sizeof full, "experts.%d.%s", e, EXPERT_KEYS[k]);
            fsc_param *p = fsc_params_find(&ps, full)->param;
            read_floats(cJSON_GetArrayItem(experts, e), EXPERT_KEYS[k], p->data, p->numel);
        }
    const int64_t n = (int64_t)B * T * C;
    float *xd = malloc(sizeof(float) * (size_t)n), *dyd = malloc(sizeof(float) * (size_t)n);
    read_floats(c, "x", xd, n);
    read_floats(c, "dy", dyd, n);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    fsc_ctx ctx = {.arena = arena, .training = true};
    fsc_tensor x = fsc_tensor_make(xd, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C}), y, dx;
    fsc_tensor dy = fsc_tensor_make(dyd, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
    void *saved;
    assert_int_equal(fsc_module_forward(m, &ctx, &x, &y, &saved), FSC_OK);
    expect_close(name, c, "y", y.data, n);
    fsc_moe_stats st = fsc_moe_get_stats(m);
    assert_int_equal(st.tokens, (int64_t)B * T);
    assert_int_equal(st.rows, B);
    assert_int_equal(st.dropped1, num(c, "dropped1"));
    assert_int_equal(st.dropped2, num(c, "dropped2"));
    assert_true(fabs(st.aux_sum / st.rows - cJSON_GetObjectItem(c, "l_aux")->valuedouble) < 1e-6);
    assert_int_equal(st.exchanges, 0);
    fsc_params_zero_grad(&ps);
    assert_int_equal(fsc_module_backward(m, &ctx, saved, &dy, &dx), FSC_OK);
    expect_close(name, c, "dx", dx.data, n);
    expect_close(name, c, "dgate", fsc_params_find(&ps, "gate.weight")->param->grad,
                 (int64_t)E * C);
    for (int e = 0; e < E; e++)
        for (int k = 0; k < 4; k++) {
            char full[96], key[32];
            snprintf(full, sizeof full, "experts.%d.%s", e, EXPERT_KEYS[k]);
            snprintf(key, sizeof key, "d%s", EXPERT_KEYS[k]);
            fsc_param *p = fsc_params_find(&ps, full)->param;
            expect_close(full, cJSON_GetArrayItem(experts, e), key, p->grad, p->numel);
        }
    fsc_moe_reset_stats(m);
    assert_int_equal(fsc_moe_get_stats(m).tokens, 0);
    free(xd), free(dyd);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

static void test_golden_drops(void **state) {
    (void)state;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(golden, "cases"), 0);
    assert_true(num(c, "dropped1") > 0 && num(c, "dropped2") > 0); /* both rules exercised */
    golden_case(c);
}

static void test_golden_no_drops(void **state) {
    (void)state;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(golden, "cases"), 1);
    assert_int_equal(num(c, "dropped1") + num(c, "dropped2"), 0);
    golden_case(c);
}

static fsc_moe_options GPT_MOE = {
    .experts = 4, .every = 2, .capacity_factor = 1.0f, .aux_coef = 0.01f};
static const fsc_gpt_config GPT = {
    .vocab = 64, .seq = 16, .layers = 2, .d_model = 32, .heads = 4, .moe = &GPT_MOE};

/* Gradients of a 4-row batch: one micro-batch or `micro` accumulated; with
 * every block's activations recomputed in backward when `recompute`; the
 * rows taken in another order when `shift` > 0 (row i is the batch's row
 * (i + shift) % 4, reversed when `shift` is 4): the same loss, another
 * summation order of every gradient. */
static float *grads_of(int micro, bool recompute, int shift, int64_t *numel) {
    fsc_module *m = fsc_gpt_new(&GPT);
    for (int c = 0; recompute && c < m->nchildren; c++)
        if (!strncmp(m->children[c]->name, "h.", 2))
            assert_int_equal(fsc_checkpoint_wrap(m->children[c]), FSC_OK);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 3, true, &ps), FSC_OK);
    enum { G = 4, T = 16 };
    int32_t x[G * T], y[G * T];
    for (int i = 0; i < G * T; i++) {
        const int r = shift == G ? G - 1 - i / T : (i / T + shift) % G, j = r * T + i % T;
        x[i] = (j * 13 + j / 7) % 64, y[i] = (j * 5 + 3) % 64;
    }
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    fsc_params_zero_grad(&ps);
    const int B = G / micro;
    for (int k = 0; k < micro; k++) {
        fsc_arena_reset(arena);
        fsc_ctx ctx = {.arena = arena, .training = true, .keyed = true, .sample0 = k * B};
        float loss;
        assert_int_equal(fsc_gpt_train_micro(m, &ctx, x + k * B * T, y + k * B * T, B, T, -1,
                                             (double)G * T, &loss),
                         FSC_OK);
    }
    float *g = malloc(sizeof(float) * (size_t)ps.numel);
    memcpy(g, ps.grad, sizeof(float) * (size_t)ps.numel);
    *numel = ps.numel;
    /* a recomputed forward is not a new one: routing counted once per token */
    assert_int_equal(fsc_moe_get_stats(m).tokens, (int64_t)G * T);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(m);
    return g;
}

/* eq_noise for the one-micro-batch gradients g1: their spread against the
 * same batch as one micro-batch with its rows in two other orders (rotated,
 * reversed), per row of each tensor and at least its median row's, as
 * tests/support/equivalence.h measures it. Neither variant splits the batch, so a
 * per-call grouping or normaliser (what the split tests look for) cannot
 * widen the floor. */
static void grads_noise(const float *g1) {
    int64_t n;
    float *alt[2] = {grads_of(1, false, 1, &n), grads_of(1, false, 4, &n)};
    fsc_module *m = fsc_gpt_new(&GPT);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 3, true, &ps), FSC_OK);
    assert_int_equal(ps.numel, n);
    assert_true(n <= EQ_MAX_NUMEL);
    eq_set_noise(&ps, g1, alt, 2);
    fsc_params_free(&ps);
    fsc_module_free(m);
    free(alt[0]), free(alt[1]);
}

/* Routing groups are sequences, and l_aux is normalised by the global
 * target count: 4 micro-batches of one row give one 4-row batch's
 * gradients (a per-call grouping or normaliser would not), within
 * equivalence.h's bound around the noise floor grads_noise measures. */
static void test_split_batch_equal(void **state) {
    (void)state;
    int64_t n1, n4;
    float *g1 = grads_of(1, false, 0, &n1), *g4 = grads_of(4, false, 0, &n4);
    assert_int_equal(n1, n4);
    grads_noise(g1);
    assert_int_equal(eq_compare("4 micro-batches vs one", g4, g1, n1), 0);
    free(g1), free(g4);
}

/* Activation checkpointing re-runs the MoE forward inside backward: the
 * same routing, the same gradients (within the same bound). */
static void test_recompute_equal(void **state) {
    (void)state;
    int64_t n1, n2;
    float *g1 = grads_of(1, false, 0, &n1), *g2 = grads_of(1, true, 0, &n2);
    assert_int_equal(n1, n2);
    grads_noise(g1);
    assert_int_equal(eq_compare("recomputed vs stored activations", g2, g1, n1), 0);
    free(g1), free(g2);
}

/* Gating stays fp32 under bf16 autocast (the experts' GEMMs do not): the
 * routing, its drops and l_aux are exactly the fp32 ones. */
static void test_bf16_gating_fp32(void **state) {
    (void)state;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(golden, "cases"), 0);
    const int B = num(c, "B"), T = num(c, "T"), C = num(c, "C"), E = num(c, "E");
    fsc_moe_options o = {.experts = E, .capacity_factor = 1.0f, .hidden = num(c, "H")};
    fsc_module *m = fsc_moe_new("mlp", C, &o, 0.f, 0, 0.02f, 0.02f);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 1, true, &ps), FSC_OK);
    read_floats(c, "gate", fsc_params_find(&ps, "gate.weight")->param->data, (int64_t)E * C);
    const int64_t n = (int64_t)B * T * C;
    float *xd = malloc(sizeof(float) * (size_t)n);
    read_floats(c, "x", xd, n);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    fsc_tensor x = fsc_tensor_make(xd, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C}), y;
    fsc_moe_stats st[2];
    for (int k = 0; k < 2; k++) {
        fsc_ctx ctx = {
            .arena = arena, .training = true, .autocast = k ? FSC_DTYPE_BF16 : FSC_DTYPE_F32};
        fsc_moe_reset_stats(m);
        assert_int_equal(fsc_module_forward(m, &ctx, &x, &y, NULL), FSC_OK);
        st[k] = fsc_moe_get_stats(m);
    }
    assert_int_equal(st[0].dropped1, num(c, "dropped1"));
    assert_int_equal(st[1].dropped1, st[0].dropped1);
    assert_int_equal(st[1].dropped2, st[0].dropped2);
    assert_true(st[1].aux_sum == st[0].aux_sum);
    free(xd);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

static void test_gpt_names_and_count(void **state) {
    (void)state;
    fsc_module *m = fsc_gpt_new(&GPT);
    assert_non_null(m);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 3, false, &ps), FSC_OK);
    assert_non_null(fsc_params_find(&ps, "h.0.mlp.c_fc.weight")); /* block 0 stays dense */
    assert_null(fsc_params_find(&ps, "h.1.mlp.c_fc.weight"));
    assert_non_null(fsc_params_find(&ps, "h.1.mlp.gate.weight"));
    assert_non_null(fsc_params_find(&ps, "h.1.mlp.experts.3.c_proj.bias"));
    int64_t total = 0;
    for (int i = 0; i < ps.count; i++) total += ps.entries[i].param->numel;
    assert_int_equal(total, fsc_gpt_num_params(&GPT));
    assert_int_equal(fsc_moe_ep_size(m), 1);
    /* a dense GPT is untouched by the new field */
    fsc_gpt_config dense = GPT;
    dense.moe = NULL;
    assert_true(fsc_gpt_num_params(&dense) < total);
    assert_int_equal(fsc_moe_ep_size(NULL), 0);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

/* The LLaMA family's MoE is Mixtral's layout: block_sparse_moe with a
 * bias-free gate and SwiGLU experts w1, w3 (H,C) and w2 (C,H), as wide as
 * the dense MLP unless moe.hidden says otherwise; dense layers keep mlp. The
 * count is fsc_gpt_num_params's, and a token's FLOPs count two experts. */
static void test_llama_names_and_count(void **state) {
    (void)state;
    fsc_moe_options o = {.experts = 4, .every = 2, .capacity_factor = 4.0f};
    fsc_gpt_config c = EQ_LLAMA_MOE; /* C 32, F 48 */
    c.moe = &o;
    fsc_module *m = fsc_gpt_new(&c);
    assert_non_null(m);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 3, false, &ps), FSC_OK);
    assert_non_null(fsc_params_find(&ps, "model.layers.0.mlp.gate_proj.weight"));
    assert_null(fsc_params_find(&ps, "model.layers.1.mlp.gate_proj.weight"));
    const struct {
        const char *name;
        int64_t rows, cols;
    } want[] = {{"model.layers.1.block_sparse_moe.gate.weight", 4, 32},
                {"model.layers.1.block_sparse_moe.experts.3.w1.weight", 48, 32},
                {"model.layers.1.block_sparse_moe.experts.3.w3.weight", 48, 32},
                {"model.layers.1.block_sparse_moe.experts.3.w2.weight", 32, 48}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const fsc_param_entry *p = fsc_params_find(&ps, want[i].name);
        if (!p) fprintf(stderr, "missing %s\n", want[i].name);
        assert_non_null(p);
        assert_int_equal(p->param->shape[0], want[i].rows);
        assert_int_equal(p->param->shape[1], want[i].cols);
    }
    int64_t total = 0, biases = 0;
    for (int i = 0; i < ps.count; i++) {
        total += ps.entries[i].param->numel;
        biases += strstr(ps.entries[i].name, ".bias") != NULL;
    }
    assert_int_equal(biases, 0);
    assert_int_equal(total, fsc_gpt_num_params(&c));
    fsc_gpt_config dense = c;
    dense.moe = NULL; /* one MoE layer: gate 4C and 4 experts for one 3CF MLP */
    assert_int_equal(total - fsc_gpt_num_params(&dense), 4 * 32 + 3 * (3 * 32 * 48));
    assert_true(fabs(fsc_gpt_flops_per_token(&c, 8) - fsc_gpt_flops_per_token(&dense, 8) -
                     6.0 * (4 * 32 + 3 * 32 * 48)) < 1e-6);
    fsc_params_free(&ps);
    fsc_module_free(m);
    o.hidden = 40; /* experts of their own width */
    m = fsc_gpt_new(&c);
    assert_non_null(m);
    assert_int_equal(fsc_params_bind(m, 3, false, &ps), FSC_OK);
    assert_int_equal(fsc_params_find(&ps, "model.layers.1.block_sparse_moe.experts.0.w2.weight")
                         ->param->shape[1],
                     40);
    total = 0;
    for (int i = 0; i < ps.count; i++) total += ps.entries[i].param->numel;
    assert_int_equal(total, fsc_gpt_num_params(&c));
    fsc_params_free(&ps);
    fsc_module_free(m);
    /* pipeline stages and tensor parallelism build dense layers only: refused */
    assert_null(fsc_gpt_stage_new(&c, 0, c.layers + 2));
    assert_non_null(strstr(fsc_last_error(), "cfg->moe asks for 4 experts"));
    const fsc_tp_options tp = {0};
    assert_null(fsc_tp_gpt_new(&c, &tp));
    assert_non_null(strstr(fsc_last_error(), "cfg->moe asks for 4 experts"));
}

static void expect_refused(fsc_moe_options o, const char *needle) {
    assert_null(fsc_moe_new("mlp", 8, &o, 0.f, 0, 0.02f, 0.02f));
    if (!strstr(fsc_last_error(), needle)) fprintf(stderr, "message: %s\n", fsc_last_error());
    assert_non_null(strstr(fsc_last_error(), needle));
}

static void test_bad_options(void **state) {
    (void)state;
    expect_refused((fsc_moe_options){.experts = 1}, "experts 1");
    expect_refused((fsc_moe_options){.experts = 4, .capacity_factor = -1}, "capacity factor");
    expect_refused((fsc_moe_options){.experts = 4, .capacity_factor = NAN}, "capacity factor");
    expect_refused((fsc_moe_options){.experts = 4, .aux_coef = -0.5f}, "aux_coef");
    expect_refused((fsc_moe_options){.experts = 3, .ep = {.ranks = 2}}, "do not divide");
    expect_refused((fsc_moe_options){.experts = 4, .ep = {.ranks = 2, .rank = 0}}, "alltoall");
    expect_refused((fsc_moe_options){.experts = 4, .expert = (fsc_moe_expert)7}, "expert kind 7");
    fsc_gpt_config bad = GPT;
    fsc_moe_options o = {.experts = 4, .hidden = -3};
    bad.moe = &o;
    assert_null(fsc_gpt_new(&bad));
    assert_non_null(strstr(fsc_last_error(), "hidden"));
}

/* The builders with dense MLPs only refuse cfg->moe by name, not ignore it. */
static void test_dense_builders_refuse(void **state) {
    (void)state;
    const fsc_tp_options tp = {0};
    fsc_module *made[3] = {fsc_gpt_stage_new(&GPT, 0, GPT.layers + 2), NULL, NULL};
    const char *msg[3] = {NULL};
    msg[0] = strstr(fsc_last_error(), "fsc_gpt_stage_new (pipeline stages)");
    made[1] = fsc_tp_gpt_new(&GPT, &tp);
    msg[1] = strstr(fsc_last_error(), "fsc_tp_gpt_new (tensor parallelism)");
    made[2] = fsc_tp_gpt_stage_new(&GPT, 1, 2, &tp);
    msg[2] = strstr(fsc_last_error(), "fsc_tp_gpt_stage_new (tensor parallelism)");
    for (int i = 0; i < 3; i++) {
        assert_null(made[i]);
        assert_non_null(msg[i]);
    }
    assert_non_null(strstr(fsc_last_error(), "cfg->moe asks for 4 experts"));
    fsc_gpt_config dense = GPT; /* experts 0 means dense: still built */
    fsc_moe_options none = {0};
    dense.moe = &none;
    fsc_module *m = fsc_gpt_stage_new(&dense, 0, 2);
    assert_non_null(m);
    fsc_module_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_drops),          cmocka_unit_test(test_golden_no_drops),
        cmocka_unit_test(test_split_batch_equal),     cmocka_unit_test(test_recompute_equal),
        cmocka_unit_test(test_bf16_gating_fp32),      cmocka_unit_test(test_gpt_names_and_count),
        cmocka_unit_test(test_bad_options),           cmocka_unit_test(test_dense_builders_refuse),
        cmocka_unit_test(test_llama_names_and_count),
    };
    return cmocka_run_group_tests(tests, load_golden, free_golden);
}
