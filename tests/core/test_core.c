/* Core: errors, dtype conversions, tagged memory, arena, tensors, Philox. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fsc/core.h"
#include "test_main.h"

static void test_error_message(void **state) {
    (void)state;
    int rc = fsc_error(FSC_ERR_INVALID, "--heads %d must divide --d-model %d", 3, 64);
    assert_int_equal(rc, FSC_ERR_INVALID);
    assert_string_equal(fsc_last_error(), "--heads 3 must divide --d-model 64");
    assert_string_equal(fsc_strerror(FSC_ERR_FORMAT), "malformed file");
}

static void test_half_conversions(void **state) {
    (void)state;
    float vals[] = {0.f, 1.f, -2.5f, 3.14159f, 65504.f, 1e-7f, -1e-3f};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        float b = fsc_bf16_to_f32(fsc_f32_to_bf16(vals[i]));
        assert_true(fabsf(b - vals[i]) <= fabsf(vals[i]) / 128.f);
        float h = fsc_f16_to_f32(fsc_f32_to_f16(vals[i]));
        assert_true(fabsf(h - vals[i]) <= fabsf(vals[i]) / 1024.f + 6e-8f);
    }
    assert_int_equal(fsc_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(fsc_f32_to_f16(1.0f), 0x3c00);
    assert_true(isinf(fsc_f16_to_f32(fsc_f32_to_f16(1e6f))));
    /* round to nearest even: 1 + 2^-8 is halfway between two bf16 values */
    assert_int_equal(fsc_f32_to_bf16(1.00390625f), 0x3f80);
}

static void test_mem_tags(void **state) {
    (void)state;
    size_t before = fsc_mem_current(FSC_MEM_OPTIM);
    void *p = fsc_mem_alloc(FSC_MEM_OPTIM, 1000);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    assert_int_equal(fsc_mem_current(FSC_MEM_OPTIM), before + 1000);
    assert_true(fsc_mem_peak(FSC_MEM_OPTIM) >= before + 1000);
    fsc_mem_free(p);
    assert_int_equal(fsc_mem_current(FSC_MEM_OPTIM), before);
    fsc_mem_free(NULL);
    assert_null(fsc_mem_alloc(FSC_MEM_OPTIM, SIZE_MAX - 10));
    assert_non_null(strstr(fsc_last_error(), "too large"));
}

static void test_mem_discard_recommit(void **state) {
    (void)state;
    for (size_t size = 1000; size <= ((size_t)8 << 20); size *= 8192) { /* calloc'd and mapped */
        size_t before = fsc_mem_current(FSC_MEM_GRADS);
        float *p = fsc_mem_alloc(FSC_MEM_GRADS, size);
        for (size_t i = 0; i < size / 4; i++) p[i] = 1.f;
        size_t off = size / 4, len = size / 2; /* not page aligned at either end */
        off -= off % 4 + 12, len -= len % 4;
        assert_int_equal(fsc_mem_discard(p, off, len), FSC_OK);
        assert_int_equal(fsc_mem_current(FSC_MEM_GRADS), before + size - len);
        for (size_t i = 0; i < size / 4; i++) /* the range reads as zero, the rest is intact */
            assert_true(p[i] == ((i * 4 >= off && i * 4 < off + len) ? 0.f : 1.f));
        assert_int_equal(fsc_mem_recommit(p, off, len), FSC_OK);
        assert_int_equal(fsc_mem_current(FSC_MEM_GRADS), before + size);
        assert_int_equal(fsc_mem_recommit(p, off, len), FSC_ERR_INVALID); /* nothing left */
        assert_int_equal(fsc_mem_discard(p, size, 8), FSC_ERR_INVALID);   /* outside */
        assert_int_equal(fsc_mem_discard(p, 0, 64), FSC_OK);
        fsc_mem_free(p); /* a discarded range is not subtracted twice */
        assert_int_equal(fsc_mem_current(FSC_MEM_GRADS), before);
    }
}

static void test_arena_reuses_memory(void **state) {
    (void)state;
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, 1024);
    for (int i = 0; i < 10; i++) assert_non_null(fsc_arena_alloc(a, 700));
    size_t hw = fsc_arena_high_water(a);
    assert_true(hw >= 7000);
    fsc_arena_reset(a);
    size_t held = fsc_mem_current(FSC_MEM_ACTIV);
    for (int i = 0; i < 10; i++) assert_non_null(fsc_arena_alloc(a, 700));
    assert_int_equal(fsc_mem_current(FSC_MEM_ACTIV), held); /* no new block after reset */
    fsc_arena_free(a);
}

static void test_arena_mark_release(void **state) {
    (void)state;
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, 4096);
    char *keep = fsc_arena_alloc(a, 1000);
    fsc_arena_mark_t m = fsc_arena_mark(a);
    for (int i = 0; i < 8; i++) assert_non_null(fsc_arena_alloc(a, 3000)); /* spans new blocks */
    size_t held = fsc_mem_current(FSC_MEM_ACTIV);
    fsc_arena_release(a, m);
    assert_int_equal(fsc_arena_used(a), 1024);
    /* released blocks are reused, not allocated again */
    for (int i = 0; i < 8; i++) assert_non_null(fsc_arena_alloc(a, 3000));
    assert_int_equal(fsc_mem_current(FSC_MEM_ACTIV), held);
    keep[0] = 1;
    /* reset shrinks to one block sized by the last step */
    fsc_arena_reset(a);
    fsc_arena_alloc(a, 500);
    fsc_arena_reset(a);
    fsc_arena_reset(a);
    assert_true(fsc_mem_current(FSC_MEM_ACTIV) < held);
    fsc_arena_free(a);
}

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* The block a reset merges the first step's chain into is faulted in by the
 * reset: the next step, using as much, maps no fresh page. Untouched, 48 MiB
 * would take 12288 faults (4 KiB pages) or at least 24 (2 MiB huge pages). */
static void test_arena_reset_block_resident(void **state) {
    (void)state;
    enum { PIECES = 48, PIECE = 1 << 20 };
    fsc_arena *a = fsc_arena_new(FSC_MEM_ACTIV, PIECE);
    for (int i = 0; i < PIECES; i++) memset(fsc_arena_alloc(a, PIECE), 1, PIECE); /* a chain */
    fsc_arena_reset(a); /* one block of 48 MiB */
    char *piece[PIECES];
    for (int i = 0; i < PIECES; i++) assert_non_null(piece[i] = fsc_arena_alloc(a, PIECE));
    for (int i = 1; i < PIECES; i++) assert_ptr_equal(piece[i], piece[0] + (size_t)i * PIECE);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (size_t)PIECES * PIECE / page;
    unsigned char *in = malloc(pages);
    assert_non_null(in);
    assert_int_equal(mincore(piece[0], (size_t)PIECES * PIECE, in), 0); /* 2 MiB aligned */
    size_t resident = 0;
    for (size_t i = 0; i < pages; i++) resident += in[i] & 1;
    assert_int_equal(resident, pages);
    free(in);
    long before = minor_faults();
    for (int i = 0; i < PIECES; i++) memset(piece[i], 2, PIECE);
    assert_true(minor_faults() - before < 8);
    fsc_arena_free(a);
}

static void test_tensor_views(void **state) {
    (void)state;
    float buf[24];
    fsc_tensor t = fsc_tensor_3d(buf, FSC_DTYPE_F32, 2, 3, 4), r, n;
    assert_int_equal(fsc_tensor_numel(&t), 24);
    assert_int_equal(fsc_tensor_reshape(&t, 2, (int64_t[]){6, 4}, &r), FSC_OK);
    assert_int_equal(fsc_tensor_reshape(&t, 2, (int64_t[]){5, 4}, &r), FSC_ERR_SHAPE);
    assert_int_equal(fsc_tensor_narrow0(&t, 1, 1, &n), FSC_OK);
    assert_ptr_equal(n.data, buf + 12);
    assert_int_equal(fsc_tensor_narrow0(&t, 1, 2, &n), FSC_ERR_SHAPE);
}

static void test_philox_known_answer(void **state) {
    (void)state;
    /* Random123 known-answer test for philox4x32-10: counter and key all zero. */
    fsc_philox_out r = fsc_philox4x32(0, 0, 0);
    assert_int_equal(r.v[0], 0x6627e8d5u);
    assert_int_equal(r.v[1], 0xe169c58du);
    assert_int_equal(r.v[2], 0xbc57ac4cu);
    assert_int_equal(r.v[3], 0x9b00dbd8u);
}

static void test_normal_fill_slices_match(void **state) {
    (void)state;
    enum { N = 4096 };
    static float full[N], part[100];
    uint64_t key = fsc_rng_key(42, "h.0.attn.c_attn.weight");
    fsc_rng_normal_fill(full, N, 0, key, 0.f, 1.f);
    fsc_rng_normal_fill(part, 100, 1001, key, 0.f, 1.f);
    assert_memory_equal(part, full + 1001, sizeof part);
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) s += full[i], s2 += (double)full[i] * full[i];
    assert_true(fabs(s / N) < 0.06);
    assert_true(fabs(s2 / N - 1.0) < 0.08);
    assert_true(fsc_rng_key(42, "a") != fsc_rng_key(42, "b"));
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_error_message),
              cmocka_unit_test(test_half_conversions), cmocka_unit_test(test_mem_tags),
              cmocka_unit_test(test_mem_discard_recommit),
              cmocka_unit_test(test_arena_reuses_memory), cmocka_unit_test(test_arena_mark_release),
              cmocka_unit_test(test_arena_reset_block_resident),
              cmocka_unit_test(test_tensor_views), cmocka_unit_test(test_philox_known_answer),
              cmocka_unit_test(test_normal_fill_slices_match))
