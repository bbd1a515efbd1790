/* Token data: llm.c shards (round trip and each kind of bad header), byte
 * files, the built-in corpus, and the batch contract that every data-parallel
 * layout relies on, checked against the formula written out directly. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/io.h"

#include "tmpdir.h"
#include "tokens_test.h"
#include "test_main.h"

/* A shard with chosen header words and ntok tokens actually present. */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count, int ntok) {
    tokens_write_shard(path, magic, version, count, NULL, ntok, 2);
}

static void expect_load_fails(const char *spec, int status, const char *needle) {
    fsc_tokens tk;
    expect_tokens_refused(spec, fsc_tokens_load(spec, &tk), &tk, status, needle);
}

/* ---- llm.c shards ------------------------------------------------------------------- */

static void test_shard_round_trip(void **state) {
    (void)state;
    enum { N = 3000 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)((i * 7919) % 50257);
    assert_int_equal(fsc_shard_write(tmp("train_000.bin"), tok, 1000), FSC_OK);
    assert_int_equal(fsc_shard_write(tmp("train_001.bin"), tok + 1000, 2000), FSC_OK);
    fsc_tokens tk;
    assert_int_equal(fsc_tokens_load(tmp("train_000.bin"), &tk), FSC_OK);
    assert_int_equal(tk.count, 1000);
    assert_int_equal(tk.dtype, FSC_DTYPE_U16);
    assert_memory_equal(tk.data, tok, 1000 * 2);
    int mx = 0;
    for (int i = 0; i < 1000; i++) mx = tok[i] > mx ? tok[i] : mx;
    assert_int_equal(tk.vocab, mx + 1);
    fsc_tokens_free(&tk);
    assert_null(tk.data);

    char spec[600];
    snprintf(spec, sizeof spec, "%s,%s", tmp("train_000.bin"), tmp("train_001.bin"));
    assert_int_equal(fsc_tokens_load(spec, &tk), FSC_OK);
    assert_int_equal(tk.count, N);
    assert_memory_equal(tk.data, tok, sizeof tok);
    fsc_tokens_free(&tk);

    assert_int_equal(fsc_tokens_load(tmp("train_*.bin"), &tk), FSC_OK); /* sorted glob */
    assert_int_equal(tk.count, N);
    assert_memory_equal(tk.data, tok, sizeof tok);
    assert_int_equal(fsc_tokens_at(&tk, 1500), tok[1500]);
    fsc_tokens_free(&tk);
}

static void test_shard_errors(void **state) {
    (void)state;
    write_shard(tmp("magic.bin"), 20240521, 1, 4, 4);
    expect_load_fails(tmp("magic.bin"), FSC_ERR_FORMAT, "bad magic 20240521");
    write_shard(tmp("version.bin"), 20240520, 2, 4, 4);
    expect_load_fails(tmp("version.bin"), FSC_ERR_FORMAT, "unsupported shard version 2");
    write_shard(tmp("count.bin"), 20240520, 1, 1000, 10);
    expect_load_fails(tmp("count.bin"), FSC_ERR_FORMAT,
                      "header says 1000 tokens (3024 bytes) but "
                      "the file has 1044 bytes (truncated?)");
    write_shard(tmp("huge.bin"), 20240520, 1, 2147483647, 10);
    expect_load_fails(tmp("huge.bin"), FSC_ERR_FORMAT, "(truncated?)");
    write_shard(tmp("neg.bin"), 20240520, 1, -5, 10);
    expect_load_fails(tmp("neg.bin"), FSC_ERR_FORMAT, "negative token count -5");
    write_shard(tmp("trail.bin"), 20240520, 1, 4, 10);
    expect_load_fails(tmp("trail.bin"), FSC_ERR_FORMAT, "(trailing data)");
    write_shard(tmp("empty.bin"), 20240520, 1, 0, 0);
    expect_load_fails(tmp("empty.bin"), FSC_ERR_FORMAT, "no tokens");
    write_raw(tmp("short.bin"), "abc", 3);
    expect_load_fails(tmp("short.bin"), FSC_ERR_FORMAT, "3 bytes is too short");
    expect_load_fails(tmp("missing.bin"), FSC_ERR_IO, "cannot open");
    expect_load_fails(tmp("nomatch_*.bin"), FSC_ERR_NOT_FOUND, "pattern matched no files");
    write_raw(tmp("text.txt"), "hello", 5);
    char spec[600];
    snprintf(spec, sizeof spec, "%s,%s", tmp("text.txt"), tmp("magic.bin"));
    expect_load_fails(spec, FSC_ERR_INVALID, "mixes llm.c shards (.bin) with byte files");
    snprintf(spec, sizeof spec, "%s,", tmp("text.txt"));
    expect_load_fails(spec, FSC_ERR_INVALID, "empty item");
    expect_load_fails("", FSC_ERR_INVALID, "token spec is empty");
}

/* ---- bytes and the built-in corpus -------------------------------------------------------- */

static void test_bytes_file(void **state) {
    (void)state;
    const char text[] = "hello, world\n\xff";
    write_raw(tmp("book.txt"), text, sizeof text - 1);
    fsc_tokens tk;
    assert_int_equal(fsc_tokens_load(tmp("book.txt"), &tk), FSC_OK);
    assert_int_equal(tk.count, sizeof text - 1);
    assert_int_equal(tk.vocab, 256);
    for (int i = 0; i < (int)tk.count; i++)
        assert_int_equal(fsc_tokens_at(&tk, i), (unsigned char)text[i]);
    fsc_tokens_free(&tk);
    write_raw(tmp("empty.txt"), "", 0);
    expect_load_fails(tmp("empty.txt"), FSC_ERR_FORMAT, "no tokens");
}

static void test_builtin_corpus(void **state) {
    (void)state;
    fsc_tokens a, b, c, d;
    assert_int_equal(fsc_tokens_load("builtin:7:100000", &a), FSC_OK);
    assert_int_equal(fsc_tokens_load("builtin:7:100000", &b), FSC_OK);
    assert_int_equal(fsc_tokens_load("builtin:8:100000", &c), FSC_OK);
    assert_int_equal(a.count, 100000);
    assert_int_equal(a.vocab, 256);
    assert_memory_equal(a.data, b.data, 200000);
    assert_memory_not_equal(a.data, c.data, 200000);
    int lines = 0;
    for (int64_t i = 0; i < a.count; i++) {
        int ch = fsc_tokens_at(&a, i);
        assert_true(ch == '\n' || (ch >= 32 && ch < 127));
        lines += ch == '\n';
    }
    assert_true(lines > 1000);
    fsc_tokens_free(&b);
    fsc_tokens_free(&c);

    assert_int_equal(fsc_tokens_load("builtin", &d), FSC_OK); /* default: seed 1337, 2 MB */
    assert_int_equal(d.count, 2 << 20);
    fsc_tokens_free(&d);
    assert_int_equal(fsc_tokens_load("builtin:7", &d), FSC_OK);
    assert_memory_equal(d.data, a.data, 200000); /* a prefix does not depend on the length */
    fsc_tokens_free(&d);
    fsc_tokens_free(&a);

    /* structured enough to learn: the generator's own information content per
     * byte is far below the 5.55 nats of uniform bytes */
    static char text[1 << 20];
    double nats = 0;
    assert_int_equal(fsc_corpus_generate(1337, sizeof text, text, &nats), FSC_OK);
    print_message("builtin corpus: %.3f nats/byte upper bound on the best loss\n", nats);
    assert_true(nats > 0.1 && nats < 1.0);
    assert_non_null(strstr(text, "+"));
    assert_non_null(strstr(text, "repeat:"));

    expect_load_fails("builtin:x", FSC_ERR_INVALID, "expected builtin, builtin:SEED");
    expect_load_fails("builtin:1:0", FSC_ERR_INVALID, "0 < BYTES");
    expect_load_fails("builtin:1:2:3", FSC_ERR_INVALID, "builtin:SEED:BYTES");
    expect_load_fails("builtin:", FSC_ERR_INVALID, "builtin:SEED");
}

/* ---- the batch contract ----------------------------------------------------------------- */

static fsc_tokens make_tokens(int64_t n) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)((i * 2654435761u) % 1000);
    fsc_tokens tk;
    assert_int_equal(fsc_tokens_from_i32(t, n, 1000, &tk), FSC_OK);
    free(t);
    return tk;
}

/* The formula from io.h, written out with nothing clever. */
static void reference_batch(const fsc_tokens *tk, int64_t step, int micro, int rank, int B,
                            int accum, int dp, int T, int32_t *x, int32_t *y) {
    int64_t G = (int64_t)B * accum * dp;
    for (int b = 0; b < B; b++) {
        int64_t seq = step * G + (int64_t)micro * B * dp + (int64_t)rank * B + b;
        for (int t = 0; t < T; t++) {
            x[b * T + t] = fsc_tokens_at(tk, (seq * T + t) % tk->count);
            y[b * T + t] = fsc_tokens_at(tk, (seq * T + t + 1) % tk->count);
        }
    }
}

static void test_batch_matches_formula(void **state) {
    (void)state;
    fsc_tokens tk = make_tokens(1003); /* not a multiple of T: windows wrap across the end */
    const struct {
        int64_t step;
        int micro, rank, B, accum, dp, T;
    } cases[] = {
        {0, 0, 0, 1, 1, 1, 8},      {0, 0, 0, 4, 1, 1, 16},   {3, 1, 0, 2, 2, 1, 16},
        {5, 1, 1, 2, 3, 2, 10},     {7, 2, 3, 3, 3, 4, 7},    {100, 0, 1, 4, 1, 2, 32},
        {12345, 1, 0, 2, 2, 2, 64}, {1, 0, 0, 2, 1, 1, 1002},
    };
    int32_t x[4096], y[4096], rx[4096], ry[4096];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int n = cases[c].B * cases[c].T;
        assert_int_equal(fsc_tokens_batch(&tk, cases[c].step, cases[c].micro, cases[c].rank,
                                          cases[c].B, cases[c].accum, cases[c].dp, cases[c].T, x,
                                          y),
                         FSC_OK);
        reference_batch(&tk, cases[c].step, cases[c].micro, cases[c].rank, cases[c].B,
                        cases[c].accum, cases[c].dp, cases[c].T, rx, ry);
        assert_memory_equal(x, rx, (size_t)n * 4);
        assert_memory_equal(y, ry, (size_t)n * 4);
        int64_t first = cases[c].step * cases[c].B * cases[c].accum * cases[c].dp +
                        (int64_t)cases[c].micro * cases[c].B * cases[c].dp +
                        (int64_t)cases[c].rank * cases[c].B;
        assert_int_equal(fsc_batch_first_sample(cases[c].step, cases[c].micro, cases[c].rank,
                                                cases[c].B, cases[c].accum, cases[c].dp),
                         first);
    }
    /* y is x shifted by one token */
    assert_int_equal(fsc_tokens_batch(&tk, 2, 0, 0, 2, 1, 1, 16, x, y), FSC_OK);
    for (int i = 0; i < 15; i++) assert_int_equal(y[i], x[i + 1]);
    fsc_tokens_free(&tk);
}

static void test_batch_layouts_agree(void **state) {
    (void)state;
    fsc_tokens tk = make_tokens(777);
    enum { B = 3, T = 20 };
    int32_t x0[B * T], y0[B * T], x1[B * T], y1[B * T], xg[2 * B * T], yg[2 * B * T];
    for (int64_t step = 0; step < 30; step += 7) {
        /* dp=2 ranks 0 and 1 together == one process with the batch doubled */
        assert_int_equal(fsc_tokens_batch(&tk, step, 0, 0, B, 1, 2, T, x0, y0), FSC_OK);
        assert_int_equal(fsc_tokens_batch(&tk, step, 0, 1, B, 1, 2, T, x1, y1), FSC_OK);
        assert_int_equal(fsc_tokens_batch(&tk, step, 0, 0, 2 * B, 1, 1, T, xg, yg), FSC_OK);
        assert_memory_equal(xg, x0, sizeof x0);
        assert_memory_equal(xg + B * T, x1, sizeof x1);
        assert_memory_equal(yg, y0, sizeof y0);
        assert_memory_equal(yg + B * T, y1, sizeof y1);
        /* so do two micro-steps of grad accumulation */
        assert_int_equal(fsc_tokens_batch(&tk, step, 0, 0, B, 2, 1, T, x0, y0), FSC_OK);
        assert_int_equal(fsc_tokens_batch(&tk, step, 1, 0, B, 2, 1, T, x1, y1), FSC_OK);
        assert_memory_equal(xg, x0, sizeof x0);
        assert_memory_equal(xg + B * T, x1, sizeof x1);
        assert_int_equal(fsc_batch_first_sample(step, 1, 0, B, 2, 1),
                         fsc_batch_first_sample(step, 0, 1, B, 1, 2));
    }
    fsc_tokens_free(&tk);
}

static void test_batch_refuses_bad_input(void **state) {
    (void)state;
    fsc_tokens tk = make_tokens(16);
    int32_t x[64], y[64];
    assert_int_equal(fsc_tokens_batch(&tk, 0, 0, 0, 1, 1, 1, 16, x, y), FSC_ERR_INVALID);
    assert_non_null(
        strstr(fsc_last_error(), "has 16 tokens; a sequence of T=16 needs at least T+1"));
    assert_int_equal(fsc_tokens_batch(&tk, 0, 0, 0, 1, 1, 1, 15, x, y), FSC_OK);
    assert_int_equal(fsc_tokens_batch(&tk, 0, 2, 0, 1, 2, 1, 4, x, y), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "micro 2 of 2"));
    assert_int_equal(fsc_tokens_batch(&tk, 0, 0, 2, 1, 1, 2, 4, x, y), FSC_ERR_INVALID);
    assert_int_equal(fsc_tokens_batch(&tk, -1, 0, 0, 1, 1, 1, 4, x, y), FSC_ERR_INVALID);
    assert_int_equal(fsc_tokens_batch(&tk, INT64_MAX / 2, 0, 0, 4, 1, 1, 4, x, y), FSC_ERR_INVALID);
    assert_int_equal(fsc_tokens_batch(&tk, 0, 0, 0, 0, 1, 1, 4, x, y), FSC_ERR_INVALID);
    assert_int_equal(fsc_batch_first_sample(0, 0, 0, 1, 0, 1), -1);
    assert_int_equal(fsc_tokens_num_windows(&tk, 5), 3);
    fsc_tokens_free(&tk);

    int32_t bad[2] = {1, -3};
    assert_int_equal(fsc_tokens_from_i32(bad, 2, 0, &tk), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "token 1 is -3"));
    int32_t big[2] = {1, 300};
    assert_int_equal(fsc_tokens_from_i32(big, 2, 256, &tk), FSC_ERR_INVALID);
    assert_int_equal(fsc_tokens_from_i32(big, 2, 0, &tk), FSC_OK);
    assert_int_equal(tk.vocab, 301);
    fsc_tokens_free(&tk);
}

FSC_TEST_MAIN(setup, teardown, cmocka_unit_test(test_shard_round_trip),
              cmocka_unit_test(test_shard_errors), cmocka_unit_test(test_bytes_file),
              cmocka_unit_test(test_builtin_corpus), cmocka_unit_test(test_batch_matches_formula),
              cmocka_unit_test(test_batch_layouts_agree),
              cmocka_unit_test(test_batch_refuses_bad_input))
