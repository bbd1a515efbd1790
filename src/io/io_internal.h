/* Internal helpers of the io floor: whole-range reads and atomic file writes.
 *
 * An atomic file is written to `path.tmp.<pid>` and only renamed over `path`
 * after fflush + fsync succeed, so a failed save never damages an old file.
 */
#ifndef FSC_IO_INTERNAL_H
#define FSC_IO_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *fp;
    char *path;
    char *tmp;
} fsc_atomic_file;

/* Creates the temporary. On failure af is zeroed and the error names path. */
int fsc_atomic_open(fsc_atomic_file *af, const char *path);
int fsc_atomic_write(fsc_atomic_file *af, const void *data, size_t nbytes);
/* fflush + fsync + rename; on any failure the temporary is removed. Frees af's fields. */
int fsc_atomic_commit(fsc_atomic_file *af);
/* Removes the temporary and frees af's fields. Safe on a zeroed af. */
void fsc_atomic_abort(fsc_atomic_file *af);

/* Reads exactly nbytes at offset (retrying short reads); FSC_ERR_IO naming path. */
int fsc_pread_full(int fd, void *dst, size_t nbytes, uint64_t offset, const char *path);
/* Opens path read-only and reports its size; FSC_ERR_IO naming path on failure. */
int fsc_open_read(const char *path, int *fd, uint64_t *size);

/* llm.c token shards: checks magic, version and count against the file size. */
int fsc_shard_probe(const char *path, int64_t *count);
/* Reads the count tokens of a shard probed before (re-checked on the way). */
int fsc_shard_read(const char *path, uint16_t *dst, int64_t count);

#endif
