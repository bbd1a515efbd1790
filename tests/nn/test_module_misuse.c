/* The silent traps a new user meets, each now a status and a message that
 * says what happened: a model whose parameters were never bound, a NULL
 * ctx or arena, an output gradient of the wrong shape, and dropout run with
 * a ctx nobody keyed (which would draw the same masks at every step). Each
 * case asserts the status and the words of the message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "fsc/gpt.h"
#include "test_main.h"

static const fsc_gpt_config TINY = {
    .vocab = 64, .seq = 8, .layers = 2, .d_model = 16, .heads = 2, .dropout = 0.1f};

static void expect_error(int rc, int want, const char *text) {
    assert_int_equal(rc, want);
    if (!strstr(fsc_last_error(), text))
        fail_msg("message \"%s\" lacks \"%s\"", fsc_last_error(), text);
}

static fsc_module *child(fsc_module *m, const char *name) {
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->children[i]->name, name)) return m->children[i];
    fail_msg("module %s has no child %s", m->name, name);
    return NULL;
}

/* ---- unbound parameters, missing ctx or arena ----------------------------- */

static void test_unbound_parameters(void **state) {
    (void)state;
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena};
    float xd[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, 2, 4), y;

    /* a lone layer, never bound */
    fsc_module *fc = fsc_linear_new("fc", 4, 3, true, FSC_WEIGHT_OUT_IN, 0.1f);
    expect_error(fsc_module_forward(fc, &ctx, &x, &y, NULL), FSC_ERR_INVALID,
                 "module 'fc' (Linear): parameter 'weight' is not bound; call fsc_params_bind "
                 "first");
    fsc_module_free(fc);

    /* a GPT never bound: its root reads wte itself, so the root's call says so */
    fsc_module *g = fsc_gpt_new(&TINY);
    int32_t ids[4] = {1, 2, 3, 4};
    fsc_tensor tok = fsc_tensor_2d(ids, FSC_DTYPE_I32, 1, 4);
    expect_error(fsc_module_forward(g, &ctx, &tok, &y, NULL), FSC_ERR_INVALID,
                 "module 'wte' (Embedding): parameter 'weight' is not bound");

    /* one view deep inside a bound GPT lost: named by its full path */
    fsc_params ps;
    assert_int_equal(fsc_params_bind(g, 1, true, &ps), FSC_OK);
    fsc_param_entry *e = fsc_params_find(&ps, "h.1.attn.c_attn.weight");
    assert_non_null(e);
    float *keep = e->param->data;
    e->param->data = NULL;
    expect_error(fsc_module_forward(g, &ctx, &tok, &y, NULL), FSC_ERR_INVALID,
                 "module 'h.1.attn.c_attn' (Linear): parameter 'weight' is not bound");
    e->param->data = keep;
    assert_int_equal(fsc_module_forward(g, &ctx, &tok, &y, NULL), FSC_OK);

    char path[64];
    assert_string_equal(fsc_module_path(child(child(g, "h.1"), "attn"), path, sizeof path),
                        "h.1.attn");
    assert_string_equal(fsc_module_path(g, path, sizeof path), "gpt"); /* a root: its own name */
    assert_string_equal(fsc_module_path(child(child(g, "h.1"), "attn"), path, 5), "h.1.");
    assert_string_equal(fsc_module_path(NULL, path, sizeof path), "(null)");
    fsc_params_free(&ps);
    fsc_module_free(g);
    fsc_arena_free(arena);
}

/* Bound without gradients, backward would add into NULL. */
static void test_unbound_gradients(void **state) {
    (void)state;
    fsc_module *fc = fsc_linear_new("fc", 4, 3, true, FSC_WEIGHT_OUT_IN, 0.1f);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(fc, 1, false, &ps), FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true};
    float xd[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, 2, 4), y;
    void *saved;
    assert_int_equal(fsc_module_forward(fc, &ctx, &x, &y, &saved), FSC_OK);
    expect_error(fsc_module_backward(fc, &ctx, saved, &y, NULL), FSC_ERR_INVALID,
                 "module 'fc' (Linear): the gradient of parameter 'weight' is not bound");
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(fc);
}

static void test_null_ctx_and_arena(void **state) {
    (void)state;
    fsc_module *g = fsc_gpt_new(&TINY);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(g, 1, true, &ps), FSC_OK);
    int32_t ids[4] = {1, 2, 3, 4};
    fsc_tensor tok = fsc_tensor_2d(ids, FSC_DTYPE_I32, 1, 4), y;
    fsc_ctx no_arena = {.training = true, .keyed = true};
    expect_error(fsc_module_forward(g, &no_arena, &tok, &y, NULL), FSC_ERR_INVALID,
                 "module 'gpt' (GPT): forward: ctx->arena is NULL");
    expect_error(fsc_module_forward(g, NULL, &tok, &y, NULL), FSC_ERR_INVALID,
                 "module 'gpt' (GPT): forward: ctx is NULL");
    expect_error(fsc_module_forward(NULL, &no_arena, &tok, &y, NULL), FSC_ERR_INVALID,
                 "the module is NULL");
    /* the training helper goes through the same door */
    int32_t tgt[4] = {2, 3, 4, 5};
    float loss;
    expect_error(fsc_gpt_train_micro(g, &no_arena, ids, tgt, 1, 4, -1, 4, &loss), FSC_ERR_INVALID,
                 "ctx->arena is NULL");

    /* backward: the record of a good forward, then a ctx without an arena */
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true, .keyed = true};
    void *saved;
    expect_error(fsc_module_forward(g, &ctx, NULL, &y, NULL), FSC_ERR_INVALID,
                 "module 'gpt' (GPT): forward: x is NULL");
    expect_error(fsc_module_forward(g, &ctx, &tok, NULL, NULL), FSC_ERR_INVALID, "y is NULL");
    assert_int_equal(fsc_module_forward(g, &ctx, &tok, &y, &saved), FSC_OK);
    expect_error(fsc_module_backward(g, &no_arena, saved, &y, NULL), FSC_ERR_INVALID,
                 "module 'gpt' (GPT): backward: ctx->arena is NULL");
    expect_error(fsc_module_backward(g, &ctx, saved, NULL, NULL), FSC_ERR_INVALID, "dy is NULL");
    assert_int_equal(fsc_module_backward(g, &ctx, saved, &y, NULL), FSC_OK);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(g);
}

/* ---- output gradients of the wrong shape ---------------------------------- */

static void test_wrong_dy_shape(void **state) {
    (void)state;
    fsc_module *parts[2] = {fsc_linear_new("fc", 4, 3, true, FSC_WEIGHT_OUT_IN, 0.1f),
                            fsc_gelu_new("act")};
    fsc_module *seq = fsc_sequential_new("net", 2, parts);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(seq, 1, true, &ps), FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true};
    float xd[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dyd[12] = {0};
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, 2, 4), y, dx;
    void *saved;

    /* a lone layer: dy must be the (2,3) its forward produced */
    void *fc_saved;
    fsc_tensor fc_y;
    assert_int_equal(fsc_module_forward(parts[0], &ctx, &x, &fc_y, &fc_saved), FSC_OK);
    fsc_tensor bad = fsc_tensor_2d(dyd, FSC_DTYPE_F32, 2, 4);
    expect_error(fsc_module_backward(parts[0], &ctx, fc_saved, &bad, &dx), FSC_ERR_SHAPE,
                 "module 'fc' (Linear): output gradient dy is F32 (2,4), expected F32 (2,3)");
    bad = fsc_tensor_1d(dyd, FSC_DTYPE_F32, 6); /* same count, other shape */
    expect_error(fsc_module_backward(parts[0], &ctx, fc_saved, &bad, &dx), FSC_ERR_SHAPE,
                 "dy is F32 (6), expected F32 (2,3)");
    bad = fsc_tensor_2d(dyd, FSC_DTYPE_BF16, 2, 3);
    expect_error(fsc_module_backward(parts[0], &ctx, fc_saved, &bad, &dx), FSC_ERR_SHAPE,
                 "dy is BF16 (2,3), expected F32 (2,3)");
    expect_error(fsc_module_backward(parts[0], &ctx, NULL, &fc_y, &dx), FSC_ERR_INVALID,
                 "module 'fc' (Linear): backward without the record its forward returned");
    assert_int_equal(fsc_module_backward(parts[0], &ctx, fc_saved, &fc_y, &dx), FSC_OK);

    /* through a container: the module that sees the bad dy names itself */
    assert_int_equal(fsc_module_forward(seq, &ctx, &x, &y, &saved), FSC_OK);
    bad = fsc_tensor_2d(dyd, FSC_DTYPE_F32, 3, 2);
    expect_error(fsc_module_backward(seq, &ctx, saved, &bad, &dx), FSC_ERR_SHAPE,
                 "module 'act' (GELU): output gradient dy is F32 (3,2), expected F32 (2,3)");
    assert_int_equal(fsc_module_backward(seq, &ctx, saved, &y, &dx), FSC_OK);

    /* the custom-module helper */
    expect_error(fsc_module_check_dy(seq, &bad, 2, (int64_t[]){2, 3}), FSC_ERR_SHAPE,
                 "module 'net' (Sequential): output gradient dy is F32 (3,2), expected F32 (2,3)");
    expect_error(fsc_module_check_dy(seq, NULL, 2, (int64_t[]){2, 3}), FSC_ERR_INVALID, "NULL");
    assert_int_equal(fsc_module_check_dy(seq, &y, 2, (int64_t[]){2, 3}), FSC_OK);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(seq);
}

/* A GPT's logits gradient, one vocabulary entry short: refused before the
 * head's matmul reads past it; and a block's, deep inside. */
static void test_wrong_dy_shape_gpt(void **state) {
    (void)state;
    fsc_module *g = fsc_gpt_new(&TINY);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(g, 1, true, &ps), FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true, .keyed = true};
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fsc_tensor tok = fsc_tensor_2d(ids, FSC_DTYPE_I32, 2, 4), y;
    void *saved;
    assert_int_equal(fsc_module_forward(g, &ctx, &tok, &y, &saved), FSC_OK);
    fsc_tensor bad = fsc_tensor_3d(y.data, FSC_DTYPE_F32, 2, 4, TINY.vocab - 1);
    expect_error(fsc_module_backward(g, &ctx, saved, &bad, NULL), FSC_ERR_SHAPE,
                 "module 'gpt' (GPT): output gradient dy is F32 (2,4,63), expected F32 (2,4,64)");

    fsc_module *blk = child(g, "h.0");
    fsc_tensor h = fsc_tensor_arena(arena, FSC_DTYPE_F32, 3, (int64_t[]){2, 4, TINY.d_model}), hy;
    memset(h.data, 0, fsc_tensor_nbytes(&h));
    assert_int_equal(fsc_module_forward(blk, &ctx, &h, &hy, &saved), FSC_OK);
    bad = fsc_tensor_3d(hy.data, FSC_DTYPE_F32, 4, 2, TINY.d_model);
    expect_error(fsc_module_backward(blk, &ctx, saved, &bad, NULL), FSC_ERR_SHAPE,
                 "expected F32 (2,4,16)");
    assert_non_null(strstr(fsc_last_error(), "module 'h.0.mlp.c_proj' (Linear)"));
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(g);
}

/* ---- dropout without a key -------------------------------------------------- */

static void test_dropout_needs_a_keyed_ctx(void **state) {
    (void)state;
    fsc_module *d = fsc_dropout_new("drop", 0.5f, 3);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    float xd[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, 2, 4), y;
    fsc_ctx ctx = {.arena = arena, .training = true, .seed = 7};
    expect_error(fsc_module_forward(d, &ctx, &x, &y, NULL), FSC_ERR_INVALID,
                 "module 'drop' (Dropout, p = 0.5): training forward with a ctx that is not keyed");
    assert_non_null(strstr(fsc_last_error(), "ctx.keyed = true"));
    /* step 0, sample 0 is a key like any other once the caller says so */
    ctx.keyed = true;
    assert_int_equal(fsc_module_forward(d, &ctx, &x, &y, NULL), FSC_OK);
    /* no masks drawn, no key needed: evaluation, and p = 0 */
    fsc_ctx eval = {.arena = arena};
    assert_int_equal(fsc_module_forward(d, &eval, &x, &y, NULL), FSC_OK);
    assert_ptr_equal(y.data, xd);
    fsc_module *off = fsc_dropout_new("off", 0.f, 4);
    fsc_ctx unkeyed = {.arena = arena, .training = true};
    assert_int_equal(fsc_module_forward(off, &unkeyed, &x, &y, NULL), FSC_OK);
    fsc_module_free(off);
    fsc_module_free(d);

    /* inside a model: the GPT's first dropout refuses, by its path */
    fsc_module *g = fsc_gpt_new(&TINY);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(g, 1, true, &ps), FSC_OK);
    int32_t ids[4] = {1, 2, 3, 4}, tgt[4] = {2, 3, 4, 5};
    float loss;
    expect_error(fsc_gpt_train_micro(g, &unkeyed, ids, tgt, 1, 4, -1, 4, &loss), FSC_ERR_INVALID,
                 "module 'drop' (Dropout, p = 0.1)");
    fsc_params_zero_grad(&ps);
    fsc_arena_reset(arena);
    fsc_ctx keyed = {.arena = arena, .training = true, .seed = 7, .keyed = true};
    assert_int_equal(fsc_gpt_train_micro(g, &keyed, ids, tgt, 1, 4, -1, 4, &loss), FSC_OK);
    /* evaluation needs no key */
    assert_int_equal(fsc_gpt_eval_loss(g, &unkeyed, ids, tgt, 1, 4, -1, &loss), FSC_OK);
    fsc_params_free(&ps);
    fsc_module_free(g);
    fsc_arena_free(arena);
}

/* NaN weights (a diverged run, a damaged file) reach every exp: softmax and
 * GELU give NaN, and no float-to-int conversion of NaN happens on the way
 * (undefined behaviour, which the UBSan build turns into an abort). */
static void test_nan_through_exp(void **state) {
    (void)state;
    float in[8] = {0.f, NAN, 1.f, -2.f, NAN, 3.f, 0.5f, -0.5f}, out[8];
    fsc_softmax_forward(out, in, 2, 4);
    for (int i = 0; i < 4; i++) assert_true(isnan(out[i])); /* a NaN row stays NaN */
    fsc_gelu_forward(out, in, 8);
    assert_true(isnan(out[1]) && isnan(out[4]) && !isnan(out[0]) && !isnan(out[5]));
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_unbound_parameters),
              cmocka_unit_test(test_unbound_gradients), cmocka_unit_test(test_null_ctx_and_arena),
              cmocka_unit_test(test_wrong_dy_shape), cmocka_unit_test(test_wrong_dy_shape_gpt),
              cmocka_unit_test(test_dropout_needs_a_keyed_ctx),
              cmocka_unit_test(test_nan_through_exp))
