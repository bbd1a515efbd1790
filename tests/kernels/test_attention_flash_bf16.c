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

#include "bf16_test.h"
#include "flash_ref.h"

static int setup(void **state) {
    (void)state;
    if (!fsc_bf16_gemm_available()) return 0;
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    return 0;
}

static void test_gpt2_fused_bf16(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fr_gpt2_fused_case(FSC_GEMM_BF16, 31);
}

static void test_llama_gqa_bf16(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fr_llama_gqa_case(FSC_GEMM_BF16, 33);
}

/* fr_thread_count_case: 1 and 3 threads, the same bits, in bf16. */
static void test_thread_count_independent_bf16(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fr_thread_count_case(FSC_GEMM_BF16, 35);
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
