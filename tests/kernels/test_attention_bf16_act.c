/* Attention on q/k/v and probabilities stored in bf16 (bf16 autocast's
 * saves, issue 27): the batched bf16 path rounds both to bf16 for its GEMMs
 * anyway, so the kernels that read them stored that way must compute bit
 * for bit what the fp32-stored path computes on their widenings:
 *  - forward: the same output, and the probabilities it keeps are the fp32
 *    path's rounded to bf16 (every entry a later GEMM reads);
 *  - backward: the same dqkv as fsc_attention_backward_prec at bf16 given
 *    the widened q/k/v and the widened stored probabilities (so the one
 *    change against fp32-stored probabilities is the softmax backward
 *    reading p rounded, |dp| <= 2^-9 p, which bf16_train's curve covers);
 *  - where the batched path is off (FSC_BF16_GEMM=off, or oneDNN absent),
 *    the same functions run the per-head path on the widenings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "bf16_test.h"
#include "frand.h"

/* T > 64: two query blocks, the second partial; B = 2 */
enum { B = 2, T = 80, C = 64, NH = 2, NQ = B * T * 3 * C, NA = B * NH * T * T };

/* qkv in bf16 (qh) and its widening (qw); dy fp32 */
static void inputs(uint16_t *qh, float *qw, float *dy) {
    uint64_t seed = 5;
    for (int i = 0; i < NQ; i++) {
        qh[i] = fsc_f32_to_bf16(3 * frand(&seed));
        qw[i] = fsc_bf16_to_f32(qh[i]);
    }
    for (int i = 0; i < B * T * C; i++) dy[i] = frand(&seed);
}

/* Runs both forms on the same inputs and compares them bit for bit. */
static void both_forms(void) {
    uint16_t *qh = malloc(NQ * 2), *atth = malloc(NA * 2);
    float *qw = malloc(NQ * 4), *dy = malloc(B * T * C * 4);
    float *o1 = malloc(B * T * C * 4), *o2 = malloc(B * T * C * 4);
    float *att = calloc(NA, 4), *attw = calloc(NA, 4);
    float *d1 = malloc(NQ * 4), *d2 = malloc(NQ * 4);
    assert_true(qh && atth && qw && dy && o1 && o2 && att && attw && d1 && d2);
    inputs(qh, qw, dy);
    fsc_attention_forward_prec(o1, att, qw, B, T, C, NH, FSC_GEMM_BF16);
    assert_int_equal(fsc_attention_forward_bf16_act(o2, atth, qh, B, T, C, NH), FSC_OK);
    assert_memory_equal(o1, o2, B * T * C * 4);
    for (int bh = 0; bh < B * NH; bh++) /* the causal entries: rounded, as kept */
        for (int t = 0; t < T; t++)
            for (int u = 0; u <= t; u++) {
                size_t at = ((size_t)bh * T + t) * T + u;
                assert_int_equal(atth[at], fsc_f32_to_bf16(att[at]));
                attw[at] = fsc_bf16_to_f32(atth[at]);
            }
    fsc_attention_backward_prec(d1, dy, qw, attw, B, T, C, NH, FSC_GEMM_BF16);
    assert_int_equal(fsc_attention_backward_bf16_act(d2, dy, qh, atth, B, T, C, NH), FSC_OK);
    assert_memory_equal(d1, d2, NQ * 4);
    free(qh), free(atth), free(qw), free(dy), free(o1), free(o2), free(att), free(attw);
    free(d1), free(d2);
}

static void test_batched_reads_bf16_as_its_widening(void **state) {
    (void)state;
    if (!have_bf16()) skip();
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_ON);
    assert_true(fsc_attention_bf16_act_ready(B, T, C, NH));
    fsc_bf16_gemm_reset_stats();
    both_forms();
    assert_true(fsc_bf16_gemm_get_stats().calls_bf16 > 0);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_AUTO);
}

static void test_forced_off_runs_per_head(void **state) {
    (void)state;
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_OFF);
    assert_false(fsc_attention_bf16_act_ready(B, T, C, NH));
    fsc_bf16_gemm_reset_stats();
    both_forms();
    assert_int_equal(fsc_bf16_gemm_get_stats().calls_bf16, 0);
    fsc_bf16_gemm_set_mode(FSC_BF16_GEMM_AUTO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_reads_bf16_as_its_widening),
        cmocka_unit_test(test_forced_off_runs_per_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
