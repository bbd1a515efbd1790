/* Checkpoint reader: finds the newest complete checkpoint of a directory and
 * verifies it before anything is used.
 *
 * The one idea: `latest` is a hint, not the truth. A save killed after its
 * step directory was renamed into place but before `latest` moved leaves a
 * complete checkpoint newer than `latest`; it is verified (state.json's own
 * checksum, every member's size and CRC-32) and adopted, so the same command
 * resumes from it. One that fails verification is skipped with a message.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "fsc/checkpoint.h"
#include "fsc/io.h"
#include "io/checkpoint_internal.h"
#include "io/io_internal.h"

struct fsc_ckpt {
    char path[CKPT_DIR_LEN + 512];
    int64_t step;
    cJSON *state;
    char **values; /* fsc_ckpt_get results, alive until close */
    int nvalues;
};

/* A JSON number that is an integer in [0, max]. */
static bool json_count(const cJSON *j, double max, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!isfinite(d) || d < 0 || d > max || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

/* state.json's text: NUL-terminated, at most CKPT_STATE_MAX bytes. */
static int read_state_text(const char *path, char **text, size_t *len) {
    int fd;
    uint64_t size;
    int rc = fsc_open_read_nofollow(path, &fd, &size);
    if (rc) return rc;
    if (size > CKPT_STATE_MAX) {
        close(fd);
        return fsc_error(FSC_ERR_FORMAT, "%s: %llu bytes, more than the %d a state.json may have",
                         path, (unsigned long long)size, CKPT_STATE_MAX);
    }
    char *buf;
    if ((rc = fsc_read_fd_text(fd, size, path, &buf))) return rc;
    if (strlen(buf) != size) {
        free(buf);
        return fsc_error(FSC_ERR_FORMAT, "%s: contains a NUL byte", path);
    }
    *text = buf;
    *len = (size_t)size;
    return FSC_OK;
}

int ckpt_meta_number(const char *dir, int64_t step, const char *key, double *out) {
    char path[CKPT_PATH_LEN];
    if ((size_t)snprintf(path, sizeof path, "%s/step-%06" PRId64 "/state.json", dir, step) >=
        sizeof path)
        return fsc_error(FSC_ERR_INVALID, "%s: path too long", dir);
    char *text;
    size_t len;
    int rc = read_state_text(path, &text, &len);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "meta");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    rc = cJSON_IsNumber(v) ? (*out = v->valuedouble, FSC_OK)
                           : fsc_error(FSC_ERR_NOT_FOUND, "%s: no number \"%s\"", path, key);
    cJSON_Delete(root);
    return rc;
}

/* The self-checksum: absent in checkpoints written before it existed (they
 * still load); when present it must be the last member and match. */
static int check_own_sum(const char *path, const char *text, const cJSON *root) {
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(root, CKPT_SUM_KEY);
    if (!sum) return FSC_OK;
    const char *key = NULL;
    for (const char *p = text; (p = strstr(p, "\"" CKPT_SUM_KEY "\"")); p++) key = p;
    const char *q = key ? strchr(key + strlen(CKPT_SUM_KEY) + 2, '"') : NULL;
    unsigned want;
    int used = 0;
    if (!cJSON_IsString(sum) || sum->next || !q || strlen(sum->valuestring) != 8 ||
        sscanf(sum->valuestring, "%8x%n", &want, &used) != 1 || used != 8)
        return fsc_error(FSC_ERR_FORMAT, "%s: \"%s\" must be the last member, 8 hex digits", path,
                         CKPT_SUM_KEY);
    uint32_t got = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)text, (uInt)(q + 1 - text));
    if (got != want)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: fails its own checksum (CRC-32 %08" PRIx32
                         ", recorded %08x): edited or damaged",
                         path, got, want);
    return FSC_OK;
}

static int parse_state(fsc_ckpt *c) {
    char path[CKPT_PATH_LEN + 16], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/state.json", c->path);
    int rc = read_state_text(path, &text, &len);
    if (rc) return rc;
    const char *end = NULL;
    c->state = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!c->state)
        rc = fsc_error(FSC_ERR_FORMAT, "%s: not valid JSON (error near byte %td)", path,
                       end ? end - text : (ptrdiff_t)0);
    for (const char *p = end; !rc && p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: unexpected bytes after the JSON object (at byte %td)", path,
                           p - text);
    if (!rc && !cJSON_IsObject(c->state))
        rc = fsc_error(FSC_ERR_FORMAT, "%s: must be a JSON object", path);
    if (!rc) rc = check_own_sum(path, text, c->state);
    free(text);
    return rc;
}

/* A safetensors member says what it is on its own (the trainer writes the
 * step as "fsc.step" and its state pairs as "fsc.<key>"): each must agree
 * with state.json, so a member taken from another checkpoint is refused.
 * Metadata state.json does not have (or files without it) is not compared. */
static int check_member_meta(const fsc_ckpt *c, const char *path, const char *name) {
    int rc;
    fsc_st_file *f = fsc_st_open(path, &rc);
    if (!f) return fsc_error_context(rc, "checkpoint %s: ", c->path);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(c->state, "meta");
    for (int i = 0; !rc && i < fsc_st_metadata_count(f); i++) {
        const char *key, *value;
        fsc_st_metadata_at(f, i, &key, &value);
        if (strncmp(key, "fsc.", 4) != 0) continue;
        char step[32];
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(meta, key + 4);
        if (!strcmp(key, "fsc.step")) {
            snprintf(step, sizeof step, "%" PRId64, c->step);
            if (strcmp(value, step))
                rc = fsc_error(FSC_ERR_FORMAT,
                               "checkpoint %s: %s records step %s but state.json says step %s (a "
                               "member of another checkpoint?)",
                               c->path, name, value, step);
            continue;
        }
        if (!want) continue;
        cJSON *have = cJSON_Parse(value);
        if (!have || !cJSON_Compare(have, want, true))
            rc = fsc_error(FSC_ERR_FORMAT,
                           "checkpoint %s: %s records %s = %s, which state.json does not (a "
                           "member of another checkpoint?)",
                           c->path, name, key, value);
        cJSON_Delete(have);
    }
    fsc_st_close(f);
    return rc;
}

static bool is_safetensors(const char *name) {
    size_t n = strlen(name), k = strlen(".safetensors");
    return n > k && !strcmp(name + n - k, ".safetensors");
}

static int verify(fsc_ckpt *c) {
    int rc = parse_state(c);
    if (rc) return rc;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(c->state, "files");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(c->state, "step");
    uint64_t s;
    if (!cJSON_IsObject(files) || !step)
        return fsc_error(FSC_ERR_FORMAT, "%s/state.json: missing \"files\" or \"step\"", c->path);
    if (!json_count(step, CKPT_MAX_STEP, &s))
        return fsc_error(FSC_ERR_FORMAT, "%s/state.json: \"step\" must be an integer in [0, 2^53]",
                         c->path);
    c->step = (int64_t)s;
    const char *base = strrchr(c->path, '/');
    int64_t named;
    if (ckpt_step_name(base ? base + 1 : c->path, &named) && named != c->step)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s/state.json: says step %" PRId64 " but the directory is step %" PRId64,
                         c->path, c->step, named);
    for (const cJSON *f = files->child; f; f = f->next) {
        uint64_t size, crc;
        if (!json_count(cJSON_GetObjectItemCaseSensitive(f, "size"), CKPT_MAX_STEP, &size) ||
            !json_count(cJSON_GetObjectItemCaseSensitive(f, "crc32"), 4294967295.0, &crc) ||
            !f->string[0] || f->string[0] == '.' || strchr(f->string, '/') ||
            !strcmp(f->string, "state.json"))
            return fsc_error(FSC_ERR_FORMAT, "%s/state.json: bad entry for \"%s\"", c->path,
                             f->string);
        uint32_t got;
        int64_t n;
        char member[CKPT_PATH_LEN];
        snprintf(member, sizeof member, "%s/%s", c->path, f->string);
        rc = ckpt_file_crc(member, &got, &n);
        if (rc) return fsc_error_context(FSC_ERR_FORMAT, "checkpoint %s is incomplete: ", c->path);
        if ((uint64_t)n != size)
            return fsc_error(FSC_ERR_FORMAT,
                             "checkpoint %s: %s has %" PRId64 " bytes, %" PRIu64
                             " were written (torn checkpoint)",
                             c->path, f->string, n, size);
        if (got != (uint32_t)crc)
            return fsc_error(FSC_ERR_FORMAT,
                             "checkpoint %s: %s fails its checksum (CRC-32 %08" PRIx32
                             ", expected %08" PRIx32 ")",
                             c->path, f->string, got, (uint32_t)crc);
        if (is_safetensors(f->string) && (rc = check_member_meta(c, member, f->string))) return rc;
    }
    return FSC_OK;
}

/* Opens and verifies the step directory at path. */
static int open_at(const char *path, fsc_ckpt **out) {
    *out = NULL;
    fsc_ckpt *c = calloc(1, sizeof *c);
    if (!c) return fsc_error(FSC_ERR_NOMEM, "out of memory opening a checkpoint");
    int rc = (size_t)snprintf(c->path, sizeof c->path, "%s", path) >= sizeof c->path
                 ? fsc_error(FSC_ERR_INVALID, "%s: checkpoint path too long", path)
                 : verify(c);
    if (rc) {
        fsc_ckpt_close(c);
        return rc;
    }
    *out = c;
    return FSC_OK;
}

/* The newest step directory newer than `latest` (floor) that verifies. */
static int adopt_newer(const char *dir, int64_t floor, const char *latest, fsc_ckpt **out) {
    int64_t *steps;
    int n, rc = ckpt_list_steps(dir, &steps, &n);
    for (int i = 0; !rc && i < n && steps[i] > floor && !*out; i++) {
        char path[CKPT_PATH_LEN];
        snprintf(path, sizeof path, "%s/step-%06" PRId64, dir, steps[i]);
        if (open_at(path, out) == FSC_OK)
            fsc_log(FSC_LOG_WARN,
                    "checkpoint %s is complete and newer than %s (a save cut short before it "
                    "moved): resuming from it",
                    path, latest);
        else
            fsc_log(FSC_LOG_WARN, "checkpoint: skipping %s, newer than %s: %s", path, latest,
                    fsc_last_error());
    }
    free(steps);
    return rc;
}

int fsc_ckpt_open(const char *dir, fsc_ckpt **out) {
    *out = NULL;
    if (strlen(dir) >= CKPT_DIR_LEN)
        return fsc_error(FSC_ERR_INVALID, "checkpoint directory path is longer than %d characters",
                         CKPT_DIR_LEN - 1);
    char name[64], shown[CKPT_PATH_LEN];
    int64_t latest = -1;
    int rc = ckpt_read_latest(dir, name, sizeof name, &latest);
    if (rc && rc != FSC_ERR_NOT_FOUND) return rc;
    bool has_latest = rc == FSC_OK;
    snprintf(shown, sizeof shown, has_latest ? "%s/latest (%s)" : "%s/latest (absent)", dir, name);
    rc = adopt_newer(dir, latest, shown, out);
    if (rc || *out) return rc;
    if (has_latest) {
        char path[CKPT_PATH_LEN];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        return open_at(path, out);
    }
    char state[CKPT_PATH_LEN];
    snprintf(state, sizeof state, "%s/state.json", dir);
    if (access(state, F_OK) != 0) {
        int64_t *steps;
        int n;
        ckpt_list_steps(dir, &steps, &n);
        free(steps);
        return n ? fsc_error(FSC_ERR_FORMAT,
                             "%s: no complete checkpoint (no latest, and none of "
                             "its %d step directories verifies)",
                             dir, n)
                 : fsc_error(FSC_ERR_NOT_FOUND, "%s: no checkpoint here (no latest, no state.json)",
                             dir);
    }
    return open_at(dir, out); /* a step directory itself */
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
    char buf[CKPT_PATH_LEN];
    snprintf(buf, sizeof buf, "%s/%s", c->path, name);
    return retain((fsc_ckpt *)c, strdup(buf));
}

const char *fsc_ckpt_get(const fsc_ckpt *c, const char *key) {
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(c->state, "meta");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    if (!v) return NULL;
    return retain((fsc_ckpt *)c, fsc_json_print_exact(v, 0));
}
