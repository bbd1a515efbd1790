/* Activation checkpointing: a checkpointed GPT trains bit-identically to the
 * plain one (every block, some blocks, nested), its activation high-water
 * drops by what the arithmetic of a block says, hooks fire as the contract
 * says (the wrapped module's once, its children's again in the recompute, with
 * ctx->recompute set), evaluation is untouched, and wrapping is refused twice
 * and freed with the tree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/checkpoint_wrapper.h"
#include "fsc/gpt.h"
#include "hook_log.h"
#include "test_main.h"

#define ALIGN 64 /* the arena's allocation granule */

static size_t rounded(size_t n) {
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static fsc_module *child(fsc_module *m, const char *name) {
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->children[i]->name, name)) return m->children[i];
    fail_msg("module %s has no child %s", m->name, name);
    return NULL;
}

static fsc_module *block(fsc_module *gpt, int l) {
    char name[16];
    snprintf(name, sizeof name, "h.%d", l);
    return child(gpt, name);
}

/* ---- a GPT step, plain or checkpointed ---------------------------------- */

typedef struct {
    float loss;
    float *grad; /* flat gradients (ps.numel), malloc'd copy */
    int64_t numel;
    size_t high_water; /* of the step arena, which is fresh for the run */
} gpt_run;

enum { SEED = 42, STEP = 3, SAMPLE0 = 8 };

/* One micro-batch (training or eval) of a GPT with blocks in block_mask
 * checkpointed, and the MLPs of blocks in mlp_mask. */
static void run_gpt(const fsc_gpt_config *cfg, int B, unsigned block_mask, unsigned mlp_mask,
                    bool train, gpt_run *out) {
    fsc_module *g = fsc_gpt_new(cfg);
    assert_non_null(g);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(g, 7, true, &ps), FSC_OK);
    for (int l = 0; l < cfg->layers; l++) {
        if (mlp_mask >> l & 1)
            assert_int_equal(fsc_checkpoint_wrap(child(block(g, l), "mlp")), FSC_OK);
        if (block_mask >> l & 1) assert_int_equal(fsc_checkpoint_wrap(block(g, l)), FSC_OK);
    }
    int T = cfg->seq, n = B * T;
    int32_t *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint64_t key = fsc_rng_key(5, "ckpt-tokens");
    for (int i = 0; i < n; i++) {
        fsc_philox_out r = fsc_philox4x32(key, 0, (uint64_t)i);
        x[i] = (int32_t)(r.v[0] % (uint32_t)cfg->vocab);
        y[i] = (int32_t)(r.v[1] % (uint32_t)cfg->vocab);
    }
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena,
                   .training = train,
                   .seed = SEED,
                   .step = STEP,
                   .sample0 = SAMPLE0,
                   .keyed = true};
    if (train)
        assert_int_equal(fsc_gpt_train_micro(g, &ctx, x, y, B, T, -1, n, &out->loss), FSC_OK);
    else
        assert_int_equal(fsc_gpt_eval_loss(g, &ctx, x, y, B, T, -1, &out->loss), FSC_OK);
    out->numel = ps.numel;
    out->grad = malloc((size_t)ps.numel * sizeof(float));
    memcpy(out->grad, ps.grad, (size_t)ps.numel * sizeof(float));
    out->high_water = fsc_arena_high_water(arena);
    fsc_arena_free(arena);
    free(x), free(y);
    fsc_params_free(&ps);
    fsc_module_free(g);
}

static void assert_same_run(const gpt_run *a, const gpt_run *b) {
    assert_memory_equal(&a->loss, &b->loss, sizeof a->loss);
    assert_int_equal(a->numel, b->numel);
    assert_memory_equal(a->grad, b->grad, (size_t)a->numel * sizeof(float));
}

static const fsc_gpt_config SMALL = {
    .vocab = 64, .seq = 16, .layers = 3, .d_model = 32, .heads = 4, .dropout = 0.1f};

static void test_gpt_gradients_bit_identical(void **state) {
    (void)state;
    gpt_run plain, all, some, nested, mlp_only;
    run_gpt(&SMALL, 3, 0, 0, true, &plain);
    run_gpt(&SMALL, 3, 0x7, 0, true, &all);      /* every block */
    run_gpt(&SMALL, 3, 0x5, 0, true, &some);     /* h.0 and h.2 */
    run_gpt(&SMALL, 3, 0x3, 0x6, true, &nested); /* h.1: block and its mlp */
    run_gpt(&SMALL, 3, 0, 0x7, true, &mlp_only); /* inside each unwrapped block */
    /* dropout is on and the recompute draws its masks again: the gradients
     * being non-trivial and equal to the bit shows both are the same masks */
    bool any = false;
    for (int64_t i = 0; i < plain.numel; i++) any |= plain.grad[i] != 0.f;
    assert_true(any);
    assert_same_run(&plain, &all);
    assert_same_run(&plain, &some);
    assert_same_run(&plain, &nested);
    assert_same_run(&plain, &mlp_only);
    /* and checkpointing pays off even at this size */
    assert_true(all.high_water < plain.high_water);
    gpt_run *runs[] = {&plain, &all, &some, &nested, &mlp_only};
    for (int i = 0; i < 5; i++) free(runs[i]->grad);
}

/* ---- what a wrapped forward keeps --------------------------------------- */

static void fill(float *x, int64_t n, const char *name) {
    fsc_rng_normal_fill(x, n, 0, fsc_rng_key(3, name), 0.f, 1.f);
}

/* A checkpointed block keeps y and one record, nothing else, and gives the
 * recompute's memory back but dx, even when the arena had to chain new
 * blocks after the mark (small 4 KiB blocks force that); its outputs, dx
 * and gradients are the plain block's to the bit. */
static void test_block_keeps_only_output(void **state) {
    (void)state;
    enum { B = 2, T = 8, C = 32 };
    fsc_module *blk = fsc_block_new("h.0", C, 4, 0.1f, 0, 2);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(blk, 7, true, &ps), FSC_OK);
    size_t nb = (size_t)B * T * C * sizeof(float), gb = (size_t)ps.numel * sizeof(float);
    float *ref_y = malloc(nb), *ref_dx = malloc(nb), *ref_g = malloc(gb);
    for (int wrapped = 0; wrapped < 2; wrapped++) {
        if (wrapped) {
            assert_false(fsc_is_checkpointed(blk));
            assert_int_equal(fsc_checkpoint_wrap(blk), FSC_OK);
            assert_true(fsc_is_checkpointed(blk));
        }
        fsc_params_zero_grad(&ps);
        fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 4096);
        fsc_ctx ctx = {
            .arena = arena, .training = true, .seed = 1, .step = 2, .sample0 = 4, .keyed = true};
        fsc_tensor x = fsc_tensor_arena(arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C}), y, dx;
        fill(x.data, B * T * C, "x");
        size_t before = fsc_arena_used(arena);
        void *saved;
        assert_int_equal(fsc_module_forward(blk, &ctx, &x, &y, &saved), FSC_OK);
        size_t kept = fsc_arena_used(arena) - before;
        fsc_tensor dy = fsc_tensor_arena(arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
        fill(dy.data, B * T * C, "dy");
        before = fsc_arena_used(arena);
        assert_int_equal(fsc_module_backward(blk, &ctx, saved, &dy, &dx), FSC_OK);
        size_t bwd_kept = fsc_arena_used(arena) - before;
        if (!wrapped) {
            memcpy(ref_y, y.data, nb), memcpy(ref_dx, dx.data, nb), memcpy(ref_g, ps.grad, gb);
            assert_true(kept > 10 * nb); /* ~20 (B,T,C) tensors and the attention map */
        } else {
            assert_int_equal(kept, rounded(nb) + ALIGN); /* y and the record of x */
            assert_int_equal(bwd_kept, rounded(nb));     /* dx */
            assert_memory_equal(y.data, ref_y, nb);
            assert_memory_equal(dx.data, ref_dx, nb);
            assert_memory_equal(ps.grad, ref_g, gb);
        }
        fsc_arena_free(arena);
    }
    free(ref_y), free(ref_dx), free(ref_g);
    fsc_params_free(&ps);
    fsc_module_free(blk);
}

/* An identity (dropout with p = 0) returns x as y and dy as dx: the wrapper
 * keeps them as they are and allocates only its record. */
static void test_identity_keeps_aliases(void **state) {
    (void)state;
    fsc_module *d = fsc_dropout_new("drop", 0.f, 1);
    assert_int_equal(fsc_checkpoint_wrap(d), FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 4096);
    fsc_ctx ctx = {.arena = arena, .training = true};
    float xd[6] = {1, 2, 3, 4, 5, 6}, dyd[6] = {6, 5, 4, 3, 2, 1};
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, 2, 3), y, dx;
    fsc_tensor dy = fsc_tensor_2d(dyd, FSC_DTYPE_F32, 2, 3);
    void *saved;
    assert_int_equal(fsc_module_forward(d, &ctx, &x, &y, &saved), FSC_OK);
    assert_ptr_equal(y.data, xd);
    assert_int_equal(fsc_arena_used(arena), ALIGN);
    assert_int_equal(fsc_module_backward(d, &ctx, saved, &dy, &dx), FSC_OK);
    assert_ptr_equal(dx.data, dyd);
    assert_int_equal(fsc_arena_used(arena), ALIGN);
    fsc_arena_free(arena);
    fsc_module_free(d);
}

/* ---- memory -------------------------------------------------------------- */

/* Activation high-water of a GPT step, plain vs every block checkpointed.
 *
 * Arithmetic: a block's training forward keeps K bytes (measured below on a
 * lone block: ~20 (B,T,C) tensors plus the (B,NH,T,T) attention map); wrapped
 * it keeps only y (one (B,T,C), Y bytes) and a record. Backward recomputes one
 * block at a time (K again) and GPT backward gives each block's memory back,
 * so at the backward peak the plain model holds L*K and the checkpointed one
 * L*Y + K. The high-water must fall by at least (L-1)*K - L*Y, less a little
 * for records. Here K = 22 Y (2.75 MiB against 0.125 MiB), so the fall is
 * 3*22 Y - 4 Y = 62 Y = 7.75 MiB of the plain 14.08 MiB: checkpointed, the
 * step needs ~45% of the plain activation memory. (Measured: exactly
 * (L-1)*K - L*(Y + 64), the 64 bytes being each block's record of x.) */
static void test_activation_memory_drops(void **state) {
    (void)state;
    enum { B = 4 };
    fsc_gpt_config cfg = {
        .vocab = 64, .seq = 64, .layers = 4, .d_model = 128, .heads = 4, .dropout = 0.1f};
    int T = cfg.seq, C = cfg.d_model, L = cfg.layers;
    /* K: what one plain block keeps, beyond its input */
    fsc_module *blk = fsc_block_new("h.0", C, cfg.heads, cfg.dropout, 0, L);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(blk, 7, true, &ps), FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true, .seed = SEED, .step = STEP, .keyed = true};
    float *xd = malloc((size_t)B * T * C * sizeof(float));
    fill(xd, (int64_t)B * T * C, "x");
    fsc_tensor x = fsc_tensor_3d(xd, FSC_DTYPE_F32, B, T, C), y;
    assert_int_equal(fsc_module_forward(blk, &ctx, &x, &y, NULL), FSC_OK);
    double K = (double)fsc_arena_used(arena), Y = (double)B * T * C * sizeof(float);
    free(xd);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(blk);

    gpt_run plain, ckpt;
    run_gpt(&cfg, B, 0, 0, true, &plain);
    run_gpt(&cfg, B, (1u << L) - 1, 0, true, &ckpt);
    assert_same_run(&plain, &ckpt);
    double saved = (double)plain.high_water - (double)ckpt.high_water;
    double expect = (L - 1) * K - L * Y - 4096; /* records: a few per block */
    printf("activation high-water, GPT L=%d C=%d B=%d T=%d V=%d: plain %.2f MiB, "
           "checkpointed %.2f MiB (%.1f%%); one block keeps %.2f MiB, its output %.2f MiB; "
           "expected saving >= %.0f bytes, got %.0f bytes\n",
           L, C, B, T, cfg.vocab, plain.high_water / 1048576.0, ckpt.high_water / 1048576.0,
           100.0 * ckpt.high_water / plain.high_water, K / 1048576.0, Y / 1048576.0, expect, saved);
    assert_true(K > 15 * Y); /* the arithmetic below is about a real block */
    assert_true(saved >= expect);
    free(plain.grad), free(ckpt.grad);
}

/* ---- hooks ----------------------------------------------------------------- */

/* A module that logs what its forward saw in ctx->recompute: y = 2x. */
typedef struct {
    fsc_module base;
    hook_log *log;
} probe;

static int probe_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                         void **saved) {
    (void)saved;
    hook_log_note(((probe *)m)->log, ctx->recompute ? "fwd_recompute" : "fwd", m->name);
    *y = *x;
    y->data = fsc_arena_alloc(ctx->arena, fsc_tensor_nbytes(x));
    if (!y->data) return FSC_ERR_NOMEM;
    for (int64_t i = 0; i < fsc_tensor_numel(x); i++)
        ((float *)y->data)[i] = 2.f * ((const float *)x->data)[i];
    return FSC_OK;
}

static int probe_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                          fsc_tensor *dx) {
    (void)saved;
    hook_log_note(((probe *)m)->log, ctx->recompute ? "bwd_recompute" : "bwd", m->name);
    if (!dx) return FSC_OK;
    *dx = *dy;
    dx->data = fsc_arena_alloc(ctx->arena, fsc_tensor_nbytes(dy));
    if (!dx->data) return FSC_ERR_NOMEM;
    for (int64_t i = 0; i < fsc_tensor_numel(dy); i++)
        ((float *)dx->data)[i] = 2.f * ((const float *)dy->data)[i];
    return FSC_OK;
}

static const fsc_module_ops probe_ops = {"Probe", probe_forward, probe_backward, NULL};

static fsc_module *probe_new(const char *name, hook_log *log) {
    probe *p = calloc(1, sizeof *p);
    assert_non_null(p);
    fsc_module_init(&p->base, &probe_ops, name);
    p->log = log;
    return &p->base;
}

/* The wrapped module's own hooks fire once per forward and once per backward
 * (never around the recompute); a child's forward hooks fire again inside
 * backward, where they and its forward see ctx->recompute; its backward and
 * backward hooks do not (backward is not a recompute). */
static void test_hooks_and_recompute_flag(void **state) {
    (void)state;
    hook_log log = {0};
    fsc_module *parts[2] = {fsc_linear_new("lin", 4, 4, true, FSC_WEIGHT_OUT_IN, 0.1f),
                            probe_new("probe", &log)};
    fsc_module *seq = fsc_sequential_new("seq", 2, parts);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(seq, 1, true, &ps), FSC_OK);
    for (int k = 0; k < FSC_HOOK_KIND_COUNT; k++) {
        assert_int_equal(fsc_module_add_hook(seq, (fsc_hook_kind)k, hook_log_record, &log), FSC_OK);
        assert_int_equal(fsc_module_add_hook(parts[1], (fsc_hook_kind)k, hook_log_record, &log),
                         FSC_OK);
    }
    assert_int_equal(fsc_checkpoint_wrap(seq), FSC_OK);
    hook_log_step(seq);
    const char *want[] = {
        "pre_fwd:seq",
        "pre_fwd:probe",
        "fwd:probe",
        "post_fwd:probe",
        "post_fwd:seq",
        "pre_bwd:seq",
        "pre_fwd_recompute:probe",
        "fwd_recompute:probe",
        "post_fwd_recompute:probe",
        "pre_bwd:probe",
        "bwd:probe",
        "post_bwd:probe",
        "post_bwd:seq",
    };
    int nwant = (int)(sizeof want / sizeof *want);
    assert_int_equal(log.n, nwant);
    for (int i = 0; i < nwant; i++) assert_string_equal(log.log[i], want[i]);
    fsc_params_free(&ps);
    fsc_module_free(seq);
}

/* ---- eval, refusal, lifetime ---------------------------------------------- */

/* training = false: nothing is dropped or recomputed, so the loss and the
 * arena's high-water are the plain model's exactly. */
static void test_eval_is_plain(void **state) {
    (void)state;
    gpt_run plain, ckpt;
    run_gpt(&SMALL, 3, 0, 0, false, &plain);
    run_gpt(&SMALL, 3, 0x7, 0x2, false, &ckpt);
    assert_memory_equal(&plain.loss, &ckpt.loss, sizeof plain.loss);
    assert_int_equal(plain.high_water, ckpt.high_water);
    free(plain.grad), free(ckpt.grad);
}

static void test_wrap_twice_refused(void **state) {
    (void)state;
    fsc_module *g = fsc_gpt_new(&SMALL);
    assert_non_null(g);
    fsc_module *h1 = block(g, 1);
    assert_int_equal(fsc_checkpoint_wrap(h1), FSC_OK);
    const fsc_module_ops *ops = h1->ops;
    assert_int_equal(fsc_checkpoint_wrap(h1), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "h.1"));
    assert_non_null(strstr(fsc_last_error(), "already checkpointed"));
    assert_ptr_equal(h1->ops, ops); /* untouched by the refusal */
    assert_int_equal(fsc_checkpoint_wrap(NULL), FSC_ERR_INVALID);
    assert_false(fsc_is_checkpointed(NULL));
    assert_false(fsc_is_checkpointed(block(g, 0)));
    fsc_module_free(g);
}

/* Wrapping keeps names, kind and tree; the records go with fsc_module_free
 * whether the module has its own free (the GPT root) or not (blocks, the MLP
 * Sequential). The ASan build checks nothing leaks. */
static void test_wrap_keeps_tree_and_frees(void **state) {
    (void)state;
    fsc_module *g = fsc_gpt_new(&SMALL);
    assert_non_null(g);
    fsc_params before, after;
    assert_int_equal(fsc_params_collect(g, &before), FSC_OK);
    const char *kind = block(g, 0)->ops->kind;
    assert_int_equal(fsc_checkpoint_wrap(g), FSC_OK); /* GPT has its own free op */
    for (int l = 0; l < SMALL.layers; l++) {
        assert_int_equal(fsc_checkpoint_wrap(block(g, l)), FSC_OK);
        assert_int_equal(fsc_checkpoint_wrap(child(block(g, l), "mlp")), FSC_OK);
    }
    assert_string_equal(block(g, 0)->ops->kind, kind);
    assert_string_equal(g->ops->kind, "GPT");
    assert_int_equal(fsc_params_collect(g, &after), FSC_OK);
    assert_int_equal(before.count, after.count);
    for (int i = 0; i < before.count; i++) {
        assert_string_equal(before.entries[i].name, after.entries[i].name);
        assert_int_equal(before.entries[i].offset, after.entries[i].offset);
    }
    fsc_params_free(&before);
    fsc_params_free(&after);
    fsc_module_free(g);
    /* a lone wrapped leaf without a free op */
    fsc_module *lin = fsc_linear_new("lin", 3, 3, false, FSC_WEIGHT_OUT_IN, 0.1f);
    assert_int_equal(fsc_checkpoint_wrap(lin), FSC_OK);
    fsc_module_free(lin);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_gpt_gradients_bit_identical),
              cmocka_unit_test(test_block_keeps_only_output),
              cmocka_unit_test(test_identity_keeps_aliases),
              cmocka_unit_test(test_activation_memory_drops),
              cmocka_unit_test(test_hooks_and_recompute_flag), cmocka_unit_test(test_eval_is_plain),
              cmocka_unit_test(test_wrap_twice_refused),
              cmocka_unit_test(test_wrap_keeps_tree_and_frees))
