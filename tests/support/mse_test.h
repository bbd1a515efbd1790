/* A micro-batch of least squares for the trainer tests' own MLPs: inputs and
 * targets are functions of the global sample index, so every layout sees the
 * same samples whichever rank and micro-batch hold them. */
#ifndef FSC_TEST_MSE_TEST_H
#define FSC_TEST_MSE_TEST_H

#include <stdint.h>
#include <stdlib.h>

#include "fsc/nn.h"
#include "fsc/trainer.h"

typedef float (*mse_value_fn)(int64_t sample, int index);

/* Forward and backward of m on mb's rows (in inputs, out outputs each): half
 * the squared error, summed over the rows and outputs, over mb->norm (the
 * global count of targets), so that the ranks' losses add up to the mean. */
static inline int mse_micro_batch(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb,
                                  int in, int out, mse_value_fn input, mse_value_fn target,
                                  float *loss) {
    float *x = malloc(sizeof(float) * (size_t)(mb->rows * in));
    if (!x) return FSC_ERR_NOMEM;
    const int64_t s0 = mb->sample0 + mb->row0;
    for (int r = 0; r < mb->rows; r++)
        for (int j = 0; j < in; j++) x[r * in + j] = input(s0 + r, j);
    fsc_tensor xt = fsc_tensor_2d(x, FSC_DTYPE_F32, mb->rows, in), y;
    void *saved;
    int rc = fsc_module_forward(m, ctx, &xt, &y, &saved);
    fsc_tensor dy = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 2, (int64_t[]){mb->rows, out});
    if (rc || !dy.data) {
        free(x);
        return rc ? rc : FSC_ERR_NOMEM;
    }
    const float *yd = y.data;
    float *dyd = dy.data;
    double sum = 0;
    for (int r = 0; r < mb->rows; r++)
        for (int k = 0; k < out; k++) {
            float d = yd[r * out + k] - target(s0 + r, k);
            sum += 0.5 * (double)d * d;
            dyd[r * out + k] = (float)(d / mb->norm);
        }
    *loss = (float)(sum / mb->norm);
    rc = fsc_module_backward(m, ctx, saved, &dy, NULL);
    free(x); /* the forward may keep x for the backward */
    return rc;
}

/* A least-squares problem: `in` inputs and `out` targets per sample, each a
 * function of the global sample index. */
typedef struct mse_data {
    int in, out;
    mse_value_fn input, target;
} mse_data;

/* The trainer's loss for the problem user (an mse_data): mse_micro_batch. */
static inline int mse_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                           float *loss) {
    const mse_data *d = user;
    return mse_micro_batch(m, ctx, mb, d->in, d->out, d->input, d->target, loss);
}

#endif
