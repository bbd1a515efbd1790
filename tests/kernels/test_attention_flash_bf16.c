/* Flash attention with bf16 GEMM inputs (FSC_GEMM_BF16, oneDNN on) against
 * the naive kernels at bf16: flash's distance from the exact
 * (double-precision) attention at most FR_NOISE_K times the naive kernel's
 * own, for GPT-2's fused qkv and LLaMA's grouped heads at T not a multiple
 * of the tiles, and the same bits at 1 and 3 threads. Every case runs twice:
 * with the default tiles (avx512_bf16 register kernels where the CPU has
 * them) and with FSC_FLASH_TILES=gemm (oneDNN bf16 GEMM calls, what other
 * CPUs run). A program of its own: it loads oneDNN, whose worker threads
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
    fr_gpt2_fused_case(FSC_GEMM_BF16, 31);
}

static void test_llama_gqa_bf16(void **state) {
    (void)state;
    need_bf16();
    fr_llama_gqa_case(FSC_GEMM_BF16, 33);
}

/* The backward's fused loop (one thread) and its two passes (more threads
 * than (batch, KV head) pairs) give the same bits, as does the forward;
 * T odd, so the last query and key rows pair with zero. */
static void test_thread_count_independent_bf16(void **state) {
    (void)state;
    need_bf16();
    enum { B = 1, T = 333, NH = 4, NKV = 1, HD = 32, CQ = NH * HD, CK = NKV * HD };
    float *q = fr_random(B * T * CQ, 35), *k = fr_random(B * T * CK, 36);
    float *v = fr_random(B * T * CK, 37), *dout = fr_random(B * T * CQ, 38);
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
    const int saved = fsc_get_num_threads();
    fsc_set_num_threads(1);
    fr_case one = fr_case_run(&d, q, k, v, dout, FSC_GEMM_BF16);
    fsc_set_num_threads(3);
    fr_case three = fr_case_run(&d, q, k, v, dout, FSC_GEMM_BF16);
    fsc_set_num_threads(saved);
    assert_memory_equal(one.out, three.out, (size_t)B * T * CQ * 4);
    assert_memory_equal(one.dq, three.dq, (size_t)B * T * CQ * 4);
    assert_memory_equal(one.dk, three.dk, (size_t)B * T * CK * 4);
    assert_memory_equal(one.dv, three.dv, (size_t)B * T * CK * 4);
    fr_check_against_reference(&one);
    fr_assert_rounded_bf16(&one);
    fr_case_free(&one), fr_case_free(&three);
    free(q), free(k), free(v), free(dout);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_fused_bf16),
        cmocka_unit_test(test_llama_gqa_bf16),
        cmocka_unit_test(test_thread_count_independent_bf16),
    };
    int failed = cmocka_run_group_tests_name("default tiles", tests, setup, NULL);
    setenv("FSC_FLASH_TILES", "gemm", 1);
    failed += cmocka_run_group_tests_name("fsc_gemm tiles", tests, setup, NULL);
    return failed;
}
