/* DDP over 1, 2 and 4 ranks ends with the same parameters as one process on
 * the same global batch (AdamW, dropout on): with one bucket and with many
 * small ones, with gradient accumulation under no_sync, and with a parameter
 * that backward never reaches (which must not hang the step). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "trainer_test.h"
#include "fsc/parallel.h"

static int rank, world;

/* Trains EQ_STEPS steps with DDP: this rank's share of the global batch in
 * `accum` micro-batches; returns the final parameters (*numel of them; the
 * caller frees them). */
static float *run_ddp(size_t bucket_bytes, int accum, fsc_ddp_stats *stats, int64_t *numel) {
    /* a different seed on other ranks: the wrap-time broadcast must fix it */
    eq_setup e;
    assert_int_equal(eq_setup_new(&e, &EQ_MODEL, rank == 0 ? 5 : 99), FSC_OK);
    fsc_module *ddp = fsc_ddp_wrap(e.m, &e.ps, fsc_group_world(),
                                   &(fsc_ddp_options){.bucket_bytes = bucket_bytes});
    assert_non_null(ddp);
    fsc_optim *opt = fsc_optim_new(&EQ_ADAMW, e.r, e.nr);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    const eq_batch b = eq_batch_of_rank(&e.tk, arena, EQ_MODEL.seq, accum, rank, world, x, y);
    for (int s = 0; s < EQ_STEPS; s++) {
        fsc_params_zero_grad(&e.ps);
        for (int k = 0; k < accum; k++) {
            fsc_ddp_set_no_sync(ddp, k < accum - 1);
            assert_int_equal(eq_micro(ddp, &b, s, k), FSC_OK);
        }
        fsc_optim_step(opt);
    }
    if (stats) *stats = fsc_ddp_get_stats(ddp);
    float *out = malloc(sizeof(float) * (size_t)e.ps.numel);
    memcpy(out, e.ps.data, sizeof(float) * (size_t)e.ps.numel);
    *numel = e.ps.numel;
    fsc_arena_free(arena);
    fsc_optim_free(opt);
    fsc_module_free(ddp);
    eq_setup_free(&e);
    return out;
}

static void test_one_bucket(void **state) {
    (void)state;
    fsc_ddp_stats st;
    int64_t n;
    float *p = run_ddp(0, 1, &st, &n);
    assert_int_equal(st.buckets, 1);
    tt_expect_reference(NULL, "DDP, one 25 MB bucket", p, n);
}

static void test_many_buckets(void **state) { /* 1 KB buckets: many in flight at once */
    (void)state;
    fsc_ddp_stats st;
    int64_t n;
    float *p = run_ddp(1024, 1, &st, &n);
    /* every matrix (>= 256 floats) closes a bucket: 4 per layer, wpe, wte */
    assert_int_equal(st.buckets, 4 * EQ_MODEL.layers + 2);
    assert_int_equal(st.allreduces, st.buckets * EQ_STEPS);
    tt_expect_reference(NULL, "DDP, 1 KB buckets", p, n);
}

static void test_accumulation_no_sync(void **state) {
    (void)state;
    if (EQ_GLOBAL_BATCH % (world * 2)) skip();
    fsc_ddp_stats st;
    int64_t n;
    float *p = run_ddp(1024, 2, &st, &n);
    /* reductions only on the last micro-batch of each step */
    assert_int_equal(st.allreduces, st.buckets * EQ_STEPS);
    tt_expect_reference(NULL, "DDP, 2 micro-batches with no_sync", p, n);
}

/* A model whose second Linear is never used: its gradients stay zero, its
 * bucket is still reduced, and the step completes on every rank. */
typedef struct {
    fsc_module base;
} partial;

static int partial_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                           void **saved) {
    return fsc_module_forward(m->children[0], ctx, x, y, saved);
}

static int partial_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                            fsc_tensor *dx) {
    return fsc_module_backward(m->children[0], ctx, saved, dy, dx);
}

static const fsc_module_ops partial_ops = {"Partial", partial_forward, partial_backward, NULL};

static void test_unused_parameters(void **state) {
    (void)state;
    partial *p = calloc(1, sizeof *p);
    fsc_module_init(&p->base, &partial_ops, "net");
    fsc_module_add_child(&p->base, fsc_linear_new("used", 4, 4, true, FSC_WEIGHT_OUT_IN, 0.5f));
    fsc_module_add_child(&p->base, fsc_linear_new("unused", 4, 4, true, FSC_WEIGHT_OUT_IN, 0.5f));
    fsc_params ps;
    assert_int_equal(fsc_params_bind(&p->base, 1, true, &ps), FSC_OK);
    fsc_module *ddp =
        fsc_ddp_wrap(&p->base, &ps, fsc_group_world(), &(fsc_ddp_options){.bucket_bytes = 64});
    assert_non_null(ddp);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true};
    float xd[8] = {1, 2, 3, 4, (float)rank, 0, 1, 0};
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, 2, 4), y;
    void *saved;
    assert_int_equal(fsc_module_forward(ddp, &ctx, &x, &y, &saved), FSC_OK);
    assert_int_equal(fsc_module_backward(ddp, &ctx, saved, &y, NULL), FSC_OK);
    fsc_param_entry *e = fsc_params_find(&ps, "unused.weight");
    for (int i = 0; i < 16; i++) assert_true(e->param->grad[i] == 0.f);
    /* the used weight's gradient is the sum over ranks: identical everywhere */
    float g0 = fsc_params_find(&ps, "used.weight")->param->grad[0], all = g0;
    assert_int_equal(fsc_group_allreduce(fsc_group_world(), &all, 1, FSC_DTYPE_F32, FSC_REDUCE_MAX),
                     FSC_OK);
    assert_true(all == g0);
    fsc_arena_free(arena);
    fsc_module_free(ddp);
    fsc_params_free(&ps);
    fsc_module_free(&p->base);
}

MPI_EQ_MAIN(cmocka_unit_test(test_one_bucket), cmocka_unit_test(test_many_buckets),
            cmocka_unit_test(test_accumulation_no_sync), cmocka_unit_test(test_unused_parameters))
