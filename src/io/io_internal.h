/* Internal helpers of the io floor: guarded opens, whole-range reads, atomic
 * file writes, unpredictable temporary names and link-safe removal.
 *
 * An atomic file is written to `path.tmp.<pid>.<random>` (created with
 * O_EXCL|O_NOFOLLOW) and only renamed over `path` after fflush + fsync
 * succeed, then the directory is fsynced: a failed save never damages an old
 * file, and a finished one survives a power cut.
 */
#ifndef FSC_IO_INTERNAL_H
#define FSC_IO_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *fp;
    char *path;
    char *tmp;
    char *mem; /* while a stage captures (ckpt_stage.h): the bytes, in memory */
    size_t mem_len;
} fsc_atomic_file;

/* Creates the temporary. On failure af is zeroed and the error names path.
 * While a checkpoint stage captures on this thread, the file is written to
 * memory instead and handed to the stage at commit (nothing on disk). */
int fsc_atomic_open(fsc_atomic_file *af, const char *path);
int fsc_atomic_write(fsc_atomic_file *af, const void *data, size_t nbytes);
/* fflush + fsync + rename; on any failure the temporary is removed. Frees af's fields. */
int fsc_atomic_commit(fsc_atomic_file *af);
/* Removes the temporary and frees af's fields. Safe on a zeroed af. */
void fsc_atomic_abort(fsc_atomic_file *af);

/* Closes f, an open_memstream over *text and *len, writes what it held to
 * path with fsc_file_write_atomic and frees *text; FSC_ERR_NOMEM naming path
 * when the stream failed (a config or index printed in memory first). */
int fsc_memstream_write_atomic(FILE *f, char **text, size_t *len, const char *path);

/* Reads exactly nbytes at offset (retrying short reads); FSC_ERR_IO naming path. */
int fsc_pread_full(int fd, void *dst, size_t nbytes, uint64_t offset, const char *path);
/* The size bytes of fd (opened by the caller, which checked size against
 * its own cap; closed here) into a new NUL-terminated *out. */
int fsc_read_fd_text(int fd, uint64_t size, const char *path, char **out);
/* Opens path read-only and reports its size; FSC_ERR_IO naming path on failure.
 * Opened with O_NONBLOCK (a FIFO cannot block) and refused unless fstat says
 * it is a regular file (FIFOs, devices, directories: named in the message). */
int fsc_open_read(const char *path, int *fd, uint64_t *size);
/* fsc_open_read that also refuses a symbolic link as the last component: for
 * files fsc wrote itself (checkpoint members, state.json, latest). */
int fsc_open_read_nofollow(const char *path, int *fd, uint64_t *size);

/* n (<= 63) random characters [a-z0-9] and a NUL into out. */
void fsc_random_name(char *out, size_t n);
/* Creates a new file prefix+<random> with O_EXCL|O_NOFOLLOW (retrying on a
 * clash); its name goes to out, the descriptor (write-only) to *fd. */
int fsc_create_unique(const char *prefix, char *out, size_t cap, int *fd);
/* Creates a new directory prefix+<random>; its name goes to out. */
int fsc_mkdir_unique(const char *prefix, char *out, size_t cap);
/* fsync of a directory (its entries: renames, creations) and of path's parent. */
int fsc_fsync_dir(const char *path);
int fsc_fsync_parent(const char *path);
/* Removes name in dirfd, or path: a file or a link is unlinked (never
 * followed), a directory emptied the same way and removed. shown names the
 * tree in messages. A missing entry is not an error. */
int fsc_remove_tree_at(int dirfd, const char *name, const char *shown);
int fsc_remove_tree(const char *path);

/* llm.c token shards (version 1: uint16 tokens, version 7: uint32): checks
 * magic, version and count against the file size; *width gets the bytes per
 * token (2 or 4). An unknown header is refused naming both versions. */
int fsc_shard_probe(const char *path, int64_t *count, int *width);
/* Reads the count tokens of a shard probed before (re-checked on the way)
 * into dst: uint16 for width 2, int32 for width 4 (ids above 2^31 - 2
 * refused). */
int fsc_shard_read(const char *path, void *dst, int width, int64_t count);

/* A stretch of file work (io_busy.c): the heartbeat reports this rank busy
 * in fsc on `what`, under FSC_IO_TIMEOUT_S, until the matching end. Nests;
 * every begin that returned FSC_OK needs its end. */
int fsc_io_busy_begin(const char *what);
void fsc_io_busy_end(void);
/* Makes both no-ops on the calling thread: a background writer's file work
 * (an asynchronous checkpoint) must not arm or clear the deadline of the
 * main thread's, which waits for it in a scope of its own. */
void fsc_io_busy_quiet(void);

/* Every finite number under node becomes a raw node holding its "%.17g"
 * text, so printing the tree keeps each double bit for bit (cJSON's own print
 * keeps 15 digits when they round-trip within an epsilon). 0 when out of
 * memory. */
struct cJSON;
int fsc_json_exact_numbers(struct cJSON *node);
/* value printed with every number exact (value itself is not changed);
 * malloc'd, NULL when out of memory. */
char *fsc_json_print_exact(const struct cJSON *value, int formatted);

#endif
