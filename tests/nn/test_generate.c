/* Generation: the KV cache's logits equal the full forward's at every
 * position (prefilled in one go or appended token by token) within the
 * forward's measured noise floor (logits_noise below, tests/support/equivalence.h's
 * method; not a fixed tolerance, which would hold one CPU's rounding), its limits are
 * refused clearly, and sampling is greedy at temperature 0, reproducible by
 * (seed, index) and confined to the top k. A Mixture-of-Experts GPT (dense
 * and MoE blocks, every token kept) gives the same logits through the cache
 * within the forward's measured noise floor (tests/support/equivalence.h), and the
 * same sampled ids; a layer that could drop tokens, or holds only some of
 * its experts, is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/gpt.h"
#include "fsc/moe.h"
#include "test_main.h"

static const fsc_gpt_config CFG = {.vocab = 50, .seq = 16, .layers = 3, .d_model = 32, .heads = 4};

typedef struct {
    const fsc_gpt_config *cfg;
    fsc_module *gpt;
    fsc_params ps;
    fsc_arena *arena;
} model;

static void model_new_cfg(model *m, const fsc_gpt_config *cfg) {
    m->cfg = cfg;
    m->gpt = fsc_gpt_new(cfg);
    assert_non_null(m->gpt);
    assert_int_equal(fsc_params_bind(m->gpt, 42, false, &m->ps), FSC_OK);
    /* larger weights than the init's 0.02 so attention is far from uniform */
    for (int64_t i = 0; i < m->ps.numel; i++) m->ps.data[i] *= 8.f;
    m->arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
}

static void model_new(model *m) {
    model_new_cfg(m, &CFG);
}

static void model_free(model *m) {
    fsc_arena_free(m->arena);
    fsc_params_free(&m->ps);
    fsc_module_free(m->gpt);
}

/* logits (B,T,V) of the module forward on ids (B,T). */
static void forward_batch(model *m, const int32_t *ids, int B, int T, float *out) {
    fsc_arena_reset(m->arena);
    fsc_ctx ctx = {.arena = m->arena, .training = false};
    fsc_tensor x = fsc_tensor_2d((void *)ids, FSC_DTYPE_I32, B, T), y;
    void *saved;
    assert_int_equal(fsc_module_forward(m->gpt, &ctx, &x, &y, &saved), FSC_OK);
    memcpy(out, y.data, sizeof(float) * (size_t)B * T * m->cfg->vocab);
}

/* logits (T,V) of the module forward on ids[0..T). */
static void full_forward(model *m, const int32_t *ids, int T, float *out) {
    forward_batch(m, ids, 1, T, out);
}

static void logits_noise(model *m, const int32_t *ids, int T, const float *ref);

/* Row t of the logits (T,V) against the full forward's row t, within
 * equivalence.h's bound from the noise floor logits_noise measured on the
 * full forward's (ids, T): eq_noise[t * V + v]. */
static void expect_close(const float *got, const float *full, int V, const char *what, int t) {
    int64_t bad = 0, worst = 0;
    double worst_r = 0;
    for (int v = 0; v < V; v++) {
        const int64_t i = (int64_t)t * V + v;
        const double r = fabs((double)got[v] - full[i]) / eq_tolerance(i, full[i]);
        if (r > worst_r) worst_r = r, worst = v;
        bad += r > 1;
    }
    if (bad)
        fail_msg("%s, position %d: %lld logits outside the bound; token %lld: %.8g vs %.8g "
                 "(bound %.2e, noise floor %.2e)",
                 what, t, (long long)bad, (long long)worst, got[worst], full[t * V + worst],
                 eq_tolerance((int64_t)t * V + worst, full[t * V + worst]),
                 eq_noise[(int64_t)t * V + worst]);
}

/* A cache for m, filled with ids[0..T): a prefill of `prefill` positions
 * with every position's logits, then one token at a time, each compared
 * with the full forward's (left in full, its noise floor in eq_noise). */
static fsc_gpt_kv *decode_and_compare(model *m, const int32_t *ids, int T, int prefill, float *full,
                                      float *got, const char *what) {
    const int V = m->cfg->vocab;
    full_forward(m, ids, T, full);
    logits_noise(m, ids, T, full);
    fsc_gpt_kv *kv = fsc_gpt_kv_new(m->gpt, m->cfg);
    assert_non_null(kv);
    char label[64];
    assert_int_equal(fsc_gpt_kv_append(kv, ids, prefill, got, true), FSC_OK);
    snprintf(label, sizeof label, "%s prefill", what);
    for (int t = 0; t < prefill; t++) expect_close(got + t * V, full, V, label, t);
    snprintf(label, sizeof label, "%s incremental", what);
    for (int t = prefill; t < T; t++) {
        assert_int_equal(fsc_gpt_kv_append(kv, ids + t, 1, got, false), FSC_OK);
        expect_close(got, full, V, label, t);
    }
    return kv;
}

static void test_kv_matches_full_forward(void **state) {
    (void)state;
    model m;
    model_new(&m);
    enum { T = 16 };
    const int V = CFG.vocab;
    int32_t ids[T];
    for (int i = 0; i < T; i++) ids[i] = (i * 17 + 3) % V;
    float *full = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * T * V);
    fsc_gpt_kv *kv = decode_and_compare(&m, ids, T, 5, full, got, "GPT-2");
    assert_int_equal(fsc_gpt_kv_len(kv), T);
    /* full: one more position is refused, naming the limit */
    assert_int_equal(fsc_gpt_kv_append(kv, ids, 1, got, false), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "exceed the model's 16"));
    /* after a reset the cache gives a shorter context's logits again */
    fsc_gpt_kv_reset(kv);
    assert_int_equal(fsc_gpt_kv_append(kv, ids + 4, 7, got, false), FSC_OK);
    full_forward(&m, ids + 4, 7, full);
    logits_noise(&m, ids + 4, 7, full);
    expect_close(got, full, V, "after reset", 6);
    int32_t bad = V;
    assert_int_equal(fsc_gpt_kv_append(kv, &bad, 1, got, false), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "outside vocab"));
    fsc_gpt_kv_free(kv);
    free(full), free(got);
    model_free(&m);
}

static void test_kv_refuses_other_models(void **state) {
    (void)state;
    model m;
    model_new(&m);
    fsc_gpt_config other = CFG;
    other.d_model = 64;
    assert_null(fsc_gpt_kv_new(m.gpt, &other));
    assert_non_null(strstr(fsc_last_error(), "the model is L3 C32"));
    fsc_module *lin = fsc_linear_new("lin", 4, 4, true, FSC_WEIGHT_IN_OUT, 0.02f);
    assert_null(fsc_gpt_kv_new(lin, &CFG));
    assert_non_null(strstr(fsc_last_error(), "not a whole one-process model"));
    fsc_module_free(lin);
    fsc_module *unbound = fsc_gpt_new(&CFG);
    assert_null(fsc_gpt_kv_new(unbound, &CFG));
    fsc_module_free(unbound);
    fsc_gpt_kv_free(NULL);
    model_free(&m);
}

static void test_sampling(void **state) {
    (void)state;
    enum { V = 10 };
    float logits[V] = {0.1f, 2.0f, -1.f, 1.9f, 0.f, 0.5f, 1.8f, -3.f, 0.2f, 0.3f}, work[V];
    assert_int_equal(fsc_gpt_sample(logits, V, 0.f, 0, 1, 0, work), 1); /* greedy */
    for (int i = 0; i < 50; i++) /* top_k 1 is greedy at any temperature */
        assert_int_equal(fsc_gpt_sample(logits, V, 5.f, 1, 3, i, work), 1);
    int seen[V] = {0};
    for (int i = 0; i < 2000; i++) {
        int32_t a = fsc_gpt_sample(logits, V, 1.f, 3, 7, i, work);
        assert_int_equal(a, fsc_gpt_sample(logits, V, 1.f, 3, 7, i, work)); /* (seed, index) */
        seen[a]++;
    }
    for (int i = 0; i < V; i++) /* only the top 3: ids 1, 3, 6, each drawn */
        if ((i == 1 || i == 3 || i == 6) != (seen[i] > 0))
            fail_msg("top-k 3: token %d drawn %d times", i, seen[i]);
    int differ = 0;
    for (int i = 0; i < 100; i++)
        differ += fsc_gpt_sample(logits, V, 1.f, 0, 7, i, work) !=
                  fsc_gpt_sample(logits, V, 1.f, 0, 8, i, work);
    assert_true(differ > 10); /* another seed, other draws */
}

/* ---- Mixture of Experts ---------------------------------------------------------------------- */

/* Blocks 1 and 3 are MoE (4 experts, 48 wide), 0 and 2 dense. Capacity
 * factor = experts: capacity T per row, so the full forward drops nothing,
 * as the cache never does (what fsc-sample builds). */
static const fsc_moe_options MOE = {.experts = 4, .every = 2, .capacity_factor = 4.f, .hidden = 48};
static const fsc_gpt_config MOE_CFG = {
    .vocab = 50, .seq = 16, .layers = 4, .d_model = 32, .heads = 4, .moe = &MOE};

/* Elements of got outside equivalence.h's bound around want (eq_noise set). */
static int64_t outside(const float *got, const float *want, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += fabs((double)got[i] - want[i]) > eq_tolerance(i, want[i]);
    return bad;
}

/* eq_noise for the full forward's logits ref (T,V): the spread between it and
 * two other legal evaluations of the same positions, the sequence as row 1 of
 * a batch of two, and each position as the last of its own prefix (shorter
 * attention and routing); per position the largest spread of its row, and at
 * least the median row's, as equivalence.h does for parameters. */
static void logits_noise(model *m, const int32_t *ids, int T, const float *ref) {
    const int V = m->cfg->vocab;
    float *batch = malloc(sizeof(float) * 2 * T * V), *prefix = malloc(sizeof(float) * T * V);
    int32_t *two = malloc(sizeof(int32_t) * 2 * T);
    float rows[64];
    assert_true(batch && prefix && two && T <= 64 && (int64_t)T * V <= EQ_MAX_NUMEL);
    for (int t = 0; t < T; t++) two[t] = (t * 5 + 1) % V, two[T + t] = ids[t];
    forward_batch(m, two, 2, T, batch);
    for (int t = 0; t < T; t++) {
        full_forward(m, ids, t + 1, prefix);
        float spread = 0;
        for (int v = 0; v < V; v++) {
            const float r = ref[t * V + v];
            spread = fmaxf(spread, fabsf(batch[(T + t) * V + v] - r));
            spread = fmaxf(spread, fabsf(prefix[t * V + v] - r));
        }
        rows[t] = spread;
        for (int v = 0; v < V; v++) eq_noise[t * V + v] = spread;
    }
    qsort(rows, (size_t)T, sizeof *rows, eq_cmp_float);
    for (int i = 0; i < T * V; i++) eq_noise[i] = fmaxf(eq_noise[i], rows[T / 2]);
    free(batch), free(prefix), free(two);
}

static void test_moe_kv_matches_full_forward(void **state) {
    (void)state;
    model m;
    model_new_cfg(&m, &MOE_CFG);
    enum { T = 16 };
    const int V = MOE_CFG.vocab;
    int32_t ids[T];
    for (int i = 0; i < T; i++) ids[i] = (i * 17 + 3) % V;
    float *full = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * T * V);
    full_forward(&m, ids, T, full);
    logits_noise(&m, ids, T, full);
    fsc_gpt_kv *kv = fsc_gpt_kv_new(m.gpt, &MOE_CFG);
    assert_non_null(kv);
    /* token by token (one token per MoE step), a prefill of 5 then single
     * tokens, and one prefill of all 16 (16 tokens routed at once) */
    for (int t = 0; t < T; t++)
        assert_int_equal(fsc_gpt_kv_append(kv, ids + t, 1, got + t * V, false), FSC_OK);
    assert_int_equal(eq_compare("MoE KV cache, token by token", got, full, T * V), 0);
    fsc_gpt_kv_reset(kv);
    assert_int_equal(fsc_gpt_kv_append(kv, ids, 5, got, true), FSC_OK);
    for (int t = 5; t < T; t++)
        assert_int_equal(fsc_gpt_kv_append(kv, ids + t, 1, got + t * V, false), FSC_OK);
    assert_int_equal(eq_compare("MoE KV cache, prefill 5 then 1 by 1", got, full, T * V), 0);
    fsc_gpt_kv_reset(kv);
    assert_int_equal(fsc_gpt_kv_append(kv, ids, T, got, true), FSC_OK);
    assert_int_equal(eq_compare("MoE KV cache, prefill 16", got, full, T * V), 0);
    /* the bound has power: every expert of every MoE layer is some token's
     * choice here, so a nudge to any one expert's output bias moves the
     * logits past it (a cache that skipped the MoE MLP or took another
     * expert would be caught) */
    for (int l = 1; l < MOE_CFG.layers; l += 2)
        for (int e = 0; e < MOE.experts; e++) {
            char name[64];
            snprintf(name, sizeof name, "h.%d.mlp.experts.%d.c_proj.bias", l, e);
            fsc_param_entry *pe = fsc_params_find(&m.ps, name);
            assert_non_null(pe);
            pe->param->data[0] += 0.5f;
            full_forward(&m, ids, T, got);
            pe->param->data[0] -= 0.5f;
            if (!outside(got, full, T * V)) fail_msg("%s: no token reaches this expert", name);
        }
    fsc_gpt_kv_free(kv);
    free(full), free(got);
    model_free(&m);
}

/* Sampling at temperature 1 over all tokens from a 2-token prompt, through
 * the cache or a full forward per token: the same ids for the same seed. */
static void sample_ids(model *m, bool cache, uint64_t seed, int32_t *ctx, int n) {
    const int V = m->cfg->vocab;
    float *logits = malloc(sizeof(float) * (size_t)n * V), work[64];
    assert_true(logits && V <= 64);
    fsc_gpt_kv *kv = cache ? fsc_gpt_kv_new(m->gpt, m->cfg) : NULL;
    assert_true(!cache || kv);
    if (kv) assert_int_equal(fsc_gpt_kv_append(kv, ctx, 2, logits, false), FSC_OK);
    for (int i = 2; i < n; i++) {
        if (!kv) full_forward(m, ctx, i, logits); /* row i-1 is the next token's */
        const float *next = kv ? logits : logits + (size_t)(i - 1) * V;
        ctx[i] = fsc_gpt_sample(next, V, 1.f, 0, seed, i, work);
        if (kv && i + 1 < n) assert_int_equal(fsc_gpt_kv_append(kv, ctx + i, 1, logits, false), 0);
    }
    fsc_gpt_kv_free(kv);
    free(logits);
}

static void test_moe_sampling_same_ids(void **state) {
    (void)state;
    model m;
    model_new_cfg(&m, &MOE_CFG);
    enum { N = 16 };
    int32_t a[N] = {7, 3}, b[N] = {7, 3}, c[N] = {7, 3};
    sample_ids(&m, true, 11, a, N);
    sample_ids(&m, false, 11, b, N);
    sample_ids(&m, true, 12, c, N);
    for (int i = 0; i < N; i++)
        if (a[i] != b[i])
            fail_msg("seed 11, token %d: %d with the cache, %d without", i, a[i], b[i]);
    assert_memory_not_equal(a, c, sizeof a); /* and the seed matters */
    model_free(&m);
}

static int refuse_alltoall(void *user, const float *in, float *out, int64_t n) {
    (void)user, (void)in, (void)out, (void)n;
    return FSC_ERR_UNSUPPORTED;
}

static void test_moe_kv_refusals(void **state) {
    (void)state;
    /* the default capacity factor (2) may drop tokens in the full forward */
    fsc_moe_options drops = MOE;
    drops.capacity_factor = 0;
    fsc_gpt_config cfg = MOE_CFG;
    cfg.moe = &drops;
    model m;
    model_new_cfg(&m, &cfg);
    assert_null(fsc_gpt_kv_new(m.gpt, &cfg));
    assert_non_null(strstr(fsc_last_error(), "h.1.mlp has capacity factor 2"));
    assert_non_null(strstr(fsc_last_error(), "capacity_factor >= experts (4)"));
    model_free(&m);
    /* half the experts on this rank (expert parallel over 2) */
    fsc_moe_options ep = MOE;
    ep.ep = (fsc_moe_exchange){.ranks = 2, .rank = 1, .alltoall = refuse_alltoall};
    cfg.moe = &ep;
    model_new_cfg(&m, &cfg);
    assert_null(fsc_gpt_kv_new(m.gpt, &cfg));
    assert_non_null(strstr(fsc_last_error(), "holds 2 of its 4 experts"));
    model_free(&m);
}

/* The LLaMA family decodes through the same cache: grouped-query attention
 * keeps only its KV heads, rotary positions start at the cached length. */
static void test_llama_kv_matches_full_forward(void **state) {
    (void)state;
    static const fsc_gpt_config LLAMA = {.vocab = 50,
                                         .seq = 16,
                                         .layers = 2,
                                         .d_model = 32,
                                         .heads = 4,
                                         .arch = FSC_ARCH_LLAMA,
                                         .kv_heads = 2};
    model m;
    model_new_cfg(&m, &LLAMA);
    enum { T = 16 };
    const int V = LLAMA.vocab;
    int32_t ids[T];
    for (int i = 0; i < T; i++) ids[i] = (i * 13 + 5) % V;
    float *full = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * T * V);
    fsc_gpt_kv_free(decode_and_compare(&m, ids, T, 6, full, got, "LLaMA"));
    free(full), free(got);
    model_free(&m);
}

/* A cache of 512 positions or more decodes through flash attention
 * (fsc_ctx.attention AUTO at the cache's capacity: the new rows as queries
 * at the cache's length), while the full forward of these 20 positions runs
 * the naive kernel: the two agree within the noise floor, GPT-2 and a
 * grouped-query LLaMA. */
static void test_kv_flash_matches_full_forward(void **state) {
    (void)state;
    static const fsc_gpt_config GPT = {
        .vocab = 50, .seq = FSC_ATTENTION_FLASH_MIN_T, .layers = 2, .d_model = 32, .heads = 4};
    static const fsc_gpt_config LLAMA = {.vocab = 50,
                                         .seq = FSC_ATTENTION_FLASH_MIN_T,
                                         .layers = 2,
                                         .d_model = 32,
                                         .heads = 4,
                                         .arch = FSC_ARCH_LLAMA,
                                         .kv_heads = 2};
    const fsc_gpt_config *cfgs[2] = {&GPT, &LLAMA};
    enum { T = 20 };
    for (int c = 0; c < 2; c++) {
        model m;
        model_new_cfg(&m, cfgs[c]);
        const int V = cfgs[c]->vocab;
        int32_t ids[T];
        for (int i = 0; i < T; i++) ids[i] = (i * 11 + 7) % V;
        float *full = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * T * V);
        fsc_gpt_kv_free(
            decode_and_compare(&m, ids, T, 7, full, got, c ? "LLaMA, flash" : "GPT-2, flash"));
        free(full), free(got);
        model_free(&m);
    }
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_kv_matches_full_forward),
              cmocka_unit_test(test_kv_refuses_other_models),
              cmocka_unit_test(test_llama_kv_matches_full_forward),
              cmocka_unit_test(test_kv_flash_matches_full_forward), cmocka_unit_test(test_sampling),
              cmocka_unit_test(test_moe_kv_matches_full_forward),
              cmocka_unit_test(test_moe_sampling_same_ids), cmocka_unit_test(test_moe_kv_refusals))
