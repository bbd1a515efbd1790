/* The checkpoint directory as a whole: which steps it holds, what `latest`
 * says, which temporaries belong to writers that died, and pruning.
 *
 * The one idea: nothing here follows a symbolic link or removes a name it did
 * not make itself. A stale temporary is recognised by its name (made by
 * ckpt_writer_tag) and removed only when the writer's pid is gone on this
 * host; removal goes through unlinkat/openat(O_NOFOLLOW).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/fault.h"
#include "fsc/core.h"
#include "io/checkpoint_internal.h"
#include "io/io_internal.h"

bool ckpt_step_name(const char *name, int64_t *step) {
    if (strncmp(name, "step-", 5) != 0) return false;
    const char *d = name + 5;
    size_t n = strspn(d, "0123456789");
    if (n == 0 || n > 16 || d[n] != '\0') return false;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) v = v * 10 + (d[i] - '0');
    *step = v;
    return true;
}

/* The host name with '-' and odd characters replaced, so a tag splits on '-'. */
static void host_name(char *out, size_t cap) {
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) != 0 || !h[0]) strcpy(h, "localhost");
    size_t i = 0;
    for (; h[i] && i + 1 < cap && i < 64; i++) {
        char c = h[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_';
        out[i] = ok ? c : '_';
    }
    out[i] = '\0';
}

void ckpt_writer_tag(char *out, size_t cap) {
    char host[80];
    host_name(host, sizeof host);
    snprintf(out, cap, "%ld-%s-", (long)getpid(), host);
}

int ckpt_read_latest(const char *dir, char *name, size_t cap, int64_t *step) {
    char path[CKPT_PATH_LEN];
    snprintf(path, sizeof path, "%s/latest", dir);
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT)
        return fsc_error(FSC_ERR_NOT_FOUND, "%s: no latest", dir);
    int fd;
    uint64_t size;
    int rc = fsc_open_read_nofollow(path, &fd, &size);
    if (rc) return rc;
    char buf[64] = "";
    ssize_t got = size < sizeof buf ? pread(fd, buf, sizeof buf - 1, 0) : -1;
    close(fd);
    if (got < 0)
        return fsc_error(FSC_ERR_FORMAT, "%s: %llu bytes, not one line naming a step directory",
                         path, (unsigned long long)size);
    buf[got] = '\0';
    size_t len = strcspn(buf, "\n");
    bool one_line = buf[len] == '\0' || (buf[len] == '\n' && buf[len + 1] == '\0');
    buf[len] = '\0';
    if (!one_line || !ckpt_step_name(buf, step))
        return fsc_error(FSC_ERR_FORMAT, "%s: does not name a step directory (\"%s\")", path, buf);
    snprintf(name, cap, "%s", buf);
    return FSC_OK;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ckpt_list_steps(const char *dir, int64_t **steps, int *n) {
    *steps = NULL;
    *n = 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno == ENOENT || errno == ENOTDIR
                   ? FSC_OK
                   : fsc_error(FSC_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return fsc_error(FSC_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    }
    int rc = FSC_OK, cap = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        int64_t s;
        struct stat st;
        if (!ckpt_step_name(e->d_name, &s)) continue;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *g = realloc(*steps, sizeof *g * (size_t)cap);
            if (!g) {
                rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory listing checkpoints", dir);
                break;
            }
            *steps = g;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (rc) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return rc;
    }
    if (*n) qsort(*steps, (size_t)*n, sizeof **steps, cmp_desc);
    return FSC_OK;
}

/* A hidden temporary's writer: ".<x>.tmp-<pid>-<host>-<r>" (or .del-); false
 * for any other name. */
static bool temp_owner(const char *name, long *pid, char *host, size_t cap) {
    if (name[0] != '.') return false;
    const char *m = strstr(name, ".tmp-");
    if (!m) m = strstr(name, ".del-");
    if (!m) return false;
    const char *p = m + 5;
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || *end != '-' || v <= 0) return false;
    const char *h = end + 1, *dash = strchr(h, '-');
    if (!dash || (size_t)(dash - h) >= cap || strchr(dash + 1, '-')) return false;
    memcpy(host, h, (size_t)(dash - h));
    host[dash - h] = '\0';
    *pid = v;
    return true;
}

int ckpt_clean_stale(const char *dir) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return 0;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    char here[80], host[80];
    host_name(here, sizeof here);
    int removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        long pid;
        if (!temp_owner(e->d_name, &pid, host, sizeof host) || strcmp(host, here) != 0) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char shown[CKPT_PATH_LEN];
        snprintf(shown, sizeof shown, "%s/%s", dir, e->d_name);
        if (fsc_remove_tree_at(dfd, e->d_name, shown) == FSC_OK) {
            fsc_log(FSC_LOG_WARN, "checkpoint: removed %s, left by writer %ld, which is gone",
                    shown, pid);
            removed++;
        }
    }
    closedir(d);
    return removed;
}

int ckpt_rename_noreplace(const char *from, const char *to) {
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return FSC_OK;
    if (errno == EINVAL || errno == ENOSYS) { /* a file system without RENAME_NOREPLACE */
        struct stat st;
        if (lstat(to, &st) == 0)
            errno = EEXIST;
        else if (rename(from, to) == 0)
            return FSC_OK;
    }
    return fsc_error(FSC_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
}

/* keep[i] for the keep_best of steps[0..n) (up to newest) with the lowest
 * `key`: a selection by repeated minimum, n being a few hundred at most. */
static void mark_best(const char *dir, const int64_t *steps, int n, int64_t newest, int keep_best,
                      const char *key, bool *keep) {
    double *v = malloc((size_t)n * sizeof *v);
    bool *taken = calloc((size_t)n, sizeof *taken);
    for (int i = 0; v && taken && i < n; i++)
        if (steps[i] > newest || ckpt_meta_number(dir, steps[i], key, &v[i]) || isnan(v[i]))
            taken[i] = true, fsc_clear_error(); /* not a candidate */
    for (int k = 0; v && taken && k < keep_best; k++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && (best < 0 || v[i] < v[best])) best = i;
        if (best < 0) break;
        taken[best] = keep[best] = true;
    }
    free(v);
    free(taken);
}

int ckpt_prune(const char *dir, int64_t newest, int keep_last, int keep_best, const char *key) {
    if (keep_last <= 0 && keep_best <= 0) return FSC_OK;
    int64_t *steps;
    int n, rc = ckpt_list_steps(dir, &steps, &n), kept = 0;
    bool *keep = rc || n == 0 ? NULL : calloc((size_t)n, sizeof *keep);
    if (!rc && n > 0 && !keep) rc = fsc_error(FSC_ERR_NOMEM, "checkpoint %s: out of memory", dir);
    if (!rc && keep_best > 0) mark_best(dir, steps, n, newest, keep_best, key, keep);
    char tag[128];
    ckpt_writer_tag(tag, sizeof tag);
    const int last = keep_last > 0 ? keep_last : 1; /* the newest always stays */
    for (int i = 0; i < n && !rc; i++) {
        if (steps[i] > newest) continue;
        if (kept++ < last || keep[i]) continue;
        char from[CKPT_PATH_LEN], prefix[CKPT_PATH_LEN], aside[CKPT_PATH_LEN], rnd[13];
        snprintf(from, sizeof from, "%s/step-%06" PRId64, dir, steps[i]);
        snprintf(prefix, sizeof prefix, "%s/.step-%06" PRId64 ".del-%s", dir, steps[i], tag);
        fsc_random_name(rnd, 12);
        if ((size_t)snprintf(aside, sizeof aside, "%s%s", prefix, rnd) >= sizeof aside) {
            rc = fsc_error(FSC_ERR_INVALID, "%s: path too long", from);
            break;
        }
        /* out of sight first: a crash mid-removal leaves a stale temporary,
         * never a half-deleted step directory that looks like a checkpoint */
        rc = ckpt_rename_noreplace(from, aside);
        if (!rc) fsc_fault_ckpt_point(FSC_CKPT_POINT_PRUNE_ASIDE);
        if (!rc) rc = fsc_remove_tree(aside);
        if (!rc) fsc_fault_ckpt_point(FSC_CKPT_POINT_PRUNED);
    }
    free(steps);
    free(keep);
    if (!rc) rc = fsc_fsync_dir(dir);
    return rc ? fsc_error_context(rc,
                                  "checkpoint %s: pruning to the last %d and the best %d: ", dir,
                                  keep_last, keep_best)
              : FSC_OK;
}

int ckpt_file_crc(const char *path, uint32_t *crc, int64_t *size) {
    int fd;
    uint64_t st_size;
    int rc = fsc_open_read_nofollow(path, &fd, &st_size);
    if (rc) return rc;
    static _Thread_local unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    int64_t n = 0;
    for (;;) {
        ssize_t got = read(fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            rc = fsc_error(FSC_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (got == 0) break;
        c = crc32(c, buf, (uInt)got);
        n += got;
    }
    close(fd);
    if (rc) return rc;
    *crc = (uint32_t)c;
    *size = n;
    return FSC_OK;
}
