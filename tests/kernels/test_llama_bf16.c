/* Grouped-query attention's bf16 path (FSC_GEMM_BF16, oneDNN on) against
 * its fp32 path, within the bound tests/kernels/test_bf16.c derives for attention
 * forward. A program of its own: it loads oneDNN, whose worker threads
 * LeakSanitizer's exit-time tracer can trip on (tests/CMakeLists.txt runs
 * it with the bf16 tests' ASAN_OPTIONS). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "fsc/nn.h"
#include "bf16_test.h"
#include "test_main.h"

enum { B = 2 };

static void fill(float *x, int64_t n, uint64_t seed, float std) {
    fsc_rng_normal_fill(x, n, 0, fsc_rng_key(seed, "llama_bf16"), 0.f, std);
}

/* Grouped-query attention at bf16 (FSC_GEMM_BF16, oneDNN on) within
 * test_bf16.c's bound for attention forward, written for shared heads:
 * scores off by at most d_tu = e(hd) scale sum|q||k|, softmax turning that
 * into |p' - p| <= p (exp(2 dmax_t) - 1), att v adding e(T) sum p'|v|, so
 *     |out' - out|_t <= [(exp(2 dmax_t) - 1) + e(T) exp(2 dmax_t)] sum_u p_tu |v_u|
 * with e(K) = 2u + u^2 + 2 K 2^-24, u = 2^-8 (bf16's unit roundoff), and
 * out, p the fp32 kernel's. */
static double e_bf16(int K) {
    const double u = 1.0 / 256;
    return 2 * u + u * u + 2.0 * K / 16777216.0;
}

static void test_gqa_bf16(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fsc_bf16_gemm_mode mode = fsc_bf16_gemm_get_mode();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    enum { TT = 80, NH = 4, NKV = 2, HD = 16, CQ = NH * HD, CK = NKV * HD };
    int64_t nq = (int64_t)B * TT * CQ, nk = (int64_t)B * TT * CK;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    fill(q, nq, 1, 1.f), fill(k, nk, 2, 1.f), fill(v, nk, 3, 1.f);
    float *o16 = malloc(nq * 4), *o32 = malloc(nq * 4);
    size_t natt = (size_t)B * NH * TT * TT;
    float *a16 = calloc(natt, 4), *a32 = calloc(natt, 4);
    fsc_bf16_gemm_reset_stats();
    fsc_attention_gqa_forward_prec(o16, a16, q, k, v, B, TT, NH, NKV, HD, FSC_GEMM_BF16);
    assert_true(fsc_bf16_gemm_get_stats().calls_bf16 > 0);
    fsc_attention_gqa_forward_prec(o32, a32, q, k, v, B, TT, NH, NKV, HD, FSC_GEMM_F32);
    const double scale = 1 / sqrt(HD);
    double worst = 0, worst_diff = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < TT; t++) {
                const float *qt = q + ((size_t)b * TT + t) * CQ + h * HD;
                const size_t kvo = (size_t)b * TT * CK + (size_t)(h / (NH / NKV)) * HD;
                const float *p = a32 + (((size_t)b * NH + h) * TT + t) * TT;
                double dmax = 0;
                for (int u = 0; u <= t; u++) {
                    double sum = 0;
                    for (int c = 0; c < HD; c++)
                        sum += fabs((double)qt[c] * k[kvo + (size_t)u * CK + c]);
                    dmax = fmax(dmax, e_bf16(HD) * scale * sum);
                }
                double f = expm1(2 * dmax) + e_bf16(TT) * exp(2 * dmax);
                for (int c = 0; c < HD; c++) {
                    double pv = 0;
                    for (int u = 0; u <= t; u++)
                        pv += p[u] * fabs((double)v[kvo + (size_t)u * CK + c]);
                    size_t i = ((size_t)b * TT + t) * CQ + h * HD + c;
                    double d = fabs((double)o16[i] - o32[i]);
                    worst = fmax(worst, d / (f * pv + 1e-30));
                    worst_diff = fmax(worst_diff, d);
                }
            }
    print_message("gqa bf16 forward: max |diff| %.3g, worst %.3f of the bound\n", worst_diff,
                  worst);
    assert_true(worst <= 1.0);
    assert_true(worst_diff > 0); /* the bf16 path did run */
    fsc_bf16_gemm_set_mode(mode);
    free(q), free(k), free(v), free(o16), free(o32), free(a16), free(a32);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_gqa_bf16))
