/* Checkpoint directories: temporary name, fsync, rename, then an atomic
 * `latest` pointer; state.json carries metadata and per-file CRC-32 (zlib),
 * verified before a checkpoint is used. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fsc/checkpoint.h"

#define DIR_LEN 1024 /* longest checkpoint directory accepted */
#define PATH_LEN 4096

struct fsc_ckpt_writer {
    char dir[DIR_LEN], tmp[DIR_LEN + 128], final[DIR_LEN + 128], member[PATH_LEN];
    char name[64]; /* "step-000012" */
    int64_t step;
    cJSON *meta;
};

struct fsc_ckpt {
    char path[DIR_LEN + 512];
    int64_t step;
    cJSON *state;
    char **values; /* fsc_ckpt_get results, alive until close */
    int nvalues;
};

static int fsync_path(const char *path, bool dir) {
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) return fsc_error(FSC_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
    int rc = fsync(fd) == 0 ? FSC_OK
                            : fsc_error(FSC_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    close(fd);
    return rc;
}

/* CRC-32 and size of a whole file, streamed. */
static int file_crc(const char *path, uint32_t *crc, int64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return fsc_error(FSC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    static _Thread_local unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    int64_t n = 0;
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        c = crc32(c, buf, (uInt)got);
        n += (int64_t)got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return fsc_error(FSC_ERR_IO, "%s: read error", path);
    *crc = (uint32_t)c;
    *size = n;
    return FSC_OK;
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        char child[PATH_LEN];
        for (struct dirent *e; (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(child, sizeof child, "%s/%s", path, e->d_name);
            unlink(child);
        }
        closedir(d);
    }
    rmdir(path);
}

int fsc_ckpt_begin(const char *dir, int64_t step, fsc_ckpt_writer **out) {
    *out = NULL;
    if (step < 0) return fsc_error(FSC_ERR_INVALID, "checkpoint step %" PRId64 " < 0", step);
    if (strlen(dir) >= DIR_LEN)
        return fsc_error(FSC_ERR_INVALID, "checkpoint directory path is longer than %d characters",
                         DIR_LEN - 1);
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
    snprintf(w->tmp, sizeof w->tmp, "%s/.%s.tmp-%d", dir, w->name, (int)getpid());
    remove_tree(w->tmp); /* a leftover of an earlier crash with the same pid */
    if (mkdir(w->tmp, 0777) != 0) {
        int rc = fsc_error(FSC_ERR_IO, "checkpoint %s: cannot create %s: %s", dir, w->tmp,
                           strerror(errno));
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

int fsc_ckpt_set(fsc_ckpt_writer *w, const char *key, const char *json_value) {
    cJSON *v = cJSON_Parse(json_value);
    if (!v)
        return fsc_error(FSC_ERR_INVALID, "checkpoint metadata %s: not JSON: %s", key, json_value);
    cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
    cJSON_AddItemToObject(w->meta, key, v);
    return FSC_OK;
}

void fsc_ckpt_abort(fsc_ckpt_writer *w) {
    if (!w) return;
    remove_tree(w->tmp);
    cJSON_Delete(w->meta);
    free(w);
}

/* state.json = {"step": S, "meta": {...}, "files": {"name": {"size": n, "crc32": c}}} */
static int write_state(fsc_ckpt_writer *w) {
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "step", (double)w->step);
    cJSON_AddItemToObject(root, "meta", w->meta);
    w->meta = NULL;
    cJSON_AddItemToObject(root, "files", files);
    int rc = FSC_OK;
    DIR *d = opendir(w->tmp);
    if (!d) rc = fsc_error(FSC_ERR_IO, "%s: %s", w->tmp, strerror(errno));
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        uint32_t crc;
        int64_t size;
        rc = file_crc(fsc_ckpt_member(w, e->d_name), &crc, &size);
        if (!rc) rc = fsync_path(fsc_ckpt_member(w, e->d_name), false);
        if (rc) break;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "size", (double)size);
        cJSON_AddNumberToObject(f, "crc32", (double)crc);
        cJSON_AddItemToObject(files, e->d_name, f);
    }
    if (d) closedir(d);
    char *text = rc ? NULL : cJSON_Print(root);
    cJSON_Delete(root);
    if (rc) return rc;
    if (!text) return fsc_error(FSC_ERR_NOMEM, "out of memory writing state.json");
    const char *path = fsc_ckpt_member(w, "state.json");
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    ok = f && fclose(f) == 0 && ok;
    free(text);
    if (!ok) return fsc_error(FSC_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return fsync_path(path, false);
}

int fsc_ckpt_commit(fsc_ckpt_writer *w) {
    int rc = write_state(w);
    if (!rc) rc = fsync_path(w->tmp, true);
    if (!rc) {
        struct stat st;
        if (stat(w->final, &st) == 0)
            rc =
                fsc_error(FSC_ERR_IO, "checkpoint %s already exists; not overwriting it", w->final);
        else if (rename(w->tmp, w->final) != 0)
            rc = fsc_error(FSC_ERR_IO, "cannot rename %s to %s: %s", w->tmp, w->final,
                           strerror(errno));
    }
    char latest[PATH_LEN], latest_tmp[PATH_LEN];
    snprintf(latest, sizeof latest, "%s/latest", w->dir);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/.latest.tmp-%d", w->dir, (int)getpid());
    if (!rc) {
        FILE *f = fopen(latest_tmp, "w");
        bool ok = f && fprintf(f, "%s\n", w->name) > 0;
        ok = f && fclose(f) == 0 && ok;
        if (!ok) rc = fsc_error(FSC_ERR_IO, "%s: cannot write: %s", latest_tmp, strerror(errno));
        if (!rc) rc = fsync_path(latest_tmp, false);
        if (!rc && rename(latest_tmp, latest) != 0)
            rc = fsc_error(FSC_ERR_IO, "cannot update %s: %s", latest, strerror(errno));
        if (!rc) rc = fsync_path(w->dir, true);
        if (rc) unlink(latest_tmp);
    }
    if (rc) remove_tree(w->tmp);
    cJSON_Delete(w->meta);
    free(w);
    return rc;
}

/* ---- reading ---------------------------------------------------------------- */

static char *read_text(const char *path, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

static int verify(fsc_ckpt *c) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(c->state, "files");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(c->state, "step");
    if (!cJSON_IsObject(files) || !cJSON_IsNumber(step))
        return fsc_error(FSC_ERR_FORMAT, "%s/state.json: missing \"files\" or \"step\"", c->path);
    c->step = (int64_t)step->valuedouble;
    for (const cJSON *f = files->child; f; f = f->next) {
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(f, "size");
        const cJSON *crc = cJSON_GetObjectItemCaseSensitive(f, "crc32");
        if (!cJSON_IsNumber(size) || !cJSON_IsNumber(crc) || strchr(f->string, '/'))
            return fsc_error(FSC_ERR_FORMAT, "%s/state.json: bad entry for %s", c->path, f->string);
        uint32_t got;
        int64_t n;
        int rc = file_crc(fsc_ckpt_path(c, f->string), &got, &n);
        if (rc) return fsc_error_context(FSC_ERR_FORMAT, "checkpoint %s is incomplete: ", c->path);
        if (n != (int64_t)size->valuedouble)
            return fsc_error(FSC_ERR_FORMAT,
                             "checkpoint %s: %s has %" PRId64 " bytes, %" PRId64
                             " were written (torn checkpoint)",
                             c->path, f->string, n, (int64_t)size->valuedouble);
        if (got != (uint32_t)crc->valuedouble)
            return fsc_error(FSC_ERR_FORMAT,
                             "checkpoint %s: %s fails its checksum (CRC-32 %08x, "
                             "expected %08x)",
                             c->path, f->string, got, (uint32_t)crc->valuedouble);
    }
    return FSC_OK;
}

int fsc_ckpt_open(const char *dir, fsc_ckpt **out) {
    *out = NULL;
    if (strlen(dir) >= DIR_LEN)
        return fsc_error(FSC_ERR_INVALID, "checkpoint directory path is longer than %d characters",
                         DIR_LEN - 1);
    fsc_ckpt *c = calloc(1, sizeof *c);
    if (!c) return fsc_error(FSC_ERR_NOMEM, "out of memory opening a checkpoint");
    char latest[PATH_LEN];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    char *name = read_text(latest, 255);
    if (name) {
        name[strcspn(name, "\r\n")] = '\0';
        snprintf(c->path, sizeof c->path, "%s/%s", dir, name);
        free(name);
    } else {
        snprintf(c->path, sizeof c->path, "%s", dir); /* a step directory itself */
    }
    char state_path[PATH_LEN];
    snprintf(state_path, sizeof state_path, "%s/state.json", c->path);
    char *text = read_text(state_path, 1 << 20);
    int rc = FSC_OK;
    if (!text)
        rc = fsc_error(FSC_ERR_NOT_FOUND, "%s: no checkpoint here (no latest, no state.json)", dir);
    else if (!(c->state = cJSON_Parse(text)))
        rc = fsc_error(FSC_ERR_FORMAT, "%s: state.json is not valid JSON", c->path);
    free(text);
    if (!rc) rc = verify(c);
    if (rc) {
        fsc_ckpt_close(c);
        return rc;
    }
    *out = c;
    return FSC_OK;
}

void fsc_ckpt_close(fsc_ckpt *c) {
    if (!c) return;
    cJSON_Delete(c->state);
    for (int i = 0; i < c->nvalues; i++) free(c->values[i]);
    free(c->values);
    free(c);
}

int64_t fsc_ckpt_step(const fsc_ckpt *c) {
    return c->step;
}

/* Keeps text alive until close; returns it (NULL if out of memory). */
static const char *retain(fsc_ckpt *c, char *text) {
    char **grown = text ? realloc(c->values, sizeof *grown * (size_t)(c->nvalues + 1)) : NULL;
    if (!grown) {
        free(text);
        return NULL;
    }
    c->values = grown;
    c->values[c->nvalues++] = text;
    return text;
}

const char *fsc_ckpt_path(const fsc_ckpt *c, const char *name) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(c->state, "files");
    if (strcmp(name, "state.json") && !cJSON_GetObjectItemCaseSensitive(files, name)) return NULL;
    char buf[PATH_LEN];
    snprintf(buf, sizeof buf, "%s/%s", c->path, name);
    return retain((fsc_ckpt *)c, strdup(buf));
}

const char *fsc_ckpt_get(const fsc_ckpt *c, const char *key) {
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(c->state, "meta");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    if (!v) return NULL;
    return retain((fsc_ckpt *)c, cJSON_PrintUnformatted(v));
}
