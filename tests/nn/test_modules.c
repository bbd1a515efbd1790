/* The module contract beyond gradients: hooks fire at every level in order,
 * dropout masks depend on what a row is (not on how the batch was split),
 * parameter names and flat layout, and bad configurations are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "fsc/gpt.h"
#include "hook_log.h"
#include "test_main.h"

static void test_hooks_fire_in_order(void **state) {
    (void)state;
    fsc_module *parts[2] = {fsc_linear_new("a", 4, 4, true, FSC_WEIGHT_OUT_IN, 0.1f),
                            fsc_gelu_new("b")};
    fsc_module *seq = fsc_sequential_new("seq", 2, parts);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(seq, 1, true, &ps), FSC_OK);
    hook_log log = {0};
    fsc_module *all[] = {seq, parts[0], parts[1]};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < FSC_HOOK_KIND_COUNT; k++)
            assert_int_equal(fsc_module_add_hook(all[i], (fsc_hook_kind)k, hook_log_record, &log),
                             FSC_OK);
    hook_log_step(seq);
    const char *want[] = {"pre_fwd:seq", "pre_fwd:a",    "post_fwd:a",  "pre_fwd:b",
                          "post_fwd:b",  "post_fwd:seq", "pre_bwd:seq", "pre_bwd:b",
                          "post_bwd:b",  "pre_bwd:a",    "post_bwd:a",  "post_bwd:seq"};
    assert_int_equal(log.n, 12);
    for (int i = 0; i < 12; i++) assert_string_equal(log.log[i], want[i]);
    fsc_params_free(&ps);
    fsc_module_free(seq);
}

static void test_dropout_mask_is_keyed_by_sample(void **state) {
    (void)state;
    enum { B = 4, D = 37 };
    fsc_module *d = fsc_dropout_new("drop", 0.5f, 3);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    float xd[B * D];
    for (int i = 0; i < B * D; i++) xd[i] = 1.f;
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, B, D), whole, half;
    fsc_ctx ctx = {
        .arena = arena, .training = true, .seed = 9, .step = 2, .sample0 = 100, .keyed = true};
    assert_int_equal(fsc_module_forward(d, &ctx, &x, &whole, NULL), FSC_OK);
    /* rows 2..3 alone, numbered 102..103, drop exactly what they dropped in the whole batch */
    fsc_tensor x2 = fsc_tensor_2d(xd + 2 * D, FSC_DTYPE_F32, 2, D);
    ctx.sample0 = 102;
    assert_int_equal(fsc_module_forward(d, &ctx, &x2, &half, NULL), FSC_OK);
    assert_memory_equal(half.data, (float *)whole.data + 2 * D, 2 * D * sizeof(float));
    int kept = 0;
    for (int i = 0; i < B * D; i++) kept += ((float *)whole.data)[i] != 0.f;
    assert_true(kept > B * D / 4 && kept < 3 * B * D / 4);
    /* another step draws another mask; evaluation drops nothing */
    ctx.sample0 = 100, ctx.step = 3;
    fsc_tensor other;
    assert_int_equal(fsc_module_forward(d, &ctx, &x, &other, NULL), FSC_OK);
    assert_true(memcmp(other.data, whole.data, sizeof xd) != 0);
    ctx.training = false;
    assert_int_equal(fsc_module_forward(d, &ctx, &x, &other, NULL), FSC_OK);
    assert_memory_equal(other.data, xd, sizeof xd);
    fsc_arena_free(arena);
    fsc_module_free(d);
}

static void test_gpt_names_and_layout(void **state) {
    (void)state;
    fsc_gpt_config cfg = {.vocab = 50, .seq = 16, .layers = 2, .d_model = 32, .heads = 4};
    fsc_module *g = fsc_gpt_new(&cfg);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(g, 1, true, &ps), FSC_OK);
    assert_int_equal(ps.count, 4 + 12 * cfg.layers);
    assert_string_equal(ps.entries[0].name, "wte.weight");
    assert_string_equal(ps.entries[1].name, "wpe.weight");
    fsc_param_entry *e = fsc_params_find(&ps, "h.1.attn.c_attn.weight");
    assert_non_null(e);
    assert_int_equal(e->param->shape[0], 32); /* Conv1D: (in, out) */
    assert_int_equal(e->param->shape[1], 96);
    assert_non_null(fsc_params_find(&ps, "h.0.mlp.c_proj.bias"));
    assert_non_null(fsc_params_find(&ps, "ln_f.weight"));
    int64_t total = 0;
    for (int i = 0; i < ps.count; i++) total += ps.entries[i].param->numel;
    assert_int_equal(total, fsc_gpt_num_params(&cfg));
    /* views into one flat buffer, 64-byte aligned, not overlapping */
    for (int i = 0; i < ps.count; i++) {
        assert_ptr_equal(ps.entries[i].param->data, ps.data + ps.entries[i].offset);
        assert_int_equal(ps.entries[i].offset % 16, 0);
        if (i)
            assert_true(ps.entries[i].offset >=
                        ps.entries[i - 1].offset + ps.entries[i - 1].param->numel);
    }
    assert_int_equal(fsc_mem_current(FSC_MEM_PARAMS) >= (size_t)ps.numel * 4, 1);
    /* weight decay by default only on >= 2-dim parameters */
    assert_true(fsc_params_find(&ps, "h.0.attn.c_attn.weight")->param->weight_decay);
    assert_false(fsc_params_find(&ps, "h.0.attn.c_attn.bias")->param->weight_decay);
    /* initial values are keyed by name: the same seed gives the same weights */
    fsc_module *g2 = fsc_gpt_new(&cfg);
    fsc_params ps2;
    assert_int_equal(fsc_params_bind(g2, 1, true, &ps2), FSC_OK);
    assert_memory_equal(ps.data, ps2.data, (size_t)ps.numel * sizeof(float));
    fsc_params_free(&ps2);
    fsc_module_free(g2);
    fsc_params_free(&ps);
    fsc_module_free(g);
}

static void test_bad_configurations(void **state) {
    (void)state;
    fsc_gpt_config cfg = {.vocab = 50, .seq = 16, .layers = 2, .d_model = 30, .heads = 4};
    assert_null(fsc_gpt_new(&cfg));
    assert_non_null(strstr(fsc_last_error(), "heads 4 must divide d_model 30"));
    cfg.d_model = 32, cfg.dropout = 1.0f;
    assert_null(fsc_gpt_new(&cfg));
    assert_non_null(strstr(fsc_last_error(), "dropout"));
    assert_null(fsc_linear_new("l", 0, 3, true, FSC_WEIGHT_OUT_IN, 0.1f));
    assert_null(fsc_attention_new("a", 10, 3, 0, 0, 0.1f, 0.1f));
    /* a token outside the vocabulary is an error naming it, not a wild read */
    cfg.dropout = 0;
    fsc_module *g = fsc_gpt_new(&cfg);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(g, 1, true, &ps), FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true};
    int32_t x[4] = {1, 2, 50, 3}, y[4] = {1, 2, 3, 4};
    float loss;
    assert_int_equal(fsc_gpt_train_micro(g, &ctx, x, y, 1, 4, -1, 4, &loss), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "token 50"));
    x[2] = 5, y[3] = -7;
    assert_int_equal(fsc_gpt_train_micro(g, &ctx, x, y, 1, 4, -1, 4, &loss), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "target -7"));
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(g);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_hooks_fire_in_order),
              cmocka_unit_test(test_dropout_mask_is_keyed_by_sample),
              cmocka_unit_test(test_gpt_names_and_layout),
              cmocka_unit_test(test_bad_configurations))
