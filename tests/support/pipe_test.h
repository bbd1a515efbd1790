/* The raw pipeline's test data (fsc_pipe_io without the trainer): token
 * micro-batches of the test corpus as one replica's, the cross-entropy on
 * the last stage, and each micro-batch's first sample; and a run of it: the
 * steps, the weights saved and read back, a step refused by shape. Shared
 * by mpi_pipe.c and mpi_pipe_half.c. Include after cmocka.h. */
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

/* m micro-batches of B samples of the EQ corpus a step, the loss normalised
 * by all their tokens; pt_data_free frees it. */
static inline pt_data *pt_data_new(int B, int m) {
    pt_data *d = calloc(1, sizeof *d);
    assert_non_null(d);
    eq_tokens(&d->tk);
    d->B = B, d->m = m, d->T = EQ_MODEL.seq, d->norm = (double)B * m * EQ_MODEL.seq;
    return d;
}

static inline void pt_data_free(pt_data *d) {
    fsc_tokens_free(&d->tk);
    free(d);
}

static inline fsc_pipe_io pt_io(pt_data *d) {
    return (fsc_pipe_io){.input = pt_input, .loss = pt_loss, .sample0 = pt_sample0, .user = d};
}

/* EQ_STEPS steps of p on d, dropout on; a failure names the rank. */
static inline void pt_train(fsc_pipe *p, pt_data *d) {
    fsc_pipe_io io = pt_io(d);
    for (int s = 0; s < EQ_STEPS; s++) {
        d->step = s;
        fsc_ctx ctx = {.training = true, .seed = 5, .step = s};
        float l;
        fsc_pipe_zero_grad(p);
        if (fsc_pipe_run(p, &ctx, &io, &l))
            fail_msg("rank %d: %s", fsc_dist_rank(), fsc_last_error());
        assert_int_equal(fsc_pipe_step(p), FSC_OK);
    }
}

/* A run's end on the world: saves p's whole model to path, frees p, sched
 * and d, and returns the weights read back (the caller frees them). The
 * barrier keeps the next run from writing path before every rank read it. */
static inline float *pt_save_read_free(fsc_pipe *p, fsc_pipe_schedule *sched, pt_data *d,
                                       const char *path, int64_t *numel) {
    assert_int_equal(fsc_pipe_save_weights(p, path, 0, 0, NULL, NULL), FSC_OK);
    float *out = tt_read_weights(&EQ_MODEL, path, numel);
    pt_data_free(d);
    fsc_pipe_free(p);
    fsc_pipe_schedule_free(sched);
    fsc_group_barrier(fsc_group_world());
    return out;
}

/* A step (1F1B, 2 micro-batches of 2, on 2 ranks) of a pipeline under opt,
 * whose plan is not the shape a stage sends: both ends fail by shape at
 * once, rank 0 (the sender) with a message holding `send`, rank 1 `recv`. */
static inline void pt_expect_shape_refused(const fsc_pipe_options *opt, const char *send,
                                           const char *recv) {
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_1F1B, 2, 1, 2, &sched), FSC_OK);
    fsc_pipe *p = fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, opt);
    if (!p) fail_msg("fsc_pipe_new: %s", fsc_last_error());
    pt_data *d = pt_data_new(2, 2);
    fsc_pipe_io io = pt_io(d);
    fsc_ctx ctx = {.training = true, .seed = 5};
    float l;
    assert_int_equal(fsc_pipe_run(p, &ctx, &io, &l), FSC_ERR_SHAPE);
    const int rank = fsc_dist_rank();
    const char *want = rank == 0 ? send : recv;
    if (!strstr(fsc_last_error(), want))
        fail_msg("rank %d: \"%s\" lacks \"%s\"", rank, fsc_last_error(), want);
    pt_data_free(d);
    fsc_pipe_free(p);
    fsc_pipe_schedule_free(sched);
}

#endif
