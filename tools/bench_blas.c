/* fsc-bench's BLAS figures (bench_blas.h). */
#include "bench_blas.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* s as a JSON string (null for NULL): the environment's value may hold anything. */
static void print_json_string(const char *s) {
    if (!s) {
        printf("null");
        return;
    }
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

int bench_blas_info(void) {
    const char *user = getenv("OPENBLAS_CORETYPE"); /* before fsc may set it */
    const char *hint = fsc_blas_hint();
    if (fsc_blas_init(0)) {
        fprintf(stderr, "fsc-bench: %s\n", fsc_last_error());
        return 1;
    }
    printf("{\"blas\": ");
    print_json_string(fsc_blas_describe());
    printf(", \"corename\": ");
    print_json_string(fsc_blas_corename());
    printf(", \"openblas_coretype\": ");
    print_json_string(user);
    printf(", \"hint\": ");
    print_json_string(hint);
    printf("}\n");
    return 0;
}

void bench_bf16_print(const fsc_bf16_gemm_stats *b, double timed, double bf16_peak,
                      double fp32_peak) {
    printf("\"bf16_gemm_calls\": %" PRId64 ", \"bf16_fallback_sgemm_calls\": %" PRId64 ", "
           "\"bf16_gemm_time_share\": %.3f, \"bf16_fallback_time_share\": %.3f, "
           "\"bf16_gemm_gflops\": %.1f, \"bf16_peak_gflops\": %.1f, "
           "\"fp32_peak_gflops\": %.1f, \"bf16_gemm\": ",
           b->calls_bf16, b->calls_f32, timed > 0 ? b->seconds_bf16 / timed : 0,
           timed > 0 ? b->seconds_f32 / timed : 0,
           b->seconds_bf16 > 0 ? b->flops_bf16 / b->seconds_bf16 / 1e9 : 0, bf16_peak, fp32_peak);
    print_json_string(fsc_bf16_gemm_describe());
    printf(", ");
}
