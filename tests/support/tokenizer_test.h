/* What the tokenizer tests share (tests/io/test_bpe.c, test_tokenizer_json.c,
 * test_tokenizer_nfc.c): loading tests/data/tokenizer_json's files and
 * comparing an encoding with the ids wanted. Include after cmocka.h. */
#ifndef FSC_TEST_TOKENIZER_TEST_H
#define FSC_TEST_TOKENIZER_TEST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fsc/tokenizer.h"
#include "test_data.h"

/* tests/data/tokenizer_json/<name> (test_data's lifetime). */
static inline const char *tokenizer_json_path(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer_json/%s", name);
    return test_data(rel);
}

/* tests/data/tokenizer_json/<name>, loaded; fails the test naming the file. */
static inline fsc_bpe *tokenizer_json_load(const char *name) {
    fsc_bpe *b = NULL;
    if (fsc_bpe_load(tokenizer_json_path(name), &b)) fail_msg("%s: %s", name, fsc_last_error());
    return b;
}

/* Whether ids[0..count) are want[0..n); when not, both on stderr with text. */
static inline bool tokens_as_wanted(const char *text, const int32_t *ids, int64_t count,
                                    const int32_t *want, int n) {
    bool same = count == n && (!n || !memcmp(ids, want, sizeof *ids * (size_t)n));
    if (!same) {
        fprintf(stderr, "\"%s\": got", text);
        for (int64_t i = 0; i < count; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    return same;
}

#endif
