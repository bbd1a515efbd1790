/* The raw pipeline's test data (fsc_pipe_io without the trainer): token
 * micro-batches of the test corpus as one replica's, the cross-entropy on
 * the last stage, and each micro-batch's first sample. Shared by mpi_pipe.c
 * and mpi_pipe_half.c. */
#ifndef FSC_TESTS_PIPE_TEST_H
#define FSC_TESTS_PIPE_TEST_H

#include "fsc/pipe.h"
#include "trainer_test.h"

typedef struct {
    fsc_tokens tk;
    int64_t step;
    int B, m, T;
    int32_t x[64 * 16], y[64 * 16];
    double norm;
} pt_data;

static inline int pt_input(void *user, int micro, fsc_tensor *x) {
    pt_data *d = user;
    int32_t *xs = d->x + (size_t)micro * d->B * d->T, *ys = d->y + (size_t)micro * d->B * d->T;
    int rc = fsc_tokens_batch(&d->tk, d->step, micro, 0, d->B, d->m, 1, d->T, xs, ys);
    *x = fsc_tensor_2d(xs, FSC_DTYPE_I32, d->B, d->T);
    return rc;
}

static inline int pt_loss(void *user, int micro, fsc_tensor *y, fsc_arena *arena, float *out) {
    pt_data *d = user;
    int32_t *xs = d->x + (size_t)micro * d->B * d->T, *ys = d->y + (size_t)micro * d->B * d->T;
    int rc = fsc_tokens_batch(&d->tk, d->step, micro, 0, d->B, d->m, 1, d->T, xs, ys);
    fsc_tensor t = fsc_tensor_2d(ys, FSC_DTYPE_I32, d->B, d->T);
    return rc ? rc : fsc_cross_entropy(out, y, &t, -1, d->norm, arena);
}

static inline int64_t pt_sample0(void *user, int micro) {
    pt_data *d = user;
    return fsc_batch_first_sample(d->step, micro, 0, d->B, d->m, 1);
}

#endif
