/* One training micro-step of a tensor-parallel GPT on step s's whole global
 * batch (EQ_GLOBAL_BATCH sequences, data order of fsc_tokens_batch, dropout
 * keyed with seed 5), gradients zeroed first, and the run of EQ_STEPS such
 * steps: what the TP tests compare with one process. */
#ifndef FSC_TEST_TP_TEST_H
#define FSC_TEST_TP_TEST_H

#include "equivalence.h"
#include "fsc/tp.h"

/* Returns the status of the first failing call; *loss the batch's mean loss. */
static inline int tp_test_micro(fsc_module *m, fsc_params *ps, fsc_arena *arena,
                                const fsc_tokens *tk, int T, int s, float *loss) {
    const int G = EQ_GLOBAL_BATCH;
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    if (T > 16) return FSC_ERR_INVALID; /* the buffers above */
    fsc_params_zero_grad(ps);
    fsc_arena_reset(arena);
    int rc = fsc_tokens_batch(tk, s, 0, 0, G, 1, 1, T, x, y);
    if (rc) return rc;
    fsc_ctx ctx = {.arena = arena,
                   .training = true,
                   .keyed = true,
                   .seed = 5,
                   .step = s,
                   .sample0 = fsc_batch_first_sample(s, 0, 0, G, 1, 1)};
    return fsc_tp_gpt_train_micro(m, &ctx, x, y, G, T, -1, (double)G * T, loss);
}

/* EQ_STEPS AdamW steps (EQ_ADAMW) of m, whose parameters ps are bound, each
 * on step s's whole global batch (tp_test_micro), clipping the gradients'
 * norm over the TP group g to max_norm when it is > 0 (*first_norm: step
 * 0's norm before the clip); then m's weights saved by global name to path.
 * Fails the test on any error. Include after cmocka.h. */
static inline void tp_test_train_save(fsc_module *m, fsc_params *ps, fsc_group *g, int T,
                                      float max_norm, float *first_norm, const char *path) {
    fsc_optim_range *r;
    int nr;
    fsc_tokens tk;
    eq_tokens(&tk);
    assert_int_equal(fsc_optim_ranges_from_params(ps, &r, &nr), FSC_OK);
    fsc_optim *o = fsc_optim_new(&EQ_ADAMW, r, nr);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    assert_non_null(o);
    assert_non_null(arena);
    for (int s = 0; s < EQ_STEPS; s++) {
        float loss;
        if (tp_test_micro(m, ps, arena, &tk, T, s, &loss))
            fail_msg("rank %d: %s", fsc_dist_rank(), fsc_last_error());
        if (max_norm > 0) {
            float norm;
            assert_int_equal(fsc_tp_clip_grad_norm(m, ps, g, max_norm, &norm), FSC_OK);
            if (s == 0) *first_norm = norm;
        }
        assert_int_equal(fsc_optim_step(o), FSC_OK);
    }
    assert_int_equal(fsc_tp_save_weights(path, m, ps, g, 0, NULL, NULL), FSC_OK);
    fsc_arena_free(arena);
    fsc_optim_free(o);
    fsc_optim_ranges_free(r);
    fsc_tokens_free(&tk);
}

#endif
