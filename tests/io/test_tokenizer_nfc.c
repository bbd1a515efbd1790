/* tokenizer.json's NFC normalizer (Qwen 2's): text whose NFC differs from it
 * (a combining accent, Hangul jamo, the Angstrom sign, marks out of
 * canonical order, and U+0958, which NFC decomposes and so grows) encodes
 * under tests/data/tokenizer_json/nfc.json as its NFC does under the same
 * file without the normalizer (strings.json). The NFC forms were written by
 * Python's unicodedata.normalize("NFC", ...), an implementation apart from
 * ICU's. Added tokens matched on the raw text stay whole between normalized
 * segments; a normalized added token ([MASK]) is matched after NFC; bytes
 * that are not UTF-8 pass through; a normalizer fsc does not run (NFKC, a
 * Sequence holding Lowercase) is refused by name. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/io.h"
#include "fsc/tokenizer.h"

#include "tokenizer_test.h"
#include "test_main.h"

static int64_t encode(const fsc_bpe *b, const char *text, size_t n, int32_t **ids) {
    int64_t count;
    assert_int_equal(fsc_bpe_encode(b, text, n, ids, &count), FSC_OK);
    return count;
}

/* input under nfc.json gives the ids of want under strings.json */
static void expect_same(const fsc_bpe *nfc, const fsc_bpe *plain, const char *input,
                        const char *want) {
    int32_t *a, *b;
    int64_t na = encode(nfc, input, strlen(input), &a), nb = encode(plain, want, strlen(want), &b);
    if (na != nb || memcmp(a, b, sizeof *a * (size_t)na))
        fail_msg("\"%s\": %lld ids under NFC, its NFC \"%s\" %lld", input, (long long)na, want,
                 (long long)nb);
    free(a), free(b);
}

static void test_nfc_forms(void **state) {
    (void)state;
    fsc_bpe *nfc = tokenizer_json_load("nfc.json"), *plain = tokenizer_json_load("strings.json");
    static const char *const cases[][2] = {
        {"cafe\xcc\x81", "caf\xc3\xa9"},
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 han", "\xea\xb0\x81 han"},
        {"\xe2\x84\xab ring", "\xc3\x85 ring"},
        {"a\xcc\x82\xcc\xa3 order", "\xe1\xba\xad order"},
        {"\xe0\xa5\x98 qa", "\xe0\xa4\x95\xe0\xa4\xbc qa"},
        {"o\xcc\x88 und u\xcc\x88"
         "ber",
         "\xc3\xb6 und \xc3\xbc"
         "ber"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_true(strcmp(cases[i][0], cases[i][1]) != 0);
        expect_same(nfc, plain, cases[i][0], cases[i][1]);
        expect_same(nfc, plain, cases[i][1], cases[i][1]); /* NFC text is left as is */
        int32_t *a, *b; /* and the normalizer does change the ids */
        int64_t na = encode(plain, cases[i][0], strlen(cases[i][0]), &a);
        int64_t nb = encode(plain, cases[i][1], strlen(cases[i][1]), &b);
        assert_true(na != nb || memcmp(a, b, sizeof *a * (size_t)na));
        free(a), free(b);
    }
    fsc_bpe_free(nfc), fsc_bpe_free(plain);
}

static void test_added_tokens_and_raw_bytes(void **state) {
    (void)state;
    fsc_bpe *nfc = tokenizer_json_load("nfc.json"), *plain = tokenizer_json_load("strings.json");
    /* raw-matched tokens between segments, each normalized alone */
    expect_same(nfc, plain, "e\xcc\x81<|endoftext|>A\xcc\x8a<s>x",
                "\xc3\xa9<|endoftext|>\xc3\x85<s>x");
    /* a normalized added token is found in the normalized text */
    expect_same(nfc, plain, "o\xcc\x88 [MASK] e\xcc\x81", "\xc3\xb6 [MASK] \xc3\xa9");
    /* not UTF-8: the bytes as they are */
    expect_same(nfc, plain, "ab\xff\xfe cd", "ab\xff\xfe cd");
    fsc_bpe_free(nfc), fsc_bpe_free(plain);
}

/* nfc.json with its normalizer replaced by `normalizer` (JSON text). */
static int load_with(const char *normalizer, fsc_bpe **out) {
    char *text;
    size_t len;
    assert_int_equal(fsc_file_read_all(tokenizer_json_path("nfc.json"), 1 << 20, &text, &len),
                     FSC_OK);
    const char *key = "\"normalizer\": {\n  \"type\": \"NFC\"\n }";
    char *at = strstr(text, key);
    assert_non_null(at);
    char dir[] = "/tmp/fsc_nfc_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(text, 1, (size_t)(at - text), f);
    fprintf(f, "\"normalizer\": %s", normalizer);
    fputs(at + strlen(key), f);
    fclose(f);
    free(text);
    *out = NULL;
    int rc = fsc_bpe_load(path, out);
    unlink(path);
    rmdir(dir);
    return rc;
}

static void test_normalizers_refused_by_name(void **state) {
    (void)state;
    fsc_bpe *b;
    assert_int_equal(load_with("{\"type\": \"NFKC\"}", &b), FSC_ERR_UNSUPPORTED);
    assert_non_null(strstr(fsc_last_error(), "normalizer \"NFKC\" is not supported"));
    assert_null(b);
    assert_int_equal(load_with("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
                               "{\"type\": \"Lowercase\"}]}",
                               &b),
                     FSC_ERR_UNSUPPORTED);
    assert_non_null(strstr(fsc_last_error(), "normalizer \"Lowercase\""));
    assert_int_equal(load_with("{\"type\": \"Sequence\"}", &b), FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), "\"normalizers\""));
    /* a Sequence of NFC alone is NFC; null is none */
    assert_int_equal(load_with("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}",
                               &b),
                     FSC_OK);
    fsc_bpe *plain = tokenizer_json_load("strings.json");
    expect_same(b, plain, "cafe\xcc\x81", "caf\xc3\xa9");
    fsc_bpe_free(b);
    assert_int_equal(load_with("null", &b), FSC_OK);
    expect_same(b, plain, "cafe\xcc\x81", "cafe\xcc\x81");
    fsc_bpe_free(b), fsc_bpe_free(plain);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_nfc_forms),
              cmocka_unit_test(test_added_tokens_and_raw_bytes),
              cmocka_unit_test(test_normalizers_refused_by_name))
