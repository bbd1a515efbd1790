/* What every example shares: a small model of the user's own (a residual MLP,
 * not the GPT), a regression task generated from the global sample index, its
 * loss, and the learning criterion each example's exit status is.
 *
 * The data are a pure function of the sample's global index (inputs drawn by
 * Philox from it, targets a fixed smooth function of the inputs), so every
 * strategy, world size and batch split sees exactly the same global batch:
 * step s of rank r takes samples s * B * world + r * B + [0, B). */
#ifndef FSC_EXAMPLES_COMMON_H
#define FSC_EXAMPLES_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fsc/fsc.h"

/* Every fsc call's status is checked; an example simply stops on a failure
 * (under mpiexec, the launcher then ends the other ranks). */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != FSC_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, fsc_strerror(rc_),  \
                    fsc_last_error());                                                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
/* For the calls that return an object (NULL on failure). */
#define CHECK_PTR(p) CHECK((p) ? FSC_OK : FSC_ERR_INVALID)

enum {
    IN = 8,      /* inputs per sample */
    H = 32,      /* width of the residual stream */
    OUT = 2,     /* targets per sample */
    BLOCKS = 3,  /* residual blocks */
    B = 32,      /* samples per rank per step */
    STEPS = 150, /* optimizer steps */
};

/* x (N, IN) -> y (N, OUT): fc_in, GELU, BLOCKS x "block<i>" (x + fc2(GELU(fc1(x))),
 * width H -> 4H -> H), head. The signature is fsc_replica_fn's, for the dp
 * strategy's thread replicas. */
static inline fsc_module *model_new(void *unused) {
    (void)unused;
    fsc_module *parts[BLOCKS + 3] = {fsc_linear_new("fc_in", IN, H, true, FSC_WEIGHT_OUT_IN, 0.3f),
                                     fsc_gelu_new("act")};
    for (int i = 0; i < BLOCKS; i++) {
        char name[32];
        snprintf(name, sizeof name, "block%d", i);
        fsc_module *mlp[3] = {fsc_linear_new("fc1", H, 4 * H, true, FSC_WEIGHT_OUT_IN, 0.1f),
                              fsc_gelu_new("act"),
                              fsc_linear_new("fc2", 4 * H, H, true, FSC_WEIGHT_OUT_IN, 0.05f)};
        parts[2 + i] = fsc_residual_new(name, fsc_sequential_new("mlp", 3, mlp));
    }
    parts[BLOCKS + 2] = fsc_linear_new("head", H, OUT, true, FSC_WEIGHT_OUT_IN, 0.1f);
    return fsc_sequential_new("resmlp", BLOCKS + 3, parts);
}

/* Input j of global sample s, uniform in [-1, 1), and its targets. */
static inline float sample_input(int64_t s, int j) {
    return 2.0f * fsc_rng_uniform(fsc_philox4x32(1234, (uint64_t)s, (uint64_t)j / 4).v[j % 4]) -
           1.0f;
}
static inline void sample_targets(int64_t s, float *y) {
    float x[IN];
    for (int j = 0; j < IN; j++) x[j] = sample_input(s, j);
    y[0] = sinf(2.0f * x[0]) * x[1] + 0.5f * x[2] - x[3] * x[4];
    y[1] = cosf(x[5] + x[6]) - 0.5f * x[7] * x[0];
}

/* The first global sample of rank `rank`'s rows at `step` (K = 1 micro-batch). */
static inline int64_t first_sample(int step, int rank, int world) {
    return ((int64_t)step * world + rank) * B;
}

/* *x gets the inputs of `rows` samples from ctx->sample0, (rows, IN), in
 * ctx->arena. */
static inline int batch_inputs(const fsc_ctx *ctx, int rows, fsc_tensor *x) {
    *x = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 2, (int64_t[]){rows, IN});
    if (!x->data) return FSC_ERR_NOMEM;
    float *xd = x->data;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < IN; j++) xd[r * IN + j] = sample_input(ctx->sample0 + r, j);
    return FSC_OK;
}

/* The loss of predictions y (rows, OUT) of the samples from ctx->sample0 and
 * its gradient *dy (in ctx->arena): half the squared error summed over rows
 * and targets, divided by `norm`, the GLOBAL batch's target count. The
 * ranks' gradients then add up to those of the global mean (fsc's loss
 * convention, fsc/parallel.h); *loss gets this rank's share of it. */
static inline int mse_loss(const fsc_ctx *ctx, const fsc_tensor *y, double norm, fsc_tensor *dy,
                           float *loss) {
    const int64_t rows = y->shape[0];
    *dy = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 2, (int64_t[]){rows, OUT});
    if (!dy->data) return FSC_ERR_NOMEM;
    const float *yd = y->data;
    float *dyd = dy->data;
    double sum = 0;
    for (int64_t r = 0; r < rows; r++) {
        float t[OUT];
        sample_targets(ctx->sample0 + r, t);
        for (int k = 0; k < OUT; k++) {
            float d = yd[r * OUT + k] - t[k];
            sum += 0.5 * (double)d * d;
            dyd[r * OUT + k] = (float)(d / norm);
        }
    }
    *loss = (float)(sum / norm);
    return FSC_OK;
}

/* Forward, loss and backward of `rows` samples on m (the model or its
 * wrapper): the loss functions of the strategy and trainer examples. */
static inline int mse(fsc_module *m, const fsc_ctx *ctx, int rows, double norm, float *loss) {
    fsc_tensor x, y, dy;
    void *saved;
    int rc = batch_inputs(ctx, rows, &x);
    if (!rc) rc = fsc_module_forward(m, ctx, &x, &y, &saved);
    if (!rc) rc = mse_loss(ctx, &y, norm, &dy, loss);
    return rc ? rc : fsc_module_backward(m, ctx, saved, &dy, NULL);
}

/* mse as fsc_strategy_forward_backward's callback (fsc_dp_work_fn); user
 * points to the norm. ctx->sample0 is already that of row0. */
static inline int mse_fn(fsc_module *m, const fsc_ctx *ctx, int row0, int rows, void *user,
                         float *loss) {
    (void)row0;
    return mse(m, ctx, rows, *(const double *)user, loss);
}

/* The first and the latest global loss of a run. */
typedef struct losses {
    double first, last;
} losses;

/* Records step's global loss, the sum of the ranks' shares (one tiny
 * all-reduce over g; g NULL: `loss` is the global loss already, as the
 * trainer's), and prints it now and then on rank 0. */
static inline void track(losses *l, fsc_group *g, int step, float loss) {
    if (g) CHECK(fsc_group_allreduce(g, &loss, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM));
    if (step == 0) l->first = loss;
    l->last = loss;
    if (fsc_dist_rank() == 0 && (step % 50 == 0 || step == STEPS - 1))
        printf("step %3d  loss %.5f\n", step, loss);
}

/* The learning criterion, the exit status of every example: after STEPS
 * steps the loss must be below half the first (the model fits this task far
 * better than that; the margin keeps the check independent of the CPU's
 * rounding). Every rank holds the same global losses, so all exit alike. */
static inline int learned(const char *what, const losses *l) {
    bool ok = l->last < 0.5 * l->first;
    if (fsc_dist_rank() == 0)
        printf("%s: loss %.5f -> %.5f (%s: must end below half the first)\n", what, l->first,
               l->last, ok ? "learned" : "FAILED");
    return ok ? 0 : 1;
}

#endif
