/* Context parallelism (ring attention, fsc/cp.h) against one process:
 *  - 5 AdamW steps of the tiny GPT-2 (dropout on: masks keyed by global
 *    position) and of a grouped-query LLaMA (8 query heads on 4 key/value
 *    heads: K/V heads travel; RoPE at global positions) with the sequence
 *    split over cp ranks, each holding chunks c and 2C-1-c, give one
 *    process's per-step losses and parameters within equivalence.h's noise
 *    floor: cp = the world (1, 2, 4 ranks) and, at 4 ranks, cp 2 x dp 2 with
 *    the gradients summed over dp x cp (fsc_mesh_dp_cp);
 *  - the load balance: every cp rank computes the same 2C+1 (query run, key
 *    run) blocks per batch row in each attention forward and as many in
 *    its backward (chunks c and 2C-1-c; any other split gives the ranks
 *    unequal counts);
 *  - a sequence length the 2C chunks do not divide is refused by name.
 * The fault row "cp:cp-skip-block" reruns this program with the last cp
 * rank skipping one visiting key block per attention forward; every
 * comparison must catch it. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/cp.h"
#include "mpi_test.h"

static int rank, world;

/* 5 AdamW steps of `model` on EQ_GLOBAL_BATCH sequences; under mesh (NULL:
 * one process, the batch in `micro` micro-batches) this rank's dp share of
 * the batch and its cp positions of each sequence, gradients summed over
 * dp x cp. Returns the final parameters; losses[s] the global mean loss. */
static float *run(const fsc_gpt_config *model, fsc_mesh *mesh, int micro, double *losses,
                  int64_t *numel) {
    const int dp = mesh ? fsc_mesh_size(mesh, FSC_MESH_DP) : 1;
    const int d = mesh ? fsc_mesh_coord(mesh, FSC_MESH_DP) : 0;
    fsc_cp *cp = mesh ? fsc_cp_new(fsc_mesh_group(mesh, FSC_MESH_CP), model->seq) : NULL;
    if (mesh && !cp) fail_msg("fsc_cp_new: %s", fsc_last_error());
    const int C = mesh ? fsc_mesh_size(mesh, FSC_MESH_CP) : 1;
    fsc_module *m = fsc_gpt_new(model);
    fsc_params ps;
    fsc_optim_range *r;
    int nr;
    assert_non_null(m);
    assert_int_equal(fsc_params_bind(m, 5, true, &ps), FSC_OK);
    assert_int_equal(fsc_optim_ranges_from_params(&ps, &r, &nr), FSC_OK);
    fsc_optim *opt = fsc_optim_new(&EQ_ADAMW, r, nr);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    fsc_tokens tk;
    eq_tokens(&tk);
    const int G = EQ_GLOBAL_BATCH, T = model->seq, B = G / (dp * micro), Tl = T / C;
    int32_t *x = malloc(sizeof *x * (size_t)B * T), *y = malloc(sizeof *y * (size_t)B * T);
    int32_t *xl = malloc(sizeof *x * (size_t)B * Tl), *yl = malloc(sizeof *y * (size_t)B * Tl);
    for (int s = 0; s < EQ_STEPS; s++) {
        fsc_params_zero_grad(&ps);
        double loss = 0;
        for (int k = 0; k < micro; k++) {
            fsc_arena_reset(arena);
            assert_int_equal(fsc_tokens_batch(&tk, s, k, d, B, micro, dp, T, x, y), FSC_OK);
            fsc_ctx ctx = {.arena = arena,
                           .training = true,
                           .keyed = true,
                           .seed = 5,
                           .step = s,
                           .sample0 = fsc_batch_first_sample(s, k, d, B, micro, dp),
                           .seq = fsc_cp_seq(cp),
                           /* the ring attends with flash tiles: the reference
                            * runs them too, so the bound measures the ring, not
                            * flash against naive (train_attention tests that) */
                           .attention = FSC_ATTENTION_FLASH};
            if (cp) fsc_cp_take(cp, x, B, xl), fsc_cp_take(cp, y, B, yl);
            float part;
            if (fsc_gpt_train_micro(m, &ctx, cp ? xl : x, cp ? yl : y, B, Tl, -1, (double)G * T,
                                    &part))
                fail_msg("step %d: %s", s, fsc_last_error());
            loss += part;
        }
        if (mesh) {
            fsc_group *g = fsc_mesh_dp_cp(mesh);
            assert_int_equal(
                fsc_group_allreduce(g, ps.grad, ps.numel, FSC_DTYPE_F32, FSC_REDUCE_SUM), FSC_OK);
            float share = (float)loss; /* as the trainer sums the ranks' shares */
            assert_int_equal(fsc_group_allreduce(g, &share, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM),
                             FSC_OK);
            loss = share;
        }
        losses[s] = loss;
        fsc_optim_step(opt);
    }
    if (cp && fsc_fault_active == FSC_FAULT_NONE) { /* the fault skips a block on purpose */
        const int64_t want = 2LL * (2 * C + 1) * B * model->layers * micro * EQ_STEPS;
        const int64_t got = fsc_cp_get_stats(cp).blocks;
        if (got != want)
            fail_msg("cp rank %d of %d: %lld attention blocks forward and backward, expected "
                     "2 x (2C+1) x B %d x layers %d x micro-batches %d x steps %d = %lld",
                     fsc_group_rank(fsc_mesh_group(mesh, FSC_MESH_CP)), C, (long long)got, B,
                     model->layers, micro, EQ_STEPS, (long long)want);
    }
    float *out = malloc(sizeof(float) * (size_t)ps.numel);
    memcpy(out, ps.data, sizeof(float) * (size_t)ps.numel);
    *numel = ps.numel;
    free(x), free(y), free(xl), free(yl);
    fsc_tokens_free(&tk);
    fsc_arena_free(arena);
    fsc_optim_free(opt);
    fsc_optim_ranges_free(r);
    fsc_params_free(&ps);
    fsc_module_free(m);
    fsc_cp_free(cp);
    return out;
}

/* One process: the reference, its losses, and eq_noise and the loss noise
 * from the batch summed as 2 and 4 micro-batches. */
static float *reference(const fsc_gpt_config *model, double *losses, double *loss_noise,
                        int64_t *numel) {
    const fsc_fault fault = fsc_fault_active; /* the reference never runs with a fault */
    fsc_fault_active = FSC_FAULT_NONE;
    double alt_losses[2][EQ_STEPS];
    float *alt[2] = {run(model, NULL, 2, alt_losses[0], numel),
                     run(model, NULL, 4, alt_losses[1], numel)};
    float *ref = run(model, NULL, 1, losses, numel);
    *loss_noise = eq_noise_of_two(fsc_gpt_new(model), ref, alt, losses, alt_losses[0], EQ_STEPS);
    fsc_fault_active = fault;
    return ref;
}

/* model under cp x dp (dp * cp = the world) against one process. */
static void expect_reference(const char *label, const fsc_gpt_config *model, int cp) {
    if (world % cp || EQ_GLOBAL_BATCH % (world / cp)) skip();
    double ref_losses[EQ_STEPS], losses[EQ_STEPS], loss_noise;
    int64_t n, n2;
    float *ref = reference(model, ref_losses, &loss_noise, &n);
    fsc_mesh *mesh = NULL;
    assert_int_equal(fsc_mesh_new_over(NULL, (fsc_mesh_shape){.cp = cp}, &mesh), FSC_OK);
    float *got = run(model, mesh, 1, losses, &n2);
    assert_int_equal(n, n2);
    for (int s = 0; s < EQ_STEPS && fsc_fault_active == FSC_FAULT_NONE; s++) {
        const double bound =
            EQ_NOISE_K * loss_noise + EQ_FLOOR_ULPS * FLT_EPSILON * fabs(ref_losses[s]);
        if (fabs(losses[s] - ref_losses[s]) > bound)
            fail_msg("%s: step %d loss %.9g vs one process's %.9g (bound %.2e)", label, s + 1,
                     losses[s], ref_losses[s], bound);
    }
    char what[96];
    snprintf(what, sizeof what, "%s: parameters after %d steps", label, EQ_STEPS);
    assert_int_equal(eq_compare(what, got, ref, n), 0); /* under a fault: 0 when caught */
    fsc_mesh_free(mesh);
    free(ref), free(got);
}

static void test_gpt2_cp(void **state) {
    (void)state;
    expect_reference("gpt2 cp = world", &EQ_MODEL, world);
}

static void test_llama_cp(void **state) {
    (void)state;
    expect_reference("llama (GQA 8/4) cp = world", &EQ_LLAMA, world);
}

static void test_gpt2_cp2_dp2(void **state) {
    (void)state;
    if (world != 4) skip();
    expect_reference("gpt2 cp 2 x dp 2", &EQ_MODEL, 2);
}

static void test_refusals(void **state) {
    (void)state;
    assert_null(fsc_cp_new(fsc_group_world(), 6 * world + 1));
    assert_non_null(strstr(fsc_last_error(), "must be a positive multiple of"));
    assert_null(fsc_cp_new(fsc_group_world(), 0));
}

MPI_EQ_MAIN(cmocka_unit_test(test_gpt2_cp), cmocka_unit_test(test_llama_cp),
            cmocka_unit_test(test_gpt2_cp2_dp2), cmocka_unit_test(test_refusals))
