/* GPT-2's byte-level BPE: vocabulary files in, ids out and back.
 *
 * The one idea: BPE runs on ids, not strings. At load every merge "A B" of
 * vocab.bpe becomes a table entry (id(A), id(B)) -> (rank, id(AB)); a piece
 * of text starts as one single-byte token per byte and merges the
 * lowest-ranked adjacent pair (every occurrence, left to right) until no
 * pair is in the table: GPT-2's algorithm, without a string in the loop.
 * Token strings in the files are in GPT-2's byte-to-unicode alphabet and
 * are turned back into raw bytes once, at load.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/tokenizer.h"
#include "io/bpe_internal.h"
#include "io/io_internal.h"

typedef struct {
    int32_t a, b, rank, merged; /* rank -1: empty slot */
} pair_slot;

struct fsc_bpe {
    int n;            /* tokens */
    char *bytes;      /* every token's bytes, back to back */
    size_t *off;      /* token i is bytes[off[i], off[i+1]) */
    uint32_t *by_str; /* open addressing: id + 1, 0 empty */
    uint32_t str_mask;
    pair_slot *pairs;
    uint32_t pair_mask;
    int32_t byte_id[256]; /* the single-byte tokens */
    int32_t eot;
};

/* ---- GPT-2's byte <-> unicode alphabet ------------------------------------------------------- */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes map to
 * U+0100.. in byte order (GPT-2's bytes_to_unicode). */
static uint32_t byte_to_cp(int b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return (uint32_t)b;
    int k = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) k++;
    return 256u + (uint32_t)k;
}

/* ---- UTF-8 and character classes ----------------------------------------------------------------
 */

/* The code point at s[0..n) (n >= 1) and its byte length; -1 (length 1) for
 * a byte that does not start a valid, shortest-form scalar value. */
static int32_t utf8_next(const unsigned char *s, size_t n, int *len) {
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

static bool is_space(int32_t cp) { /* Unicode White_Space */
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static int char_class(int32_t cp) {
    if (cp < 0) return CL_OTHER; /* a stray byte: punctuation-like */
    if (cp < 128) {
        if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return CL_LETTER;
        if (cp >= '0' && cp <= '9') return CL_NUMBER;
        return is_space(cp) ? CL_SPACE : CL_OTHER;
    }
    if (is_space(cp)) return CL_SPACE;
    if (in_ranges(fsc_bpe_letters, fsc_bpe_letters_count, (uint32_t)cp)) return CL_LETTER;
    if (in_ranges(fsc_bpe_numbers, fsc_bpe_numbers_count, (uint32_t)cp)) return CL_NUMBER;
    return CL_OTHER;
}

static int class_at(const unsigned char *s, size_t n, size_t i, int *len) {
    return char_class(utf8_next(s + i, n - i, len));
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
static size_t piece_end(const unsigned char *s, size_t n, size_t i) {
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

/* ---- tables --------------------------------------------------------------------------------- */

static uint32_t hash_bytes(const char *p, size_t len) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

static uint32_t hash_pair(int32_t a, int32_t b) {
    uint64_t x = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

static int32_t find_str(const fsc_bpe *t, const char *p, size_t len) {
    for (uint32_t h = hash_bytes(p, len) & t->str_mask;; h = (h + 1) & t->str_mask) {
        uint32_t v = t->by_str[h];
        if (!v) return -1;
        size_t tl = t->off[v] - t->off[v - 1];
        if (tl == len && !memcmp(t->bytes + t->off[v - 1], p, len)) return (int32_t)v - 1;
    }
}

static const pair_slot *find_pair(const fsc_bpe *t, int32_t a, int32_t b) {
    for (uint32_t h = hash_pair(a, b) & t->pair_mask;; h = (h + 1) & t->pair_mask) {
        const pair_slot *p = &t->pairs[h];
        if (p->rank < 0) return NULL;
        if (p->a == a && p->b == b) return p;
    }
}

static uint32_t table_size(size_t n) {
    uint32_t s = 1024;
    while (s < 2 * n) s *= 2;
    return s;
}

/* A token string of the files (GPT-2's alphabet, UTF-8) -> raw bytes into
 * out (at least strlen(s) bytes); -1 for a character outside the alphabet. */
static long unmap(const char *s, size_t n, const int16_t *cp_to_byte, char *out) {
    long k = 0;
    for (size_t i = 0; i < n;) {
        int len;
        int32_t cp = utf8_next((const unsigned char *)s + i, n - i, &len);
        if (cp < 0 || cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[k++] = (char)cp_to_byte[cp];
        i += (size_t)len;
    }
    return k;
}

static int read_file(const char *path, char **buf, size_t *size) {
    int fd;
    uint64_t sz;
    int rc = fsc_open_read(path, &fd, &sz);
    if (rc) return rc;
    *buf = sz < (1ull << 31) ? malloc((size_t)sz + 1) : NULL;
    if (!*buf)
        rc = fsc_error(FSC_ERR_NOMEM, "%s: too large to read (%llu bytes)", path,
                       (unsigned long long)sz);
    if (!rc) rc = fsc_pread_full(fd, *buf, (size_t)sz, 0, path);
    close(fd);
    if (rc) {
        free(*buf);
        *buf = NULL;
        return rc;
    }
    (*buf)[sz] = '\0';
    *size = (size_t)sz;
    return FSC_OK;
}

/* encoder.json: {"token": id, ...} with ids 0..n-1, each once. */
static int load_encoder(fsc_bpe *t, const char *path, const int16_t *cp_to_byte) {
    char *text;
    size_t size;
    int rc = read_file(path, &text, &size);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(text, size);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fsc_error(FSC_ERR_FORMAT, "%s: not a JSON object of token -> id", path);
    }
    int n = cJSON_GetArraySize(root);
    size_t total = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) total += strlen(e->string);
    char **tok = calloc((size_t)n + 1, sizeof *tok);
    long *len = calloc((size_t)n + 1, sizeof *len);
    t->bytes = malloc(total + 1);
    t->off = calloc((size_t)n + 1, sizeof *t->off);
    t->str_mask = table_size((size_t)n) - 1;
    t->by_str = calloc((size_t)t->str_mask + 1, sizeof *t->by_str);
    char *scratch = malloc(total + 1);
    if (!tok || !len || !t->bytes || !t->off || !t->by_str || !scratch)
        rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
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
        long k = unmap(e->string, strlen(e->string), cp_to_byte, scratch + at);
        if (k < 0)
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: token \"%.40s\" has a character outside GPT-2's byte alphabet",
                           path, e->string);
        tok[(int)v] = scratch + at, len[(int)v] = k;
        at += k > 0 ? (size_t)k : 0;
    }
    for (int i = 0, pos = 0; !rc && i < n; pos += (int)len[i++]) {
        memcpy(t->bytes + pos, tok[i], (size_t)len[i]);
        t->off[i + 1] = t->off[i] + (size_t)len[i];
    }
    t->n = rc ? 0 : n;
    for (int i = 0; i < t->n; i++) {
        const char *p = t->bytes + t->off[i];
        size_t l = t->off[i + 1] - t->off[i];
        uint32_t h = hash_bytes(p, l) & t->str_mask;
        while (t->by_str[h]) h = (h + 1) & t->str_mask;
        t->by_str[h] = (uint32_t)i + 1;
    }
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
    int rc = read_file(path, &text, &size);
    if (rc) return rc;
    size_t lines = 1;
    for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
    t->pair_mask = table_size(lines) - 1;
    t->pairs = malloc(((size_t)t->pair_mask + 1) * sizeof *t->pairs);
    buf = malloc(size + 1);
    if (!t->pairs || !buf) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    for (uint32_t i = 0; !rc && i <= t->pair_mask; i++) t->pairs[i].rank = -1;
    int32_t rank = 0;
    long lineno = 0;
    for (char *line = text, *next; !rc && line < text + size; line = next) {
        lineno++;
        char *nl = memchr(line, '\n', (size_t)(text + size - line));
        next = nl ? nl + 1 : text + size;
        size_t l = (size_t)((nl ? nl : text + size) - line);
        if (l && line[l - 1] == '\r') l--;
        if (!l || (lineno == 1 && !strncmp(line, "#version", 8))) continue;
        char *sp = memchr(line, ' ', l);
        long la = sp ? unmap(line, (size_t)(sp - line), cp_to_byte, buf) : -1;
        long lb = la > 0 ? unmap(sp + 1, l - (size_t)(sp + 1 - line), cp_to_byte, buf + la) : -1;
        int32_t a = la > 0 ? find_str(t, buf, (size_t)la) : -1;
        int32_t b = lb > 0 ? find_str(t, buf + la, (size_t)lb) : -1;
        int32_t ab = a >= 0 && b >= 0 ? find_str(t, buf, (size_t)(la + lb)) : -1;
        if (ab < 0) {
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s:%ld: \"%.*s\" is not a merge of two tokens whose concatenation "
                           "is a token of encoder.json",
                           path, lineno, (int)(l < 60 ? l : 60), line);
            break;
        }
        if (find_pair(t, a, b)) continue; /* a repeated merge keeps its first rank */
        uint32_t h = hash_pair(a, b) & t->pair_mask;
        while (t->pairs[h].rank >= 0) h = (h + 1) & t->pair_mask;
        t->pairs[h] = (pair_slot){a, b, rank++, ab};
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
    memset(cp_to_byte, 0xFF, sizeof cp_to_byte);
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp(b)] = (int16_t)b;
    int rc = load_encoder(t, encoder_json, cp_to_byte);
    for (int b = 0; !rc && b < 256; b++) {
        char c = (char)b;
        if ((t->byte_id[b] = find_str(t, &c, 1)) < 0)
            rc = fsc_error(FSC_ERR_FORMAT, "%s: no token for byte 0x%02X (every byte needs one)",
                           encoder_json, b);
    }
    if (!rc) rc = load_merges(t, vocab_bpe, cp_to_byte);
    if (rc) {
        fsc_bpe_free(t);
        return rc;
    }
    *out = t;
    return FSC_OK;
}

int fsc_bpe_load(const char *dir, fsc_bpe **out) {
    if (!dir || !out) return fsc_error(FSC_ERR_INVALID, "fsc_bpe_load: NULL argument");
    const char *home = getenv("HOME");
    char base[4096], enc[4200], merges[4200];
    if (!strncmp(dir, "~/", 2) && home)
        snprintf(base, sizeof base, "%s/%s", home, dir + 2);
    else
        snprintf(base, sizeof base, "%s", dir);
    snprintf(enc, sizeof enc, "%s/encoder.json", base);
    snprintf(merges, sizeof merges, "%s/vocab.bpe", base);
    return fsc_bpe_load_files(enc, merges, out);
}

void fsc_bpe_free(fsc_bpe *t) {
    if (!t) return;
    free(t->bytes), free(t->off), free(t->by_str), free(t->pairs);
    free(t);
}

int fsc_bpe_vocab_size(const fsc_bpe *t) {
    return t->n;
}
int32_t fsc_bpe_eot(const fsc_bpe *t) {
    return t->eot;
}

const char *fsc_bpe_token_bytes(const fsc_bpe *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n) {
        *len = 0;
        return NULL;
    }
    *len = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

/* ---- encode and decode ---------------------------------------------------------------------- */

/* BPE of one piece: w[0..n) holds its single-byte ids; returns the count left. */
static int64_t merge_piece(const fsc_bpe *t, int32_t *w, int64_t n) {
    while (n > 1) {
        const pair_slot *best = NULL;
        for (int64_t i = 0; i + 1 < n; i++) {
            const pair_slot *p = find_pair(t, w[i], w[i + 1]);
            if (p && (!best || p->rank < best->rank)) best = p;
        }
        if (!best) break;
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++) {
            if (i + 1 < n && w[i] == best->a && w[i + 1] == best->b)
                w[k++] = best->merged, i++;
            else
                w[k++] = w[i];
        }
        n = k;
    }
    return n;
}

int fsc_bpe_encode(const fsc_bpe *t, const char *text, size_t n, int32_t **ids, int64_t *count) {
    if (!t || (!text && n) || !ids || !count)
        return fsc_error(FSC_ERR_INVALID, "fsc_bpe_encode: NULL argument");
    *ids = NULL, *count = 0;
    if (!n) return FSC_OK;
    int32_t *out = malloc(n * sizeof *out); /* never more ids than bytes */
    if (!out) return fsc_error(FSC_ERR_NOMEM, "BPE: out of memory encoding %zu bytes", n);
    const unsigned char *s = (const unsigned char *)text;
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t end = piece_end(s, n, i);
        for (size_t j = i; j < end; j++) out[k + (int64_t)(j - i)] = t->byte_id[s[j]];
        k += merge_piece(t, out + k, (int64_t)(end - i));
        i = end;
    }
    *ids = out, *count = k;
    return FSC_OK;
}

int fsc_bpe_decode(const fsc_bpe *t, const int32_t *ids, int64_t n, char **text, size_t *len) {
    if (!t || (!ids && n) || n < 0 || !text || !len)
        return fsc_error(FSC_ERR_INVALID, "fsc_bpe_decode: NULL argument or negative count");
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n)
            return fsc_error(FSC_ERR_INVALID,
                             "BPE decode: id %d at position %lld is outside "
                             "the vocabulary [0, %d)",
                             ids[i], (long long)i, t->n);
        total += t->off[ids[i] + 1] - t->off[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out) return fsc_error(FSC_ERR_NOMEM, "BPE: out of memory decoding");
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t l = t->off[ids[i] + 1] - t->off[ids[i]];
        memcpy(out + at, t->bytes + t->off[ids[i]], l);
        at += l;
    }
    out[at] = '\0';
    *text = out, *len = at;
    return FSC_OK;
}

int fsc_bpe_encode_file(const fsc_bpe *t, const char *path, fsc_tokens *out) {
    if (!t || !path || !out)
        return fsc_error(FSC_ERR_INVALID, "fsc_bpe_encode_file: NULL argument");
    memset(out, 0, sizeof *out);
    char *text;
    size_t size;
    int rc = read_file(path, &text, &size);
    if (rc) return rc;
    int32_t *ids = NULL;
    int64_t count = 0;
    rc = size ? fsc_bpe_encode(t, text, size, &ids, &count)
              : fsc_error(FSC_ERR_FORMAT, "%s: empty file, no tokens", path);
    free(text);
    if (!rc) rc = fsc_tokens_from_i32(ids, count, t->n, out);
    free(ids);
    return rc ? fsc_error_context(rc, "%s: ", path) : FSC_OK;
}
