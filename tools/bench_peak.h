/* fsc-bench's GEMM peak for the model's own shapes: every GEMM a training
 * step of the config runs through its Linears and head (forward, input
 * gradient, weight gradient, at B*T rows), each timed alone in bf16 and
 * fp32 (fsc_gemm_shape_peak), and the FLOP-weighted peak of the whole set:
 * the GFLOP/s the step's GEMMs would reach if each ran at its own best. */
#ifndef FSC_TOOLS_BENCH_PEAK_H
#define FSC_TOOLS_BENCH_PEAK_H

#include <stdbool.h>

#include "fsc/gpt.h"
#include "fsc/kernels.h"

#define BENCH_PEAK_SHAPES 16

typedef struct {
    const char *what; /* "c_attn fwd", ... */
    bool ta, tb, acc;
    int m, n, k;
    int count; /* calls per step (layers) */
    fsc_gemm_peak bf16, fp32;
} bench_shape;

typedef struct {
    int nshapes;
    bench_shape shapes[BENCH_PEAK_SHAPES];
    /* FLOP-weighted over the shapes (time = sum of flops / gflops): bf16 on
     * oneDNN, fp32 on sgemm, and best of the two per shape; by the wall
     * clock and per CPU-second */
    double bf16, fp32, best, cpu_bf16, cpu_fp32, cpu_best;
    double flops; /* of the listed GEMMs in one step */
} bench_peaks;

/* Measures the shapes of cfg at rows = batch * seq with reps timed runs each;
 * bf16 also when with_bf16 (0 there when oneDNN is absent). */
int bench_peaks_measure(const fsc_gpt_config *cfg, int rows, bool with_bf16, int reps,
                        bench_peaks *out);
/* Prints `"gemm_shapes": [...], "bf16_shape_peak_gflops": ..., ...` (no
 * surrounding braces, a trailing ", "). */
void bench_peaks_print(const bench_peaks *p);

#endif
