/* The sharded grad scaler over 1, 2 and 4 ranks: each rank unscales its own
 * shard, and an inf or NaN on any single rank (each in turn) makes found_inf
 * true on EVERY rank, so every rank skips and backs off together; a clean
 * step is false everywhere with the shards exactly unscaled; fp16 overflow of
 * scaled gradients on one rank is seen by all; a bad argument on one rank
 * fails every rank without a hang; and ShardedDDP + OSS training with loss
 * scaling (and one overflowed step) ends bit-identical to unscaled training
 * that skips the same step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "equivalence.h"
#include "mpi_test.h"
#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/sharded_grad_scaler.h"
#include "fsc/zero.h"
#include "zero_test.h"

static int rank, world;

/* This rank's shard: a different length and different values on every rank,
 * the length not a multiple of any vector width. */
static int64_t shard_len(int r) {
    return 513 + 37 * r;
}

static void fill_shard(float *g, int64_t n, int r) {
    for (int64_t i = 0; i < n; i++) g[i] = (float)((i * 13 + r * 7) % 101 - 50) * 0.37f * 1024.0f;
}

static fsc_grad_scaler *scaler_at(double scale) {
    fsc_grad_scaler *s = fsc_grad_scaler_new(&(fsc_grad_scaler_config){.init_scale = scale});
    assert_non_null(s);
    return s;
}

/* Every rank holds this same double (compared as bits, through allgather). */
static void assert_same_on_all_ranks(double v) {
    int64_t bits, *all = malloc(sizeof(int64_t) * (size_t)world);
    memcpy(&bits, &v, sizeof bits);
    assert_int_equal(fsc_group_allgather(fsc_group_world(), &bits, all, 1, FSC_DTYPE_I64), FSC_OK);
    for (int r = 0; r < world; r++) assert_true(all[r] == bits);
    free(all);
}

static void test_clean_step(void **state) {
    (void)state;
    const int64_t n = shard_len(rank);
    float *g = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
    fill_shard(ref, n, rank);
    memcpy(g, ref, sizeof(float) * (size_t)n);
    fsc_grad_scaler *s = scaler_at(1024.0);
    fsc_optim_range r[2] = {{.grad = g, .n = n, .name = "shard"}, {.grad = NULL, .n = 0}};
    bool inf = true;
    assert_int_equal(fsc_sharded_grad_scaler_unscale(s, fsc_group_world(), r, 2, &inf), FSC_OK);
    assert_false(inf);
    for (int64_t i = 0; i < n; i++) assert_true(g[i] == ref[i] * (float)(1.0 / 1024.0));
    assert_int_equal(fsc_grad_scaler_update(s, inf), FSC_OK);
    assert_true(fsc_grad_scaler_get_scale(s) == 1024.0);
    assert_int_equal(fsc_grad_scaler_get_state(s).growth_tracker, 1);
    fsc_grad_scaler_free(s);
    free(g);
    free(ref);
}

/* inf, -inf and NaN, in the scalar tail of one rank's shard, each rank in turn. */
static void test_inf_on_one_rank(void **state) {
    (void)state;
    const int64_t n = shard_len(rank);
    const float bad[] = {INFINITY, -INFINITY, NAN};
    float *g = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
    for (int culprit = 0; culprit < world; culprit++)
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            fsc_grad_scaler *s = scaler_at(4096.0);
            fill_shard(ref, n, rank);
            if (rank == culprit) ref[n - 1] = bad[b];
            memcpy(g, ref, sizeof(float) * (size_t)n);
            fsc_optim_range r = {.grad = g, .n = n};
            bool inf = false;
            assert_int_equal(fsc_sharded_grad_scaler_unscale(s, fsc_group_world(), &r, 1, &inf),
                             FSC_OK);
            if (!inf)
                fprintf(stderr, "rank %d of %d missed %g on rank %d\n", rank, world, (double)bad[b],
                        culprit);
            assert_true(inf);
            /* the clean elements are unscaled all the same */
            for (int64_t i = 0; i < n - (rank == culprit); i++)
                assert_true(g[i] == ref[i] * (float)(1.0 / 4096.0));
            /* and every rank backs off together */
            assert_int_equal(fsc_grad_scaler_update(s, inf), FSC_OK);
            assert_true(fsc_grad_scaler_get_scale(s) == 2048.0);
            assert_int_equal(fsc_grad_scaler_get_state(s).skipped_steps, 1);
            assert_same_on_all_ranks(fsc_grad_scaler_get_scale(s));
            fsc_grad_scaler_free(s);
        }
    free(g);
    free(ref);
}

/* A rank that owns nothing (an uneven partition) still learns of a peer's inf. */
static void test_rank_owning_nothing(void **state) {
    (void)state;
    float g[5] = {1, 2, 3, 4, 5};
    g[2] = NAN;
    fsc_grad_scaler *s = scaler_at(2.0);
    fsc_optim_range r = {.grad = g, .n = 5};
    bool inf = false;
    assert_int_equal(fsc_sharded_grad_scaler_unscale(s, fsc_group_world(), rank == 0 ? &r : NULL,
                                                     rank == 0 ? 1 : 0, &inf),
                     FSC_OK);
    assert_true(inf);
    fsc_grad_scaler_free(s);
}

/* Gradients around 1 scaled by 65536 do not fit fp16 (max 65504): on the rank
 * whose gradients travelled as fp16 they become inf, every rank skips, and at
 * the backed-off scale the same gradients fit and every rank steps. */
static void test_fp16_overflow(void **state) {
    (void)state;
    enum { N = 97 };
    float g[N], want[N];
    for (int culprit = 0; culprit < world; culprit++) {
        fsc_grad_scaler *s = fsc_grad_scaler_new(NULL);
        int64_t steps_taken = 0;
        for (int attempt = 0; attempt < 2; attempt++) {
            const float scale = (float)fsc_grad_scaler_get_scale(s);
            for (int i = 0; i < N; i++) {
                /* the culprit's gradients reach 1.48, the others' stay below 0.9 */
                float v = rank == culprit ? 1.0f + 0.005f * i : 0.1f + 0.008f * i;
                g[i] = fsc_f16_to_f32(fsc_f32_to_f16(v * scale)); /* a trip through fp16 */
                want[i] = v;
            }
            if (rank == culprit && attempt == 0) assert_true(isinf(g[N - 1]));
            fsc_optim_range r = {.grad = g, .n = N};
            bool inf;
            assert_int_equal(fsc_sharded_grad_scaler_unscale(s, fsc_group_world(), &r, 1, &inf),
                             FSC_OK);
            assert_true(inf == (attempt == 0));
            if (!inf) {
                steps_taken++;
                /* fp16 keeps 11 significant bits */
                for (int i = 0; i < N; i++)
                    assert_true(fabsf(g[i] - want[i]) <= want[i] * 0x1p-11f);
            }
            assert_int_equal(fsc_grad_scaler_update(s, inf), FSC_OK);
        }
        assert_int_equal(steps_taken, 1);
        assert_true(fsc_grad_scaler_get_scale(s) == 32768.0);
        assert_same_on_all_ranks(fsc_grad_scaler_get_scale(s));
        fsc_grad_scaler_free(s);
    }
}

/* A malformed range on one rank: that rank still joins the all-reduce, so no
 * rank waits for the watchdog; every rank fails and reports found_inf. */
static void test_bad_argument_on_one_rank(void **state) {
    (void)state;
    const int64_t n = shard_len(rank);
    float *g = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
    fsc_grad_scaler *s = scaler_at(16.0);
    for (int culprit = 0; culprit < world; culprit++) {
        fill_shard(ref, n, rank);
        memcpy(g, ref, sizeof(float) * (size_t)n);
        fsc_optim_range r[2] = {
            {.grad = g, .n = n, .name = "wte.weight"},
            {.grad = rank == culprit ? NULL : g, .n = 3, .name = "h.1.mlp.c_proj.weight"}};
        bool inf = false;
        fsc_clear_error();
        assert_int_equal(fsc_sharded_grad_scaler_unscale(s, fsc_group_world(), r, 2, &inf),
                         FSC_ERR_INVALID);
        assert_true(inf);
        if (rank == culprit) {
            assert_non_null(strstr(fsc_last_error(), "h.1.mlp.c_proj.weight"));
            assert_memory_equal(g, ref, sizeof(float) * (size_t)n); /* untouched */
        } else {
            assert_non_null(strstr(fsc_last_error(), "another rank"));
        }
    }
    /* the group is still in step: a good call succeeds everywhere */
    fsc_optim_range r = {.grad = g, .n = n};
    bool inf = true;
    fill_shard(g, n, rank);
    assert_int_equal(fsc_sharded_grad_scaler_unscale(s, fsc_group_world(), &r, 1, &inf), FSC_OK);
    assert_false(inf);
    /* local refusals, before any communication */
    assert_int_equal(fsc_sharded_grad_scaler_unscale(s, NULL, &r, 1, &inf), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "group"));
    assert_int_equal(fsc_sharded_grad_scaler_unscale(s, fsc_group_world(), &r, 1, NULL),
                     FSC_ERR_INVALID);
    fsc_grad_scaler_free(s);
    free(g);
    free(ref);
}

/* ---- training ------------------------------------------------------------------ */

/* The equivalence tests' GPT (EQ_MODEL) on EQ_GLOBAL_BATCH sequences a step. */
enum { STEPS = 4, SKIPPED = 1 };

/* ShardedDDP + OSS (EVEN) for STEPS steps. With a scaler, the loss is scaled,
 * the owned gradients unscaled (one rank's poisoned with an inf at step
 * SKIPPED) and the step taken only when no rank overflowed; without, step
 * SKIPPED is simply not taken. Returns the final parameters. */
static float *train(fsc_grad_scaler *gs, int64_t *numel) {
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, true, &ps), FSC_OK);
    enum { NTOK = 2048 };
    static int32_t tok[NTOK];
    for (int i = 0; i < NTOK; i++) tok[i] = (int32_t)((i * 7 + (i / 5) * 3) % EQ_MODEL.vocab);
    fsc_tokens tk;
    assert_int_equal(fsc_tokens_from_i32(tok, NTOK, EQ_MODEL.vocab, &tk), FSC_OK);
    const fsc_optim_config adamw = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-2, .weight_decay = 0.1};
    fsc_oss *oss = fsc_oss_new(&adamw, &ps, fsc_group_world(),
                               &(fsc_oss_options){.policy = FSC_PARTITION_EVEN});
    assert_non_null(oss);
    fsc_module *sdp = fsc_sdp_wrap(m, &ps, oss, NULL);
    assert_non_null(sdp);
    fsc_optim_range *owned;
    int nowned;
    assert_int_equal(fsc_partition_ranges(fsc_oss_partition(oss), &ps, rank, &owned, &nowned),
                     FSC_OK);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    const eq_batch b = eq_batch_of_rank(&tk, arena, EQ_MODEL.seq, 1, rank, world, x, y);
    for (int s = 0; s < STEPS; s++) {
        fsc_sdp_zero_grad(sdp);
        fsc_ctx ctx;
        assert_int_equal(eq_micro_input(&b, s, 0, &ctx), FSC_OK);
        double norm = (double)b.G * b.T;
        if (gs) norm /= fsc_grad_scaler_get_scale(gs);
        float loss;
        assert_int_equal(fsc_gpt_train_micro(sdp, &ctx, x, y, b.B, b.T, -1, norm, &loss), FSC_OK);
        bool skip = s == SKIPPED;
        if (gs) {
            /* the overflow lands on one rank's shard only */
            if (s == SKIPPED && rank == SKIPPED % world) {
                assert_true(nowned > 0 && owned[nowned - 1].n > 0);
                owned[nowned - 1].grad[owned[nowned - 1].n - 1] = INFINITY;
            }
            assert_int_equal(
                fsc_sharded_grad_scaler_unscale(gs, fsc_group_world(), owned, nowned, &skip),
                FSC_OK);
            assert_true(skip == (s == SKIPPED));
        }
        if (!skip) assert_int_equal(fsc_oss_step(oss), FSC_OK);
        if (gs) assert_int_equal(fsc_grad_scaler_update(gs, skip), FSC_OK);
    }
    assert_int_equal(fsc_optim_get_step(fsc_oss_local(oss)), STEPS - 1);
    *numel = ps.numel;
    float *out = params_copy(&ps);
    fsc_optim_ranges_free(owned);
    sdp_run_free(arena, sdp, oss, &ps, &tk, m);
    return out;
}

/* Scaling by a power of two is exact, and so are the sums of the gradient
 * reduction: the scaled run matches the unscaled one bit for bit. */
static void test_sharded_training(void **state) {
    (void)state;
    if (EQ_GLOBAL_BATCH % world) skip();
    int64_t n_plain, n_scaled;
    float *plain = train(NULL, &n_plain);
    fsc_grad_scaler *gs = scaler_at(1024.0);
    float *scaled = train(gs, &n_scaled);
    assert_int_equal(n_plain, n_scaled);
    int64_t diff = 0;
    for (int64_t i = 0; i < n_plain; i++) diff += plain[i] != scaled[i];
    if (diff) fprintf(stderr, "rank %d: %lld parameters differ\n", rank, (long long)diff);
    assert_int_equal(diff, 0);
    fsc_grad_scaler_state st = fsc_grad_scaler_get_state(gs);
    assert_true(st.scale == 512.0); /* 1024, overflow at step 1, then two good steps */
    assert_int_equal(st.growth_tracker, 2);
    assert_int_equal(st.skipped_steps, 1);
    assert_same_on_all_ranks(st.scale);
    fsc_grad_scaler_free(gs);
    free(plain);
    free(scaled);
}

MPI_TEST_MAIN(cmocka_unit_test(test_clean_step), cmocka_unit_test(test_inf_on_one_rank),
              cmocka_unit_test(test_rank_owning_nothing), cmocka_unit_test(test_fp16_overflow),
              cmocka_unit_test(test_bad_argument_on_one_rank),
              cmocka_unit_test(test_sharded_training))
