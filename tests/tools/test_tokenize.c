/* fsc-tokenize end to end: the program runs the tool (FSC_TOKENIZE) on text
 * files and reads what it wrote with the library's shard reader
 * (fsc_tokens_load) and the tokenizer's decoder: the tokens decode to the
 * text, the headers say what llm.c expects (magic, version, count, size),
 * the val split takes the stated tail, shards split at --shard-tokens, and
 * bad input ends with a message naming it. Byte tokens and the hand-made
 * vocabulary of tests/data/bpe_tiny and the hand-made tokenizer.json of
 * tests/data/tokenizer_json always; GPT-2's own files when
 * scripts/fetch_gpt2_bpe.sh installed them, and LLaMA-3's tokenizer.json
 * (128256 ids: version-7 shards) when scripts/fetch_tokenizers.sh did
 * (skipped otherwise). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsc/io.h"
#include "fsc/tokenizer.h"

#include "gpt2_files.h"
#include "run_tool.h"
#include "test_data.h"
#include "tmpdir.h"
#include "test_main.h"

static char log_text[8192];

/* Runs fsc-tokenize with args (NULL-terminated); its stdout and stderr in log_text. */
static int run_tool(const char *const *args) {
    const char *tool = getenv("FSC_TOKENIZE");
    assert_non_null(tool);
    char logp[600];
    snprintf(logp, sizeof logp, "%s", tmp("tool.log"));
    return run_tool_logged(tool, args, logp, log_text, sizeof log_text);
}

static int expect_ok(const char *const *args) {
    int rc = run_tool(args);
    if (rc) print_message("fsc-tokenize exited %d:\n%s\n", rc, log_text);
    return rc;
}

/* Header words 0..2 and the file's size. */
static void header(const char *path, int32_t w[3], long *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char h[12];
    assert_int_equal(fread(h, 1, 12, f), 12);
    for (int i = 0; i < 3; i++)
        w[i] = (int32_t)((uint32_t)h[4 * i] | (uint32_t)h[4 * i + 1] << 8 |
                         (uint32_t)h[4 * i + 2] << 16 | (uint32_t)h[4 * i + 3] << 24);
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fclose(f);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* The tokens of spec, as int32, through the library's reader. */
static int32_t *load_ids(const char *spec, int64_t *n) {
    fsc_tokens tk;
    int rc = fsc_tokens_load(spec, &tk);
    if (rc) print_message("%s: %s\n", spec, fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    int32_t *ids = malloc((size_t)tk.count * sizeof *ids);
    assert_non_null(ids);
    for (int64_t i = 0; i < tk.count; i++) ids[i] = fsc_tokens_at(&tk, i);
    *n = tk.count;
    fsc_tokens_free(&tk);
    return ids;
}

/* Some text every tokenizer must carry through: words, numbers, contractions,
 * runs of spaces and newlines, UTF-8 in several scripts. */
static size_t make_text(char *buf, size_t cap, int lines) {
    static const char *const words[] = {"the",  "quick", "brown", "fox",   "it's", "we'll",
                                        "2024", "3.14",  "naïve", "東京",  "Ünï",  "  ",
                                        "\t",   "--",    "hello", "world", "aaaa", "é!"};
    size_t n = 0;
    uint32_t s = 12345;
    for (int l = 0; l < lines; l++) {
        for (int w = 0; w < 9; w++) {
            s = s * 1103515245u + 12345u;
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", w ? " " : "", words[(s >> 16) % 18]);
        }
        n += (size_t)snprintf(buf + n, cap - n, l % 5 == 4 ? "\n\n" : "\n");
    }
    return n;
}

static void test_bytes_val_fraction(void **state) {
    (void)state;
    char a[5000], b[3000];
    size_t na = make_text(a, sizeof a, 40), nb = 2000;
    for (size_t i = 0; i < nb; i++) b[i] = (char)(i * 37 % 256); /* every byte, NUL included */
    write_raw(tmp("a.txt"), a, na);
    write_raw(tmp("b.bin"), b, nb);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s", tmp("bytes"));
    assert_int_equal(expect_ok((const char *[]){"--tokenizer", "bytes", "--val-fraction=0.25", "-o",
                                                prefix, tmp("a.txt"), tmp("b.bin"), NULL}),
                     0);
    const int64_t total = (int64_t)(na + nb), nval = llround(0.25 * (double)total);
    int32_t w[3];
    long size;
    header(tmp("bytes_train_000000.bin"), w, &size);
    assert_int_equal(w[0], 20240520);
    assert_int_equal(w[1], 1);
    assert_int_equal(w[2], total - nval);
    assert_int_equal(size, 1024 + 2 * (total - nval));
    header(tmp("bytes_val_000000.bin"), w, &size);
    assert_int_equal(w[2], nval);
    assert_int_equal(size, 1024 + 2 * nval);
    /* train then val is the two files' bytes, in the order given */
    int64_t nt, nv;
    int32_t *t = load_ids(tmp("bytes_train_000000.bin"), &nt);
    int32_t *v = load_ids(tmp("bytes_val_000000.bin"), &nv);
    assert_int_equal(nt + nv, total);
    for (int64_t i = 0; i < total; i++) {
        const int32_t got = i < nt ? t[i] : v[i - nt];
        const unsigned char want = (unsigned char)((size_t)i < na ? a[i] : b[i - (int64_t)na]);
        if (got != want) fail_msg("token %lld is %d, the byte is %d", (long long)i, got, want);
    }
    free(t), free(v);
}

static void test_shards_version7(void **state) {
    (void)state;
    char a[3000];
    memset(a, 'x', sizeof a);
    for (size_t i = 0; i < 2500; i++) a[i] = (char)('a' + i % 26);
    write_raw(tmp("c.txt"), a, 2500);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s", tmp("v7"));
    assert_int_equal(expect_ok((const char *[]){"--tokenizer", "bytes", "--val-fraction", "0",
                                                "--shard-tokens", "1000", "--shard-version=7",
                                                "--output", prefix, tmp("c.txt"), NULL}),
                     0);
    const int want[3] = {1000, 1000, 500};
    for (int s = 0; s < 3; s++) {
        char name[64];
        snprintf(name, sizeof name, "v7_train_%06d.bin", s);
        int32_t w[3];
        long size;
        header(tmp(name), w, &size);
        assert_int_equal(w[0], 20240801);
        assert_int_equal(w[1], 7);
        assert_int_equal(w[2], want[s]);
        assert_int_equal(size, 1024 + 4 * want[s]);
    }
    assert_false(exists(tmp("v7_train_000003.bin")));
    assert_false(exists(tmp("v7_val_000000.bin"))); /* --val-fraction 0: none */
    char glob[600];
    snprintf(glob, sizeof glob, "%s/v7_train_*.bin", dir);
    int64_t n;
    int32_t *ids = load_ids(glob, &n); /* the shards in name order: the text again */
    assert_int_equal(n, 2500);
    for (int64_t i = 0; i < n; i++) assert_int_equal(ids[i], (unsigned char)a[i]);
    free(ids);
}

/* Tokenizes with the vocabulary in vocab_dir and checks that the shards hold
 * exactly fsc_bpe_encode's ids of each file, and decode to the text. */
static void round_trip(const char *vocab_dir, bool eot) {
    fsc_bpe *bpe;
    assert_int_equal(fsc_bpe_load(vocab_dir, &bpe), FSC_OK);
    char a[20000], v[4000];
    size_t na = make_text(a, sizeof a, 150), nv = make_text(v, sizeof v, 20);
    write_raw(tmp("t.txt"), a, na);
    write_raw(tmp("v.txt"), v, nv);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s", tmp("bpe"));
    const char *args[] = {"--tokenizer", vocab_dir,    "-o",         prefix,
                          "--val",       tmp("v.txt"), tmp("t.txt"), eot ? "--eot" : NULL,
                          NULL};
    assert_int_equal(expect_ok(args), 0);
    const char *files[2] = {"bpe_train_000000.bin", "bpe_val_000000.bin"};
    const char *texts[2] = {a, v};
    const size_t lens[2] = {na, nv};
    for (int k = 0; k < 2; k++) {
        int32_t w[3];
        long size;
        header(tmp(files[k]), w, &size);
        assert_int_equal(w[1], 1); /* both vocabularies fit uint16 */
        int64_t n, m;
        int32_t *got = load_ids(tmp(files[k]), &n), *want = NULL;
        assert_int_equal(fsc_bpe_encode(bpe, texts[k], lens[k], &want, &m), FSC_OK);
        assert_int_equal(n, m + (eot ? 1 : 0));
        if (eot) assert_int_equal(got[0], fsc_bpe_eot(bpe));
        for (int64_t i = 0; i < m; i++) assert_int_equal(got[i + (eot ? 1 : 0)], want[i]);
        char *text;
        size_t len;
        assert_int_equal(fsc_bpe_decode(bpe, got + (eot ? 1 : 0), m, &text, &len), FSC_OK);
        assert_int_equal(len, lens[k]);
        assert_memory_equal(text, texts[k], len);
        free(text), free(got), free(want);
    }
    fsc_bpe_free(bpe);
}

static void test_bpe_tiny_round_trip(void **state) {
    (void)state;
    const char *path = test_data("bpe_tiny");
    round_trip(path, false);
    round_trip(path, true);
}

static void test_tokenizer_json_round_trip(void **state) {
    (void)state;
    const char *path = test_data("tokenizer_json/strings.json");
    round_trip(path, false);
    round_trip(path, true);
}

/* LLaMA-3's vocabulary needs uint32 tokens: version-7 shards, read back. */
static void test_llama3_version7(void **state) {
    (void)state;
    char json[600];
    const char *env = getenv("FSC_TOKENIZERS_DIR"), *home = getenv("HOME");
    if (env)
        snprintf(json, sizeof json, "%s/llama3/tokenizer.json", env);
    else
        snprintf(json, sizeof json, "%s/.cache/fsc/tokenizers/llama3/tokenizer.json",
                 home ? home : "");
    struct stat st;
    if (stat(json, &st)) {
        print_message(
            "LLaMA-3's tokenizer.json not found (scripts/fetch_tokenizers.sh): skipped\n");
        skip();
    }
    fsc_bpe *bpe;
    assert_int_equal(fsc_bpe_load(json, &bpe), FSC_OK);
    assert_int_equal(fsc_bpe_vocab_size(bpe), 128256);
    char a[20000], prefix[600];
    size_t na = make_text(a, sizeof a, 150);
    write_raw(tmp("l.txt"), a, na);
    snprintf(prefix, sizeof prefix, "%s", tmp("l"));
    assert_int_equal(expect_ok((const char *[]){"--tokenizer", json, "-o", prefix, "--eot",
                                                "--val-fraction", "0", tmp("l.txt"), NULL}),
                     0);
    int32_t w[3];
    long size;
    header(tmp("l_train_000000.bin"), w, &size);
    assert_int_equal(w[0], 20240801);
    assert_int_equal(w[1], 7);
    int64_t n, m;
    int32_t *got = load_ids(tmp("l_train_000000.bin"), &n), *want;
    assert_int_equal(fsc_bpe_encode(bpe, a, na, &want, &m), FSC_OK);
    assert_int_equal(n, m + 1);
    assert_int_equal(got[0], 128000); /* --eot: <|begin_of_text|>, as llm.c's LLaMA-3 scripts */
    assert_memory_equal(got + 1, want, (size_t)m * sizeof *want);
    char *text;
    size_t len;
    assert_int_equal(fsc_bpe_decode(bpe, got + 1, m, &text, &len), FSC_OK);
    assert_int_equal(len, na);
    assert_memory_equal(text, a, na);
    free(text), free(got), free(want);
    fsc_bpe_free(bpe);
}

static void test_gpt2_round_trip(void **state) {
    (void)state;
    const char *d = gpt2_dir();
    if (!d) {
        print_message("GPT-2's vocabulary not found (scripts/fetch_gpt2_bpe.sh): skipped\n");
        skip();
    }
    round_trip(d, true);
    /* the default split: the last tenth of the tokens, decoding to the text's tail */
    fsc_bpe *bpe;
    assert_int_equal(fsc_bpe_load(d, &bpe), FSC_OK);
    char a[20000], prefix[600];
    size_t na = make_text(a, sizeof a, 150);
    write_raw(tmp("g.txt"), a, na);
    snprintf(prefix, sizeof prefix, "%s", tmp("g"));
    assert_int_equal(
        expect_ok((const char *[]){"--tokenizer", d, "-o", prefix, tmp("g.txt"), NULL}), 0);
    int64_t nt, nv;
    int32_t *t = load_ids(tmp("g_train_000000.bin"), &nt);
    int32_t *v = load_ids(tmp("g_val_000000.bin"), &nv);
    assert_int_equal(nv, llround(0.1 * (double)(nt + nv)));
    char *tt, *vt;
    size_t lt, lv;
    assert_int_equal(fsc_bpe_decode(bpe, t, nt, &tt, &lt), FSC_OK);
    assert_int_equal(fsc_bpe_decode(bpe, v, nv, &vt, &lv), FSC_OK);
    assert_int_equal(lt + lv, na);
    assert_memory_equal(tt, a, lt);
    assert_memory_equal(vt, a + lt, lv);
    free(t), free(v), free(tt), free(vt);
    fsc_bpe_free(bpe);
}

/* Each refusal: its exit status and a message naming what was wrong; nothing written. */
static void test_refusals(void **state) {
    (void)state;
    write_raw(tmp("s.txt"), "tiny", 4); /* a tenth of 4 tokens rounds to none */
    char prefix[600], none[600], text[600], missing[600];
    snprintf(prefix, sizeof prefix, "%s", tmp("bad"));
    snprintf(none, sizeof none, "%s", tmp("no-vocab-here"));
    snprintf(text, sizeof text, "%s", tmp("s.txt"));
    snprintf(missing, sizeof missing, "%s", tmp("missing.txt"));
    const struct {
        const char *args[10];
        int status;
        const char *needle;
    } cases[] = {
        {{"--tokenizer", none, "-o", prefix, text}, 1, "scripts/fetch_gpt2_bpe.sh"},
        {{"--tokenizer", "bytes", "-o", prefix, missing}, 1, "missing.txt"},
        {{"--tokenizer", "bytes", "-o", prefix, "--val-fraction", "1.5", text},
         2,
         "--val-fraction"},
        {{"--tokenizer", "bytes", "-o", prefix, "--val-fraction", "0.3", "--val", text, text},
         2,
         "not both"},
        {{"--tokenizer", "bytes", text}, 2, "--output"},
        {{"--tokenizer", "bytes", "-o", prefix}, 2, "no text file"},
        {{"--tokenizer", "bytes", "--eot", "-o", prefix, text}, 1, "--eot"},
        {{"--tokenizer", "bytes", "-o", prefix, text}, 1, "no val tokens"},
        {{"--tokenizer", "bytes", "--shard-version", "5", "-o", prefix, text},
         2,
         "--shard-version"},
        {{"--tokenizer", "bytes", "--shard-tok", "5", "-o", prefix, text}, 2, "--shard-tok"},
        {{"--tokenizer", "bytes", "--shard-tokens", "1e3", "-o", prefix, text},
         2,
         "--shard-tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run_tool(cases[i].args);
        if (rc != cases[i].status || !strstr(log_text, cases[i].needle) ||
            !strstr(log_text, "fsc-tokenize"))
            fail_msg("case %zu: exit %d (expected %d), message without \"%s\":\n%s", i, rc,
                     cases[i].status, cases[i].needle, log_text);
        assert_false(exists(tmp("bad_train_000000.bin")));
    }
}

FSC_TEST_MAIN(setup, teardown, cmocka_unit_test(test_bytes_val_fraction),
              cmocka_unit_test(test_shards_version7), cmocka_unit_test(test_bpe_tiny_round_trip),
              cmocka_unit_test(test_tokenizer_json_round_trip),
              cmocka_unit_test(test_llama3_version7), cmocka_unit_test(test_gpt2_round_trip),
              cmocka_unit_test(test_refusals))
