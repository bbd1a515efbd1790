/* Backward that bypasses a data-parallel wrapper, at 1, 2 and 4 ranks.
 *
 * DDP and ShardedDDP hook the child's modules, so running the child's
 * backward instead of the wrapper's used to skip every reduction without a
 * word (replicas drift apart; on one rank nothing looks wrong at all). Now
 * the hooks refuse, with no_sync on or off, and the wrapper stays usable.
 * FSDP wraps in place (the root is the model), so the trap there is running
 * backward on a unit or on a submodule directly: refused too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "mpi_test.h"
#include "fsc/fsdp.h"
#include "fsc/gpt.h"
#include "fsc/parallel.h"
#include "fsc/zero.h"

static int rank, world;

static void expect_error(int rc, int want, const char *text) {
    assert_int_equal(rc, want);
    if (!strstr(fsc_last_error(), text))
        fail_msg("message \"%s\" lacks \"%s\"", fsc_last_error(), text);
}

/* net: fc1 (4 -> 8), GELU, fc2 (8 -> 2) */
static fsc_module *net_new(void) {
    fsc_module *parts[3] = {fsc_linear_new("fc1", 4, 8, true, FSC_WEIGHT_OUT_IN, 0.5f),
                            fsc_gelu_new("act"),
                            fsc_linear_new("fc2", 8, 2, true, FSC_WEIGHT_OUT_IN, 0.5f)};
    return fsc_sequential_new("net", 3, parts);
}

/* This rank's rows differ from every other rank's. */
static fsc_tensor rank_input(float *xd) {
    for (int i = 0; i < 8; i++) xd[i] = (float)(i + 1) * (rank + 1) / 8;
    return fsc_tensor_2d(xd, FSC_DTYPE_F32, 2, 4);
}

/* The same value on every rank? */
static bool same_everywhere(float v) {
    float lo = -v, hi = v; /* min(v) = -max(-v) */
    fsc_group_allreduce(fsc_group_world(), &lo, 1, FSC_DTYPE_F32, FSC_REDUCE_MAX);
    fsc_group_allreduce(fsc_group_world(), &hi, 1, FSC_DTYPE_F32, FSC_REDUCE_MAX);
    return -lo == hi;
}

static float sum(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return (float)s;
}

/* Forward on the wrapped child is fine (evaluation does it); its backward
 * is refused with `said`, under the wrapper's no_sync too (no exception). */
static void expect_bypass_refused(fsc_module *net, fsc_module *wrapper,
                                  void (*set_no_sync)(fsc_module *, bool), const fsc_ctx *ctx,
                                  const fsc_tensor *x, const char *said) {
    fsc_tensor y;
    void *saved;
    assert_int_equal(fsc_module_forward(net, ctx, x, &y, &saved), FSC_OK);
    expect_error(fsc_module_backward(net, ctx, saved, &y, NULL), FSC_ERR_INVALID, said);
    set_no_sync(wrapper, true);
    expect_error(fsc_module_backward(net, ctx, saved, &y, NULL), FSC_ERR_INVALID, said);
    set_no_sync(wrapper, false);
}

static void test_ddp_bypass(void **state) {
    (void)state;
    fsc_module *net = net_new();
    fsc_params ps;
    assert_int_equal(fsc_params_bind(net, 3, true, &ps), FSC_OK);
    fsc_module *ddp = fsc_ddp_wrap(net, &ps, fsc_group_world(), NULL);
    assert_non_null(ddp);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true};
    float xd[8];
    fsc_tensor x = rank_input(xd), y;
    void *saved;
    const char *said = "DDP: the wrapped module's backward ran without the DDP wrapper (called the "
                       "inner model directly?): its gradients were never all-reduced";

    expect_bypass_refused(net, ddp, fsc_ddp_set_no_sync, &ctx, &x, said);

    /* the wrapper still works, and reduces */
    fsc_params_zero_grad(&ps);
    fsc_arena_reset(arena);
    assert_int_equal(fsc_module_forward(ddp, &ctx, &x, &y, &saved), FSC_OK);
    assert_int_equal(fsc_module_backward(ddp, &ctx, saved, &y, NULL), FSC_OK);
    assert_true(same_everywhere(sum(ps.grad, ps.numel)));
    assert_true(sum(ps.grad, ps.numel) != 0.f);

    /* and a bypass after a good step is still caught */
    fsc_arena_reset(arena);
    assert_int_equal(fsc_module_forward(net, &ctx, &x, &y, &saved), FSC_OK);
    expect_error(fsc_module_backward(net, &ctx, saved, &y, NULL), FSC_ERR_INVALID, said);
    fsc_arena_free(arena);
    fsc_module_free(ddp);
    fsc_params_free(&ps);
    fsc_module_free(net);
}

static void test_sdp_bypass(void **state) {
    (void)state;
    fsc_module *net = net_new();
    fsc_params ps;
    assert_int_equal(fsc_params_bind(net, 3, true, &ps), FSC_OK);
    fsc_optim_config cfg = {.kind = FSC_OPTIM_SGD, .lr = 0.1};
    fsc_oss *oss = fsc_oss_new(&cfg, &ps, fsc_group_world(), NULL);
    assert_non_null(oss);
    fsc_module *sdp = fsc_sdp_wrap(net, &ps, oss, NULL);
    assert_non_null(sdp);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true};
    float xd[8];
    fsc_tensor x = rank_input(xd), y;
    void *saved;
    const char *said = "ShardedDDP: the wrapped module's backward ran without the ShardedDDP "
                       "wrapper (called the inner model directly?): its gradients were never "
                       "reduced to their owners";

    expect_bypass_refused(net, sdp, fsc_sdp_set_no_sync, &ctx, &x, said);

    /* refused before anything was written: a good step follows */
    for (int step = 0; step < 2; step++) {
        fsc_sdp_zero_grad(sdp);
        fsc_arena_reset(arena);
        assert_int_equal(fsc_module_forward(sdp, &ctx, &x, &y, &saved), FSC_OK);
        assert_int_equal(fsc_module_backward(sdp, &ctx, saved, &y, NULL), FSC_OK);
        assert_int_equal(fsc_oss_step(oss), FSC_OK);
    }
    assert_true(same_everywhere(sum(ps.data, ps.numel)));

    fsc_arena_reset(arena);
    assert_int_equal(fsc_module_forward(net, &ctx, &x, &y, &saved), FSC_OK);
    expect_error(fsc_module_backward(net, &ctx, saved, &y, NULL), FSC_ERR_INVALID, said);
    fsc_arena_free(arena);
    fsc_module_free(sdp);
    fsc_oss_free(oss);
    fsc_params_free(&ps);
    fsc_module_free(net);
}

static fsc_module *child(fsc_module *m, const char *name) {
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->children[i]->name, name)) return m->children[i];
    fail_msg("module %s has no child %s", m->name, name);
    return NULL;
}

/* FSDP: training the root is the only way in; a unit's backward run alone
 * (its reduce-scatter would be left in flight past the step) and a plain
 * submodule called between steps (its views point nowhere) are refused. */
static void test_fsdp_submodule(void **state) {
    (void)state;
    const fsc_gpt_config cfg = {
        .vocab = 64, .seq = 8, .layers = 2, .d_model = 16, .heads = 2, .dropout = 0.1f};
    fsc_module *g = fsc_gpt_new(&cfg);
    fsc_module *units[2] = {child(g, "h.0"), child(g, "h.1")};
    fsc_optim_config ocfg = {.kind = FSC_OPTIM_SGD, .lr = 0.1};
    fsc_fsdp *f = fsc_fsdp_new(g, fsc_group_world(), 5, units, 2, &ocfg, NULL);
    assert_non_null(f);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    enum { B = 2, T = 8 };
    int32_t ids[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) ids[i] = (i * 7 + rank) % cfg.vocab, tgt[i] = (i * 3) % 64;
    for (int step = 0; step < 3; step++) {
        fsc_fsdp_zero_grad(f);
        fsc_arena_reset(arena);
        fsc_ctx ctx = {.arena = arena, .training = true, .seed = 5, .step = step, .keyed = true};
        float loss;
        assert_int_equal(fsc_gpt_train_micro(g, &ctx, ids, tgt, B, T, -1, B * T, &loss), FSC_OK);
        assert_int_equal(fsc_fsdp_step(f), FSC_OK);
        if (step != 1) continue;
        /* between steps: a unit run by hand, forward then backward */
        fsc_tensor h = fsc_tensor_arena(arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, cfg.d_model});
        memset(h.data, 0, fsc_tensor_nbytes(&h));
        fsc_tensor hy;
        void *saved;
        assert_int_equal(fsc_module_forward(units[0], &ctx, &h, &hy, &saved), FSC_OK);
        expect_error(fsc_module_backward(units[0], &ctx, saved, &hy, NULL), FSC_ERR_INVALID,
                     "FSDP: unit 'h.0' ran backward outside the root's backward (called a "
                     "submodule directly?)");
        /* a module of the root's unit: nothing gathered for it */
        expect_error(fsc_module_forward(child(g, "ln_f"), &ctx, &hy, &h, NULL), FSC_ERR_INVALID,
                     "module 'ln_f' (LayerNorm): parameter 'weight' is not bound");
    }
    fsc_arena_free(arena);
    fsc_fsdp_free(f);
    fsc_module_free(g);
}

MPI_TEST_MAIN(cmocka_unit_test(test_ddp_bypass), cmocka_unit_test(test_sdp_bypass),
              cmocka_unit_test(test_fsdp_submodule))
