/* Token streams: one in-memory array of tokens, loaded from a spec string.
 *
 * A spec names the built-in corpus, llm.c shards (version 1: uint16 tokens,
 * version 7: uint32), nanoGPT's headerless uint16 files or byte files (see
 * io.h). Every file is probed and validated first; the token array is sized
 * from the validated counts only, then filled. It is uint16 unless a
 * version-7 shard is among the files; then every file widens to int32.
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

/* llm.c shards (versions 1 and 7) are read by shard.c. */
typedef enum { FILE_BYTES, FILE_SHARD_V1, FILE_SHARD_V7, FILE_RAW_U16 } file_kind;

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

/* Which llm.c shard version path is (its header, checked whole). */
static int shard_kind(const char *path, file_kind *kind) {
    int64_t count;
    int width = 2, rc = fsc_shard_probe(path, &count, &width);
    *kind = width == 4 ? FILE_SHARD_V7 : FILE_SHARD_V1;
    return rc;
}

static int probe(const char *path, file_kind kind, int64_t *count) {
    int width;
    if (kind == FILE_SHARD_V1 || kind == FILE_SHARD_V7) return fsc_shard_probe(path, count, &width);
    int fd;
    uint64_t size;
    int rc = fsc_open_read(path, &fd, &size);
    if (rc) return rc;
    close(fd);
    if (size > INT64_MAX / 4) return fsc_error(FSC_ERR_FORMAT, "%s: file is too large", path);
    if (kind == FILE_RAW_U16 && size % 2)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: %llu bytes, an odd size; a nanoGPT .bin holds uint16 tokens "
                         "(2 bytes each, no header)",
                         path, (unsigned long long)size);
    *count = (int64_t)(kind == FILE_RAW_U16 ? size / 2 : size);
    return FSC_OK;
}

/* Reads path whole into buf, which holds exactly its `bytes` (counted
 * earlier: a file that changed size since fails). */
static int read_exact(const char *path, void *buf, uint64_t bytes) {
    int fd;
    uint64_t size;
    int rc = fsc_open_read(path, &fd, &size);
    if (rc) return rc;
    if (size != bytes) rc = fsc_error(FSC_ERR_IO, "%s: changed size while loading", path);
    if (!rc) rc = fsc_pread_full(fd, buf, (size_t)bytes, 0, path);
    close(fd);
    return rc;
}

/* Reads a byte file as tokens; the bytes land in the upper half, then widen. */
static int read_bytes(const char *path, uint16_t *dst, int64_t count) {
    unsigned char *b = (unsigned char *)dst + count;
    int rc = read_exact(path, b, (uint64_t)count);
    for (int64_t i = 0; !rc && i < count; i++) dst[i] = b[i]; /* b[i] lies at or after dst[i] */
    return rc;
}

/* Reads a nanoGPT file: little-endian uint16 tokens from byte 0. */
static int read_raw_u16(const char *path, uint16_t *dst, int64_t count) {
    unsigned char *b = (unsigned char *)dst;
    int rc = read_exact(path, b, 2 * (uint64_t)count);
    for (int64_t i = 0; !rc && i < count; i++) /* little-endian on disk, host order in memory */
        dst[i] = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
    return rc;
}

/* Reads one file's count tokens into a stream of uint16 or, when wide, int32.
 * Narrow tokens bound for a wide stream land in the upper half, then widen. */
static int read_file(const char *path, file_kind kind, void *dst, int wide, int64_t count) {
    if (kind == FILE_SHARD_V7) return fsc_shard_read(path, dst, 4, count);
    uint16_t *narrow = wide ? (uint16_t *)((unsigned char *)dst + 2 * count) : dst;
    int rc = kind == FILE_SHARD_V1  ? fsc_shard_read(path, narrow, 2, count)
             : kind == FILE_RAW_U16 ? read_raw_u16(path, narrow, count)
                                    : read_bytes(path, narrow, count);
    int32_t *d = dst;
    for (int64_t i = 0; wide && !rc && i < count; i++) d[i] = narrow[i]; /* narrow[i] at or after */
    return rc;
}

static int load_files(const path_list *l, fsc_data_format format, fsc_tokens *out) {
    int shard = format == FSC_DATA_LLMC || (format == FSC_DATA_AUTO && is_shard(l->paths[0]));
    int rc = FSC_OK, wide = 0;
    int64_t *counts = calloc((size_t)l->n, sizeof *counts), total = 0;
    file_kind *kinds = calloc((size_t)l->n, sizeof *kinds);
    if (!counts || !kinds) {
        free(counts), free(kinds);
        return fsc_error(FSC_ERR_NOMEM, "token spec: out of memory");
    }
    for (int i = 0; i < l->n && !rc; i++) {
        if (format == FSC_DATA_AUTO && is_shard(l->paths[i]) != shard)
            rc = fsc_error(FSC_ERR_INVALID,
                           "token spec mixes llm.c shards (.bin) with byte files "
                           "(%s and %s)",
                           l->paths[0], l->paths[i]);
        kinds[i] = format == FSC_DATA_NANOGPT ? FILE_RAW_U16 : FILE_BYTES;
        if (!rc && shard) rc = shard_kind(l->paths[i], &kinds[i]);
        if (!rc) rc = probe(l->paths[i], kinds[i], &counts[i]);
        if (!rc && counts[i] > INT64_MAX / 4 - total)
            rc = fsc_error(FSC_ERR_FORMAT, "token files are too large in total");
        if (!rc) total += counts[i];
        wide |= kinds[i] == FILE_SHARD_V7;
    }
    if (!rc && total == 0) rc = fsc_error(FSC_ERR_FORMAT, "%s: no tokens", l->paths[0]);
    const size_t width = wide ? 4 : 2;
    unsigned char *tok = rc ? NULL : fsc_mem_alloc(FSC_MEM_WORK, (size_t)total * width);
    if (!rc && !tok) rc = FSC_ERR_NOMEM;
    int64_t at = 0;
    for (int i = 0; i < l->n && !rc; at += counts[i++])
        rc = read_file(l->paths[i], kinds[i], tok + (size_t)at * width, wide, counts[i]);
    free(counts);
    free(kinds);
    if (rc) {
        fsc_mem_free(tok);
        return rc;
    }
    fsc_tokens tk = {.data = tok, .dtype = wide ? FSC_DTYPE_I32 : FSC_DTYPE_U16, .count = total};
    int32_t mx = -1;
    for (int64_t i = 0; i < total && (shard || format == FSC_DATA_NANOGPT); i++) {
        int32_t v = fsc_tokens_at(&tk, i);
        if (v > mx) mx = v;
    }
    tk.vocab = mx < 0 ? 256 : (int)mx + 1;
    *out = tk;
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

static const char *const FORMAT_NAMES[] = {"auto", "llmc", "nanogpt"};

int fsc_data_format_parse(const char *name, fsc_data_format *out) {
    for (int i = 0; name && out && i < 3; i++)
        if (strcmp(name, FORMAT_NAMES[i]) == 0) {
            *out = (fsc_data_format)i;
            return FSC_OK;
        }
    return fsc_error(FSC_ERR_INVALID,
                     "data format \"%s\": expected auto (llm.c shards by the .bin name, other "
                     "files as bytes), llmc (llm.c shards) or nanogpt (headerless uint16 .bin)",
                     name ? name : "(null)");
}

int fsc_tokens_load(const char *spec, fsc_tokens *out) {
    return fsc_tokens_load_as(spec, FSC_DATA_AUTO, out);
}

int fsc_tokens_load_as(const char *spec, fsc_data_format format, fsc_tokens *out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_tokens_load: out is NULL");
    memset(out, 0, sizeof *out);
    if ((unsigned)format > FSC_DATA_NANOGPT)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_tokens_load_as: format %d (expected auto, llmc or "
                         "nanogpt)",
                         (int)format);
    if (!spec || !*spec) return fsc_error(FSC_ERR_INVALID, "token spec is empty");
    if (strncmp(spec, "builtin", 7) == 0 && (spec[7] == '\0' || spec[7] == ':')) {
        if (format != FSC_DATA_AUTO)
            return fsc_error(FSC_ERR_INVALID,
                             "token spec \"%s\" is the built-in corpus; data format %s applies "
                             "to files only",
                             spec, FORMAT_NAMES[format]);
        return load_builtin(spec, out);
    }
    path_list l = {0};
    int rc = split_spec(spec, &l);
    if (!rc) rc = load_files(&l, format, out);
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
