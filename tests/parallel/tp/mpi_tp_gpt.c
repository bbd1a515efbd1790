/* The tensor-parallel GPT (fsc/tp.h) over the world as one TP group (t = 1,
 * 2, 4), beyond training equivalence (tests/parallel/tp/mpi_tp.c):
 *  - the file a TP group saves is the one-process file, byte for byte, and a
 *    TP model loads the one-process file into exactly its slices (so every
 *    shard equals the slice of the one-process weight, bit for bit);
 *  - replicated parameters (LayerNorms, row biases, wpe) stay bitwise equal
 *    across TP ranks over 50 AdamW steps with sequence parallelism on;
 *  - the gradient norm under TP equals the one-process norm within the noise
 *    floor of summation order, and counting replicated parameters t times
 *    (the recurring bug) would be caught by that bound;
 *  - activation checkpointing inside TP blocks changes nothing, bitwise;
 *  - a training micro-step writes no gradient before backward begins (the
 *    fused head runs there), as ShardedDDP's gradient memory needs;
 *  - bad configurations are refused with a message. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <string.h>

/* the model, data and noise constants; this program compares bitwise or by its
 * own bounds, so equivalence.h's eq_compare goes unused here */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "equivalence.h"
#include "tp_test.h"
#pragma GCC diagnostic pop
#include "fsc/checkpoint_wrapper.h"
#include "fsc/tp.h"
#include "fsc/weights.h"
#include "mpi_test.h"

static int rank, world;
static char dir[64];

static fsc_gpt_config model_v(int vocab) {
    fsc_gpt_config c = EQ_MODEL;
    c.vocab = vocab;
    return c;
}

static unsigned char *slurp(const char *path, long *n) {
    unsigned char *b = mpi_read_file(path, n);
    assert_non_null(b);
    return b;
}

/* cfg's one-process GPT (seed 5) written to path with the n metadata
 * entries keys/values: the file the TP model reads by global name. */
static void save_one_process(const fsc_gpt_config *cfg, const char *path, int n,
                             const char *const *keys, const char *const *values) {
    fsc_module *m = fsc_gpt_new(cfg);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, false, &ps), FSC_OK);
    assert_int_equal(fsc_weights_save(path, &ps, n, keys, values), FSC_OK);
    fsc_params_free(&ps), fsc_module_free(m);
}

/* ---- weights by global name ---------------------------------------------------------- */
static void check_weights(int vocab) {
    fsc_gpt_config cfg = model_v(vocab);
    const char *keys[] = {"format"}, *values[] = {"pt"};
    char one[128], tp[128];
    snprintf(one, sizeof one, "%s/one_%d.safetensors", dir, vocab);
    snprintf(tp, sizeof tp, "%s/tp_%d.safetensors", dir, vocab);
    if (rank == 0) save_one_process(&cfg, one, 1, keys, values);
    fsc_tp_options opt = {.group = fsc_group_world()};
    fsc_module *a = fsc_tp_gpt_new(&cfg, &opt), *b = fsc_tp_gpt_new(&cfg, &opt);
    fsc_params pa, pb;
    assert_int_equal(fsc_tp_params_bind(a, 5, false, &pa), FSC_OK);
    assert_int_equal(fsc_tp_params_bind(b, 77, false, &pb), FSC_OK);
    assert_int_equal(fsc_tp_save_weights(tp, a, &pa, fsc_group_world(), 1, keys, values), FSC_OK);
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK);
    long n1, n2;
    unsigned char *f1 = slurp(one, &n1), *f2 = slurp(tp, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(f1, f2, (size_t)n1);
    fprintf(stderr, "V %d, TP %d: saved file = one-process file (%ld bytes)\n", vocab, world, n1);
    free(f1), free(f2);
    /* the one-process file loads into exactly the slices a TP init draws */
    int unused = -1;
    assert_int_equal(fsc_tp_load_weights(one, b, &pb, &unused), FSC_OK);
    assert_int_equal(unused, 0);
    assert_memory_equal(pa.data, pb.data, sizeof(float) * (size_t)pa.numel);
    /* padding rows: zero */
    int first, count, vp;
    fsc_tp_vocab_range(vocab, world, rank, &first, &count, &vp);
    const fsc_param *wte = fsc_params_find(&pa, "wte.weight")->param;
    assert_int_equal(wte->shape[0], vp);
    for (int64_t i = (int64_t)count * cfg.d_model; i < wte->numel; i++)
        assert_true(wte->data[i] == 0.f);
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK);
    fsc_params_free(&pa), fsc_params_free(&pb);
    fsc_module_free(a), fsc_module_free(b);
}

static void test_weights_by_global_name(void **state) {
    (void)state;
    check_weights(64);
    check_weights(67);
    /* a file of another model: refused, nothing changed */
    fsc_gpt_config small = EQ_MODEL;
    small.layers = 1;
    char path[128];
    snprintf(path, sizeof path, "%s/small.safetensors", dir);
    if (rank == 0) save_one_process(&small, path, 0, NULL, NULL);
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK);
    fsc_tp_options opt = {.group = fsc_group_world()};
    fsc_module *m = fsc_tp_gpt_new(&EQ_MODEL, &opt);
    fsc_params ps;
    assert_int_equal(fsc_tp_params_bind(m, 5, false, &ps), FSC_OK);
    float *before = malloc(sizeof(float) * (size_t)ps.numel);
    memcpy(before, ps.data, sizeof(float) * (size_t)ps.numel);
    assert_int_equal(fsc_tp_load_weights(path, m, &ps, NULL), FSC_ERR_NOT_FOUND);
    assert_non_null(strstr(fsc_last_error(), "h.1."));
    assert_memory_equal(before, ps.data, sizeof(float) * (size_t)ps.numel);
    free(before);
    fsc_params_free(&ps), fsc_module_free(m);
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK);
}

/* ---- training helpers -------------------------------------------------------------------- */
typedef struct {
    fsc_module *m;
    fsc_params ps;
    fsc_optim_range *r;
    int nr;
    fsc_optim *opt;
    fsc_arena *arena;
    fsc_tokens tk;
} trainer;

static void trainer_init(trainer *t, const fsc_gpt_config *cfg, bool sp, bool ckpt) {
    fsc_tp_options opt = {.group = fsc_group_world(), .sequence_parallel = sp};
    t->m = fsc_tp_gpt_new(cfg, &opt);
    assert_non_null(t->m);
    if (ckpt)
        for (int i = 0; i < t->m->nchildren; i++)
            if (strncmp(t->m->children[i]->name, "h.", 2) == 0)
                assert_int_equal(fsc_checkpoint_wrap(t->m->children[i]), FSC_OK);
    assert_int_equal(fsc_tp_params_bind(t->m, 5, true, &t->ps), FSC_OK);
    assert_int_equal(fsc_optim_ranges_from_params(&t->ps, &t->r, &t->nr), FSC_OK);
    t->opt = fsc_optim_new(&EQ_ADAMW, t->r, t->nr);
    t->arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    eq_tokens(&t->tk);
}

/* Forward and backward of step s's global batch (gradients zeroed first). */
static float trainer_backward(trainer *t, const fsc_gpt_config *cfg, int s) {
    float loss;
    if (tp_test_micro(t->m, &t->ps, t->arena, &t->tk, cfg->seq, s, &loss))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    return loss;
}

static void trainer_free(trainer *t) {
    fsc_arena_free(t->arena);
    fsc_optim_free(t->opt);
    fsc_optim_ranges_free(t->r);
    fsc_params_free(&t->ps);
    fsc_module_free(t->m);
    fsc_tokens_free(&t->tk);
}

/* Every replicated parameter (and its gradient) equals rank 0's, bitwise. */
static int replicated_differ(trainer *t) {
    int bad = 0, checked = 0;
    for (int i = 0; i < t->ps.count; i++) {
        if (fsc_tp_param_is_sharded(t->m, &t->ps, i)) continue;
        const fsc_param *p = t->ps.entries[i].param;
        float *buf = malloc(sizeof(float) * 2 * (size_t)p->numel);
        memcpy(buf, p->data, sizeof(float) * (size_t)p->numel);
        memcpy(buf + p->numel, p->grad, sizeof(float) * (size_t)p->numel);
        assert_int_equal(
            fsc_group_broadcast(fsc_group_world(), buf, 2 * p->numel, FSC_DTYPE_F32, 0), FSC_OK);
        if (memcmp(buf, p->data, sizeof(float) * (size_t)p->numel) ||
            memcmp(buf + p->numel, p->grad, sizeof(float) * (size_t)p->numel)) {
            fprintf(stderr, "rank %d: replicated %s differs from rank 0's\n", rank,
                    t->ps.entries[i].name);
            bad++;
        }
        checked++;
        free(buf);
    }
    assert_true(checked >= 4 * EQ_MODEL.layers + 3); /* ln_1, ln_2, two row biases; wpe, ln_f */
    return bad;
}

static void test_replicated_bitwise_sp(void **state) {
    (void)state;
    fsc_gpt_config cfg = model_v(67);
    trainer t;
    trainer_init(&t, &cfg, true, false);
    for (int s = 0; s < 50; s++) {
        trainer_backward(&t, &cfg, s);
        if (s % 10 == 9) assert_int_equal(replicated_differ(&t), 0);
        assert_int_equal(fsc_optim_step(t.opt), FSC_OK);
    }
    assert_int_equal(replicated_differ(&t), 0);
    trainer_free(&t);
}

/* ---- gradient norm --------------------------------------------------------------------- */
/* One process, step 0's global batch as `micro` micro-batches: the norm. */
static double one_process_norm(int micro) {
    eq_setup e;
    assert_int_equal(eq_setup_new(&e, &EQ_MODEL, 5), FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    const eq_batch b = eq_batch_of_rank(&e.tk, arena, EQ_MODEL.seq, micro, 0, 1, x, y);
    fsc_params_zero_grad(&e.ps);
    for (int k = 0; k < micro; k++) assert_int_equal(eq_micro(e.m, &b, 0, k), FSC_OK);
    double norm = sqrt(fsc_grad_norm_sq(e.r, e.nr));
    fsc_arena_free(arena);
    eq_setup_free(&e);
    return norm;
}

static void check_grad_norm(bool sp) {
    /* the noise floor: the spread of the one-process norm over summation orders */
    double ref = one_process_norm(1), spread = 0;
    for (int micro = 2; micro <= 8; micro *= 2)
        spread = fmax(spread, fabs(one_process_norm(micro) - ref));
    const double bound = EQ_NOISE_K * spread + EQ_FLOOR_ULPS * FLT_EPSILON * ref;
    trainer t;
    trainer_init(&t, &EQ_MODEL, sp, false);
    trainer_backward(&t, &EQ_MODEL, 0);
    float norm;
    assert_int_equal(fsc_tp_grad_norm(t.m, &t.ps, fsc_group_world(), &norm), FSC_OK);
    /* the recurring bug: every rank's local norm summed, replicated ones t times */
    float local = (float)fsc_grad_norm_sq(t.r, t.nr), naive = local;
    assert_int_equal(
        fsc_group_allreduce(fsc_group_world(), &naive, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM), FSC_OK);
    naive = sqrtf(naive);
    fprintf(stderr,
            "grad norm, TP %d%s, rank %d: %.9g vs one process %.9g (bound %.2e); replicated "
            "counted %d times: %.9g\n",
            world, sp ? " + SP" : "", rank, norm, ref, bound, world, naive);
    assert_true(fabs(norm - ref) <= bound);
    if (world > 1) assert_true(fabs(naive - ref) > bound);
    float all = norm;
    assert_int_equal(fsc_group_allreduce(fsc_group_world(), &all, 1, FSC_DTYPE_F32, FSC_REDUCE_MAX),
                     FSC_OK);
    assert_true(all == norm); /* the same on every rank */
    trainer_free(&t);
}

static void test_grad_norm(void **state) {
    (void)state;
    check_grad_norm(false);
    check_grad_norm(true);
}

/* ---- gradients are written inside backward only ------------------------------------------ */
/* ShardedDDP commits gradient memory in its pre-backward hooks and drops
 * what was there: a gradient written during forward (the fused head's, if
 * it ran there) would be lost under sdp alone. The root's pre-backward hook
 * sees every gradient still zero, and the micro-step then writes them. */
typedef struct {
    const fsc_params *ps;
    int calls, nonzero;
} zero_probe;

static int probe_zero(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx, const fsc_tensor *t,
                      void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    zero_probe *z = user;
    z->calls++;
    for (int64_t i = 0; i < z->ps->numel; i++) z->nonzero += z->ps->grad[i] != 0.f;
    return FSC_OK;
}

static void test_grads_written_in_backward(void **state) {
    (void)state;
    for (int sp = 0; sp < 2; sp++) {
        fsc_tp_options opt = {.group = fsc_group_world(), .sequence_parallel = sp};
        fsc_module *m = fsc_tp_gpt_new(&EQ_MODEL, &opt);
        fsc_params ps;
        assert_int_equal(fsc_tp_params_bind(m, 5, true, &ps), FSC_OK);
        zero_probe z = {.ps = &ps};
        assert_int_equal(fsc_module_add_hook(m, FSC_HOOK_PRE_BACKWARD, probe_zero, &z), FSC_OK);
        fsc_tokens tk;
        eq_tokens(&tk);
        fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
        float loss;
        if (tp_test_micro(m, &ps, arena, &tk, EQ_MODEL.seq, 0, &loss))
            fail_msg("rank %d: %s", rank, fsc_last_error());
        assert_int_equal(z.calls, 1);
        if (z.nonzero)
            fail_msg("SP %d: %d gradient elements written before backward began", sp, z.nonzero);
        const fsc_param *wte = fsc_params_find(&ps, "wte.weight")->param;
        bool any = false;
        for (int64_t i = 0; i < wte->numel; i++) any |= wte->grad[i] != 0.f;
        assert_true(any);
        fsc_arena_free(arena);
        fsc_tokens_free(&tk);
        fsc_params_free(&ps);
        fsc_module_free(m);
    }
}

/* ---- checkpointing inside TP blocks ----------------------------------------------------- */
static void test_checkpoint_bitwise(void **state) {
    (void)state;
    fsc_gpt_config cfg = model_v(67);
    for (int sp = 0; sp < 2; sp++) {
        trainer a, b;
        trainer_init(&a, &cfg, sp, false);
        trainer_init(&b, &cfg, sp, true);
        for (int s = 0; s < 3; s++) {
            float la = trainer_backward(&a, &cfg, s), lb = trainer_backward(&b, &cfg, s);
            assert_true(la == lb);
            assert_memory_equal(a.ps.grad, b.ps.grad, sizeof(float) * (size_t)a.ps.numel);
            assert_int_equal(fsc_optim_step(a.opt), FSC_OK);
            assert_int_equal(fsc_optim_step(b.opt), FSC_OK);
        }
        assert_memory_equal(a.ps.data, b.ps.data, sizeof(float) * (size_t)a.ps.numel);
        trainer_free(&a), trainer_free(&b);
    }
}

/* ---- bad configurations ------------------------------------------------------------------ */
static void test_bad_configs(void **state) {
    (void)state;
    fsc_tp_options sp = {.group = fsc_group_world(), .sequence_parallel = true};
    assert_null(fsc_tp_gpt_new(&EQ_MODEL, NULL));
    assert_null(fsc_tp_column_linear_new("c", 4, 6, true, FSC_WEIGHT_IN_OUT, 0.1f, false, NULL));
    if (world == 1) return;
    fsc_gpt_config odd = EQ_MODEL;
    odd.heads = 2, odd.d_model = 30; /* heads not divisible by 4; 30 not by 4 */
    if (world == 4) {
        assert_null(fsc_tp_gpt_new(&odd, &sp));
        assert_non_null(strstr(fsc_last_error(), "divisible"));
    }
    assert_null(fsc_tp_column_linear_new("c", 4, 7, true, FSC_WEIGHT_IN_OUT, 0.1f, false, &sp));
    assert_non_null(strstr(fsc_last_error(), "divisible by the tensor-parallel size"));
    /* under SP the sequence must split evenly: refused before any collective */
    fsc_module *m = fsc_tp_gpt_new(&EQ_MODEL, &sp);
    fsc_params ps;
    assert_int_equal(fsc_tp_params_bind(m, 5, true, &ps), FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true, .keyed = true};
    int32_t x[15] = {0}, y[15] = {0};
    float loss;
    assert_int_equal(fsc_tp_gpt_train_micro(m, &ctx, x, y, 1, 15, -1, 15.0, &loss), FSC_ERR_SHAPE);
    assert_non_null(strstr(fsc_last_error(), "T divisible"));
    fsc_arena_free(arena);
    fsc_params_free(&ps), fsc_module_free(m);
}

MPI_TEST_MAIN_IN_SCRATCH("fsc_tp_gpt", dir, cmocka_unit_test(test_weights_by_global_name),
                         cmocka_unit_test(test_replicated_bitwise_sp),
                         cmocka_unit_test(test_grad_norm),
                         cmocka_unit_test(test_checkpoint_bitwise),
                         cmocka_unit_test(test_grads_written_in_backward),
                         cmocka_unit_test(test_bad_configs))
