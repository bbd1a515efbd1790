/* Flash attention (fsc_flash_attention_*) against a double-precision
 * reference of causal grouped-query attention, whose own backward is
 * checked by central differences; against the naive kernels within their
 * noise (flash's error from the exact result at most EQ_NOISE_K times the
 * naive kernel's, plus a few ulps); merging key blocks one call at a time
 * against one call; rows that see no key; and the backward's two loop
 * orders giving the same bits whatever the thread count. Shapes: GPT-2's
 * fused qkv (NKV = NH) and LLaMA's grouped heads, T not a multiple of the
 * tile sizes. Every case runs twice: with the tiles as this CPU runs them
 * by default (fp32 on AVX-512: attention_flash_tile.c's register-blocked
 * products) and as fsc_gemm calls (FSC_FLASH_TILES=gemm, what other CPUs
 * run). */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flash_ref.h"

/* The GPT-2 layout: q, k, v as column blocks of one (B,T,3C) array. */
static void test_gpt2_fused_matches_reference_and_naive(void **state) {
    (void)state;
    fr_gpt2_fused_case(FSC_GEMM_F32, 1);
}

/* LLaMA's layout: separate q, k and v, two query heads per KV head. */
static void test_llama_gqa_matches_reference_and_naive(void **state) {
    (void)state;
    fr_llama_gqa_case(FSC_GEMM_F32, 3);
}

/* The reference's backward by central differences in double: what the
 * comparisons above stand on. */
static void test_reference_gradcheck(void **state) {
    (void)state;
    enum { B = 1, T = 7, NH = 2, NKV = 1, HD = 4 };
    fsc_attn_dims d = {.B = B,
                       .NH = NH,
                       .NKV = NKV,
                       .hd = HD,
                       .Tq = T,
                       .Tk = T + 2,
                       .q_pos0 = 3,
                       .k_pos0 = 0,
                       .ldq = NH * HD,
                       .ldk = NKV * HD,
                       .ldv = NKV * HD,
                       .ldo = NH * HD};
    assert_true(fr_reference_gradcheck(&d) < 1e-5);
}

/* Keys given in three blocks, each merged into the out and lse of the ones
 * before, equal one call over all keys; backward per block adds up to one
 * call's gradients. Queries are a block of a longer sequence (q_pos0 > 0),
 * and the first key block lies wholly after some queries' positions. */
static void test_merge_blocks_equals_one_call(void **state) {
    (void)state;
    enum { B = 2, NH = 4, NKV = 2, HD = 16, TQ = 90, TK = 300, CQ = NH * HD, CK = NKV * HD };
    const int64_t qpos = 200; /* queries at 200..289 see keys 0..289 of 300 */
    float *q = fr_random((size_t)B * TQ * CQ, 7), *k = fr_random((size_t)B * TK * CK, 8);
    float *v = fr_random((size_t)B * TK * CK, 9), *dout = fr_random((size_t)B * TQ * CQ, 10);
    fsc_attn_dims one = {.B = B,
                         .NH = NH,
                         .NKV = NKV,
                         .hd = HD,
                         .Tq = TQ,
                         .Tk = TK,
                         .q_pos0 = qpos,
                         .ldq = CQ,
                         .ldk = CK,
                         .ldv = CK,
                         .ldo = CQ};
    fr_case c = fr_case_run(&one, q, k, v, dout, FSC_GEMM_F32);
    fr_check_against_reference(&c);
    /* the same keys in blocks [0,130) [130,210) [210,300), merged in that order */
    const int cut[4] = {0, 130, 210, TK};
    size_t no = (size_t)B * TQ * CQ, nl = (size_t)B * NH * TQ;
    float *out = malloc(no * 4), *lse = malloc(nl * 4), *delta = malloc(nl * 4);
    float *dq = calloc(no, 4), *dk = calloc((size_t)B * TK * CK, 4);
    float *dv = calloc((size_t)B * TK * CK, 4);
    for (int i = 0; i < 3; i++) {
        fsc_attn_dims part = one;
        part.Tk = cut[i + 1] - cut[i], part.k_pos0 = cut[i];
        /* a key block of a batch is rows [cut, cut + Tk) of each batch row: copy them out */
        float *kb = fr_rows(k, B, TK, CK, cut[i], part.Tk),
              *vb = fr_rows(v, B, TK, CK, cut[i], part.Tk);
        fsc_flash_attention_forward(&part, q, kb, vb, out, lse, i > 0, FSC_GEMM_F32);
        free(kb), free(vb);
    }
    fr_assert_close("merged out", out, c.out, no, 1e-5);
    fr_assert_close("merged lse", lse, c.lse, nl, 1e-5);
    fsc_flash_attention_delta(&one, out, dout, delta);
    for (int i = 0; i < 3; i++) {
        fsc_attn_dims part = one;
        part.Tk = cut[i + 1] - cut[i], part.k_pos0 = cut[i];
        float *kb = fr_rows(k, B, TK, CK, cut[i], part.Tk),
              *vb = fr_rows(v, B, TK, CK, cut[i], part.Tk);
        float *dkb = calloc((size_t)B * part.Tk * CK, 4),
              *dvb = calloc((size_t)B * part.Tk * CK, 4);
        fsc_flash_attention_backward(&part, q, kb, vb, dout, lse, delta, dq, dkb, dvb,
                                     FSC_GEMM_F32);
        fr_rows_add(dk, dkb, B, TK, CK, cut[i], part.Tk);
        fr_rows_add(dv, dvb, B, TK, CK, cut[i], part.Tk);
        free(kb), free(vb), free(dkb), free(dvb);
    }
    fr_assert_close("merged dq", dq, c.dq, no, 1e-5);
    fr_assert_close("merged dk", dk, c.dk, (size_t)B * TK * CK, 1e-5);
    fr_assert_close("merged dv", dv, c.dv, (size_t)B * TK * CK, 1e-5);
    fr_case_free(&c);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(delta), free(dq), free(dk),
        free(dv);
}

/* Keys all after some queries: those rows get out 0 and lse -inf, merging
 * into them keeps them so, and they pass no gradient. */
static void test_rows_without_keys(void **state) {
    (void)state;
    enum { B = 1, NH = 2, HD = 8, TQ = 20, TK = 10, C = NH * HD };
    float *q = fr_random(B * TQ * C, 11), *k = fr_random(B * TK * C, 12);
    float *v = fr_random(B * TK * C, 13), *dout = fr_random(B * TQ * C, 14);
    fsc_attn_dims d = {.B = B,
                       .NH = NH,
                       .NKV = NH,
                       .hd = HD,
                       .Tq = TQ,
                       .Tk = TK,
                       .q_pos0 = 0,
                       .k_pos0 = 12,
                       .ldq = C,
                       .ldk = C,
                       .ldv = C,
                       .ldo = C};
    float out[B * TQ * C], lse[B * NH * TQ], delta[B * NH * TQ];
    for (int i = 0; i < 2; i++) fsc_flash_attention_forward(&d, q, k, v, out, lse, i, FSC_GEMM_F32);
    for (int h = 0; h < NH; h++)
        for (int r = 0; r < TQ; r++) {
            const bool sees = r >= 12;
            assert_true(sees ? isfinite(lse[h * TQ + r]) : lse[h * TQ + r] == -INFINITY);
            for (int e = 0; e < HD; e++)
                if (!sees) assert_true(out[r * C + h * HD + e] == 0.f);
        }
    fr_case c = fr_case_run(&d, q, k, v, dout, FSC_GEMM_F32);
    fr_check_against_reference(&c);
    (void)delta;
    for (int r = 0; r < 12; r++)
        for (int e = 0; e < C; e++) assert_true(c.dq[r * C + e] == 0.f);
    fr_case_free(&c);
    free(q), free(k), free(v), free(dout);
}

/* fr_thread_count_case: 1 and 3 threads, the same bits. */
static void test_thread_count_independent(void **state) {
    (void)state;
    fr_thread_count_case(FSC_GEMM_F32, 15);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_gradcheck),
        cmocka_unit_test(test_gpt2_fused_matches_reference_and_naive),
        cmocka_unit_test(test_llama_gqa_matches_reference_and_naive),
        cmocka_unit_test(test_merge_blocks_equals_one_call),
        cmocka_unit_test(test_rows_without_keys),
        cmocka_unit_test(test_thread_count_independent),
    };
    int failed = cmocka_run_group_tests_name("default tiles", tests, NULL, NULL);
    setenv("FSC_FLASH_TILES", "gemm", 1);
    failed += cmocka_run_group_tests_name("fsc_gemm tiles", tests, NULL, NULL);
    return failed;
}
