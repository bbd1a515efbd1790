/* Expert parallelism on 1, 2 and 4 ranks: an MoE GPT (4 experts in every
 * block, capacity drops, dropout, gradient clipping on; GPT-2's experts, and
 * again a LLaMA with Mixtral's SwiGLU experts, no dropout) trained under ddp
 * with its experts spread over the ranks ends with the same parameters as
 * one process holding every expert on the same global batch, within the
 * measured noise floor of tests/support/equivalence.h. The weights file (every
 * rank's experts gathered by global name) loads into the one-process model.
 * A checkpoint (experts' optimizer state by global name) resumes bit for
 * bit at the same size, and across one process and the world within the
 * noise floor. The all-to-all exchanges are counted, the dropped tokens
 * reported, and strategies other than ddp refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "fsc/moe_parallel.h"
#include "trainer_test.h"

static int rank, world;
static char dir[64];

enum { STEPS = EQ_STEPS };
static const float MAX_NORM = 0.5f; /* below the gradient norm of these steps: clipping acts */

static fsc_moe_options one_moe = {
    .experts = 4, .every = 1, .capacity_factor = 1.0f, .aux_coef = 0.05f};

/* The model the MoE layers go into: the test GPT-2, or (test_llama_*) a
 * LLaMA of the same size (EQ_LLAMA_MOE), whose MoE layers are Mixtral's
 * (SwiGLU experts). */
static const fsc_gpt_config *base = &EQ_MODEL;

static fsc_gpt_config with_moe(const fsc_moe_options *o) {
    fsc_gpt_config c = *base;
    c.moe = o;
    return c;
}

typedef struct {
    int32_t *x, *y;
    int T;
    double norm;
} batch;

static int work(fsc_module *m, const fsc_ctx *ctx, int row0, int rows, void *user, float *loss) {
    batch *b = user;
    return fsc_gpt_train_micro(m, ctx, b->x + (int64_t)row0 * b->T, b->y + (int64_t)row0 * b->T,
                               rows, b->T, -1, b->norm, loss);
}

/* A strategy `name` over an MoE GPT, its experts over the world when
 * `spread` (else every expert here); NULL when set-up failed (error set). */
static fsc_strategy *make(const char *name, bool spread, fsc_module **model,
                          fsc_moe_options *ep_moe, fsc_gpt_config *cfg) {
    *ep_moe = one_moe;
    if (spread) assert_int_equal(fsc_moe_ep_exchange(fsc_group_world(), &ep_moe->ep), FSC_OK);
    *cfg = with_moe(ep_moe);
    *model = fsc_gpt_new(cfg);
    assert_non_null(*model);
    return fsc_strategy_new(*model, &EQ_ADAMW, &(fsc_strategy_options){.name = name, .seed = 5});
}

/* Steps [from, to) of s, this process being rank me of P sharing the
 * global batch; losses[st] (may be NULL) gets each step's loss. */
static void run(fsc_strategy *s, int from, int to, int me, int P, float *losses) {
    fsc_tokens tk;
    eq_tokens(&tk);
    const int B = EQ_GLOBAL_BATCH / P, T = EQ_MODEL.seq;
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    batch b = {x, y, T, (double)EQ_GLOBAL_BATCH * T};
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 22);
    const eq_batch eb = eq_batch_of_rank(&tk, arena, T, 1, me, P, x, y);
    for (int st = from; st < to; st++) {
        fsc_strategy_zero_grad(s);
        fsc_ctx ctx;
        assert_int_equal(eq_micro_input(&eb, st, 0, &ctx), FSC_OK);
        float loss, norm;
        assert_int_equal(fsc_strategy_forward_backward(s, &ctx, 0, 1, B, work, &b, &loss), FSC_OK);
        assert_int_equal(fsc_strategy_clip_grad_norm(s, MAX_NORM, &norm), FSC_OK);
        assert_true(norm > MAX_NORM);
        assert_int_equal(fsc_strategy_step(s), FSC_OK);
        if (losses) losses[st] = loss;
    }
    fsc_arena_free(arena);
    fsc_tokens_free(&tk);
}

/* STEPS steps of `name` with experts over the world; NULL when set-up
 * failed (error set). */
static fsc_strategy *train(const char *name, fsc_module **model, fsc_moe_options *ep_moe,
                           fsc_gpt_config *cfg) {
    fsc_strategy *s = make(name, true, model, ep_moe, cfg);
    if (s) run(s, 0, STEPS, rank, world, NULL);
    return s;
}

static void test_same_as_one_process(void **state) {
    (void)state;
    fsc_module *model;
    fsc_moe_options ep_moe;
    fsc_gpt_config cfg;
    fsc_group_reset_stats(fsc_group_world());
    fsc_strategy *s = train("ddp", &model, &ep_moe, &cfg);
    if (!s) fprintf(stderr, "%s\n", fsc_last_error());
    assert_non_null(s);
    const fsc_group_stats gs = fsc_group_get_stats(fsc_group_world());
    /* dispatch and combine, forward and backward, per MoE layer and step */
    assert_int_equal(gs.count[FSC_COLL_ALLTOALL], world > 1 ? 4 * EQ_MODEL.layers * STEPS : 0);
    fsc_moe_stats ms = fsc_moe_get_stats(model);
    assert_int_equal(ms.tokens,
                     (int64_t)EQ_GLOBAL_BATCH / world * EQ_MODEL.seq * EQ_MODEL.layers * STEPS);
    int64_t dropped = ms.dropped1 + ms.dropped2;
    assert_int_equal(
        fsc_group_allreduce(fsc_group_world(), &dropped, 1, FSC_DTYPE_I64, FSC_REDUCE_SUM), FSC_OK);
    assert_true(dropped > 0); /* capacity 1.0: second choices overflow */
    if (rank == 0)
        fprintf(stderr,
                "%d ranks: %lld of %lld choices dropped, %lld all-to-alls, %.3f s in them\n", world,
                (long long)dropped, (long long)(2 * ms.tokens * world), (long long)ms.exchanges,
                ms.exchange_s);
    char path[128];
    snprintf(path, sizeof path, "%s/moe.safetensors", dir);
    assert_int_equal(fsc_strategy_save_weights(s, path, 0, 0, NULL, NULL), FSC_OK);
    fsc_strategy_free(s);
    fsc_module_free(model);
    if (rank == 0) {
        const fsc_gpt_config one = with_moe(&one_moe);
        int64_t n;
        float *got = tt_read_weights(&one, path, &n);
        tt_expect_reference(&(eq_options){.model = &one, .max_norm = MAX_NORM},
                            "MoE GPT, experts over the ranks", got, n);
    }
    fsc_group_barrier(fsc_group_world());
}

enum { AT = 2 }; /* the step a checkpoint is taken at */

/* Strategy `name` (experts spread when `spread`) from the checkpoint
 * prefix.{model,optim}.safetensors, through steps [AT, STEPS); its final
 * weights to prefix.final.safetensors. */
static void resume(const char *name, bool spread, const char *prefix, int me, int P,
                   float *losses) {
    fsc_module *model;
    fsc_moe_options ep_moe;
    fsc_gpt_config cfg;
    fsc_strategy *s = make(name, spread, &model, &ep_moe, &cfg);
    assert_non_null(s);
    char path[160];
    snprintf(path, sizeof path, "%s.model.safetensors", prefix);
    assert_int_equal(fsc_strategy_load_weights(s, path, NULL), FSC_OK);
    snprintf(path, sizeof path, "%s.optim.safetensors", prefix);
    if (fsc_strategy_load_optim(s, path)) fprintf(stderr, "%s\n", fsc_last_error());
    assert_int_equal(fsc_strategy_load_optim(s, path), FSC_OK);
    run(s, AT, STEPS, me, P, losses);
    snprintf(path, sizeof path, "%s.final.safetensors", prefix);
    assert_int_equal(fsc_strategy_save_weights(s, path, 0, 0, NULL, NULL), FSC_OK);
    fsc_strategy_free(s);
    fsc_module_free(model);
}

/* Steps [0, AT) of `name`, saved as prefix.{model,optim}.safetensors. */
static void checkpoint(const char *name, bool spread, const char *prefix, int me, int P) {
    fsc_module *model;
    fsc_moe_options ep_moe;
    fsc_gpt_config cfg;
    fsc_strategy *s = make(name, spread, &model, &ep_moe, &cfg);
    assert_non_null(s);
    run(s, 0, AT, me, P, NULL);
    char path[160];
    snprintf(path, sizeof path, "%s.model.safetensors", prefix);
    assert_int_equal(fsc_strategy_save_weights(s, path, 0, 0, NULL, NULL), FSC_OK);
    snprintf(path, sizeof path, "%s.optim.safetensors", prefix);
    assert_int_equal(fsc_strategy_save_optim(s, path, 0), FSC_OK);
    fsc_strategy_free(s);
    fsc_module_free(model);
}

static float *read_final(const char *prefix, int64_t *n) {
    char path[160];
    snprintf(path, sizeof path, "%s.final.safetensors", prefix);
    const fsc_gpt_config one = with_moe(&one_moe);
    return tt_read_weights(&one, path, n);
}

/* A checkpoint at step AT with the experts over the ranks (their optimizer
 * state by global name) resumes to the uninterrupted run's losses and
 * parameters bit for bit at the same expert-parallel size; in one process
 * holding every expert, and from one process's checkpoint at this size, it
 * ends on the one-process run within its noise floor. Fresh optimizer state
 * or one expert's state on another would miss both. */
static void test_checkpoint_resume(void **state) {
    (void)state;
    char whole[128], ck[128], one[128];
    snprintf(whole, sizeof whole, "%s/whole", dir);
    snprintf(ck, sizeof ck, "%s/ep", dir);
    snprintf(one, sizeof one, "%s/one", dir);
    float straight[STEPS], resumed[STEPS];
    { /* uninterrupted */
        fsc_module *model;
        fsc_moe_options ep_moe;
        fsc_gpt_config cfg;
        fsc_strategy *s = make("ddp", true, &model, &ep_moe, &cfg);
        assert_non_null(s);
        run(s, 0, STEPS, rank, world, straight);
        char path[160];
        snprintf(path, sizeof path, "%s.final.safetensors", whole);
        assert_int_equal(fsc_strategy_save_weights(s, path, 0, 0, NULL, NULL), FSC_OK);
        fsc_strategy_free(s);
        fsc_module_free(model);
    }
    checkpoint("ddp", true, ck, rank, world);
    resume("ddp", true, ck, rank, world, resumed);
    for (int st = AT; st < STEPS; st++) assert_memory_equal(&straight[st], &resumed[st], 4);
    if (rank == 0) { /* the same experts, the same sums: the same bits */
        int64_t n, m;
        float *a = read_final(whole, &n), *b = read_final(ck, &m);
        assert_int_equal(n, m);
        assert_memory_equal(a, b, (size_t)n * 4);
        free(a), free(b);
        /* into one process holding every expert; and one process's checkpoint */
        resume("single", false, ck, 0, 1, NULL);
        checkpoint("single", false, one, 0, 1);
    }
    fsc_group_barrier(fsc_group_world());
    resume("ddp", true, one, rank, world, NULL);
    if (rank == 0) {
        const fsc_gpt_config cfg1 = with_moe(&one_moe);
        int64_t n, m, k;
        float *ref = eq_reference_ex(&(eq_options){.model = &cfg1, .max_norm = MAX_NORM}, &n);
        float *got = read_final(ck, &m), *back = read_final(one, &k);
        tt_expect_close("resumed in one process from the ranks", got, m, ref, n);
        tt_expect_close("resumed on the ranks from one process", back, k, ref, n);
        free(ref), free(got), free(back);
    }
    fsc_group_barrier(fsc_group_world());
}

/* The same two checks on the LLaMA family: Mixtral's block_sparse_moe with
 * SwiGLU experts spread over the ranks equals one process holding them all,
 * and its checkpoint resumes by global name across sizes. */
static void test_llama_same_as_one_process(void **state) {
    base = &EQ_LLAMA_MOE;
    test_same_as_one_process(state);
    base = &EQ_MODEL;
}

static void test_llama_checkpoint_resume(void **state) {
    base = &EQ_LLAMA_MOE;
    test_checkpoint_resume(state);
    base = &EQ_MODEL;
}

/* Expert shards need ddp over their group: the others are refused by name. */
static void test_other_strategies_refused(void **state) {
    (void)state;
    if (world == 1) skip();
    const char *rows[] = {"oss", "sdp", "single"};
    for (int i = 0; i < 3; i++) {
        fsc_module *model;
        fsc_moe_options ep_moe;
        fsc_gpt_config cfg;
        assert_null(train(rows[i], &model, &ep_moe, &cfg));
        assert_non_null(strstr(fsc_last_error(), "ddp only"));
        fsc_module_free(model);
    }
}

/* Ranks that route different token counts issue different all-to-alls: the
 * group's desync check names it on every rank instead of a hang or garbage.
 * On a group of its own, which the failure leaves unusable. */
static void test_mismatch_is_desync(void **state) {
    (void)state;
    if (world == 1) skip();
    fsc_group *g;
    assert_int_equal(fsc_group_split(fsc_group_world(), 0, rank, "moe-desync", &g), FSC_OK);
    fsc_moe_options o = one_moe;
    assert_int_equal(fsc_moe_ep_exchange(g, &o.ep), FSC_OK);
    fsc_module *m = fsc_moe_new("mlp", 8, &o, 0.f, 0, 0.02f, 0.02f);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 1, true, &ps), FSC_OK);
    const int B = 1 + rank, T = 4; /* a different batch on every rank */
    float xd[4 * 4 * 8] = {0};
    for (int i = 0; i < B * T * 8; i++) xd[i] = (float)((i * 7) % 5) - 2.f;
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true};
    fsc_tensor x = fsc_tensor_make(xd, FSC_DTYPE_F32, 3, (int64_t[]){B, T, 8}), y;
    assert_int_equal(fsc_module_forward(m, &ctx, &x, &y, NULL), FSC_ERR_DESYNC);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

TT_MAIN("fsc_moe", dir, cmocka_unit_test(test_same_as_one_process),
        cmocka_unit_test(test_checkpoint_resume), cmocka_unit_test(test_llama_same_as_one_process),
        cmocka_unit_test(test_llama_checkpoint_resume),
        cmocka_unit_test(test_other_strategies_refused), cmocka_unit_test(test_mismatch_is_desync))
