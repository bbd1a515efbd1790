/* One training micro-step of a tensor-parallel GPT on step s's whole global
 * batch (EQ_GLOBAL_BATCH sequences, data order of fsc_tokens_batch, dropout
 * keyed with seed 5), gradients zeroed first: what the TP tests compare
 * with one process. */
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

#endif
