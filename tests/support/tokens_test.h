/* What the token-loader tests share (tests/io/test_data.c,
 * tests/io/test_data_formats.c): llm.c shards with chosen header words, and
 * a refused load checked for its status, its message and an empty result.
 * Include after cmocka.h and tmpdir.h (write_raw). */
#ifndef FSC_TEST_TOKENS_TEST_H
#define FSC_TEST_TOKENS_TEST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/io.h"

/* An llm.c shard: 256 int32 header words (magic, version, count; the rest
 * 0), then ntok tokens of `width` bytes each, little endian (zeros when tok
 * is NULL). */
static inline void tokens_write_shard(const char *path, int32_t magic, int32_t version,
                                      int32_t count, const uint32_t *tok, int ntok, int width) {
    const size_t n = 1024 + (size_t)width * (size_t)ntok;
    unsigned char *b = calloc(n, 1);
    assert_non_null(b);
    const int32_t w[3] = {magic, version, count};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)((uint32_t)w[i] >> (8 * k));
    for (int i = 0; tok && i < ntok; i++)
        for (int k = 0; k < width; k++)
            b[1024 + (size_t)width * i + k] = (unsigned char)(tok[i] >> (8 * k));
    write_raw(path, b, n);
    free(b);
}

/* A load of spec that returned rc and *tk must have been refused with
 * status, needle in its message, and nothing in *tk. */
static inline void expect_tokens_refused(const char *spec, int rc, const fsc_tokens *tk, int status,
                                         const char *needle) {
    if (rc != status || !strstr(fsc_last_error(), needle))
        print_error("spec %s: status %d (want %d), message \"%s\" (want \"%s\")\n", spec, rc,
                    status, fsc_last_error(), needle);
    assert_int_equal(rc, status);
    assert_non_null(strstr(fsc_last_error(), needle));
    assert_null(tk->data);
    assert_int_equal(tk->count, 0);
}

#endif
