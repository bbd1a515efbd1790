/* Token streams: one in-memory array of tokens, loaded from a spec string.
 *
 * A spec names the built-in corpus, llm.c shards or byte files (see io.h).
 * Every file is probed and validated first; the token array is sized from
 * the validated counts only, then filled.
 */
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/io.h"
#include "io/io_internal.h"

#define BUILTIN_SEED 1337
#define BUILTIN_BYTES (2u << 20)
#define BUILTIN_MAX_BYTES (1ull << 32)

typedef struct {
    char **paths;
    int n, cap;
} path_list;

static void list_free(path_list *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
}

static int list_add(path_list *l, const char *p) {
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 8;
        char **np = realloc(l->paths, (size_t)nc * sizeof *np);
        if (!np) return fsc_error(FSC_ERR_NOMEM, "token spec: out of memory");
        l->paths = np;
        l->cap = nc;
    }
    l->paths[l->n] = malloc(strlen(p) + 1);
    if (!l->paths[l->n]) return fsc_error(FSC_ERR_NOMEM, "token spec: out of memory");
    strcpy(l->paths[l->n++], p);
    return FSC_OK;
}

/* One comma-separated item: a plain path, or a glob expanded in sorted order. */
static int expand_item(path_list *l, const char *item) {
    if (!*item) return fsc_error(FSC_ERR_INVALID, "token spec has an empty item");
    if (!strpbrk(item, "*?[")) return list_add(l, item);
    glob_t g;
    int r = glob(item, GLOB_ERR, NULL, &g), rc = FSC_OK;
    if (r == GLOB_NOMATCH)
        rc = fsc_error(FSC_ERR_NOT_FOUND, "%s: pattern matched no files", item);
    else if (r != 0)
        rc = fsc_error(FSC_ERR_IO, "%s: cannot expand pattern", item);
    for (size_t i = 0; r == 0 && i < g.gl_pathc && !rc; i++) rc = list_add(l, g.gl_pathv[i]);
    if (r == 0) globfree(&g);
    return rc;
}

static int split_spec(const char *spec, path_list *l) {
    char *copy = malloc(strlen(spec) + 1);
    if (!copy) return fsc_error(FSC_ERR_NOMEM, "token spec: out of memory");
    strcpy(copy, spec);
    int rc = FSC_OK;
    char *item = copy;
    for (char *comma; !rc; item = comma + 1) {
        comma = strchr(item, ',');
        if (comma) *comma = '\0';
        rc = expand_item(l, item);
        if (!comma) break;
    }
    free(copy);
    return rc;
}

static int is_shard(const char *path) {
    size_t n = strlen(path);
    return n >= 4 && strcmp(path + n - 4, ".bin") == 0;
}

static int probe(const char *path, int shard, int64_t *count) {
    if (shard) return fsc_shard_probe(path, count);
    int fd;
    uint64_t size;
    int rc = fsc_open_read(path, &fd, &size);
    if (rc) return rc;
    close(fd);
    if (size > INT64_MAX / 4) return fsc_error(FSC_ERR_FORMAT, "%s: file is too large", path);
    *count = (int64_t)size;
    return FSC_OK;
}

/* Reads a byte file as tokens; the bytes land in the upper half, then widen. */
static int read_bytes(const char *path, uint16_t *dst, int64_t count) {
    int fd;
    uint64_t size;
    int rc = fsc_open_read(path, &fd, &size);
    if (rc) return rc;
    unsigned char *b = (unsigned char *)dst + count;
    if (size != (uint64_t)count) rc = fsc_error(FSC_ERR_IO, "%s: changed size while loading", path);
    if (!rc) rc = fsc_pread_full(fd, b, (size_t)count, 0, path);
    close(fd);
    for (int64_t i = 0; !rc && i < count; i++) dst[i] = b[i]; /* b[i] lies at or after dst[i] */
    return rc;
}

static int load_files(const path_list *l, fsc_tokens *out) {
    int shard = is_shard(l->paths[0]), rc = FSC_OK;
    int64_t *counts = calloc((size_t)l->n, sizeof *counts), total = 0;
    if (!counts) return fsc_error(FSC_ERR_NOMEM, "token spec: out of memory");
    for (int i = 0; i < l->n && !rc; i++) {
        if (is_shard(l->paths[i]) != shard)
            rc = fsc_error(FSC_ERR_INVALID,
                           "token spec mixes llm.c shards (.bin) with byte files "
                           "(%s and %s)",
                           l->paths[0], l->paths[i]);
        if (!rc) rc = probe(l->paths[i], shard, &counts[i]);
        if (!rc && counts[i] > INT64_MAX / 4 - total)
            rc = fsc_error(FSC_ERR_FORMAT, "token files are too large in total");
        if (!rc) total += counts[i];
    }
    if (!rc && total == 0) rc = fsc_error(FSC_ERR_FORMAT, "%s: no tokens", l->paths[0]);
    uint16_t *tok = rc ? NULL : fsc_mem_alloc(FSC_MEM_WORK, (size_t)total * 2);
    if (!rc && !tok) rc = FSC_ERR_NOMEM;
    int64_t at = 0;
    for (int i = 0; i < l->n && !rc; at += counts[i++])
        rc = shard ? fsc_shard_read(l->paths[i], tok + at, counts[i])
                   : read_bytes(l->paths[i], tok + at, counts[i]);
    free(counts);
    if (rc) {
        fsc_mem_free(tok);
        return rc;
    }
    int vocab = 256;
    if (shard)
        for (int64_t i = 0, mx = -1; i < total; i++)
            if (tok[i] > mx) vocab = (int)(mx = tok[i]) + 1;
    *out = (fsc_tokens){.data = tok, .dtype = FSC_DTYPE_U16, .count = total, .vocab = vocab};
    return FSC_OK;
}

/* "builtin", "builtin:SEED" or "builtin:SEED:BYTES". */
static int load_builtin(const char *spec, fsc_tokens *out) {
    unsigned long long seed = BUILTIN_SEED, bytes = BUILTIN_BYTES;
    const char *p = spec + strlen("builtin");
    char *end = (char *)p;
    if (*p == ':') {
        seed = strtoull(p + 1, &end, 10);
        if (end == p + 1)
            end = (char *)p; /* no digits */
        else if (*end == ':') {
            const char *b = end + 1;
            bytes = strtoull(b, &end, 10);
            if (end == b) end = (char *)b - 1;
        }
    }
    if (*end != '\0' || bytes == 0 || bytes > BUILTIN_MAX_BYTES)
        return fsc_error(FSC_ERR_INVALID,
                         "token spec \"%s\": expected builtin, builtin:SEED or "
                         "builtin:SEED:BYTES with 0 < BYTES <= %llu",
                         spec, BUILTIN_MAX_BYTES);
    return fsc_tokens_builtin(seed, (size_t)bytes, out);
}

int fsc_tokens_load(const char *spec, fsc_tokens *out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_tokens_load: out is NULL");
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) return fsc_error(FSC_ERR_INVALID, "token spec is empty");
    if (strncmp(spec, "builtin", 7) == 0 && (spec[7] == '\0' || spec[7] == ':'))
        return load_builtin(spec, out);
    path_list l = {0};
    int rc = split_spec(spec, &l);
    if (!rc) rc = load_files(&l, out);
    list_free(&l);
    return rc;
}

int fsc_tokens_builtin(uint64_t seed, size_t nbytes, fsc_tokens *out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_tokens_builtin: out is NULL");
    memset(out, 0, sizeof *out);
    if (nbytes == 0 || nbytes > BUILTIN_MAX_BYTES)
        return fsc_error(FSC_ERR_INVALID, "builtin corpus: %zu bytes (expected 1..%llu)", nbytes,
                         BUILTIN_MAX_BYTES);
    uint16_t *tok = fsc_mem_alloc(FSC_MEM_WORK, nbytes * 2);
    if (!tok) return FSC_ERR_NOMEM;
    unsigned char *b = (unsigned char *)tok + nbytes; /* generate into the upper half, widen */
    fsc_corpus_generate(seed, nbytes, (char *)b, NULL);
    for (size_t i = 0; i < nbytes; i++) tok[i] = b[i];
    *out =
        (fsc_tokens){.data = tok, .dtype = FSC_DTYPE_U16, .count = (int64_t)nbytes, .vocab = 256};
    return FSC_OK;
}

int fsc_tokens_from_i32(const int32_t *tok, int64_t n, int vocab, fsc_tokens *out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_tokens_from_i32: out is NULL");
    memset(out, 0, sizeof *out);
    if (!tok || n <= 0 || vocab < 0)
        return fsc_error(FSC_ERR_INVALID, "fsc_tokens_from_i32: %lld tokens, vocab %d",
                         (long long)n, vocab);
    int32_t mx = -1;
    for (int64_t i = 0; i < n; i++) {
        if (tok[i] < 0 || (vocab && tok[i] >= vocab))
            return fsc_error(FSC_ERR_INVALID, "token %lld is %d, outside [0, %d)", (long long)i,
                             tok[i], vocab ? vocab : INT32_MAX);
        if (tok[i] > mx) mx = tok[i];
    }
    if ((uint64_t)n > SIZE_MAX / 4) return fsc_error(FSC_ERR_NOMEM, "too many tokens");
    int32_t *d = fsc_mem_alloc(FSC_MEM_WORK, (size_t)n * 4);
    if (!d) return FSC_ERR_NOMEM;
    memcpy(d, tok, (size_t)n * 4);
    *out = (fsc_tokens){
        .data = d, .dtype = FSC_DTYPE_I32, .count = n, .vocab = vocab ? vocab : mx + 1};
    return FSC_OK;
}

void fsc_tokens_free(fsc_tokens *tk) {
    if (!tk) return;
    fsc_mem_free(tk->data);
    memset(tk, 0, sizeof *tk);
}

int32_t fsc_tokens_at(const fsc_tokens *tk, int64_t i) {
    return tk->dtype == FSC_DTYPE_I32 ? ((const int32_t *)tk->data)[i]
                                      : ((const uint16_t *)tk->data)[i];
}

int64_t fsc_tokens_num_windows(const fsc_tokens *tk, int T) {
    return tk && T > 0 ? tk->count / T : 0;
}
