/* Fine-tuning in the library: frozen parameters (fsc_module_freeze: globs,
 * refusals, the gradient and optimizer memory they give back), LoRA on a
 * Linear against its formula in double (forward, dx, dA, dB; the base
 * frozen), fsc_lora_merge, and FSDP units by module kind. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/fsdp.h"
#include "fsc/gpt.h"
#include "fsc/lora.h"
#include "fsc/optim.h"
#include "test_main.h"

static fsc_gpt_config llama_cfg(void) {
    return (fsc_gpt_config){.vocab = 64,
                            .seq = 8,
                            .layers = 3,
                            .d_model = 32,
                            .heads = 4,
                            .arch = FSC_ARCH_LLAMA,
                            .kv_heads = 2};
}

static void test_freeze_globs_and_refusals(void **state) {
    (void)state;
    fsc_gpt_config cfg = llama_cfg();
    fsc_module *m = fsc_gpt_new(&cfg);
    assert_non_null(m);
    const char *mlp[] = {"model.layers.*.mlp.*"};
    int frozen = -1;
    assert_int_equal(fsc_module_freeze(m, mlp, 1, true, &frozen), FSC_OK);
    assert_int_equal(frozen, 3 * 3); /* gate_proj, up_proj, down_proj of each layer */
    const char *stray[] = {"model.norm.weight", "model.layer.*"};
    assert_int_equal(fsc_module_freeze(m, stray, 2, true, NULL), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "'model.layer.*' matches no parameter"));
    assert_int_equal(fsc_module_freeze(m, stray, 2, false, &frozen), FSC_OK); /* a stage's */
    assert_int_equal(frozen, 10);
    const char *empty[] = {""};
    assert_int_equal(fsc_module_freeze(m, empty, 1, true, NULL), FSC_ERR_INVALID);
    fsc_module_free(m);
}

/* The gradient stretch of a frozen tensor is given back and the optimizer
 * holds state for the others only: exact byte counts from the allocator. */
static void test_freeze_memory(void **state) {
    (void)state;
    fsc_gpt_config cfg = llama_cfg();
    fsc_module *m = fsc_gpt_new(&cfg);
    const char *pat[] = {"model.embed_tokens.*", "model.layers.*.mlp.*"};
    assert_int_equal(fsc_module_freeze(m, pat, 2, true, NULL), FSC_OK);
    const size_t g0 = fsc_mem_current(FSC_MEM_GRADS), o0 = fsc_mem_current(FSC_MEM_OPTIM);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 1, true, &ps), FSC_OK);
    int64_t frozen = 0;
    for (int i = 0; i < ps.count; i++)
        if (ps.entries[i].param->frozen) frozen += ps.entries[i].param->numel;
    assert_true(frozen > 0);
    assert_int_equal(fsc_mem_current(FSC_MEM_GRADS) - g0,
                     (size_t)(ps.numel - frozen) * sizeof(float));
    fsc_optim_range *r;
    int nr;
    assert_int_equal(fsc_optim_ranges_from_params(&ps, &r, &nr), FSC_OK);
    fsc_optim_config oc = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-3, .weight_decay = 0.1};
    fsc_optim *o = fsc_optim_new(&oc, r, nr);
    assert_non_null(o);
    const int64_t trainable = fsc_params_trainable_numel(&ps);
    assert_int_equal(fsc_optim_state_bytes(o), (size_t)(2 * 4 * trainable));
    assert_int_equal(fsc_mem_current(FSC_MEM_OPTIM) - o0, (size_t)(2 * 4 * trainable));
    /* a step with every gradient set leaves the frozen tensors as they were */
    for (int i = 0; i < ps.count; i++)
        if (!ps.entries[i].param->frozen)
            for (int64_t j = 0; j < ps.entries[i].param->numel; j++)
                ps.entries[i].param->grad[j] = 0.5f;
    fsc_param_entry *e = fsc_params_find(&ps, "model.embed_tokens.weight");
    const float before = e->param->data[7];
    assert_int_equal(fsc_optim_step(o), FSC_OK);
    assert_true(e->param->data[7] == before); /* no update, no decay */
    fsc_optim_free(o);
    fsc_optim_ranges_free(r);
    fsc_params_free(&ps);
    assert_int_equal(fsc_mem_current(FSC_MEM_GRADS), g0);
    fsc_module_free(m);
}

static void fill(float *x, int64_t n, uint64_t key) {
    fsc_rng_normal_fill(x, n, 0, key, 0.f, 1.f);
}

/* y = x W^T + b + s x A^T B^T in double, and its gradients, for a LoRA
 * Linear in torch's (out,in) layout with B made non-zero. */
static void test_lora_linear_against_formula(void **state) {
    (void)state;
    enum { N = 3, IN = 6, OUT = 5, R = 2 };
    const double s = 4.0 / R;
    fsc_module *lin = fsc_linear_new("q_proj", IN, OUT, true, FSC_WEIGHT_OUT_IN, 0.5f);
    fsc_module *root = fsc_sequential_new("root", 1, &lin);
    const char *targets[] = {"q_proj"};
    fsc_lora_config lc = {.rank = R, .alpha = 4.f, .targets = targets, .ntargets = 1};
    int n = 0;
    assert_int_equal(fsc_lora_apply(root, &lc, &n), FSC_OK);
    assert_int_equal(n, 1);
    assert_true(fsc_lora_is_adapted(lin));
    assert_int_equal(fsc_lora_apply(root, &lc, NULL), FSC_ERR_INVALID); /* twice */
    fsc_params ps;
    assert_int_equal(fsc_params_bind(root, 3, true, &ps), FSC_OK);
    fsc_param *W = fsc_params_find(&ps, "q_proj.weight")->param;
    fsc_param *b = fsc_params_find(&ps, "q_proj.bias")->param;
    fsc_param *A = fsc_params_find(&ps, "q_proj.lora_A.weight")->param;
    fsc_param *B = fsc_params_find(&ps, "q_proj.lora_B.weight")->param;
    assert_true(W->frozen && b->frozen && !A->frozen && !B->frozen);
    assert_int_equal(A->shape[0], R), assert_int_equal(A->shape[1], IN);
    assert_int_equal(B->shape[0], OUT), assert_int_equal(B->shape[1], R);
    const float bound = 1.f / sqrtf((float)IN); /* kaiming_uniform_(a=sqrt(5)) */
    for (int j = 0; j < R * IN; j++) assert_true(fabsf(A->data[j]) <= bound);
    for (int j = 0; j < OUT * R; j++) assert_true(B->data[j] == 0.f);
    fill(B->data, OUT * R, 11);
    fill(b->data, OUT, 12);
    float x[N * IN], dy[N * OUT];
    fill(x, N * IN, 13);
    fill(dy, N * OUT, 14);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true, .keyed = true};
    fsc_tensor xt = fsc_tensor_2d(x, FSC_DTYPE_F32, N, IN), y, dx;
    fsc_tensor dyt = fsc_tensor_2d(dy, FSC_DTYPE_F32, N, OUT);
    void *saved;
    assert_int_equal(fsc_module_forward(root, &ctx, &xt, &y, &saved), FSC_OK);
    assert_int_equal(fsc_module_backward(root, &ctx, saved, &dyt, &dx), FSC_OK);
    const float *yd = y.data, *dxd = dx.data;
    double h[N][R] = {{0}}; /* x A^T */
    for (int i = 0; i < N; i++)
        for (int k = 0; k < R; k++)
            for (int c = 0; c < IN; c++) h[i][k] += (double)x[i * IN + c] * A->data[k * IN + c];
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OUT; o++) {
            double ref = b->data[o];
            for (int c = 0; c < IN; c++) ref += (double)x[i * IN + c] * W->data[o * IN + c];
            for (int k = 0; k < R; k++) ref += s * h[i][k] * B->data[o * R + k];
            assert_true(fabs(yd[i * OUT + o] - ref) <= 1e-5 * (1 + fabs(ref)));
        }
    double g[N][R] = {{0}}; /* dy B */
    for (int i = 0; i < N; i++)
        for (int k = 0; k < R; k++)
            for (int o = 0; o < OUT; o++) g[i][k] += (double)dy[i * OUT + o] * B->data[o * R + k];
    for (int i = 0; i < N; i++)
        for (int c = 0; c < IN; c++) {
            double ref = 0;
            for (int o = 0; o < OUT; o++) ref += (double)dy[i * OUT + o] * W->data[o * IN + c];
            for (int k = 0; k < R; k++) ref += s * g[i][k] * A->data[k * IN + c];
            assert_true(fabs(dxd[i * IN + c] - ref) <= 1e-5 * (1 + fabs(ref)));
        }
    for (int k = 0; k < R; k++) {
        for (int c = 0; c < IN; c++) { /* dA = s (dy B)^T x */
            double ref = 0;
            for (int i = 0; i < N; i++) ref += s * g[i][k] * x[i * IN + c];
            assert_true(fabs(A->grad[k * IN + c] - ref) <= 1e-5 * (1 + fabs(ref)));
        }
        for (int o = 0; o < OUT; o++) { /* dB = s dy^T (x A^T) */
            double ref = 0;
            for (int i = 0; i < N; i++) ref += s * dy[i * OUT + o] * h[i][k];
            assert_true(fabs(B->grad[o * R + k] - ref) <= 1e-5 * (1 + fabs(ref)));
        }
    }
    for (int j = 0; j < OUT * IN; j++) assert_true(W->grad[j] == 0.f); /* never written */
    /* merging: W + s B A */
    float w0[OUT * IN];
    memcpy(w0, W->data, sizeof w0);
    assert_int_equal(fsc_lora_merge(root), 1);
    for (int o = 0; o < OUT; o++)
        for (int c = 0; c < IN; c++) {
            double ref = w0[o * IN + c];
            for (int k = 0; k < R; k++) ref += s * (double)B->data[o * R + k] * A->data[k * IN + c];
            assert_true(fabs(W->data[o * IN + c] - ref) <= 1e-6 * (1 + fabs(ref)));
        }
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(root);
}

static void test_lora_refusals(void **state) {
    (void)state;
    fsc_gpt_config cfg = llama_cfg();
    fsc_module *m = fsc_gpt_new(&cfg);
    const char *targets[] = {"q_proj", "qproj"};
    fsc_lora_config lc = {.rank = 4, .targets = targets, .ntargets = 2};
    assert_int_equal(fsc_lora_apply(m, &lc, NULL), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "'qproj' names no Linear"));
    fsc_module_free(m);
    m = fsc_gpt_new(&cfg);
    lc.rank = 0;
    assert_int_equal(fsc_lora_apply(m, &lc, NULL), FSC_ERR_INVALID);
    lc.rank = 2, lc.dropout = 1.f;
    assert_int_equal(fsc_lora_apply(m, &lc, NULL), FSC_ERR_INVALID);
    fsc_module_free(m);
}

/* One unit per decoder layer by kind, for both families, as fsc_gpt_blocks lists them. */
static void test_fsdp_wrap_kind(void **state) {
    (void)state;
    for (int arch = 0; arch < 2; arch++) {
        fsc_gpt_config cfg = llama_cfg();
        if (!arch) cfg.arch = FSC_ARCH_GPT2, cfg.kv_heads = 0;
        fsc_module *m = fsc_gpt_new(&cfg);
        fsc_module **units = NULL, *blocks[8];
        int n = 0;
        assert_int_equal(fsc_fsdp_wrap_kind(m, "TransformerBlock", &units, &n), FSC_OK);
        assert_int_equal(n, cfg.layers);
        assert_int_equal(fsc_gpt_blocks(m, blocks, 8), cfg.layers);
        for (int i = 0; i < n; i++) assert_ptr_equal(units[i], blocks[i]);
        free(units);
        assert_int_equal(fsc_fsdp_wrap_kind(m, "Nope", &units, &n), FSC_ERR_INVALID);
        assert_non_null(strstr(fsc_last_error(), "Nope"));
        fsc_module_free(m);
    }
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_freeze_globs_and_refusals),
              cmocka_unit_test(test_freeze_memory),
              cmocka_unit_test(test_lora_linear_against_formula),
              cmocka_unit_test(test_lora_refusals), cmocka_unit_test(test_fsdp_wrap_kind))
