/* Low-level file plumbing for the io floor: full reads and atomic writes.
 *
 * Writers never touch the destination until the very end: data goes to a
 * temporary next to it, which is fsynced and renamed over the destination.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsc/core.h"
#include "io/io_internal.h"

int fsc_open_read(const char *path, int *fd, uint64_t *size) {
    if (!path) return fsc_error(FSC_ERR_INVALID, "path is NULL");
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0) return fsc_error(FSC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(f);
        return fsc_error(FSC_ERR_IO, "%s: not a regular file", path);
    }
    *fd = f;
    *size = (uint64_t)st.st_size;
    return FSC_OK;
}

int fsc_pread_full(int fd, void *dst, size_t nbytes, uint64_t offset, const char *path) {
    char *p = dst;
    while (nbytes > 0) {
        ssize_t r = pread(fd, p, nbytes, (off_t)offset);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return fsc_error(FSC_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return fsc_error(FSC_ERR_IO, "%s: unexpected end of file at byte %llu", path,
                             (unsigned long long)offset);
        p += r;
        nbytes -= (size_t)r;
        offset += (uint64_t)r;
    }
    return FSC_OK;
}

static void atomic_free(fsc_atomic_file *af) {
    free(af->path);
    free(af->tmp);
    memset(af, 0, sizeof *af);
}

int fsc_atomic_open(fsc_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (!path || !*path) return fsc_error(FSC_ERR_INVALID, "output path is empty");
    size_t n = strlen(path) + 32;
    af->path = malloc(strlen(path) + 1);
    af->tmp = malloc(n);
    if (!af->path || !af->tmp) {
        atomic_free(af);
        return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    }
    strcpy(af->path, path);
    snprintf(af->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    af->fp = fopen(af->tmp, "wb");
    if (!af->fp) {
        int rc = fsc_error(FSC_ERR_IO, "%s: cannot create %s: %s", path, af->tmp, strerror(errno));
        atomic_free(af);
        return rc;
    }
    return FSC_OK;
}

int fsc_atomic_write(fsc_atomic_file *af, const void *data, size_t nbytes) {
    if (nbytes && fwrite(data, 1, nbytes, af->fp) != nbytes)
        return fsc_error(FSC_ERR_IO, "%s: write failed: %s", af->tmp, strerror(errno));
    return FSC_OK;
}

void fsc_atomic_abort(fsc_atomic_file *af) {
    if (af->fp) fclose(af->fp);
    if (af->tmp) unlink(af->tmp);
    atomic_free(af);
}

int fsc_atomic_commit(fsc_atomic_file *af) {
    int rc = FSC_OK;
    if (fflush(af->fp) != 0 || fsync(fileno(af->fp)) != 0)
        rc = fsc_error(FSC_ERR_IO, "%s: flush failed: %s", af->tmp, strerror(errno));
    int closed = fclose(af->fp);
    af->fp = NULL;
    if (rc == FSC_OK && closed != 0)
        rc = fsc_error(FSC_ERR_IO, "%s: close failed: %s", af->tmp, strerror(errno));
    if (rc == FSC_OK && rename(af->tmp, af->path) != 0)
        rc =
            fsc_error(FSC_ERR_IO, "cannot rename %s to %s: %s", af->tmp, af->path, strerror(errno));
    if (rc != FSC_OK) unlink(af->tmp);
    atomic_free(af);
    return rc;
}
