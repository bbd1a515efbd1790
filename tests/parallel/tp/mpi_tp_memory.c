/* Activation memory of the tensor-parallel layers, from the arena's byte
 * counts (deterministic: every buffer is a multiple of the arena's 64-byte
 * alignment at these sizes), over the world as one TP group of t ranks:
 *  - what a block keeps from forward to backward falls under sequence
 *    parallelism by exactly the count of the tensors that run on sequence
 *    shards: (1 - 1/t) of B*T*C floats for ln_1's and ln_2's outputs, the
 *    attention and MLP outputs (the residual sums are written into them)
 *    and, with dropout on, each row layer's output, plus LayerNorm's mean
 *    and rstd (2 * B*T floats each); the TP-region tensors (q|k|v, the
 *    probabilities, the GELU in/out) are the same size either way;
 *  - recompute_attention keeps exactly B * NH/t * T*T floats fewer per
 *    block, and its gradients equal the stored-probability ones bit for bit;
 *  - recompute_activation keeps exactly the GELU output (B*T*4C/t floats)
 *    and two tensor records fewer per block, with the same gradients;
 *  - over a whole TP GPT training micro-step the arena's high water falls
 *    under SP and again (by at least L-1 blocks' probabilities: backward
 *    holds one recomputed copy) with recompute_attention;
 *  - the LM head fused with its loss (fsc_tp_gpt_train_micro) runs below the
 *    unfused head (forward, fsc_tp_cross_entropy, backward) by at least the
 *    logits less one chunk of them and one (B*T, C) tensor, with the same
 *    loss within the noise of the unfused loss's own summation orders (the
 *    fused head's chunks are GEMMs of other shapes: nothing makes them bit
 *    for bit the unfused one's). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/tp.h"
#include "mpi_test.h"

static int rank, world;

enum { B = 2, T = 32, C = 64, NH = 4 }; /* B*T/t = 16 floats for t = 4: 64 bytes */

typedef struct {
    int64_t kept; /* arena bytes a block's forward leaves in place */
    size_t high;  /* arena high water over forward + backward */
    float *grads; /* the block's gradients after backward (caller frees) */
    int64_t n_grads;
} block_run;

/* One TP block's forward and backward on a fixed input (the whole (B,T,C)
 * tensor, or this rank's sequence shard under SP). */
static block_run run_block(bool sp, bool recompute, bool recompute_act, float dropout) {
    fsc_tp_options opt = {.group = fsc_group_world(),
                          .sequence_parallel = sp,
                          .recompute_attention = recompute,
                          .recompute_activation = recompute_act};
    fsc_module *m = fsc_tp_block_new("h.0", C, NH, dropout, 0, 2, &opt);
    if (!m) fail_msg("fsc_tp_block_new: %s", fsc_last_error());
    fsc_params ps;
    assert_int_equal(fsc_tp_params_bind(m, 7, true, &ps), FSC_OK);
    fsc_params_zero_grad(&ps);
    const int S = sp ? T / world : T, t0 = sp ? rank * S : 0;
    float *x = malloc(sizeof(float) * B * S * C), *dy = malloc(sizeof(float) * B * S * C);
    for (int b = 0; b < B; b++) /* values of the whole tensor: every layout sees the same */
        for (int i = 0; i < S; i++)
            for (int c = 0; c < C; c++) {
                int64_t g = ((int64_t)b * T + t0 + i) * C + c, l = ((int64_t)b * S + i) * C + c;
                x[l] = (float)((g * 37 % 101) - 50) / 50.f;
                dy[l] = (float)((g * 53 % 89) - 44) / 440.f;
            }
    fsc_tensor xt = fsc_tensor_3d(x, FSC_DTYPE_F32, B, S, C), dyt = xt, y, dx;
    dyt.data = dy;
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true, .keyed = true, .seed = 3, .step = 1};
    void *saved = NULL;
    size_t before = fsc_arena_used(arena);
    assert_int_equal(fsc_module_forward(m, &ctx, &xt, &y, &saved), FSC_OK);
    block_run r = {.kept = (int64_t)(fsc_arena_used(arena) - before)};
    assert_int_equal(fsc_module_backward(m, &ctx, saved, &dyt, &dx), FSC_OK);
    r.high = fsc_arena_high_water(arena);
    r.n_grads = (int64_t)ps.numel;
    r.grads = malloc(sizeof(float) * (size_t)ps.numel);
    memcpy(r.grads, ps.grad, sizeof(float) * (size_t)ps.numel);
    fsc_arena_free(arena);
    free(x), free(dy);
    fsc_params_free(&ps);
    fsc_module_free(m);
    return r;
}

static void test_block_counts(void **state) {
    (void)state;
    const int t = world;
    const int64_t unit = (int64_t)B * T * C * 4, stats = (int64_t)B * T * 4;
    for (int k = 0; k < 2; k++) {
        const float p = k ? 0.1f : 0.f;
        block_run full = run_block(false, false, false, p), sp = run_block(true, false, false, p);
        /* ln_1, ln_2 outputs; attention and MLP outputs; with dropout the
         * row layers' outputs too; mean and rstd of the two LayerNorms */
        const int64_t shard_units = p > 0 ? 6 : 4;
        const int64_t want = (shard_units * unit + 4 * stats) * (t - 1) / t;
        if (full.kept - sp.kept != want)
            fail_msg("p %g, t %d: SP keeps %lld bytes fewer, the count says %lld", (double)p, t,
                     (long long)(full.kept - sp.kept), (long long)want);
        if (t > 1) assert_true(sp.high < full.high);
        /* selective recomputation: the probabilities, exactly; same gradients */
        block_run rc = run_block(true, true, false, p);
        const int64_t att = (int64_t)B * (NH / t) * T * T * 4;
        if (sp.kept - rc.kept != att)
            fail_msg("recompute keeps %lld bytes fewer, expected %lld",
                     (long long)(sp.kept - rc.kept), (long long)att);
        assert_int_equal(rc.n_grads, sp.n_grads);
        assert_memory_equal(rc.grads, sp.grads, sizeof(float) * (size_t)sp.n_grads);
        /* GELU recomputed: its output, GELU's record and c_proj's (one
         * fsc_tensor each) no longer kept; same gradients */
        block_run ra = run_block(true, false, true, p);
        const int64_t gelu = (int64_t)B * T * (4 * C / t) * 4;
        const int64_t rec = (int64_t)(sizeof(fsc_tensor) + 63) / 64 * 64;
        if (sp.kept - ra.kept != gelu + 2 * rec)
            fail_msg("GELU recompute keeps %lld bytes fewer, expected %lld",
                     (long long)(sp.kept - ra.kept), (long long)(gelu + 2 * rec));
        assert_memory_equal(ra.grads, sp.grads, sizeof(float) * (size_t)sp.n_grads);
        free(full.grads), free(sp.grads), free(rc.grads), free(ra.grads);
    }
}

/* A TP GPT training micro-step on fixed tokens: the arena's high water
 * (bytes in use). */
static size_t gpt_high(bool sp, bool recompute, float *loss) {
    enum { GB = 8, GT = 16 };
    fsc_gpt_config cfg = {.vocab = 64, .seq = GT, .layers = 4, .d_model = 64, .heads = 4};
    fsc_tp_options opt = {
        .group = fsc_group_world(), .sequence_parallel = sp, .recompute_attention = recompute};
    fsc_module *m = fsc_tp_gpt_new(&cfg, &opt);
    if (!m) fail_msg("fsc_tp_gpt_new: %s", fsc_last_error());
    fsc_params ps;
    assert_int_equal(fsc_tp_params_bind(m, 5, true, &ps), FSC_OK);
    fsc_params_zero_grad(&ps);
    int32_t x[GB * GT], y[GB * GT];
    for (int i = 0; i < GB * GT; i++)
        x[i] = (i * 7 + 3) % cfg.vocab, y[i] = (i * 11 + 5) % cfg.vocab;
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true, .keyed = true, .seed = 5};
    if (fsc_tp_gpt_train_micro(m, &ctx, x, y, GB, GT, -1, (double)GB * GT, loss))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    size_t high = fsc_arena_high_water(arena);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(m);
    return high;
}

static void test_gpt_high_water(void **state) {
    (void)state;
    float l0, l1, l2;
    size_t full = gpt_high(false, false, &l0), sp = gpt_high(true, false, &l1);
    size_t rc = gpt_high(true, true, &l2);
    const size_t att = (size_t)8 * (4 / world) * 16 * 16 * 4;
    if (world > 1 && !(sp < full)) fail_msg("SP high water %zu, without %zu", sp, full);
    if (!(rc + 3 * att <= sp)) fail_msg("recompute high water %zu, SP %zu", rc, sp);
    assert_memory_equal(&l2, &l1, sizeof l1); /* recomputation changes no float */
    if (rank == 0)
        printf("# TP GPT micro-step arena high water, t = %d: %zu bytes, SP %zu (%.3f), "
               "SP + recompute_attention %zu (%.3f)\n",
               world, full, sp, (double)sp / (double)full, rc, (double)rc / (double)full);
}

/* The head-heavy GPT's micro-step, head fused (fsc_tp_gpt_train_micro) or
 * not (forward to logits, fsc_tp_cross_entropy, backward; the batch as
 * `micro` micro-batches, their losses summed): the arena's high water. */
enum { HB = 8, HT = 16, HV = 2048, HC = 32 };
static size_t head_high(bool sp, bool fused, int micro, float *loss) {
    fsc_gpt_config cfg = {.vocab = HV, .seq = HT, .layers = 2, .d_model = HC, .heads = 4};
    fsc_tp_options opt = {.group = fsc_group_world(), .sequence_parallel = sp};
    fsc_module *m = fsc_tp_gpt_new(&cfg, &opt);
    if (!m) fail_msg("fsc_tp_gpt_new: %s", fsc_last_error());
    fsc_params ps;
    assert_int_equal(fsc_tp_params_bind(m, 5, true, &ps), FSC_OK);
    fsc_params_zero_grad(&ps);
    int32_t x[HB * HT], y[HB * HT];
    for (int i = 0; i < HB * HT; i++) x[i] = (i * 7 + 3) % HV, y[i] = (i * 11 + 5) % HV;
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_ctx ctx = {.arena = arena, .training = true, .keyed = true, .seed = 5};
    const double norm = (double)HB * HT;
    int rc;
    if (fused) {
        rc = fsc_tp_gpt_train_micro(m, &ctx, x, y, HB, HT, -1, norm, loss);
    } else {
        const int b = HB / micro;
        *loss = 0.f;
        rc = FSC_OK;
        for (int j = 0; j < micro && !rc; j++) {
            fsc_tensor ids = fsc_tensor_2d(x + j * b * HT, FSC_DTYPE_I32, b, HT), logits;
            fsc_tensor tg = fsc_tensor_2d(y + j * b * HT, FSC_DTYPE_I32, b, HT);
            void *saved = NULL;
            float part;
            rc = fsc_module_forward(m, &ctx, &ids, &logits, &saved);
            if (!rc)
                rc = fsc_tp_cross_entropy(&part, &logits, &tg, HV, -1, norm, fsc_group_world(),
                                          arena);
            if (!rc) rc = fsc_module_backward(m, &ctx, saved, &logits, NULL);
            *loss += part;
        }
    }
    if (rc) fail_msg("rank %d: %s", rank, fsc_last_error());
    size_t high = fsc_arena_high_water(arena);
    fsc_arena_free(arena);
    fsc_params_free(&ps);
    fsc_module_free(m);
    return high;
}

static void test_fused_head(void **state) {
    (void)state;
    const int64_t N = (int64_t)HB * HT, vp = HV / world;
    /* tp_head.c's rule: max(32, N*C/vp) rows per chunk */
    const int64_t rows = N * HC / vp > 32 ? N * HC / vp : 32;
    const int64_t logits = N * vp * 4, chunk = rows * vp * 4, act = N * HC * 4;
    for (int k = 0; k < 2; k++) {
        float lf, lu, lm;
        size_t fused = head_high(k, true, 1, &lf), unfused = head_high(k, false, 1, &lu);
        if ((int64_t)unfused - (int64_t)fused < logits - chunk - act)
            fail_msg("SP %d, t %d: the fused head's high water %zu is %lld bytes below the "
                     "unfused %zu; the logits (%lld) less a chunk (%lld) and a (B*T, C) tensor "
                     "(%lld) should be",
                     k, world, fused, (long long)unfused - (long long)fused, unfused,
                     (long long)logits, (long long)chunk, (long long)act);
        /* Per row the fused head's arithmetic is the unfused one's, but in
         * GEMMs of 32 rows rather than B*T (and, at t = 4, all-reduces of
         * other sizes): whether a row's dot products round alike at another M
         * is the BLAS kernel's business (OpenBLAS picks small-matrix paths
         * and edge kernels by shape). The noise floor is what the unfused
         * loss itself does under legal orders: the batch as 2 and as 4
         * micro-batches (GEMMs of 64 and of 32 rows), the losses summed. */
        eq_noise[0] = 0.f;
        for (int micro = 2; micro <= 4; micro *= 2) {
            head_high(k, false, micro, &lm);
            eq_noise[0] = fmaxf(eq_noise[0], fabsf(lm - lu));
        }
        char what[64];
        snprintf(what, sizeof what, "rank %d, SP %d, t %d: fused head's loss", rank, k, world);
        if (eq_compare(what, &lf, &lu, 1)) fail_msg("%s differs from the unfused", what);
        if (rank == 0)
            printf("# fused head, t = %d, SP %d: high water %zu vs %zu unfused (logits %lld)\n",
                   world, k, fused, unfused, (long long)logits);
    }
}

MPI_TEST_MAIN(cmocka_unit_test(test_block_counts), cmocka_unit_test(test_gpt_high_water),
              cmocka_unit_test(test_fused_head))
