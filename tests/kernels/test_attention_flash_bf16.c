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
    fr_gpt2_fused_case(FSC_GEMM_BF16, 31);
}

static void test_llama_gqa_bf16(void **state) {
    (void)state;
    need_bf16();
    fr_llama_gqa_case(FSC_GEMM_BF16, 33);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_fused_bf16),
        cmocka_unit_test(test_llama_gqa_bf16),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
