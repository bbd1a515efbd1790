/* Low-level file plumbing for the io floor: guarded opens, full reads, atomic
 * writes, unpredictable temporary names and removal that never follows links.
 *
 * The one idea: a path names something fsc did not choose, so it is opened
 * without blocking (a FIFO or a device cannot stall open()) and fstat decides
 * whether it is a regular file before a single byte is read. Writers never
 * touch the destination until the very end: data goes to a temporary with an
 * unpredictable name created with O_EXCL|O_NOFOLLOW next to it, which is
 * fsynced, renamed over the destination, and the directory fsynced.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsc/core.h"
#include "io/ckpt_stage.h"
#include "io/io_internal.h"

static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

static int open_regular(const char *path, int *fd, uint64_t *size, int extra) {
    if (!path) return fsc_error(FSC_ERR_INVALID, "path is NULL");
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | extra);
    if (f < 0 && errno == ELOOP && (extra & O_NOFOLLOW))
        return fsc_error(FSC_ERR_IO,
                         "%s: is a symbolic link, which fsc does not follow for files it wrote "
                         "itself",
                         path);
    if (f < 0) return fsc_error(FSC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0) {
        int rc = fsc_error(FSC_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(f);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return fsc_error(FSC_ERR_IO, "%s: is %s, not a regular file; refusing to read it", path,
                         kind_of(st.st_mode));
    }
    int fl = fcntl(f, F_GETFL); /* back to blocking reads: a regular file never waits */
    if (fl >= 0) (void)fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    *size = (uint64_t)st.st_size;
    return FSC_OK;
}

int fsc_open_read(const char *path, int *fd, uint64_t *size) {
    return open_regular(path, fd, size, 0);
}

int fsc_open_read_nofollow(const char *path, int *fd, uint64_t *size) {
    return open_regular(path, fd, size, O_NOFOLLOW);
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

int fsc_read_fd_text(int fd, uint64_t size, const char *path, char **out) {
    char *buf = malloc((size_t)size + 1);
    int rc = buf ? fsc_pread_full(fd, buf, (size_t)size, 0, path)
                 : fsc_error(FSC_ERR_NOMEM, "%s: out of memory for %llu bytes", path,
                             (unsigned long long)size);
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[size] = '\0';
    *out = buf;
    return FSC_OK;
}

/* ---- names nobody can guess ------------------------------------------------ */

void fsc_random_name(char *out, size_t n) {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    static _Atomic uint64_t counter;
    unsigned char r[64];
    size_t want = n < sizeof r ? n : sizeof r;
    if (getrandom(r, want, GRND_NONBLOCK) != (ssize_t)want) {
        /* no entropy yet (early boot): still unique within the process, and
         * O_EXCL keeps a guessed name from being used against us */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                     ((uint64_t)getpid() << 40) ^
                     atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15u;
        for (size_t i = 0; i < want; i++) {
            x ^= x >> 31, x *= 0xBF58476D1CE4E5B9u, x ^= x >> 29;
            r[i] = (unsigned char)x;
        }
    }
    for (size_t i = 0; i < want; i++) out[i] = alphabet[r[i] % (sizeof alphabet - 1)];
    out[want] = '\0';
}

int fsc_create_unique(const char *prefix, char *out, size_t cap, int *fd) {
    for (int attempt = 0; attempt < 16; attempt++) {
        char rnd[13];
        fsc_random_name(rnd, 12);
        if ((size_t)snprintf(out, cap, "%s%s", prefix, rnd) >= cap)
            return fsc_error(FSC_ERR_INVALID, "%s: path too long for a temporary name", prefix);
        int f = open(out, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (f >= 0) {
            *fd = f;
            return FSC_OK;
        }
        if (errno != EEXIST)
            return fsc_error(FSC_ERR_IO, "%s: cannot create: %s", out, strerror(errno));
    }
    return fsc_error(FSC_ERR_IO, "%s*: no free temporary name after 16 tries", prefix);
}

int fsc_mkdir_unique(const char *prefix, char *out, size_t cap) {
    for (int attempt = 0; attempt < 16; attempt++) {
        char rnd[13];
        fsc_random_name(rnd, 12);
        if ((size_t)snprintf(out, cap, "%s%s", prefix, rnd) >= cap)
            return fsc_error(FSC_ERR_INVALID, "%s: path too long for a temporary name", prefix);
        if (mkdir(out, 0777) == 0) return FSC_OK; /* mkdir never follows a planted link */
        if (errno != EEXIST)
            return fsc_error(FSC_ERR_IO, "%s: cannot create: %s", out, strerror(errno));
    }
    return fsc_error(FSC_ERR_IO, "%s*: no free temporary name after 16 tries", prefix);
}

/* ---- durability ------------------------------------------------------------- */

int fsc_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return fsc_error(FSC_ERR_IO, "%s: cannot open the directory to sync it: %s", path,
                         strerror(errno));
    int rc = fsync(fd) == 0 || errno == EINVAL /* a file system without directory sync */
                 ? FSC_OK
                 : fsc_error(FSC_ERR_IO, "%s: directory fsync failed: %s", path, strerror(errno));
    close(fd);
    return rc;
}

int fsc_fsync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return fsc_fsync_dir(".");
    if (slash == path) return fsc_fsync_dir("/");
    size_t n = (size_t)(slash - path);
    char *parent = malloc(n + 1);
    if (!parent) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    memcpy(parent, path, n);
    parent[n] = '\0';
    int rc = fsc_fsync_dir(parent);
    free(parent);
    return rc;
}

/* ---- removal that never follows a link -------------------------------------- */

static int remove_at(int dfd, const char *name, const char *shown, int depth) {
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) return FSC_OK; /* files and links */
    if (errno != EISDIR && errno != EPERM)
        return fsc_error(FSC_ERR_IO, "%s: cannot remove %s: %s", shown, name, strerror(errno));
    if (depth > 16) return fsc_error(FSC_ERR_IO, "%s: nested too deeply to remove", shown);
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return fsc_error(FSC_ERR_IO, "%s: cannot open %s: %s", shown, name, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return fsc_error(FSC_ERR_IO, "%s: cannot list %s: %s", shown, name, strerror(errno));
    }
    int rc = FSC_OK;
    for (struct dirent *e; !rc && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            rc = remove_at(fd, e->d_name, shown, depth + 1);
    closedir(d);
    if (!rc && unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        rc = fsc_error(FSC_ERR_IO, "%s: cannot remove directory %s: %s", shown, name,
                       strerror(errno));
    return rc;
}

int fsc_remove_tree_at(int dirfd, const char *name, const char *shown) {
    return remove_at(dirfd, name, shown, 0);
}

int fsc_remove_tree(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    int dfd;
    if (!slash) {
        dfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        char *parent = malloc(n + 1);
        if (!parent) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
        memcpy(parent, path, n);
        parent[n] = '\0';
        dfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        free(parent);
    }
    if (dfd < 0)
        return fsc_error(FSC_ERR_IO, "%s: cannot open its directory: %s", path, strerror(errno));
    int rc = remove_at(dfd, name, path, 0);
    close(dfd);
    return rc;
}

/* ---- atomic files ------------------------------------------------------------ */

static void atomic_free(fsc_atomic_file *af) {
    free(af->path);
    free(af->tmp);
    free(af->mem);
    memset(af, 0, sizeof *af);
}

int fsc_atomic_open(fsc_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (!path || !*path) return fsc_error(FSC_ERR_INVALID, "output path is empty");
    if (ckpt_stage_current()) { /* an asynchronous save's capture */
        af->path = strdup(path);
        if (af->path) af->fp = open_memstream(&af->mem, &af->mem_len);
        if (af->fp) return FSC_OK;
        atomic_free(af);
        return fsc_error(FSC_ERR_NOMEM, "%s: out of memory staging it", path);
    }
    size_t n = strlen(path) + 64;
    af->path = malloc(strlen(path) + 1);
    af->tmp = malloc(n);
    char *prefix = malloc(n);
    if (!af->path || !af->tmp || !prefix) {
        free(prefix);
        atomic_free(af);
        return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    }
    strcpy(af->path, path);
    snprintf(prefix, n, "%s.tmp.%ld.", path, (long)getpid());
    int fd = -1;
    int rc = fsc_create_unique(prefix, af->tmp, n, &fd);
    free(prefix);
    if (!rc && !(af->fp = fdopen(fd, "wb"))) {
        rc = fsc_error(FSC_ERR_IO, "%s: cannot open %s: %s", path, af->tmp, strerror(errno));
        close(fd);
        unlink(af->tmp);
    }
    /* 1 MiB writes, not stdio's 4 KiB: a weights file is a few calls */
    if (!rc) setvbuf(af->fp, NULL, _IOFBF, (size_t)1 << 20);
    if (rc) {
        rc = fsc_error_context(rc, "%s: cannot create its temporary: ", path);
        atomic_free(af);
        return rc;
    }
    return FSC_OK;
}

int fsc_atomic_write(fsc_atomic_file *af, const void *data, size_t nbytes) {
    if (nbytes && fwrite(data, 1, nbytes, af->fp) != nbytes)
        return fsc_error(FSC_ERR_IO, "%s: write failed: %s", af->tmp ? af->tmp : af->path,
                         strerror(errno));
    return FSC_OK;
}

void fsc_atomic_abort(fsc_atomic_file *af) {
    if (af->fp) fclose(af->fp);
    if (af->tmp) unlink(af->tmp);
    atomic_free(af);
}

int fsc_atomic_commit(fsc_atomic_file *af) {
    int rc = FSC_OK;
    if (!af->tmp) { /* captured: the bytes go to the stage, written later */
        if (fclose(af->fp) != 0)
            rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory staging it", af->path);
        af->fp = NULL;
        if (!rc)
            rc = ckpt_stage_add_file(ckpt_stage_current(), af->path, af->mem, af->mem_len);
        else
            free(af->mem);
        af->mem = NULL;
        atomic_free(af);
        return rc;
    }
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
    if (rc == FSC_OK) rc = fsc_fsync_parent(af->path); /* the rename itself must survive a crash */
    atomic_free(af);
    return rc;
}
