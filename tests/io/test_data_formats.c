/* Token data formats beyond llm.c's version-1 shards: version-7 shards
 * (uint32 tokens, written by llm.c's LLaMA-3 scripts), nanoGPT's headerless
 * uint16 train.bin (only when asked for), and the refusals that name what
 * was expected. Each file is written here byte by byte, not by fsc. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/io.h"

#include "tmpdir.h"
#include "tokens_test.h"
#include "test_main.h"

/* An llm.c shard: 256 int32 header words (magic, version, count), then ntok
 * tokens of `width` bytes each, little endian. */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count,
                        const uint32_t *tok, int ntok, int width) {
    tokens_write_shard(path, magic, version, count, tok, ntok, width);
}

/* nanoGPT's train.bin: np.array(ids, dtype=np.uint16).tofile(path). */
static void write_nanogpt(const char *path, const uint32_t *tok, int ntok) {
    unsigned char *b = malloc(2 * (size_t)ntok);
    assert_non_null(b);
    for (int i = 0; i < ntok; i++)
        b[2 * i] = (unsigned char)(tok[i] & 0xff), b[2 * i + 1] = (unsigned char)(tok[i] >> 8);
    write_raw(path, b, 2 * (size_t)ntok);
    free(b);
}

static void expect_fails(const char *spec, fsc_data_format f, int status, const char *needle) {
    fsc_tokens tk;
    expect_tokens_refused(spec, fsc_tokens_load_as(spec, f, &tk), &tk, status, needle);
}

static void expect_tokens(const fsc_tokens *tk, const uint32_t *tok, int n) {
    assert_int_equal(tk->count, n);
    for (int i = 0; i < n; i++) assert_int_equal(fsc_tokens_at(tk, i), (int32_t)tok[i]);
}

enum { N = 3000 };
static uint32_t TOK[N];

static int fill(void **state) {
    for (int i = 0; i < N; i++) TOK[i] = (uint32_t)((i * 7919u) % 50257u);
    return setup(state);
}

static void test_v7_reads_as_v1(void **state) {
    (void)state;
    write_shard(tmp("v1.bin"), 20240520, 1, N, TOK, N, 2);
    write_shard(tmp("v7.bin"), 20240801, 7, N, TOK, N, 4);
    fsc_tokens a, b;
    assert_int_equal(fsc_tokens_load(tmp("v1.bin"), &a), FSC_OK);
    assert_int_equal(fsc_tokens_load(tmp("v7.bin"), &b), FSC_OK);
    assert_int_equal(a.dtype, FSC_DTYPE_U16);
    assert_int_equal(b.dtype, FSC_DTYPE_I32);
    expect_tokens(&a, TOK, N);
    expect_tokens(&b, TOK, N);
    assert_int_equal(a.vocab, b.vocab);
    /* the same data order: the batch contract sees the same windows */
    int32_t xa[4 * 16], ya[4 * 16], xb[4 * 16], yb[4 * 16];
    for (int64_t step = 0; step < 60; step += 13) {
        assert_int_equal(fsc_tokens_batch(&a, step, 0, 0, 4, 1, 1, 16, xa, ya), FSC_OK);
        assert_int_equal(fsc_tokens_batch(&b, step, 0, 0, 4, 1, 1, 16, xb, yb), FSC_OK);
        assert_memory_equal(xa, xb, sizeof xa);
        assert_memory_equal(ya, yb, sizeof ya);
    }
    fsc_tokens_free(&a);
    fsc_tokens_free(&b);

    /* a list mixing versions 1 and 7, in order; llmc reads them whatever their names */
    write_shard(tmp("part_0.bin"), 20240801, 7, 1000, TOK, 1000, 4);
    write_shard(tmp("part_1.bin"), 20240520, 1, 2000, TOK + 1000, 2000, 2);
    assert_int_equal(fsc_tokens_load(tmp("part_*.bin"), &a), FSC_OK);
    assert_int_equal(a.dtype, FSC_DTYPE_I32);
    expect_tokens(&a, TOK, N);
    fsc_tokens_free(&a);
    write_shard(tmp("llama.shard"), 20240801, 7, N, TOK, N, 4);
    assert_int_equal(fsc_tokens_load_as(tmp("llama.shard"), FSC_DATA_LLMC, &a), FSC_OK);
    expect_tokens(&a, TOK, N);
    fsc_tokens_free(&a);
    assert_int_equal(fsc_tokens_load(tmp("llama.shard"), &a), FSC_OK); /* auto: bytes */
    assert_int_equal(a.count, 1024 + 4 * N);
    assert_int_equal(a.vocab, 256);
    fsc_tokens_free(&a);
}

static void test_v7_large_ids(void **state) {
    (void)state;
    uint32_t big[4] = {5, 70000, 65536, 3};
    write_shard(tmp("big.bin"), 20240801, 7, 4, big, 4, 4);
    fsc_tokens tk;
    assert_int_equal(fsc_tokens_load(tmp("big.bin"), &tk), FSC_OK);
    expect_tokens(&tk, big, 4);
    assert_int_equal(tk.vocab, 70001); /* a --vocab of 70001 takes it, 70000 does not */
    fsc_tokens_free(&tk);
    uint32_t huge[3] = {1, 2, 0x80000000u};
    write_shard(tmp("huge.bin"), 20240801, 7, 3, huge, 3, 4);
    expect_fails(tmp("huge.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT,
                 "huge.bin: token 2 is 2147483648, outside [0, 2147483647)");
    huge[2] = 0x7fffffffu; /* max id + 1 would not fit the int vocab */
    write_shard(tmp("huge.bin"), 20240801, 7, 3, huge, 3, 4);
    expect_fails(tmp("huge.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, "token 2 is 2147483647");
}

static void test_nanogpt(void **state) {
    (void)state;
    write_nanogpt(tmp("train.bin"), TOK, N);
    fsc_tokens tk;
    assert_int_equal(fsc_tokens_load_as(tmp("train.bin"), FSC_DATA_NANOGPT, &tk), FSC_OK);
    assert_int_equal(tk.dtype, FSC_DTYPE_U16);
    expect_tokens(&tk, TOK, N);
    int mx = 0;
    for (int i = 0; i < N; i++) mx = (int)TOK[i] > mx ? (int)TOK[i] : mx;
    assert_int_equal(tk.vocab, mx + 1);
    fsc_tokens_free(&tk);
    /* any name: nanoGPT's is train.bin, but the format decides */
    write_nanogpt(tmp("tokens.u16"), TOK, 10);
    assert_int_equal(fsc_tokens_load_as(tmp("tokens.u16"), FSC_DATA_NANOGPT, &tk), FSC_OK);
    expect_tokens(&tk, TOK, 10);
    fsc_tokens_free(&tk);

    /* without the format, a headerless .bin is refused, pointing at the flag */
    expect_fails(tmp("train.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, "--data-format nanogpt");
    expect_fails(tmp("train.bin"), FSC_DATA_LLMC, FSC_ERR_FORMAT, "bad magic");
    write_raw(tmp("odd.bin"), "abc", 3);
    expect_fails(tmp("odd.bin"), FSC_DATA_NANOGPT, FSC_ERR_FORMAT, "3 bytes, an odd size");
    write_raw(tmp("empty.bin"), "", 0);
    expect_fails(tmp("empty.bin"), FSC_DATA_NANOGPT, FSC_ERR_FORMAT, "no tokens");
    expect_fails("builtin", FSC_DATA_NANOGPT, FSC_ERR_INVALID, "applies to files only");
}

static void test_unknown_formats(void **state) {
    (void)state;
    const char *both = "magic 20240520 version 1 (uint16 tokens) or magic 20240801 version 7 "
                       "(uint32 tokens)";
    write_shard(tmp("magic.bin"), 20240521, 1, 4, TOK, 4, 2);
    expect_fails(tmp("magic.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, "bad magic 20240521");
    expect_fails(tmp("magic.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, both);
    write_shard(tmp("v7v1.bin"), 20240801, 1, 4, TOK, 4, 2);
    expect_fails(tmp("v7v1.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT,
                 "unsupported shard version 1 with magic 20240801");
    expect_fails(tmp("v7v1.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, both);
    write_shard(tmp("v1v7.bin"), 20240520, 7, 4, TOK, 4, 4);
    expect_fails(tmp("v1v7.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT,
                 "unsupported shard version 7 with magic 20240520");
    /* a version-7 header that lies about its size */
    write_shard(tmp("short7.bin"), 20240801, 7, 1000, TOK, 10, 4);
    expect_fails(tmp("short7.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT,
                 "header says 1000 uint32 tokens (5024 bytes) but the file has 1064 bytes "
                 "(truncated?)");
    write_shard(tmp("trail7.bin"), 20240801, 7, 4, TOK, 10, 4);
    expect_fails(tmp("trail7.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, "(trailing data)");
    write_shard(tmp("neg7.bin"), 20240801, 7, -5, TOK, 10, 4);
    expect_fails(tmp("neg7.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, "negative token count -5");
    write_shard(tmp("max7.bin"), 20240801, 7, 2147483647, TOK, 10, 4);
    expect_fails(tmp("max7.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, "(truncated?)");
    write_shard(tmp("empty7.bin"), 20240801, 7, 0, TOK, 0, 4);
    expect_fails(tmp("empty7.bin"), FSC_DATA_AUTO, FSC_ERR_FORMAT, "no tokens");

    fsc_data_format f = FSC_DATA_NANOGPT;
    assert_int_equal(fsc_data_format_parse("auto", &f), FSC_OK);
    assert_int_equal(f, FSC_DATA_AUTO);
    assert_int_equal(fsc_data_format_parse("llmc", &f), FSC_OK);
    assert_int_equal(f, FSC_DATA_LLMC);
    assert_int_equal(fsc_data_format_parse("nanogpt", &f), FSC_OK);
    assert_int_equal(f, FSC_DATA_NANOGPT);
    assert_int_equal(fsc_data_format_parse("numpy", &f), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "data format \"numpy\": expected auto"));
    assert_non_null(strstr(fsc_last_error(), "llmc"));
    assert_non_null(strstr(fsc_last_error(), "nanogpt"));
    assert_int_equal(fsc_data_format_parse(NULL, &f), FSC_ERR_INVALID);
    expect_fails(tmp("magic.bin"), (fsc_data_format)7, FSC_ERR_INVALID, "format 7");
}

FSC_TEST_MAIN(fill, teardown, cmocka_unit_test(test_v7_reads_as_v1),
              cmocka_unit_test(test_v7_large_ids), cmocka_unit_test(test_nanogpt),
              cmocka_unit_test(test_unknown_formats))
