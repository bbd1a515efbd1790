/* The measured peak of one GEMM shape, in bf16 (oneDNN) and fp32 (sgemm).
 *
 * A model's share of "the peak" means little when the peak is a 1024^3
 * product the model never runs: its own shapes (B*T rows against narrow
 * weights, a transposed operand, an accumulating weight gradient) reach less.
 * fsc_gemm_shape_peak times exactly one shape as the training step calls it,
 * with its operands already in the GEMM's precision (the bf16 rounding is
 * the caller's cost, not the GEMM's), and reports both the wall clock and
 * this process's CPU time: on a shared machine other load stretches the
 * first and barely the second. */
#include <string.h>
#include <time.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "kernels/blas_internal.h"
#include "kernels/dnnl_internal.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Values of either sign in [-0.08, 0.08], exact in bf16. */
static float val(size_t i) {
    return (float)((int)(i % 17) - 8) * 0.01f;
}

/* One timed run: seconds of wall clock and of CPU into *wall, *cpu (kept if smaller). */
typedef struct {
    double wall, cpu;
} best_time;
static void keep(best_time *b, double w0, double c0) {
    double w = fsc_now() - w0, c = cpu_now() - c0;
    if (w < b->wall) b->wall = w;
    if (c < b->cpu) b->cpu = c;
}

static int peak_bf16(bool ta, bool tb, int M, int N, int K, bool acc, int reps, best_time *t,
                     const char **impl) {
    char why[256];
    fsc_dnnl_matmul *mm =
        fsc_dnnl_matmul_new(ta, tb, M, N, K, N, acc, false, fsc_blas_threads(), why, sizeof why);
    if (!mm) return fsc_error(FSC_ERR_NOT_FOUND, "bf16 GEMM peak: %s", why);
    size_t ea = (size_t)M * K, eb = (size_t)K * N, ec = (size_t)M * N;
    uint16_t *a = fsc_mem_alloc(FSC_MEM_WORK, 2 * (ea + eb));
    float *c = fsc_mem_alloc(FSC_MEM_WORK, 4 * ec);
    void *scratch = fsc_mem_alloc(FSC_MEM_WORK, fsc_dnnl_matmul_scratch(mm) + 64);
    int rc = a && c && scratch ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "bf16 GEMM peak: out of memory");
    if (!rc) {
        for (size_t i = 0; i < ea + eb; i++) a[i] = fsc_f32_to_bf16(val(i));
        memset(c, 0, 4 * ec);
        *impl = fsc_dnnl_matmul_impl(mm);
    }
    for (int r = -1; r < reps && !rc; r++) { /* r = -1: warm-up (oneDNN's lazy set-up) */
        double w0 = fsc_now(), c0 = cpu_now();
        if (fsc_dnnl_matmul_run(mm, a, a + ea, c, NULL, scratch, fsc_blas_threads()))
            rc = fsc_error(FSC_ERR_INVALID, "bf16 GEMM peak: oneDNN failed to run %dx%dx%d", M, N,
                           K);
        else if (r >= 0)
            keep(t, w0, c0);
    }
    fsc_mem_free(a), fsc_mem_free(c), fsc_mem_free(scratch);
    fsc_dnnl_matmul_free(mm);
    return rc;
}

static int peak_f32(bool ta, bool tb, int M, int N, int K, bool acc, int reps, best_time *t) {
    size_t ea = (size_t)M * K, eb = (size_t)K * N, ec = (size_t)M * N;
    float *a = fsc_mem_alloc(FSC_MEM_WORK, 4 * (ea + eb + ec));
    if (!a) return fsc_error(FSC_ERR_NOMEM, "sgemm peak: out of memory");
    float *b = a + ea, *c = b + eb;
    for (size_t i = 0; i < ea + eb; i++) a[i] = val(i);
    memset(c, 0, 4 * ec);
    for (int r = -1; r < reps; r++) {
        double w0 = fsc_now(), c0 = cpu_now();
        fsc_sgemm(ta, tb, M, N, K, 1.f, a, ta ? M : K, b, tb ? K : N, acc ? 1.f : 0.f, c, N);
        if (r >= 0) keep(t, w0, c0);
    }
    fsc_mem_free(a);
    return FSC_OK;
}

int fsc_gemm_shape_peak(fsc_gemm_prec prec, bool ta, bool tb, int M, int N, int K, bool acc,
                        int reps, fsc_gemm_peak *out) {
    if (!out || M <= 0 || N <= 0 || K <= 0 || reps < 1)
        return fsc_error(FSC_ERR_INVALID,
                         "GEMM shape peak: %dx%dx%d with %d runs (expected positive sizes, "
                         "reps >= 1 and out)",
                         M, N, K, reps);
    memset(out, 0, sizeof *out);
    best_time t = {1e30, 1e30};
    const char *impl = "sgemm";
    int rc = prec == FSC_GEMM_BF16 ? peak_bf16(ta, tb, M, N, K, acc, reps, &t, &impl)
                                   : peak_f32(ta, tb, M, N, K, acc, reps, &t);
    if (rc) return rc;
    const double flops = 2.0 * M * N * (double)K;
    out->gflops = t.wall > 0 ? flops / t.wall / 1e9 : 0;
    out->cpu_gflops = t.cpu > 0 ? flops / t.cpu / 1e9 : 0;
    out->impl = impl;
    return FSC_OK;
}
