/* Benchmark (not a test): flash attention's forward and backward kernels
 * against the naive ones, alone, on GPT-2's fused qkv layout (what the model
 * calls). Run it by hand:
 *   build/tests/bench_attention_flash [T [B [rounds [hd [NH [prec]]]]]]
 * defaults T 2048, B 1, 5 rounds, hd 64, NH 8, prec f32 (or bf16).
 * Threads are FSC_NUM_THREADS (default 1). The four kernels are timed in
 * turns, round after round, so that a loaded machine's noise falls on both
 * sides alike; each line gives the median milliseconds of the rounds and the
 * ratio naive / flash (above 1: flash is faster). Forward is flash's forward
 * against fsc_attention_forward_prec; backward is flash's delta + backward
 * against fsc_attention_backward_prec. "flash" runs the tiles as this
 * machine does by default (fp32 on AVX-512: fsc_flash_mm), "gemm tiles" with
 * FSC_FLASH_TILES=gemm (one fsc_gemm call per tile product). Times are the
 * process's CPU time (all threads), not wall time: on a shared machine the
 * time spent descheduled would otherwise swamp the kernels' own. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fsc/core.h"
#include "fsc/kernels.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 2048, B = argc > 2 ? atoi(argv[2]) : 1;
    const int rounds = argc > 3 ? atoi(argv[3]) : 5, hd = argc > 4 ? atoi(argv[4]) : 64;
    const int NH = argc > 5 ? atoi(argv[5]) : 8;
    const fsc_gemm_prec prec = argc > 6 && !strcmp(argv[6], "bf16") ? FSC_GEMM_BF16 : FSC_GEMM_F32;
    if (T < 1 || B < 1 || rounds < 1 || rounds > 100 || hd < 1 || NH < 1) {
        fprintf(stderr, "usage: %s [T [B [rounds(1-100) [hd [NH [f32|bf16]]]]]]\n", argv[0]);
        return 2;
    }
    if (fsc_blas_init(1) != FSC_OK) {
        fprintf(stderr, "bench_attention_flash: %s\n", fsc_last_error());
        return 1;
    }
    const int C = NH * hd;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t natt = (size_t)B * NH * T * T, nrow = (size_t)B * NH * T;
    float *qkv = malloc(nqkv * sizeof(float)), *dqkv = malloc(nqkv * sizeof(float));
    float *out = malloc(nout * sizeof(float)), *dout = malloc(nout * sizeof(float));
    float *att = malloc(natt * sizeof(float)), *lse = malloc(nrow * sizeof(float));
    float *delta = malloc(nrow * sizeof(float));
    if (!qkv || !dqkv || !out || !dout || !att || !lse || !delta) {
        fprintf(stderr, "bench_attention_flash: out of memory (T %d B %d)\n", T, B);
        return 1;
    }
    fsc_rng_normal_fill(qkv, (int64_t)nqkv, 0, 1, 0.f, 1.f);
    fsc_rng_normal_fill(dout, (int64_t)nout, 0, 2, 0.f, 1.f);
    fsc_attn_dims d = {.B = B,
                       .NH = NH,
                       .NKV = NH,
                       .hd = hd,
                       .Tq = T,
                       .Tk = T,
                       .ldq = 3 * C,
                       .ldk = 3 * C,
                       .ldv = 3 * C,
                       .ldo = C};
    double t[6][100];
    for (int r = 0; r < rounds; r++) {
        double t0 = cpu_now();
        fsc_attention_forward_prec(out, att, qkv, B, T, C, NH, prec);
        double t1 = cpu_now();
        fsc_attention_backward_prec(dqkv, dout, qkv, att, B, T, C, NH, prec);
        double t2 = cpu_now();
        fsc_flash_attention_forward(&d, qkv, qkv + C, qkv + 2 * C, out, lse, false, prec);
        double t3 = cpu_now();
        memset(dqkv, 0, nqkv * sizeof(float));
        fsc_flash_attention_delta(&d, out, dout, delta);
        fsc_flash_attention_backward(&d, qkv, qkv + C, qkv + 2 * C, dout, lse, delta, dqkv,
                                     dqkv + C, dqkv + 2 * C, prec);
        double t4 = cpu_now();
        setenv("FSC_FLASH_TILES", "gemm", 1);
        fsc_flash_attention_forward(&d, qkv, qkv + C, qkv + 2 * C, out, lse, false, prec);
        double t5 = cpu_now();
        memset(dqkv, 0, nqkv * sizeof(float));
        fsc_flash_attention_delta(&d, out, dout, delta);
        fsc_flash_attention_backward(&d, qkv, qkv + C, qkv + 2 * C, dout, lse, delta, dqkv,
                                     dqkv + C, dqkv + 2 * C, prec);
        double t6 = cpu_now();
        unsetenv("FSC_FLASH_TILES");
        t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2, t[3][r] = t4 - t3;
        t[4][r] = t5 - t4, t[5][r] = t6 - t5;
    }
    const double nf = median(t[0], rounds), nb = median(t[1], rounds);
    const double ff = median(t[2], rounds), fb = median(t[3], rounds);
    const double gf = median(t[4], rounds), gb = median(t[5], rounds);
    printf("T %d B %d NH %d hd %d %s threads %d, median of %d rounds (CPU ms):\n", T, B, NH, hd,
           prec == FSC_GEMM_BF16 ? "bf16" : "f32", fsc_get_num_threads(), rounds);
    printf("            naive ms   flash ms  gemm tiles ms  naive/flash  gemm tiles/flash\n");
    const char *name[3] = {"forward ", "backward", "both    "};
    const double row[3][3] = {{nf, ff, gf}, {nb, fb, gb}, {nf + nb, ff + fb, gf + gb}};
    for (int i = 0; i < 3; i++)
        printf("  %s %9.2f %9.2f %13.2f %11.2fx %15.2fx\n", name[i], row[i][0] * 1e3,
               row[i][1] * 1e3, row[i][2] * 1e3, row[i][0] / row[i][1], row[i][2] / row[i][1]);
    /* sorted by median(): t[k][0] is each kernel's fastest round, the
     * closest a loaded machine gets to a quiet one's figure */
    printf("  fastest rounds, both: naive %.2f flash %.2f gemm tiles %.2f ms: %.2fx %.2fx\n",
           (t[0][0] + t[1][0]) * 1e3, (t[2][0] + t[3][0]) * 1e3, (t[4][0] + t[5][0]) * 1e3,
           (t[0][0] + t[1][0]) / (t[2][0] + t[3][0]), (t[4][0] + t[5][0]) / (t[2][0] + t[3][0]));
    free(qkv), free(dqkv), free(out), free(dout), free(att), free(lse), free(delta);
    return 0;
}
