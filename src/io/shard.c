/* llm.c token shards: 256 little-endian int32 header words, then uint16 tokens.
 *
 * Word 0 is the magic 20240520, word 1 the version (1), word 2 the token
 * count; the file must be exactly 1024 + 2*count bytes, as llm.c insists.
 * The header is checked before any token memory is sized from it.
 */
#include <unistd.h>

#include "fsc/io.h"
#include "io/io_internal.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_WORDS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_WORDS * 4)

static int32_t le32(const unsigned char *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24);
}

static int check_header(const char *path, const unsigned char *h, uint64_t size, int64_t *count) {
    int32_t magic = le32(h), version = le32(h + 4), n = le32(h + 8);
    if (magic != SHARD_MAGIC)
        return fsc_error(FSC_ERR_FORMAT, "%s: bad magic %d (an llm.c shard starts with %d)", path,
                         magic, SHARD_MAGIC);
    if (version != SHARD_VERSION)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: unsupported shard version %d (expected %d: uint16 "
                         "tokens)",
                         path, version, SHARD_VERSION);
    if (n < 0) return fsc_error(FSC_ERR_FORMAT, "%s: negative token count %d", path, n);
    uint64_t want = SHARD_HEADER_BYTES + 2 * (uint64_t)n;
    if (want > size)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: header says %d tokens (%llu bytes) but the file has "
                         "%llu bytes (truncated?)",
                         path, n, (unsigned long long)want, (unsigned long long)size);
    if (want < size)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: header says %d tokens (%llu bytes) but the file has "
                         "%llu bytes (trailing data)",
                         path, n, (unsigned long long)want, (unsigned long long)size);
    *count = n;
    return FSC_OK;
}

static int open_shard(const char *path, int *fd, int64_t *count) {
    uint64_t size;
    int rc = fsc_open_read(path, fd, &size);
    if (rc) return rc;
    unsigned char h[SHARD_HEADER_BYTES];
    if (size < SHARD_HEADER_BYTES)
        rc = fsc_error(FSC_ERR_FORMAT,
                       "%s: %llu bytes is too short for the 1024-byte llm.c "
                       "shard header",
                       path, (unsigned long long)size);
    if (!rc) rc = fsc_pread_full(*fd, h, sizeof h, 0, path);
    if (!rc) rc = check_header(path, h, size, count);
    if (rc) close(*fd);
    return rc;
}

int fsc_shard_probe(const char *path, int64_t *count) {
    int fd, rc = open_shard(path, &fd, count);
    if (!rc) close(fd);
    return rc;
}

int fsc_shard_read(const char *path, uint16_t *dst, int64_t count) {
    int fd;
    int64_t n;
    int rc = open_shard(path, &fd, &n);
    if (rc) return rc;
    if (n != count)
        rc = fsc_error(FSC_ERR_IO, "%s: changed while loading (%lld tokens, then %lld)", path,
                       (long long)count, (long long)n);
    unsigned char *b = (unsigned char *)dst;
    if (!rc) rc = fsc_pread_full(fd, b, (size_t)n * 2, SHARD_HEADER_BYTES, path);
    close(fd);
    for (int64_t i = 0; !rc && i < n; i++) /* little-endian on disk, host order in memory */
        dst[i] = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
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
