/* llm.c token shards: 256 little-endian int32 header words, then the tokens.
 *
 * Word 0 is the magic, word 1 the version, word 2 the token count: magic
 * 20240520 version 1 holds uint16 tokens (llm.c's GPT-2 scripts), magic
 * 20240801 version 7 uint32 tokens (its LLaMA-3 scripts). The file must be
 * exactly 1024 + width*count bytes, as llm.c insists. The header is checked
 * before any token memory is sized from it.
 */
#include <unistd.h>

#include "fsc/io.h"
#include "io/io_internal.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_V7_MAGIC 20240801
#define SHARD_V7_VERSION 7
#define SHARD_HEADER_WORDS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_WORDS * 4)
#define SHARD_EXPECTED                                                                             \
    "an llm.c shard: magic 20240520 version 1 (uint16 tokens) or magic 20240801 version 7 "        \
    "(uint32 tokens)"
/* The largest id a stream may hold: max id + 1 is its vocab, an int. */
#define MAX_TOKEN_ID 2147483646u

static uint32_t le32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* The header's version (*width: bytes per token) and count against the size. */
static int check_header(const char *path, const unsigned char *h, uint64_t size, int64_t *count,
                        int *width) {
    int32_t magic = (int32_t)le32(h), version = (int32_t)le32(h + 4), n = (int32_t)le32(h + 8);
    if (magic == SHARD_MAGIC && version == SHARD_VERSION)
        *width = 2;
    else if (magic == SHARD_V7_MAGIC && version == SHARD_V7_VERSION)
        *width = 4;
    else if (magic == SHARD_MAGIC || magic == SHARD_V7_MAGIC)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: unsupported shard version %d with magic %d (expected " SHARD_EXPECTED
                         ")",
                         path, version, magic);
    else
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: bad magic %d (expected " SHARD_EXPECTED
                         "; nanoGPT's headerless uint16 .bin is read with --data-format nanogpt)",
                         path, magic);
    if (n < 0) return fsc_error(FSC_ERR_FORMAT, "%s: negative token count %d", path, n);
    uint64_t want = SHARD_HEADER_BYTES + (uint64_t)*width * (uint64_t)n;
    if (want != size)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: header says %d %stokens (%llu bytes) but the file has "
                         "%llu bytes (%s)",
                         path, n, *width == 4 ? "uint32 " : "", (unsigned long long)want,
                         (unsigned long long)size, want > size ? "truncated?" : "trailing data");
    *count = n;
    return FSC_OK;
}

static int open_shard(const char *path, int *fd, int64_t *count, int *width) {
    uint64_t size;
    int rc = fsc_open_read(path, fd, &size);
    if (rc) return rc;
    unsigned char h[12];
    if (size < SHARD_HEADER_BYTES)
        rc = fsc_error(FSC_ERR_FORMAT,
                       "%s: %llu bytes is too short for the 1024-byte llm.c "
                       "shard header",
                       path, (unsigned long long)size);
    if (!rc) rc = fsc_pread_full(*fd, h, sizeof h, 0, path);
    if (!rc) rc = check_header(path, h, size, count, width);
    if (rc) close(*fd);
    return rc;
}

int fsc_shard_probe(const char *path, int64_t *count, int *width) {
    int fd, rc = open_shard(path, &fd, count, width);
    if (!rc) close(fd);
    return rc;
}

int fsc_shard_read(const char *path, void *dst, int width, int64_t count) {
    int fd, w = 0;
    int64_t n;
    int rc = open_shard(path, &fd, &n, &w);
    if (rc) return rc;
    if (n != count || w != width)
        rc = fsc_error(FSC_ERR_IO, "%s: changed while loading (%lld tokens, then %lld)", path,
                       (long long)count, (long long)n);
    unsigned char *b = dst;
    if (!rc) rc = fsc_pread_full(fd, b, (size_t)n * (size_t)w, SHARD_HEADER_BYTES, path);
    close(fd);
    if (w == 2) { /* little-endian on disk, host order in memory */
        uint16_t *d = dst;
        for (int64_t i = 0; !rc && i < n; i++) d[i] = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
        return rc;
    }
    int32_t *d = dst;
    for (int64_t i = 0; !rc && i < n; i++) {
        uint32_t v = le32(b + 4 * i);
        if (v > MAX_TOKEN_ID)
            return fsc_error(FSC_ERR_FORMAT, "%s: token %lld is %lu, outside [0, %u)", path,
                             (long long)i, (unsigned long)v, MAX_TOKEN_ID + 1);
        d[i] = (int32_t)v;
    }
    return rc;
}

int fsc_shard_write(const char *path, const uint16_t *tok, int64_t n) {
    if (n < 0 || n > INT32_MAX || (!tok && n))
        return fsc_error(FSC_ERR_INVALID, "fsc_shard_write: %lld tokens (expected 0..%d)",
                         (long long)n, INT32_MAX);
    unsigned char h[SHARD_HEADER_BYTES] = {0};
    int32_t words[3] = {SHARD_MAGIC, SHARD_VERSION, (int32_t)n};
    for (int w = 0; w < 3; w++)
        for (int k = 0; k < 4; k++) h[4 * w + k] = (unsigned char)((uint32_t)words[w] >> (8 * k));
    fsc_atomic_file af;
    int rc = fsc_atomic_open(&af, path);
    if (rc) return rc;
    rc = fsc_atomic_write(&af, h, sizeof h);
    for (int64_t i = 0; i < n && !rc; i++) {
        unsigned char t[2] = {(unsigned char)(tok[i] & 0xff), (unsigned char)(tok[i] >> 8)};
        rc = fsc_atomic_write(&af, t, 2);
    }
    if (rc) {
        fsc_atomic_abort(&af);
        return rc;
    }
    return fsc_atomic_commit(&af);
}
