/* tokenizer.json on hand-made files (tests/data/tokenizer_json, make.py
 * there): merges as "a b" strings and as ["a", "b"] pairs give the same
 * ids; ignore_merges takes a piece that is a token whole; added tokens are
 * found before pre-tokenizing (special or not, lstrip); the template's
 * BOS/EOS come only when asked for; a Sequence of Splits (a regex, a
 * literal String) and each of the five behaviours, inverted too, cut as
 * Hugging Face's do; decoding gives
 * the text back; what fsc does not run (a Metaspace pre-tokenizer, a
 * Unigram model; normalizers: test_tokenizer_nfc.c) and malformed merges are refused with
 * the field named; a directory gives its tokenizer.json, else GPT-2's two
 * files under either pair of names. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsc/tokenizer.h"

#include "tmpdir.h"
#include "tokenizer_test.h"
#include "test_main.h"

/* The ids of make.py's vocabulary. */
enum { HELLO = 259, SP_WORLD = 264, N123 = 266, XYZ = 267, EOT = 268, BOS = 269, MASK = 270 };

/* The id of a single byte (GPT-2's order: '!' is 0). */
static int32_t byte_id(const fsc_bpe *b, char c) {
    return fsc_bpe_token_id(b, &c, 1);
}

/* text encodes to want[0..n) (add: the post-processor's ids too), and decodes back. */
static void expect(const fsc_bpe *b, const char *text, bool add, const int32_t *want, int n) {
    int32_t *ids;
    int64_t count;
    assert_int_equal(fsc_bpe_encode_with(b, text, strlen(text),
                                         (fsc_bpe_encode_options){.add_special_tokens = add}, &ids,
                                         &count),
                     FSC_OK);
    bool same = tokens_as_wanted(text, ids, count, want, n);
    free(ids);
    assert_true(same);
}

static void round_trip(const fsc_bpe *b, const char *text) {
    int32_t *ids;
    int64_t count;
    char *back;
    size_t len;
    assert_int_equal(fsc_bpe_encode(b, text, strlen(text), &ids, &count), FSC_OK);
    assert_int_equal(fsc_bpe_decode(b, ids, count, &back, &len), FSC_OK);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(back, text, len);
    free(ids), free(back);
}

static void test_both_merge_forms(void **state) {
    (void)state;
    fsc_bpe *s = tokenizer_json_load("strings.json"), *p = tokenizer_json_load("pairs.json");
    assert_int_equal(fsc_bpe_vocab_size(s), 271);
    assert_int_equal(fsc_bpe_vocab_size(p), 271);
    const int32_t hw[] = {HELLO, SP_WORLD};
    expect(s, "hello world", false, hw, 2);
    expect(p, "hello world", false, hw, 2);
    /* "heo": no merge (h e) then (e o)... only "he" applies; the rank order decides */
    const int32_t heo[] = {256, byte_id(s, 'o')};
    expect(s, "heo", false, heo, 2);
    expect(p, "heo", false, heo, 2);
    /* ignore_merges (strings.json only): a piece that is a token is that token */
    const int32_t xyz[] = {XYZ};
    expect(s, "xyz", false, xyz, 1);
    const int32_t x_y_z[] = {byte_id(p, 'x'), byte_id(p, 'y'), byte_id(p, 'z')};
    expect(p, "xyz", false, x_y_z, 3);
    fsc_bpe_free(s), fsc_bpe_free(p);
}

static void test_added_tokens(void **state) {
    (void)state;
    fsc_bpe *b = tokenizer_json_load("strings.json");
    assert_int_equal(fsc_bpe_eot(b), EOT);
    assert_true(fsc_bpe_is_special(b, EOT));
    assert_true(fsc_bpe_is_special(b, BOS));
    assert_false(fsc_bpe_is_special(b, MASK));
    assert_false(fsc_bpe_is_special(b, HELLO));
    assert_int_equal(fsc_bpe_token_id(b, "[MASK]", 6), MASK);
    assert_int_equal(fsc_bpe_token_id(b, "hello", 5), HELLO);
    /* found in the text before pre-tokenizing, splitting words around them */
    const int32_t a[] = {HELLO, EOT, SP_WORLD};
    expect(b, "hello<|endoftext|> world", false, a, 3);
    /* a prefix of one is text; <s> inside <|endoftext|> is not found */
    const int32_t c[] = {byte_id(b, '<'), byte_id(b, '|'), HELLO};
    expect(b, "<|hello", false, c, 3);
    /* lstrip: [MASK] takes the white space before it */
    const int32_t m[] = {HELLO, MASK, HELLO};
    expect(b, "hello \t [MASK]hello", false, m, 3);
    round_trip(b, "a<s>b<|endoftext|><|endoftext|>c[MASK]");
    fsc_bpe_free(b);
}

static void test_post_processor(void **state) {
    (void)state;
    fsc_bpe *b = tokenizer_json_load("strings.json"), *p = tokenizer_json_load("pairs.json");
    assert_int_equal(fsc_bpe_bos(b), BOS);
    assert_int_equal(fsc_bpe_eos(b), EOT);
    const int32_t plain[] = {HELLO}, framed[] = {BOS, HELLO, EOT}, empty[] = {BOS, EOT};
    expect(b, "hello", false, plain, 1);
    expect(b, "hello", true, framed, 3);
    expect(b, "", true, empty, 2);
    /* pairs.json's post-processor is ByteLevel alone: nothing added */
    assert_int_equal(fsc_bpe_bos(p), -1);
    assert_int_equal(fsc_bpe_eos(p), -1);
    expect(p, "hello", true, plain, 1);
    fsc_bpe_free(b), fsc_bpe_free(p);
}

static void test_split_sequence(void **state) {
    (void)state;
    fsc_bpe *b = tokenizer_json_load("split.json");
    /* \p{N}{1,3}: 123 | 45 */
    const int32_t n[] = {N123, byte_id(b, '4'), byte_id(b, '5')};
    expect(b, "12345", false, n, 3);
    /* the String "-" with behaviour Removed drops the dash */
    const int32_t d[] = {HELLO, SP_WORLD};
    expect(b, "hello- world", false, d, 2);
    /* bytes that are not UTF-8 match no pattern and still encode */
    int32_t *ids;
    int64_t count;
    const char bad[] = "he\xff\xfello";
    assert_int_equal(fsc_bpe_encode(b, bad, 7, &ids, &count), FSC_OK);
    char *back;
    size_t len;
    assert_int_equal(fsc_bpe_decode(b, ids, count, &back, &len), FSC_OK);
    assert_int_equal(len, 7);
    assert_memory_equal(back, bad, 7);
    free(ids), free(back);
    fsc_bpe_free(b);
}

/* strings.json with its pre-tokenizer replaced by one literal Split. */
static fsc_bpe *with_split(const char *literal, const char *behavior, bool invert) {
    char *text;
    size_t len;
    assert_int_equal(fsc_file_read_all(tokenizer_json_path("strings.json"), 1 << 20, &text, &len),
                     FSC_OK);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    cJSON *split = cJSON_CreateObject(), *pattern = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(pattern, "String", literal);
    cJSON_AddItemToObject(split, "pattern", pattern);
    cJSON_AddStringToObject(split, "behavior", behavior);
    cJSON_AddBoolToObject(split, "invert", invert);
    cJSON_ReplaceItemInObjectCaseSensitive(root, "pre_tokenizer", split);
    char *out = cJSON_PrintUnformatted(root);
    write_raw(tmp("split.json"), out, strlen(out));
    free(out);
    cJSON_Delete(root);
    fsc_bpe *b = NULL;
    if (fsc_bpe_load(tmp("split.json"), &b)) fail_msg("%s", fsc_last_error());
    return b;
}

/* Hugging Face's five behaviours, seen through ignore_merges: a piece "xyz"
 * is token XYZ, anything else is its bytes. */
static void test_split_behaviours(void **state) {
    (void)state;
    static const struct {
        const char *literal, *behavior;
        bool invert;
        const char *pieces; /* what "xyz" becomes: 'T' for XYZ, else the bytes */
    } cases[] = {
        {"z", "Isolated", false, "xyz"},         {"z", "Removed", false, "xy"},
        {"z", "MergedWithPrevious", false, "T"}, {"z", "MergedWithNext", false, "xyz"},
        {"x", "MergedWithNext", false, "T"},     {"x", "MergedWithPrevious", false, "xyz"},
        {"y", "Contiguous", false, "xyz"},       {"z", "Removed", true, "z"},
        {"q", "Isolated", false, "T"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fsc_bpe *b = with_split(cases[i].literal, cases[i].behavior, cases[i].invert);
        int32_t want[8];
        int n = 0;
        for (const char *p = cases[i].pieces; *p; p++) want[n++] = *p == 'T' ? XYZ : byte_id(b, *p);
        print_message("split \"%s\" %s%s\n", cases[i].literal, cases[i].behavior,
                      cases[i].invert ? " inverted" : "");
        expect(b, "xyz", false, want, n);
        fsc_bpe_free(b);
    }
    /* a match that follows a match stays apart: x | x | yz -> a, x, xyz */
    fsc_bpe *b = with_split("x", "MergedWithNext", false);
    const int32_t d[] = {byte_id(b, 'a'), byte_id(b, 'x'), XYZ};
    expect(b, "axxyz", false, d, 3);
    fsc_bpe_free(b);
    b = with_split("z", "MergedWithPrevious", false); /* xy | z | z -> xyz, z */
    const int32_t e[] = {XYZ, byte_id(b, 'z')};
    expect(b, "xyzz", false, e, 2);
    fsc_bpe_free(b);
}

static void expect_refused(const char *name, int code, const char *needle) {
    fsc_bpe *b = NULL;
    int rc = fsc_bpe_load(tokenizer_json_path(name), &b);
    if (rc != code || !strstr(fsc_last_error(), needle))
        fail_msg("%s: status %d, \"%s\" (want %d, \"%s\")", name, rc, fsc_last_error(), code,
                 needle);
    assert_null(b);
}

static void test_refused(void **state) {
    (void)state;
    expect_refused("metaspace.json", FSC_ERR_UNSUPPORTED, "pre_tokenizer.type \"Metaspace\"");
    expect_refused("unigram.json", FSC_ERR_UNSUPPORTED, "model.type \"Unigram\"");
    /* a merge whose parts are not tokens, and a regex PCRE2 cannot compile */
    char *text;
    size_t len;
    assert_int_equal(fsc_file_read_all(tokenizer_json_path("strings.json"), 1 << 20, &text, &len),
                     FSC_OK);
    char *bad = strstr(text, "\"l l\"");
    assert_non_null(bad);
    memcpy(bad, "\"q z\"", 5);
    write_raw(tmp("tokenizer.json"), text, len);
    fsc_bpe *b = NULL;
    assert_int_equal(fsc_bpe_load(dir, &b), FSC_ERR_FORMAT); /* a directory with tokenizer.json */
    assert_non_null(strstr(fsc_last_error(), "model.merges[1]"));
    free(text);
    assert_int_equal(fsc_file_read_all(tokenizer_json_path("split.json"), 1 << 20, &text, &len),
                     FSC_OK);
    bad = strstr(text, "\\\\p{N}{1,3}");
    assert_non_null(bad);
    memcpy(bad, "((((((((((", 10);
    write_raw(tmp("tokenizer.json"), text, len);
    assert_int_equal(fsc_bpe_load(tmp("tokenizer.json"), &b), FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), "pre_tokenizer.pretokenizers[0]: PCRE2 refuses"));
    free(text);
    assert_int_equal(fsc_bpe_load(tmp("missing"), &b), FSC_ERR_IO);
    assert_non_null(strstr(fsc_last_error(), "tokenizer.json"));
}

/* fsc_bpe_load(DIR): tokenizer.json first, else GPT-2's two files under
 * either pair of names (vocab.json + merges.txt are Hugging Face's). */
static void test_directories(void **state) {
    (void)state;
    char *enc, *merges, *json;
    size_t ne, nm, nj;
    char tiny[600];
    snprintf(tiny, sizeof tiny, "%s", test_data("bpe_tiny"));
    char pe[700], pm[700];
    snprintf(pe, sizeof pe, "%s/encoder.json", tiny);
    snprintf(pm, sizeof pm, "%s/vocab.bpe", tiny);
    assert_int_equal(fsc_file_read_all(pe, 1 << 20, &enc, &ne), FSC_OK);
    assert_int_equal(fsc_file_read_all(pm, 1 << 20, &merges, &nm), FSC_OK);
    assert_int_equal(fsc_file_read_all(tokenizer_json_path("strings.json"), 1 << 20, &json, &nj),
                     FSC_OK);
    char hfdir[600];
    snprintf(hfdir, sizeof hfdir, "%s", tmp("hf"));
    assert_int_equal(mkdir(hfdir, 0700), 0);
    write_raw(tmp("hf/vocab.json"), enc, ne);
    write_raw(tmp("hf/merges.txt"), merges, nm);
    fsc_bpe *hf, *gpt2, *tj;
    assert_int_equal(fsc_bpe_load(hfdir, &hf), FSC_OK);
    assert_int_equal(fsc_bpe_load(tiny, &gpt2), FSC_OK);
    int32_t *a, *b;
    int64_t na, nb;
    const char *text = "hello world<|endoftext|>";
    assert_int_equal(fsc_bpe_encode(hf, text, strlen(text), &a, &na), FSC_OK);
    assert_int_equal(fsc_bpe_encode(gpt2, text, strlen(text), &b, &nb), FSC_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    assert_true(na > 3); /* GPT-2's files: <|endoftext|> in the text is text */
    free(a), free(b);
    write_raw(tmp("hf/tokenizer.json"), json, nj); /* now the directory's tokenizer.json wins */
    assert_int_equal(fsc_bpe_load(hfdir, &tj), FSC_OK);
    assert_int_equal(fsc_bpe_vocab_size(tj), 271);
    const int32_t eot[] = {HELLO, SP_WORLD, EOT};
    expect(tj, text, false, eot, 3);
    fsc_bpe_free(hf), fsc_bpe_free(gpt2), fsc_bpe_free(tj);
    free(enc), free(merges), free(json);
}

FSC_TEST_MAIN(setup, teardown, cmocka_unit_test(test_both_merge_forms),
              cmocka_unit_test(test_added_tokens), cmocka_unit_test(test_post_processor),
              cmocka_unit_test(test_split_sequence), cmocka_unit_test(test_refused),
              cmocka_unit_test(test_directories), cmocka_unit_test(test_split_behaviours))
