/* Launch consistency: every rank must run with the same effective settings.
 *
 * The one idea: each rank reduces every flag of the table (train_options.c)
 * to a 64-bit hash of its effective value, adds the identity of the files it
 * will read (size and crc32 of the first and last 64 KiB of each) and the
 * library's version, and one allgather of those hashes lets every rank name,
 * identically, each field that differs and which ranks hold which value.
 *
 * Compared by value: every flag but the following.
 * Compared by presence only (set on some ranks, unset on others, is a
 * mismatch; the path itself is rank 0's alone): --save, --save-init and
 * --trace, whose writes are collectives that rank 0 completes.
 * Exempt, because they may differ per rank by design: --metrics, --metrics-csv, --quiet,
 * --log-every, --log-seconds, --progress and --print-schedule (output only rank 0 makes;
 * fsc-train opens --metrics on rank 0 only, sets --quiet on the others), --threads
 * (a per-process resource: cores per node may differ; every strategy across
 * ranks reduces gradients, so the training does not depend on it) and
 * --config (its file's flags are compared one by one as effective values). */
#define _POSIX_C_SOURCE 200809L /* pread, glob, strtok_r, strdup */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fsc/version.h"
#include "train_common.h"

#define EDGE_BYTES 65536 /* bytes hashed at each end of a file */

typedef enum { BY_VALUE, BY_PRESENCE, EXEMPT } compare_mode;

static compare_mode mode_of(const char *flag) {
    static const char *const presence[] = {"save", "save-dir", "save-init", "trace", "profile"};
    static const char *const exempt[] = {"metrics",   "metrics-csv", "quiet",
                                         "log-every", "log-seconds", "print-schedule",
                                         "threads",   "config",      "progress"};
    for (size_t i = 0; i < sizeof presence / sizeof *presence; i++)
        if (!strcmp(flag, presence[i])) return BY_PRESENCE;
    for (size_t i = 0; i < sizeof exempt / sizeof *exempt; i++)
        if (!strcmp(flag, exempt[i])) return EXEMPT;
    return BY_VALUE;
}

/* FNV-1a, 64 bits: enough to tell settings apart, not a defence. */
static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
#define HASH_SEED 0xcbf29ce484222325ull

static uint64_t mix_str(uint64_t h, const char *s) {
    return mix(h, s, strlen(s) + 1);
}

/* crc32 of n bytes at offset off (fewer if the file is shorter). */
static uint32_t crc_at(int fd, off_t off, size_t n, unsigned char *buf) {
    ssize_t got = pread(fd, buf, n, off);
    return (uint32_t)crc32(0L, buf, got > 0 ? (uInt)got : 0);
}

/* One file's identity: its size and both ends' crc32. Opened without blocking
 * and read only when regular (a FIFO or device is hashed by its kind); a file
 * that cannot be opened hashes as its errno, so the loader reports it, and a
 * file missing on some ranks only is a difference. */
static uint64_t mix_file(uint64_t h, const char *path, unsigned char *buf) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return mix(mix_str(h, "unreadable"), &e, sizeof e);
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        uint32_t kind = fstat(fd, &st) ? 0 : (uint32_t)(st.st_mode & S_IFMT);
        close(fd);
        return mix(mix_str(h, "not a regular file"), &kind, sizeof kind);
    }
    int64_t size = st.st_size;
    uint32_t first = crc_at(fd, 0, EDGE_BYTES, buf);
    uint32_t last = crc_at(fd, size > EDGE_BYTES ? size - EDGE_BYTES : 0, EDGE_BYTES, buf);
    close(fd);
    h = mix(h, &size, sizeof size);
    h = mix(h, &first, sizeof first);
    return mix(h, &last, sizeof last);
}

/* The identity of a --data-style list: builtin[:...] is its text; else each
 * comma item, a glob expanded in glob's sorted order. */
static int spec_hash(const char *spec, uint64_t *out) {
    uint64_t h = HASH_SEED;
    if (!spec || !strncmp(spec, "builtin", 7)) {
        *out = mix_str(h, spec ? spec : "(unset)");
        return FSC_OK;
    }
    char *copy = strdup(spec), *save = NULL;
    unsigned char *buf = malloc(EDGE_BYTES);
    if (!copy || !buf) {
        free(copy), free(buf);
        return fsc_error(FSC_ERR_NOMEM, "out of memory");
    }
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        glob_t g;
        if (strpbrk(item, "*?[") && !glob(item, 0, NULL, &g)) {
            for (size_t i = 0; i < g.gl_pathc; i++) h = mix_file(h, g.gl_pathv[i], buf);
            globfree(&g);
        } else {
            h = mix_file(h, item, buf);
        }
    }
    free(copy), free(buf);
    *out = h;
    return FSC_OK;
}

/* Fields beyond the flag table: file contents, and the library itself. */
static const char *const extra_names[] = {"--data (contents: size, crc32 of first/last 64 KiB)",
                                          "--val-data (contents)", "--init-from (contents)",
                                          "fsc version"};
#define N_EXTRA (int)(sizeof extra_names / sizeof *extra_names)

/* Appends "rank 0" / "ranks 0,2" for each group of equal hashes to msg. */
static void name_groups(const int64_t *all, int world, int nfields, int k, char *msg, size_t n) {
    bool *done = calloc((size_t)world, sizeof *done);
    if (!done) return;
    for (int r = 0; r < world; r++) {
        if (done[r]) continue;
        size_t len = strlen(msg);
        int members = 0;
        for (int q = r; q < world; q++)
            members += all[(size_t)q * nfields + k] == all[(size_t)r * nfields + k];
        snprintf(msg + len, n - len, "%s%s ", r ? " vs " : "", members > 1 ? "ranks" : "rank");
        bool first = true;
        for (int q = r; q < world; q++) {
            if (all[(size_t)q * nfields + k] != all[(size_t)r * nfields + k]) continue;
            done[q] = true;
            len = strlen(msg);
            snprintf(msg + len, n - len, "%s%d", first ? "" : ",", q);
            first = false;
        }
    }
    free(done);
}

int train_consistency_check(const train_options *o) {
    const int world = fsc_dist_size(), rank = fsc_dist_rank();
    if (world < 2) return FSC_OK;
    int nflags = 0;
    while (train_flag_name(nflags)) nflags++;
    const int nfields = nflags + N_EXTRA;
    int64_t *mine = calloc((size_t)nfields, sizeof *mine);
    int64_t *all = calloc((size_t)nfields * (size_t)world, sizeof *all);
    char value[4096];
    int rc = mine && all ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nflags && !rc; i++) {
        const char *name = train_flag_name(i);
        train_flag_json(o, i, value, sizeof value);
        compare_mode m = mode_of(name);
        const char *text = m == EXEMPT             ? ""
                           : m == BY_VALUE         ? value
                           : strcmp(value, "null") ? "set"
                                                   : "unset";
        mine[i] = (int64_t)mix_str(HASH_SEED, text);
    }
    uint64_t h[N_EXTRA] = {0};
    if (!rc) rc = spec_hash(o->data, &h[0]);
    if (!rc) rc = spec_hash(o->val_data, &h[1]);
    if (!rc) rc = spec_hash(o->init_from, &h[2]);
    h[3] = mix_str(HASH_SEED, fsc_version());
    for (int k = 0; k < N_EXTRA && !rc; k++) mine[nflags + k] = (int64_t)h[k];
    if (!rc) rc = fsc_group_allgather(fsc_group_world(), mine, all, nfields, FSC_DTYPE_I64);
    if (rc) {
        free(mine), free(all);
        return fsc_error_context(rc, "comparing the ranks' settings: ");
    }
    char msg[3072] = "";
    int differ = 0;
    for (int k = 0; k < nfields; k++) {
        bool same = true;
        for (int r = 1; r < world && same; r++) same = all[(size_t)r * nfields + k] == all[k];
        if (same) continue;
        size_t len = strlen(msg);
        if (len + 200 > sizeof msg) break; /* enough named to act on */
        if (k < nflags) {
            train_flag_json(o, k, value, sizeof value);
            snprintf(msg + len, sizeof msg - len, "%s--%s: ", differ ? "; " : "",
                     train_flag_name(k));
        } else {
            snprintf(msg + len, sizeof msg - len, "%s%s: ", differ ? "; " : "",
                     extra_names[k - nflags]);
        }
        name_groups(all, world, nfields, k, msg, sizeof msg);
        len = strlen(msg);
        if (k < nflags) snprintf(msg + len, sizeof msg - len, " (rank %d has %.200s)", rank, value);
        differ++;
    }
    free(mine), free(all);
    if (!differ) return FSC_OK;
    return fsc_error(FSC_ERR_INVALID,
                     "the ranks were launched with different settings (every rank must have the "
                     "same): %s",
                     msg);
}
