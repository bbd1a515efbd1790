/* Whether a bf16 test can run here: its checks need the bf16 GEMMs on
 * oneDNN (loaded at run time; absent, or the CPU cannot run them, every
 * GEMM falls back to sgemm and a bf16-against-fp32 check proves nothing).
 * Include after <cmocka.h>; a test skips with `if (!have_bf16()) skip();`. */
#ifndef FSC_TEST_BF16_TEST_H
#define FSC_TEST_BF16_TEST_H

#include <stdbool.h>

#include "fsc/core.h"
#include "fsc/kernels.h"

/* True when oneDNN's bf16 GEMMs are available; otherwise says why the
 * calling test is skipped (the loader's message) and returns false. */
static inline bool have_bf16(void) {
    if (fsc_bf16_gemm_available()) return true;
    print_message("skipped: no oneDNN bf16 path here (%s)\n", fsc_last_error());
    return false;
}

#endif
