/* Flash attention with bf16 GEMM inputs (FSC_GEMM_BF16, oneDNN on) against
 * the naive kernels at bf16: flash's distance from the exact
 * (double-precision) attention at most FR_NOISE_K times the naive kernel's
 * own, for GPT-2's fused qkv and LLaMA's grouped heads at T not a multiple
 * of the tiles. A program of its own: it loads oneDNN, whose worker threads
 * LeakSanitizer's exit-time tracer can trip on (tests/CMakeLists.txt runs it
 * with the bf16 tests' ASAN_OPTIONS). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flash_ref.h"

static int setup(void **state) {
    (void)state;
    if (!fsc_bf16_gemm_available()) return 0;
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    return 0;
}

static void need_bf16(void) {
    if (!fsc_bf16_gemm_available()) {
        print_message("skipped: no oneDNN bf16 path here (%s)\n", fsc_last_error());
        skip();
    }
}

static void test_gpt2_fused_bf16(void **state) {
    (void)state;
    need_bf16();
    enum { B = 2, T = 150, NH = 4, HD = 16, C = NH * HD };
    float *qkv = fr_random((size_t)B * T * 3 * C, 31);
    float *dout = fr_random((size_t)B * T * C, 32);
    fsc_attn_dims d = {.B = B,
                       .NH = NH,
                       .NKV = NH,
                       .hd = HD,
                       .Tq = T,
                       .Tk = T,
                       .ldq = 3 * C,
                       .ldk = 3 * C,
                       .ldv = 3 * C,
                       .ldo = C};
    fsc_bf16_gemm_reset_stats();
    fr_case c = fr_case_run(&d, qkv, qkv + C, qkv + 2 * C, dout, FSC_GEMM_BF16);
    assert_true(fsc_bf16_gemm_get_stats().calls_bf16 > 0); /* the tiles ran in bf16 */
    float *out = malloc((size_t)B * T * C * 4), *att = calloc((size_t)B * NH * T * T, 4);
    float *dqkv = malloc((size_t)B * T * 3 * C * 4);
    fsc_attention_forward_prec(out, att, qkv, B, T, C, NH, FSC_GEMM_BF16);
    fsc_attention_backward_prec(dqkv, dout, qkv, att, B, T, C, NH, FSC_GEMM_BF16);
    fr_check_against_naive(&c, out, dqkv, dqkv + C, dqkv + 2 * C, 3 * C, 3 * C, 3 * C);
    fr_case_free(&c);
    free(qkv), free(dout), free(out), free(att), free(dqkv);
}

static void test_llama_gqa_bf16(void **state) {
    (void)state;
    need_bf16();
    enum { B = 1, T = 200, NH = 4, NKV = 2, HD = 16, CQ = NH * HD, CK = NKV * HD };
    float *q = fr_random((size_t)B * T * CQ, 33), *k = fr_random((size_t)B * T * CK, 34);
    float *v = fr_random((size_t)B * T * CK, 35), *dout = fr_random((size_t)B * T * CQ, 36);
    fsc_attn_dims d = {.B = B,
                       .NH = NH,
                       .NKV = NKV,
                       .hd = HD,
                       .Tq = T,
                       .Tk = T,
                       .ldq = CQ,
                       .ldk = CK,
                       .ldv = CK,
                       .ldo = CQ};
    fr_case c = fr_case_run(&d, q, k, v, dout, FSC_GEMM_BF16);
    float *out = malloc((size_t)B * T * CQ * 4), *att = calloc((size_t)B * NH * T * T, 4);
    float *dq = malloc((size_t)B * T * CQ * 4), *dk = malloc((size_t)B * T * CK * 4);
    float *dv = malloc((size_t)B * T * CK * 4);
    fsc_attention_gqa_forward_prec(out, att, q, k, v, B, T, NH, NKV, HD, FSC_GEMM_BF16);
    fsc_attention_gqa_backward_prec(dq, dk, dv, dout, q, k, v, att, B, T, NH, NKV, HD,
                                    FSC_GEMM_BF16);
    fr_check_against_naive(&c, out, dq, dk, dv, CQ, CK, CK);
    fr_case_free(&c);
    free(q), free(k), free(v), free(dout), free(out), free(att), free(dq), free(dk), free(dv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_fused_bf16),
        cmocka_unit_test(test_llama_gqa_bf16),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
