/* Byte-level BPE: the tables, loading by path, decoding.
 *
 * The one idea: BPE runs on ids, not strings. At load every merge "A B"
 * becomes a table entry (id(A), id(B)) -> (rank, id(AB)), and every token
 * is held as its raw bytes (GPT-2's byte-to-unicode alphabet undone once).
 * Encoding (bpe_encode.c) then never builds a string. Where the tables come
 * from is the loaders' business: GPT-2's encoder.json + vocab.bpe
 * (bpe_gpt2.c) or Hugging Face's tokenizer.json (tokenizer_json.c).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/bpe_internal.h"
#include "io/io_internal.h"

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

static uint32_t table_size(size_t n) {
    uint32_t s = 1024;
    while (s < 2 * n) s *= 2;
    return s;
}

int32_t fsc_bpe_find(const fsc_bpe *t, const char *p, size_t len) {
    for (uint32_t h = hash_bytes(p, len) & t->str_mask;; h = (h + 1) & t->str_mask) {
        uint32_t v = t->by_str[h];
        if (!v) return -1;
        size_t tl = t->off[v] - t->off[v - 1];
        if (tl == len && !memcmp(t->bytes + t->off[v - 1], p, len)) return (int32_t)v - 1;
    }
}

int fsc_bpe_set_vocab(fsc_bpe *t, int n, char *const *tok, const long *len, const bool *in_model,
                      const char *what) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += len[i] > 0 ? (size_t)len[i] : 0;
    t->bytes = malloc(total + 1);
    t->off = calloc((size_t)n + 1, sizeof *t->off);
    t->str_mask = table_size((size_t)n) - 1;
    t->by_str = calloc((size_t)t->str_mask + 1, sizeof *t->by_str);
    if (!t->bytes || !t->off || !t->by_str)
        return fsc_error(FSC_ERR_NOMEM, "%s: out of memory for %d tokens", what, n);
    for (int i = 0; i < n; i++) {
        size_t l = len[i] > 0 ? (size_t)len[i] : 0;
        if (l) memcpy(t->bytes + t->off[i], tok[i], l);
        t->off[i + 1] = t->off[i] + l;
    }
    t->n = n;
    for (int i = 0; i < n; i++) {
        if (len[i] < 0 || (in_model && !in_model[i])) continue;
        const char *p = t->bytes + t->off[i];
        size_t l = t->off[i + 1] - t->off[i];
        int32_t dup = fsc_bpe_find(t, p, l);
        if (dup >= 0)
            return fsc_error(FSC_ERR_FORMAT, "%s: tokens %d and %d are the same %zu bytes \"%.*s\"",
                             what, dup, i, l, (int)(l < 40 ? l : 40), p);
        uint32_t h = hash_bytes(p, l) & t->str_mask;
        while (t->by_str[h]) h = (h + 1) & t->str_mask;
        t->by_str[h] = (uint32_t)i + 1;
    }
    return FSC_OK;
}

int fsc_bpe_find_bytes(fsc_bpe *t, const char *what) {
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if ((t->byte_id[b] = fsc_bpe_find(t, &c, 1)) < 0)
            return fsc_error(FSC_ERR_FORMAT, "%s: no token for byte 0x%02X (every byte needs one)",
                             what, b);
    }
    return FSC_OK;
}

int fsc_bpe_alloc_merges(fsc_bpe *t, size_t count, const char *what) {
    t->pair_mask = table_size(count) - 1;
    t->pairs = malloc(((size_t)t->pair_mask + 1) * sizeof *t->pairs);
    if (!t->pairs) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory for %zu merges", what, count);
    for (uint32_t i = 0; i <= t->pair_mask; i++) t->pairs[i].rank = -1;
    return FSC_OK;
}

const bpe_pair *fsc_bpe_pair(const fsc_bpe *t, int32_t a, int32_t b) {
    for (uint32_t h = hash_pair(a, b) & t->pair_mask;; h = (h + 1) & t->pair_mask) {
        const bpe_pair *p = &t->pairs[h];
        if (p->rank < 0) return NULL;
        if (p->a == a && p->b == b) return p;
    }
}

void fsc_bpe_add_merge(fsc_bpe *t, int32_t a, int32_t b, int32_t ab) {
    if (fsc_bpe_pair(t, a, b)) return; /* a repeated merge keeps its first rank */
    uint32_t h = hash_pair(a, b) & t->pair_mask;
    while (t->pairs[h].rank >= 0) h = (h + 1) & t->pair_mask;
    t->pairs[h] = (bpe_pair){a, b, t->nmerges++, ab};
}

int fsc_bpe_read_file(const char *path, char **buf, size_t *size) {
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

int fsc_bpe_read_json_object(const char *path, const char *what, cJSON **root) {
    char *text;
    size_t size;
    int rc = fsc_bpe_read_file(path, &text, &size);
    if (rc) return rc;
    *root = cJSON_ParseWithLength(text, size);
    free(text);
    if (cJSON_IsObject(*root)) return FSC_OK;
    cJSON_Delete(*root);
    *root = NULL;
    return fsc_error(FSC_ERR_FORMAT, "%s: not a JSON object %s", path, what);
}

/* ---- loading by path ------------------------------------------------------------------------ */

static bool is_file(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}

int fsc_bpe_load(const char *path, fsc_bpe **out) {
    if (!path || !out) return fsc_error(FSC_ERR_INVALID, "fsc_bpe_load: NULL argument");
    *out = NULL;
    const char *home = getenv("HOME");
    char base[4096], a[4200], b[4200];
    if (!strncmp(path, "~/", 2) && home)
        snprintf(base, sizeof base, "%s/%s", home, path + 2);
    else
        snprintf(base, sizeof base, "%s", path);
    struct stat st;
    if (!stat(base, &st) && S_ISREG(st.st_mode)) return fsc_bpe_load_json_file(base, out);
    snprintf(a, sizeof a, "%s/tokenizer.json", base);
    if (is_file(a)) return fsc_bpe_load_json_file(a, out);
    snprintf(a, sizeof a, "%s/vocab.json", base);
    snprintf(b, sizeof b, "%s/merges.txt", base);
    if (is_file(a) && !is_file(b)) /* Hugging Face's names of GPT-2's two files */
        return fsc_error(FSC_ERR_IO, "%s: has vocab.json but no merges.txt beside it", base);
    if (!is_file(a)) {
        snprintf(a, sizeof a, "%s/encoder.json", base);
        snprintf(b, sizeof b, "%s/vocab.bpe", base);
    }
    int rc = fsc_bpe_load_files(a, b, out);
    if (rc == FSC_ERR_IO && !is_file(a))
        return fsc_error(FSC_ERR_IO,
                         "%s: no tokenizer there: expected a tokenizer.json file, or a directory "
                         "holding tokenizer.json, encoder.json + vocab.bpe, or vocab.json + "
                         "merges.txt",
                         base);
    return rc;
}

int fsc_bpe_load_json(const char *tokenizer_json, fsc_bpe **out) {
    if (!tokenizer_json || !out)
        return fsc_error(FSC_ERR_INVALID, "fsc_bpe_load_json: NULL argument");
    *out = NULL;
    return fsc_bpe_load_json_file(tokenizer_json, out);
}

void fsc_bpe_free(fsc_bpe *t) {
    if (!t) return;
    fsc_bpe_split_free(t);
    fsc_bpe_added_free(t);
    free(t->bytes), free(t->off), free(t->by_str), free(t->pairs), free(t->kind), free(t->post);
    free(t);
}

/* ---- what a tokenizer holds ----------------------------------------------------------------- */

int fsc_bpe_vocab_size(const fsc_bpe *t) {
    return t->n;
}
int32_t fsc_bpe_eot(const fsc_bpe *t) {
    return t->eot;
}
int32_t fsc_bpe_bos(const fsc_bpe *t) {
    return t->npre ? t->post[0] : -1;
}
int32_t fsc_bpe_eos(const fsc_bpe *t) {
    return t->npost ? t->post[t->npre] : -1;
}

bool fsc_bpe_is_special(const fsc_bpe *t, int32_t id) {
    return t->kind && id >= 0 && id < t->n && (t->kind[id] & BPE_TOKEN_SPECIAL);
}

int32_t fsc_bpe_token_id(const fsc_bpe *t, const char *s, size_t len) {
    if (!t || (!s && len)) return -1;
    for (int pass = 0; pass < 2; pass++) { /* an added token first, as encoding finds them */
        size_t start, end;
        int32_t id;
        if (t->added[pass] &&
            fsc_bpe_added_next(t, pass, (const unsigned char *)s, len, 0, &start, &end, &id) &&
            start == 0 && end == len)
            return id;
    }
    return len ? fsc_bpe_find(t, s, len) : -1;
}

const char *fsc_bpe_token_bytes(const fsc_bpe *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n || (t->kind && (t->kind[id] & BPE_TOKEN_UNUSED))) {
        *len = 0;
        return NULL;
    }
    *len = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

/* ---- decode ---------------------------------------------------------------------------------- */

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
        if (t->kind && (t->kind[ids[i]] & BPE_TOKEN_UNUSED))
            return fsc_error(FSC_ERR_INVALID,
                             "BPE decode: id %d at position %lld is no token (tokenizer.json "
                             "leaves it unassigned)",
                             ids[i], (long long)i);
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
    int rc = fsc_bpe_read_file(path, &text, &size);
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
