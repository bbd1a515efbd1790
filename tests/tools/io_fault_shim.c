/* A disk that fails or is slow, below fsc and below MPI: an LD_PRELOAD
 * library wrapping the write, pwrite(v), writev, fsync and fdatasync calls
 * of one process, for the fault tests (tests/tools/train_e2e_io.py). Open
 * MPI's MPI-IO writes through these (its posix fbtl), and fsc's own files
 * do through write and fsync; glibc's stdio writes through an internal
 * symbol, so a stdio file's failure is injected at its fsync, where a real
 * write-back error is reported too.
 *
 * Set in the environment (unset: the call passes through):
 *   FSC_SHIM_PATH   a substring of the file's path (/proc/self/fd) that selects it
 *   FSC_SHIM_RANK   only in the MPI rank of that number (OMPI_COMM_WORLD_RANK,
 *                   PMI_RANK); unset: every process
 *   FSC_SHIM_WRITE  EIO or ENOSPC: writes reaching FSC_SHIM_FROM (a byte offset,
 *                   default 0) fail with it; one straddling it is cut short there.
 *                   GARBLE: they succeed, but the bytes from FSC_SHIM_FROM on
 *                   land as zeros (a lost write that reports success)
 *   FSC_SHIM_FSYNC  EIO: fsync and fdatasync of the file fail
 *   FSC_SHIM_DELAY_MS  each selected write and fsync first sleeps this long
 *   FSC_SHIM_DELAY_ON  "fsync": only fsync and fdatasync sleep (a directory's
 *                      too), the writes do not; "dirsync": only a directory's
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef int (*sync_fn)(int);

/* real_<name>: the next definition of name (libc's), looked up once. */
#define REAL(name, type)                                                                           \
    static type real_##name;                                                                       \
    if (!real_##name) *(void **)&real_##name = dlsym(RTLD_NEXT, #name)

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Whether fd is a file this process's fault applies to. */
static int selected(int fd) {
    const char *want = env("FSC_SHIM_PATH"), *rank = env("FSC_SHIM_RANK");
    if (!want) return 0;
    if (rank) {
        const char *mine = env("OMPI_COMM_WORLD_RANK");
        if (!mine) mine = env("PMI_RANK");
        if (!mine || strcmp(mine, rank)) return 0;
    }
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = '\0';
    return strstr(path, want) != NULL;
}

/* is_sync: called for an fsync or fdatasync of fd, else for a write. */
static void delay(bool is_sync, int fd) {
    const char *ms = env("FSC_SHIM_DELAY_MS"), *on = env("FSC_SHIM_DELAY_ON");
    struct stat st;
    const bool dirs = on && !strcmp(on, "dirsync");
    if (!ms || (!is_sync && on && !strcmp(on, "fsync"))) return;
    if (dirs && (!is_sync || fstat(fd, &st) || !S_ISDIR(st.st_mode))) return;
    long v = strtol(ms, NULL, 10);
    struct timespec ts = {v / 1000, (v % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int write_errno(void) {
    const char *e = env("FSC_SHIM_WRITE");
    return !e || !strcmp(e, "GARBLE") ? 0 : !strcmp(e, "ENOSPC") ? ENOSPC : EIO;
}

static off_t from_offset(void) {
    const char *f = env("FSC_SHIM_FROM");
    return f ? (off_t)strtoll(f, NULL, 10) : 0;
}

/* How many of n bytes at off may be written: n, fewer (cut at FSC_SHIM_FROM),
 * or -1 with errno set. */
static ssize_t allowed(int fd, off_t off, size_t n) {
    if (!selected(fd)) return (ssize_t)n;
    delay(false, fd);
    const int e = write_errno();
    const off_t from = from_offset();
    if (!e || n == 0) return (ssize_t)n;
    if (off >= from) {
        errno = e;
        return -1;
    }
    return (off_t)n > from - off ? (ssize_t)(from - off) : (ssize_t)n;
}

/* Under GARBLE, a copy of the n bytes at off (the iovecs joined) with those
 * from FSC_SHIM_FROM on zeroed; NULL when the write goes through as it is. */
static char *garbled(int fd, off_t off, const struct iovec *iov, int cnt, size_t n) {
    const char *e = env("FSC_SHIM_WRITE");
    const off_t from = from_offset();
    if (!e || strcmp(e, "GARBLE") || off + (off_t)n <= from || !selected(fd)) return NULL;
    char *copy = malloc(n ? n : 1);
    if (!copy) return NULL;
    size_t at = 0;
    for (int i = 0; i < cnt; i++)
        memcpy(copy + at, iov[i].iov_base, iov[i].iov_len), at += iov[i].iov_len;
    const size_t keep = off >= from ? 0 : (size_t)(from - off);
    memset(copy + keep, 0, n - keep);
    return copy;
}

static size_t iov_bytes(const struct iovec *iov, int cnt) {
    size_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    return n;
}

/* The one place every wrapped write goes: at off, or at the file position
 * when positioned is false. */
static ssize_t shim_write(int fd, const struct iovec *iov, int cnt, off_t off, bool positioned) {
    REAL(pwritev, pwritev_fn);
    REAL(writev, writev_fn);
    if (!positioned) off = lseek(fd, 0, SEEK_CUR);
    const size_t total = iov_bytes(iov, cnt);
    ssize_t k = allowed(fd, off, total);
    if (k < 0) return -1;
    char *copy = garbled(fd, off, iov, cnt, total);
    struct iovec one = {copy, total};
    if (copy) iov = &one, cnt = 1;
    if ((size_t)k < total) { /* cut short: the first iovec's part of the k bytes */
        one.iov_base = iov[0].iov_base;
        one.iov_len = iov[0].iov_len < (size_t)k ? iov[0].iov_len : (size_t)k;
        iov = &one, cnt = 1;
    }
    ssize_t r = positioned ? real_pwritev(fd, iov, cnt, off) : real_writev(fd, iov, cnt);
    free(copy);
    return r;
}

ssize_t write(int fd, const void *buf, size_t n) {
    struct iovec v = {(void *)buf, n};
    return shim_write(fd, &v, 1, 0, false);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    return shim_write(fd, iov, cnt, 0, false);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    struct iovec v = {(void *)buf, n};
    return shim_write(fd, &v, 1, off, true);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    return pwrite(fd, buf, n, off);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    return shim_write(fd, iov, cnt, off, true);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) {
    return pwritev(fd, iov, cnt, off);
}

static int sync_fault(int fd) {
    if (!selected(fd)) return 0;
    delay(true, fd);
    const char *e = env("FSC_SHIM_FSYNC");
    if (!e) return 0;
    errno = EIO;
    return -1;
}

int fsync(int fd) {
    REAL(fsync, sync_fn);
    return sync_fault(fd) ? -1 : real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync, sync_fn);
    return sync_fault(fd) ? -1 : real_fdatasync(fd);
}
