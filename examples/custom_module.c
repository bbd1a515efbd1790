/* A new module in about a page of C: SiLU (x * sigmoid(x)), used inside a
 * Sequential and trained with AdamW to fit y = sin(3x) on [-1, 1].
 *
 * The module is written in examples/silu.h (a page), so that
 * examples/user_journey.c trains the same one under every strategy.
 * Run: build/examples/example_custom_module */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fsc/fsc.h"
#include "silu.h"

/* ---- using it ------------------------------------------------------------- */
int main(void) {
    enum { N = 256, H = 32, STEPS = 400 };
    fsc_module *layers[] = {fsc_linear_new("fc1", 1, H, true, FSC_WEIGHT_OUT_IN, 1.0f),
                            silu_new("act"),
                            fsc_linear_new("fc2", H, 1, true, FSC_WEIGHT_OUT_IN, 0.1f)};
    fsc_module *net = fsc_sequential_new("net", 3, layers);
    fsc_params params;
    fsc_optim_range *ranges;
    int nranges;
    if (!net || fsc_params_bind(net, 42, true, &params) ||
        fsc_optim_ranges_from_params(&params, &ranges, &nranges)) {
        fprintf(stderr, "setup failed: %s\n", fsc_last_error());
        return 1;
    }
    fsc_optim *opt =
        fsc_optim_new(&(fsc_optim_config){.kind = FSC_OPTIM_ADAMW, .lr = 1e-2}, ranges, nranges);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    static float xs[N], ys[N];
    for (int i = 0; i < N; i++) xs[i] = -1.0f + 2.0f * i / (N - 1), ys[i] = sinf(3 * xs[i]);
    fsc_tensor x = fsc_tensor_2d(xs, FSC_DTYPE_F32, N, 1);
    double first = 0, loss = 0;
    for (int step = 0; step < STEPS; step++) {
        fsc_arena_reset(arena);
        fsc_params_zero_grad(&params);
        fsc_ctx ctx = {.arena = arena, .training = true, .step = step};
        fsc_tensor y, dy;
        void *saved;
        if (fsc_module_forward(net, &ctx, &x, &y, &saved)) break;
        dy = fsc_tensor_arena(arena, FSC_DTYPE_F32, 2, y.shape);
        float *pred = y.data, *grad = dy.data;
        loss = 0;
        for (int i = 0; i < N; i++) { /* mean squared error and its gradient */
            loss += (pred[i] - ys[i]) * (pred[i] - ys[i]) / N;
            grad[i] = 2.0f * (pred[i] - ys[i]) / N;
        }
        if (step == 0) first = loss;
        if (fsc_module_backward(net, &ctx, saved, &dy, NULL) || fsc_optim_step(opt)) break;
        if (step % 100 == 0) printf("step %3d  mse %.5f\n", step, loss);
    }
    printf("mse %.5f -> %.5f\n", first, loss);
    fsc_arena_free(arena);
    fsc_optim_free(opt);
    fsc_optim_ranges_free(ranges);
    fsc_params_free(&params);
    fsc_module_free(net);
    return loss < 0.05 * first ? 0 : 1; /* the example is also a test: it must learn */
}
