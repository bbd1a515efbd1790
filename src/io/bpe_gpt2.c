/* GPT-2's own vocabulary files and its hand-written pre-tokenizer.
 *
 * encoder.json (token -> id) and vocab.bpe (one merge "A B" a line, by rank),
 * or the same two under Hugging Face's names vocab.json and merges.txt. Token
 * strings are written in GPT-2's byte-to-unicode alphabet and become raw
 * bytes once, here. The pre-tokenizer is GPT-2's regex
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * written out by hand over the Unicode tables of bpe_unicode.c, so that any
 * byte string (invalid UTF-8 included: such a byte counts as punctuation)
 * splits the same way it always has; tokenizer.json's regexes go through
 * PCRE2 instead (tokenizer_json_split.c).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/bpe_internal.h"

/* ---- GPT-2's byte <-> unicode alphabet ------------------------------------------------------- */

static bool printable(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes map to
 * U+0100.. in byte order (GPT-2's bytes_to_unicode). */
void fsc_bpe_alphabet(int16_t cp_to_byte[324]) {
    memset(cp_to_byte, 0xFF, 324 * sizeof *cp_to_byte);
    for (int b = 0, k = 0; b < 256; b++) cp_to_byte[printable(b) ? b : 256 + k++] = (int16_t)b;
}

int32_t fsc_bpe_utf8_next(const unsigned char *s, size_t n, int *len) {
    *len = 1;
    unsigned c = s[0];
    if (c < 0x80) return (int32_t)c;
    int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (!k || c > 0xF4 || (size_t)k >= n) return -1;
    uint32_t cp = c & (0x3Fu >> k);
    for (int i = 1; i <= k; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *len = k + 1;
    return (int32_t)cp;
}

long fsc_bpe_unmap(const char *s, size_t n, const int16_t *cp_to_byte, char *out) {
    long k = 0;
    for (size_t i = 0; i < n;) {
        int len;
        int32_t cp = fsc_bpe_utf8_next((const unsigned char *)s + i, n - i, &len);
        if (cp < 0 || cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[k++] = (char)cp_to_byte[cp];
        i += (size_t)len;
    }
    return k;
}

/* ---- character classes and the pre-tokenizer ------------------------------------------------ */

static bool in_ranges(const uint32_t (*r)[2], int count, uint32_t cp) {
    int lo = 0, hi = count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid - 1;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

enum { CL_LETTER, CL_NUMBER, CL_SPACE, CL_OTHER };

bool fsc_bpe_is_space(int32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static int char_class(int32_t cp) {
    if (cp < 0) return CL_OTHER; /* a stray byte: punctuation-like */
    if (cp < 128) {
        if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return CL_LETTER;
        if (cp >= '0' && cp <= '9') return CL_NUMBER;
        return fsc_bpe_is_space(cp) ? CL_SPACE : CL_OTHER;
    }
    if (fsc_bpe_is_space(cp)) return CL_SPACE;
    if (in_ranges(fsc_bpe_letters, fsc_bpe_letters_count, (uint32_t)cp)) return CL_LETTER;
    if (in_ranges(fsc_bpe_numbers, fsc_bpe_numbers_count, (uint32_t)cp)) return CL_NUMBER;
    return CL_OTHER;
}

static int class_at(const unsigned char *s, size_t n, size_t i, int *len) {
    return char_class(fsc_bpe_utf8_next(s + i, n - i, len));
}

/* End of the run of class cl from i; *last gets the start of its last character. */
static size_t run_end(const unsigned char *s, size_t n, size_t i, int cl, size_t *last) {
    int len;
    *last = i;
    while (i < n && class_at(s, n, i, &len) == cl) *last = i, i += (size_t)len;
    return i;
}

/* The end of the regex's match at i (i < n): the first alternative that
 * matches wins, as in a backtracking regex engine. */
size_t fsc_bpe_gpt2_piece_end(const unsigned char *s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        if (s[i + 1] && strchr("stmd", s[i + 1])) return i + 2;
        if (i + 2 < n && (!memcmp(s + i + 1, "re", 2) || !memcmp(s + i + 1, "ve", 2) ||
                          !memcmp(s + i + 1, "ll", 2)))
            return i + 3;
    }
    int len;
    size_t last;
    if (s[i] == ' ' && i + 1 < n) { /* " ?X+" with the optional space */
        int cl = class_at(s, n, i + 1, &len);
        if (cl != CL_SPACE) return run_end(s, n, i + 1, cl, &last);
    }
    int cl = class_at(s, n, i, &len);
    if (cl != CL_SPACE) return run_end(s, n, i, cl, &last);
    /* \s+(?!\S): all of the run at the end of the text, else all but its
     * last character (which then starts the next piece); a single space
     * before a non-space is \s+ alone */
    size_t end = run_end(s, n, i, CL_SPACE, &last);
    return end == n || last == i ? end : last;
}

/* ---- the two files -------------------------------------------------------------------------- */

/* encoder.json: {"token": id, ...} with ids 0..n-1, each once. */
static int load_encoder(fsc_bpe *t, const char *path, const int16_t *cp_to_byte) {
    cJSON *root;
    int rc = fsc_bpe_read_json_object(path, "of token -> id", &root);
    if (rc) return rc;
    int n = cJSON_GetArraySize(root);
    size_t total = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) total += strlen(e->string);
    char **tok = calloc((size_t)n + 1, sizeof *tok);
    long *len = calloc((size_t)n + 1, sizeof *len);
    char *scratch = malloc(total + 1);
    if (!tok || !len || !scratch) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    size_t at = 0;
    cJSON_ArrayForEach(e, root) {
        if (rc) break;
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(v >= 0 && v < n && v == (int)v) || tok[(int)v]) {
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: token \"%.40s\" has id %g: ids must be 0..%d, each once", path,
                           e->string, v, n - 1);
            break;
        }
        long k = fsc_bpe_unmap(e->string, strlen(e->string), cp_to_byte, scratch + at);
        if (k < 0)
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: token \"%.40s\" has a character outside GPT-2's byte alphabet",
                           path, e->string);
        tok[(int)v] = scratch + at, len[(int)v] = k;
        at += k > 0 ? (size_t)k : 0;
    }
    if (!rc) rc = fsc_bpe_set_vocab(t, n, tok, len, NULL, path);
    cJSON *eot = rc ? NULL : cJSON_GetObjectItemCaseSensitive(root, "<|endoftext|>");
    t->eot = cJSON_IsNumber(eot) ? (int32_t)eot->valuedouble : -1;
    free(scratch), free(tok), free(len);
    cJSON_Delete(root);
    return rc;
}

/* vocab.bpe: "#version" line, then "A B" per line, rank = line order. */
static int load_merges(fsc_bpe *t, const char *path, const int16_t *cp_to_byte) {
    char *text, *buf = NULL;
    size_t size;
    int rc = fsc_bpe_read_file(path, &text, &size);
    if (rc) return rc;
    size_t lines = 1;
    for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
    rc = fsc_bpe_alloc_merges(t, lines, path);
    buf = rc ? NULL : malloc(size + 1);
    if (!rc && !buf) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    long lineno = 0;
    for (char *line = text, *next; !rc && line < text + size; line = next) {
        lineno++;
        char *nl = memchr(line, '\n', (size_t)(text + size - line));
        next = nl ? nl + 1 : text + size;
        size_t l = (size_t)((nl ? nl : text + size) - line);
        if (l && line[l - 1] == '\r') l--;
        if (!l || (lineno == 1 && !strncmp(line, "#version", 8))) continue;
        char *sp = memchr(line, ' ', l);
        long la = sp ? fsc_bpe_unmap(line, (size_t)(sp - line), cp_to_byte, buf) : -1;
        long lb =
            la > 0 ? fsc_bpe_unmap(sp + 1, l - (size_t)(sp + 1 - line), cp_to_byte, buf + la) : -1;
        int32_t a = la > 0 ? fsc_bpe_find(t, buf, (size_t)la) : -1;
        int32_t b = lb > 0 ? fsc_bpe_find(t, buf + la, (size_t)lb) : -1;
        int32_t ab = a >= 0 && b >= 0 ? fsc_bpe_find(t, buf, (size_t)(la + lb)) : -1;
        if (ab < 0)
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s:%ld: \"%.*s\" is not a merge of two tokens whose concatenation "
                           "is a token of encoder.json",
                           path, lineno, (int)(l < 60 ? l : 60), line);
        else
            fsc_bpe_add_merge(t, a, b, ab);
    }
    free(buf);
    free(text);
    return rc;
}

int fsc_bpe_load_files(const char *encoder_json, const char *vocab_bpe, fsc_bpe **out) {
    if (!encoder_json || !vocab_bpe || !out)
        return fsc_error(FSC_ERR_INVALID, "fsc_bpe_load: NULL argument");
    *out = NULL;
    fsc_bpe *t = calloc(1, sizeof *t);
    if (!t) return fsc_error(FSC_ERR_NOMEM, "BPE: out of memory");
    int16_t cp_to_byte[324];
    fsc_bpe_alphabet(cp_to_byte);
    int rc = load_encoder(t, encoder_json, cp_to_byte);
    if (!rc) rc = fsc_bpe_find_bytes(t, encoder_json);
    if (!rc) rc = load_merges(t, vocab_bpe, cp_to_byte);
    if (rc) {
        fsc_bpe_free(t);
        return rc;
    }
    *out = t;
    return FSC_OK;
}
