/* The io floor's guarded files for programs above it (the tools): reads that
 * take only regular files (a FIFO cannot block them, /dev/zero cannot grow
 * them) up to a stated size, and whole-file writes that land atomically
 * through an unpredictable temporary (a link planted at a fixed name is
 * never followed). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/io.h"
#include "io/io_internal.h"

int fsc_file_read_all(const char *path, size_t max_bytes, char **data, size_t *len) {
    if (!path || !data) return fsc_error(FSC_ERR_INVALID, "file read: needs a path and an output");
    *data = NULL;
    if (len) *len = 0;
    int fd;
    uint64_t size;
    int rc = fsc_open_read(path, &fd, &size);
    if (rc) return rc;
    if (size > max_bytes) {
        close(fd);
        return fsc_error(FSC_ERR_IO, "%s: %llu bytes, more than the %zu this file may have", path,
                         (unsigned long long)size, max_bytes);
    }
    if ((rc = fsc_read_fd_text(fd, size, path, data))) return rc;
    if (len) *len = (size_t)size;
    return FSC_OK;
}

int fsc_file_open_read(const char *path, FILE **out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "file open: needs an output");
    *out = NULL;
    int fd;
    uint64_t size;
    int rc = fsc_open_read(path, &fd, &size);
    if (rc) return rc;
    /* a regular file: its reads never block, so the open's O_NONBLOCK goes */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (!(*out = fdopen(fd, "rb"))) {
        close(fd);
        return fsc_error(FSC_ERR_NOMEM, "%s: cannot open a stream on it", path);
    }
    return FSC_OK;
}

int fsc_file_write_atomic(const char *path, const void *data, size_t n) {
    if (!data && n) return fsc_error(FSC_ERR_INVALID, "%s: nothing to write", path ? path : "");
    fsc_atomic_file af;
    int rc = fsc_atomic_open(&af, path);
    if (rc) return rc;
    rc = fsc_atomic_write(&af, data, n);
    if (rc) {
        fsc_atomic_abort(&af);
        return rc;
    }
    return fsc_atomic_commit(&af);
}

int fsc_memstream_write_atomic(FILE *f, char **text, size_t *len, const char *path) {
    const bool bad = ferror(f) | (fclose(f) != 0);
    int rc = bad || !*text ? fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path)
                           : fsc_file_write_atomic(path, *text, *len);
    free(*text);
    *text = NULL;
    return rc;
}
