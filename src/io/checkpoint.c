/* Checkpoint writer: a hidden temporary directory with an unpredictable
 * name, fsync, rename into place, fsync, then an atomic `latest` pointer and
 * pruning; state.json carries metadata, per-file CRC-32 (zlib) and its own
 * checksum.
 *
 * The one idea: every prefix of the commit sequence (the FSC_CKPT_POINT_*
 * of core/fault.h) leaves a directory that fsc_ckpt_open reads as the newest
 * complete checkpoint, and that the next writer cleans up: a temporary of a
 * dead writer is removed, a step directory newer than `latest` is complete
 * (it was fsynced before its rename) and is adopted by readers.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/fault.h"
#include "fsc/checkpoint.h"
#include "io/checkpoint_internal.h"
#include "io/io_internal.h"

struct fsc_ckpt_writer {
    char dir[CKPT_DIR_LEN], tmp[CKPT_DIR_LEN + 256], final[CKPT_DIR_LEN + 128];
    char member[CKPT_PATH_LEN];
    char name[64]; /* "step-000012" */
    int64_t step;
    int keep_last; /* 0: keep every checkpoint */
    cJSON *meta;
    cJSON *known; /* member name: [size, crc32] known from its writers (ckpt_writer_known) */
};

static int write_all(int fd, const char *p, size_t n, const char *path) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return fsc_error(FSC_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return FSC_OK;
}

int fsc_ckpt_begin(const char *dir, int64_t step, fsc_ckpt_writer **out) {
    *out = NULL;
    if (step < 0) return fsc_error(FSC_ERR_INVALID, "checkpoint step %" PRId64 " < 0", step);
    if ((double)step > CKPT_MAX_STEP)
        return fsc_error(FSC_ERR_INVALID, "checkpoint step %" PRId64 " > 2^53", step);
    if (strlen(dir) >= CKPT_DIR_LEN)
        return fsc_error(FSC_ERR_INVALID, "checkpoint directory path is longer than %d characters",
                         CKPT_DIR_LEN - 1);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return fsc_error(FSC_ERR_IO, "checkpoint directory %s: %s", dir, strerror(errno));
    fsc_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->meta = cJSON_CreateObject())) {
        free(w);
        return fsc_error(FSC_ERR_NOMEM, "out of memory starting a checkpoint");
    }
    w->step = step;
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    snprintf(w->name, sizeof w->name, "step-%06" PRId64, step);
    snprintf(w->final, sizeof w->final, "%s/%s", dir, w->name);
    ckpt_clean_stale(dir); /* leftovers of writers killed mid-save */
    char tag[128], prefix[CKPT_DIR_LEN + 256];
    ckpt_writer_tag(tag, sizeof tag);
    snprintf(prefix, sizeof prefix, "%s/.%s.tmp-%s", dir, w->name, tag);
    int rc = fsc_mkdir_unique(prefix, w->tmp, sizeof w->tmp);
    if (rc) {
        rc = fsc_error_context(rc, "checkpoint %s: ", dir);
        cJSON_Delete(w->meta);
        free(w);
        return rc;
    }
    *out = w;
    return FSC_OK;
}

const char *fsc_ckpt_member(fsc_ckpt_writer *w, const char *name) {
    snprintf(w->member, sizeof w->member, "%s/%s", w->tmp, name);
    return w->member;
}

int fsc_ckpt_check_dir(const char *dir) {
    if (!dir || !*dir) return fsc_error(FSC_ERR_INVALID, "checkpoint directory is empty");
    if (strlen(dir) >= CKPT_DIR_LEN)
        return fsc_error(FSC_ERR_INVALID, "checkpoint directory path is longer than %d characters",
                         CKPT_DIR_LEN - 1);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return fsc_error(FSC_ERR_IO, "checkpoint directory %s: %s", dir, strerror(errno));
    /* what a save does first: a hidden temporary inside (a read-only file
     * system, a full disk or a file where the directory should be fail here) */
    char tag[128], prefix[CKPT_DIR_LEN + 256], made[CKPT_DIR_LEN + 320];
    ckpt_writer_tag(tag, sizeof tag);
    snprintf(prefix, sizeof prefix, "%s/.probe.tmp-%s", dir, tag);
    int rc = fsc_mkdir_unique(prefix, made, sizeof made);
    if (rc) return fsc_error_context(rc, "checkpoint directory %s cannot be written: ", dir);
    rmdir(made);
    return FSC_OK;
}

int fsc_ckpt_set(fsc_ckpt_writer *w, const char *key, const char *json_value) {
    if (!strcmp(key, CKPT_SUM_KEY))
        return fsc_error(FSC_ERR_INVALID, "checkpoint metadata key %s is reserved", key);
    cJSON *v = cJSON_Parse(json_value);
    if (!v)
        return fsc_error(FSC_ERR_INVALID, "checkpoint metadata %s: not JSON: %s", key, json_value);
    cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
    cJSON_AddItemToObject(w->meta, key, v);
    return FSC_OK;
}

int fsc_ckpt_keep_last(fsc_ckpt_writer *w, int n) {
    if (n < 0) return fsc_error(FSC_ERR_INVALID, "checkpoint keep_last %d < 0", n);
    w->keep_last = n;
    return FSC_OK;
}

void fsc_ckpt_abort(fsc_ckpt_writer *w) {
    if (!w) return;
    fsc_remove_tree(w->tmp);
    cJSON_Delete(w->meta);
    cJSON_Delete(w->known);
    free(w);
}

void ckpt_writer_known(fsc_ckpt_writer *w, const char *path, int64_t size, uint32_t crc) {
    const size_t n = strlen(w->tmp);
    if (strncmp(path, w->tmp, n) || path[n] != '/' || strchr(path + n + 1, '/')) return;
    if (!w->known && !(w->known = cJSON_CreateObject())) return;
    cJSON *v = cJSON_CreateArray();
    if (!v) return;
    cJSON_AddItemToArray(v, cJSON_CreateNumber((double)size));
    cJSON_AddItemToArray(v, cJSON_CreateNumber((double)crc));
    cJSON_DeleteItemFromObjectCaseSensitive(w->known, path + n + 1);
    cJSON_AddItemToObject(w->known, path + n + 1, v);
}

/* Member `name`'s size and CRC-32 as its writers recorded them; false if none. */
static bool known(const fsc_ckpt_writer *w, const char *name, int64_t *size, uint32_t *crc) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(w->known, name);
    if (cJSON_GetArraySize(v) != 2) return false;
    *size = (int64_t)cJSON_GetArrayItem(v, 0)->valuedouble;
    *crc = (uint32_t)cJSON_GetArrayItem(v, 1)->valuedouble;
    return true;
}

/* The members' sizes and CRC-32s (read, unless their writers recorded them),
 * each member fsynced on the way. */
static int checksum_members(fsc_ckpt_writer *w, cJSON *files) {
    DIR *d = opendir(w->tmp);
    if (!d) return fsc_error(FSC_ERR_IO, "%s: %s", w->tmp, strerror(errno));
    int rc = FSC_OK;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "state.json")) continue;
        const char *path = fsc_ckpt_member(w, e->d_name);
        uint32_t crc;
        int64_t size;
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        rc = fd < 0           ? fsc_error(FSC_ERR_IO, "%s: cannot open: %s", path, strerror(errno))
             : fsync(fd) != 0 ? fsc_error(FSC_ERR_IO, "%s: fsync failed: %s", path, strerror(errno))
                              : FSC_OK;
        if (fd >= 0) close(fd);
        if (!rc && !known(w, e->d_name, &size, &crc)) rc = ckpt_file_crc(path, &crc, &size);
        if (rc) break;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "size", (double)size);
        cJSON_AddNumberToObject(f, "crc32", (double)crc);
        cJSON_AddItemToObject(files, e->d_name, f);
    }
    closedir(d);
    return rc;
}

/* state.json = {"step": S, "meta": {...}, "files": {"name": {"size": n,
 * "crc32": c}}, "state_crc32": "xxxxxxxx"}: the last member is the CRC-32 of
 * every byte of the file before its value's first hex digit. */
static int write_state(fsc_ckpt_writer *w) {
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "step", (double)w->step);
    cJSON_AddItemToObject(root, "meta", w->meta);
    w->meta = NULL;
    cJSON_AddItemToObject(root, "files", files);
    int rc = checksum_members(w, files);
    char *body = rc || !fsc_json_exact_numbers(root) ? NULL : cJSON_Print(root);
    cJSON_Delete(root);
    if (rc) return rc;
    size_t n = body ? strlen(body) : 0;
    char *text = body ? malloc(n + 64) : NULL;
    if (!text) {
        free(body);
        return fsc_error(FSC_ERR_NOMEM, "out of memory writing state.json");
    }
    if (n > 0 && body[n - 1] == '}') n--; /* reopen the object */
    while (n > 0 && body[n - 1] == '\n') n--;
    memcpy(text, body, n);
    free(body);
    n += (size_t)sprintf(text + n, ",\n\t\"%s\":\t\"", CKPT_SUM_KEY);
    uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)text, (uInt)n);
    n += (size_t)sprintf(text + n, "%08" PRIx32 "\"\n}\n", crc);
    const char *path = fsc_ckpt_member(w, "state.json");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) rc = fsc_error(FSC_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (!rc) rc = write_all(fd, text, n / 2, path);
    if (!rc) fsc_fault_ckpt_point(FSC_CKPT_POINT_STATE_TORN);
    if (!rc) rc = write_all(fd, text + n / 2, n - n / 2, path);
    if (!rc && fsync(fd) != 0)
        rc = fsc_error(FSC_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !rc)
        rc = fsc_error(FSC_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    free(text);
    return rc;
}

/* The step directory is already there: the checkpoint `latest` names is never
 * overwritten; any other (a save cut short before `latest` moved, that a
 * reader found incomplete) is set aside under a visible name. */
static int make_room(fsc_ckpt_writer *w) {
    struct stat st;
    if (lstat(w->final, &st) != 0) return FSC_OK;
    char latest[64];
    int64_t ls;
    if (ckpt_read_latest(w->dir, latest, sizeof latest, &ls) == FSC_OK && ls == w->step)
        return fsc_error(FSC_ERR_IO,
                         "checkpoint %s already exists and is the one %s/latest names; not "
                         "overwriting it",
                         w->final, w->dir);
    fsc_clear_error();
    char aside[CKPT_DIR_LEN + 256], rnd[13];
    fsc_random_name(rnd, 12);
    snprintf(aside, sizeof aside, "%s.aside-%s", w->final, rnd);
    int rc = ckpt_rename_noreplace(w->final, aside);
    if (!rc)
        fsc_log(FSC_LOG_WARN,
                "checkpoint: %s already existed but %s/latest does not name it (a save cut "
                "short?); moved it to %s and writing the new one",
                w->final, w->dir, aside);
    return rc;
}

/* Writes `latest` under a temporary name, renames it into place, fsyncs. */
static int point_latest(fsc_ckpt_writer *w) {
    char latest[CKPT_PATH_LEN], prefix[CKPT_PATH_LEN], tmp[CKPT_PATH_LEN], tag[128], line[80];
    ckpt_writer_tag(tag, sizeof tag);
    snprintf(latest, sizeof latest, "%s/latest", w->dir);
    snprintf(prefix, sizeof prefix, "%s/.latest.tmp-%s", w->dir, tag);
    int fd, n = snprintf(line, sizeof line, "%s\n", w->name);
    int rc = fsc_create_unique(prefix, tmp, sizeof tmp, &fd);
    if (rc) return rc;
    rc = write_all(fd, line, (size_t)n, tmp);
    if (!rc && fsync(fd) != 0)
        rc = fsc_error(FSC_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    close(fd);
    if (!rc) fsc_fault_ckpt_point(FSC_CKPT_POINT_LATEST_TMP);
    if (!rc && rename(tmp, latest) != 0)
        rc = fsc_error(FSC_ERR_IO, "cannot update %s: %s", latest, strerror(errno));
    if (rc) {
        unlink(tmp);
        return rc;
    }
    fsc_fault_ckpt_point(FSC_CKPT_POINT_LATEST);
    return fsc_fsync_dir(w->dir);
}

int fsc_ckpt_commit(fsc_ckpt_writer *w) {
    /* checksums, fsyncs and renames: file work, however slow the disk */
    char what[CKPT_DIR_LEN + 160];
    snprintf(what, sizeof what, "committing checkpoint %s", w->final);
    const bool busy = fsc_io_busy_begin(what) == FSC_OK; /* the variable was checked at start-up */
    fsc_fault_ckpt_point(FSC_CKPT_POINT_COMMIT);
    int rc = write_state(w);
    if (!rc) fsc_fault_ckpt_point(FSC_CKPT_POINT_STATE_SYNCED);
    if (!rc) rc = fsc_fsync_dir(w->tmp);
    if (!rc) fsc_fault_ckpt_point(FSC_CKPT_POINT_TMP_SYNCED);
    if (!rc) rc = make_room(w);
    if (!rc) rc = ckpt_rename_noreplace(w->tmp, w->final);
    if (rc) {
        fsc_remove_tree(w->tmp);
    } else {
        fsc_fault_ckpt_point(FSC_CKPT_POINT_RENAMED);
        /* the step directory's rename is durable before `latest` can name it */
        rc = fsc_fsync_dir(w->dir);
        if (!rc) fsc_fault_ckpt_point(FSC_CKPT_POINT_DIR_SYNCED);
        if (!rc) rc = point_latest(w);
        if (!rc) fsc_fault_ckpt_point(FSC_CKPT_POINT_DURABLE);
        if (!rc) rc = ckpt_prune(w->dir, w->step, w->keep_last, 0, NULL);
    }
    if (busy) fsc_io_busy_end();
    cJSON_Delete(w->meta);
    cJSON_Delete(w->known);
    free(w);
    return rc;
}

int fsc_ckpt_prune(const char *dir, int keep_last) {
    if (!dir || keep_last < 0)
        return fsc_error(FSC_ERR_INVALID, "fsc_ckpt_prune needs a directory and keep_last >= 0");
    ckpt_clean_stale(dir);
    char name[64];
    int64_t step;
    int rc = ckpt_read_latest(dir, name, sizeof name, &step);
    if (rc) return rc == FSC_ERR_NOT_FOUND ? (fsc_clear_error(), FSC_OK) : rc;
    return ckpt_prune(dir, step, keep_last, 0, NULL);
}

int fsc_ckpt_prune_best(const char *dir, int keep_last, int keep_best, const char *key) {
    if (!dir || keep_last < 0 || keep_best < 0 || (keep_best > 0 && (!key || !*key)))
        return fsc_error(FSC_ERR_INVALID, "fsc_ckpt_prune_best needs a directory, keep_last >= 0, "
                                          "keep_best >= 0 and a key when keep_best > 0");
    ckpt_clean_stale(dir);
    char name[64];
    int64_t step;
    int rc = ckpt_read_latest(dir, name, sizeof name, &step);
    if (rc) return rc == FSC_ERR_NOT_FOUND ? (fsc_clear_error(), FSC_OK) : rc;
    return ckpt_prune(dir, step, keep_last, keep_best, key);
}
