/* ShardedDDP (ZeRO-2) with OSS over 1, 2 and 4 ranks ends with the same
 * parameters as one process on the same global batch (AdamW and SGD with
 * momentum, both partition policies, accumulation under no_sync, clipping),
 * and a rank holds gradient memory only for what it owns plus the buckets in
 * use, by the allocator's figures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "mpi_test.h"
#include "fsc/zero.h"

static int rank, world;

typedef struct {
    const fsc_optim_config *optim;
    fsc_partition_policy policy;
    int accum;
    float max_norm;
    size_t bucket_bytes;
} sdp_cfg;

typedef struct {
    size_t owned_bytes, grad_peak, bucket_bytes;
    int64_t buckets, reduces;
} sdp_out;

static float *run_sdp(const sdp_cfg *c, sdp_out *out) {
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_params ps;
    fsc_tokens tk;
    eq_tokens(&tk);
    assert_int_equal(fsc_params_bind(m, rank == 0 ? 5 : 77, true, &ps), FSC_OK);
    fsc_oss *oss =
        fsc_oss_new(c->optim, &ps, fsc_group_world(), &(fsc_oss_options){.policy = c->policy});
    assert_non_null(oss);
    fsc_module *sdp =
        fsc_sdp_wrap(m, &ps, oss, &(fsc_sdp_options){.bucket_bytes = c->bucket_bytes});
    assert_non_null(sdp);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int B = EQ_GLOBAL_BATCH / (world * c->accum), T = EQ_MODEL.seq;
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    for (int s = 0; s < EQ_STEPS; s++) {
        if (s == 1)
            fsc_mem_reset_peaks(); /* the first backward learns which buckets the root writes */
        fsc_sdp_zero_grad(sdp);
        for (int k = 0; k < c->accum; k++) {
            fsc_arena_reset(arena);
            fsc_tokens_batch(&tk, s, k, rank, B, c->accum, world, T, x, y);
            fsc_ctx ctx = {.arena = arena,
                           .training = true,
                           .seed = 5,
                           .step = s,
                           .sample0 = fsc_batch_first_sample(s, k, rank, B, c->accum, world)};
            fsc_sdp_set_no_sync(sdp, k < c->accum - 1);
            float loss;
            assert_int_equal(
                fsc_gpt_train_micro(sdp, &ctx, x, y, B, T, -1, (double)EQ_GLOBAL_BATCH * T, &loss),
                FSC_OK);
        }
        if (c->max_norm > 0) {
            float norm;
            assert_int_equal(fsc_oss_clip_grad_norm(oss, c->max_norm, false, &norm), FSC_OK);
        }
        assert_int_equal(fsc_oss_step(oss), FSC_OK);
    }
    if (out) {
        const fsc_partition *p = fsc_oss_partition(oss);
        out->owned_bytes = (size_t)p->elems[fsc_group_rank(fsc_group_world())] * sizeof(float);
        out->grad_peak = fsc_mem_peak(FSC_MEM_GRADS);
        out->bucket_bytes = (size_t)fsc_sdp_get_stats(sdp).max_bucket_bytes;
        out->buckets = fsc_sdp_get_stats(sdp).buckets;
        out->reduces = fsc_sdp_get_stats(sdp).reduces;
    }
    float *got = malloc(sizeof(float) * (size_t)ps.numel);
    memcpy(got, ps.data, sizeof(float) * (size_t)ps.numel);
    fsc_arena_free(arena);
    fsc_module_free(sdp);
    fsc_oss_free(oss);
    fsc_params_free(&ps);
    fsc_tokens_free(&tk);
    fsc_module_free(m);
    return got;
}

static void equivalence(const char *what, sdp_cfg c) {
    if (EQ_GLOBAL_BATCH % (world * c.accum)) skip();
    int64_t n;
    float *ref = eq_reference_ex(&(eq_options){.optim = c.optim, .max_norm = c.max_norm}, &n);
    float *got = run_sdp(&c, NULL);
    char label[128];
    snprintf(label, sizeof label, "%s, %s, %d ranks, rank %d", what,
             c.policy == FSC_PARTITION_EVEN ? "even" : "greedy", world, rank);
    assert_int_equal(eq_compare(label, got, ref, n), 0);
    free(got);
    free(ref);
}

static void test_adamw(void **state) {
    (void)state;
    for (int p = 0; p < 2; p++)
        equivalence("ShardedDDP AdamW, 8 KB buckets",
                    (sdp_cfg){&EQ_ADAMW, (fsc_partition_policy)p, 1, 0, 8192});
}

static void test_sgd_momentum_accumulation(void **state) {
    (void)state;
    for (int p = 0; p < 2; p++)
        equivalence("ShardedDDP SGD momentum, 2 micro-batches (no_sync)",
                    (sdp_cfg){&EQ_SGD_MOMENTUM, (fsc_partition_policy)p, 2, 0, 8192});
}

static void test_adamw_clipping_one_bucket(void **state) {
    (void)state;
    equivalence("ShardedDDP AdamW, clipping 0.05, one 25 MB bucket",
                (sdp_cfg){&EQ_ADAMW, FSC_PARTITION_EVEN, 1, 0.05f, 0});
}

/* Gradient bytes a rank holds at its peak (after the first step): what it owns,
 * plus the buckets in use: the root-written one (wte, tied to the head, is
 * written first and last), the one being computed, and one in flight. */
static void test_gradient_memory(void **state) {
    (void)state;
    sdp_out o;
    float *got = run_sdp(&(sdp_cfg){&EQ_ADAMW, FSC_PARTITION_EVEN, 1, 0, 8192}, &o);
    free(got);
    size_t bound = o.owned_bytes + 3 * o.bucket_bytes;
    fprintf(stderr,
            "rank %d/%d: gradient peak %zu bytes; owns %zu; %lld buckets, the largest "
            "%zu; bound owned + 3 buckets = %zu; full gradients %zu\n",
            rank, world, o.grad_peak, o.owned_bytes, (long long)o.buckets, o.bucket_bytes, bound,
            (size_t)28032 * 4);
    assert_true(o.grad_peak <= bound);
    assert_true(o.reduces >= o.buckets * EQ_STEPS);
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) return 1;
    rank = fsc_dist_rank(), world = fsc_dist_size();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_sgd_momentum_accumulation),
        cmocka_unit_test(test_adamw_clipping_one_bucket),
        cmocka_unit_test(test_gradient_memory),
    };
    return mpi_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
