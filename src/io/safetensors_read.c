/* safetensors reader: validate everything in the header, then read lazily.
 *
 * No number from the file is trusted before it is checked against the file's
 * real size, so a lying header is an error message, never a huge allocation.
 * The index (names, dtypes, shapes, absolute offsets) is built once at open;
 * tensor data is read on demand with pread, which is safe from many threads.
 * Before the header is read whole, a streaming scan prices its parse (JSON
 * nodes and strings): a header whose parse would cost more than its own size
 * plus PARSE_SLACK, or pass FSC_MEM_LIMIT_MB, is refused at the first block
 * that shows it, so opening costs at most 2x the header bytes + 16 MiB.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fsc/io.h"
#include "io/io_internal.h"
#include "io/st_file_internal.h"

#define META_KEY "__metadata__"
#define FILE_MAX_DIMS 8              /* accepted in the file; fsc tensors hold 4 */
#define MAX_EXACT 9007199254740992.0 /* 2^53: integers a JSON double holds exactly */

/* ---- small helpers --------------------------------------------------------- */

static char *own_string(fsc_st_file *f, const char *s) {
    size_t len = strlen(s) + 1;
    char *c = malloc(len);
    if (!c) return NULL;
    memcpy(c, s, len);
    f->strings[f->nstrings++] = c;
    return c;
}

/* A JSON number that is a non-negative integer held exactly by a double. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double d = j->valuedouble;
    if (!(d >= 0.0) || d > MAX_EXACT || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used +=
            (size_t)snprintf(buf + used, cap - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp((*(const fsc_st_entry *const *)a)->name, (*(const fsc_st_entry *const *)b)->name);
}

static int cmp_entry_offset(const void *a, const void *b) {
    const fsc_st_entry *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* ---- header ---------------------------------------------------------------- */

/* What parsing costs, over-estimated: a cJSON node (64 bytes, 80 with the
 * allocator's overhead) and its share of the index (entries, name slots); a
 * string's two copies (cJSON's and ours) with their overhead, per string and
 * per byte. Every quoted string is priced as a node too. */
#define NODE_COST 96u
#define STRING_COST 64u
#define PARSE_SLACK ((uint64_t)15 << 20) /* + the scan block: 2x header + 16 MiB */
#define SCAN_BLOCK (1 << 16)

typedef struct {
    uint64_t nodes, strings, bytes;
    int in_string, escape, in_scalar;
} scan_state;

static void scan_block(scan_state *s, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (s->in_string) {
            if (s->escape)
                s->escape = 0;
            else if (c == '\\')
                s->escape = 1;
            else if (c == '"')
                s->in_string = 0;
            s->bytes++;
        } else if (c == '"') {
            s->in_string = 1, s->in_scalar = 0;
            s->strings++, s->nodes++;
        } else if (c == '{' || c == '[') {
            s->nodes++, s->in_scalar = 0;
        } else if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                   c == '-' || c == '+' || c == '.') {
            if (!s->in_scalar) s->nodes++, s->in_scalar = 1;
        } else {
            s->in_scalar = 0;
        }
    }
}

static uint64_t scan_cost(const scan_state *s) {
    return s->nodes * NODE_COST + s->strings * STRING_COST + 2 * s->bytes;
}

/* Streams the n header bytes once, pricing their parse; refuses a header
 * whose parse would cost more than n + PARSE_SLACK or pass the budget. */
static int check_parse_cost(fsc_st_file *f, uint64_t n) {
    const uint64_t cap = n + PARSE_SLACK;
    const size_t limit = fsc_mem_get_limit(), now = fsc_mem_current_total();
    unsigned char *buf = malloc(SCAN_BLOCK);
    if (!buf) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    scan_state s = {0};
    int rc = FSC_OK;
    for (uint64_t at = 0; at < n && !rc;) {
        size_t m = n - at < SCAN_BLOCK ? (size_t)(n - at) : SCAN_BLOCK;
        rc = fsc_pread_full(f->fd, buf, m, 8 + at, f->path);
        if (rc) break;
        scan_block(&s, buf, m);
        at += m;
        uint64_t cost = scan_cost(&s);
        if (cost > cap)
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: header of %llu bytes is too dense to parse: its first %llu bytes "
                           "hold %llu JSON values, which would take more than %llu bytes "
                           "(the bound is the header's size + 15 MiB)",
                           f->path, (unsigned long long)n, (unsigned long long)at,
                           (unsigned long long)s.nodes, (unsigned long long)cap);
        else if (limit && (uint64_t)now + n + cost > limit)
            rc = fsc_error(FSC_ERR_NOMEM,
                           "%s: reading its header (%llu bytes, parsing at least %llu more) would "
                           "pass the memory budget of %zu bytes (FSC_MEM_LIMIT_MB; %zu in use)",
                           f->path, (unsigned long long)n, (unsigned long long)cost, limit, now);
    }
    free(buf);
    return rc;
}

/* Reads and bounds-checks the header; *json is malloc'd and NUL-terminated. */
static int read_header(fsc_st_file *f, uint64_t size, char **json, size_t *len) {
    const char *p = f->path;
    if (size < 8)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: file is %llu bytes, too short for the 8-byte header length", p,
                         (unsigned long long)size);
    unsigned char b[8];
    int rc = fsc_pread_full(f->fd, b, 8, 0, p);
    if (rc) return rc;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    if (n < 2)
        return fsc_error(FSC_ERR_FORMAT, "%s: header length %llu is too small (at least 2: \"{}\")",
                         p, (unsigned long long)n);
    if (n > FSC_ST_MAX_HEADER)
        return fsc_error(FSC_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit", p,
                         (unsigned long long)n, FSC_ST_MAX_HEADER);
    if (n > size - 8)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: header length %llu is larger than the file (%llu bytes after the "
                         "length)",
                         p, (unsigned long long)n, (unsigned long long)(size - 8));
    int rc2 = check_parse_cost(f, n);
    if (rc2) return rc2;
    char *buf = malloc((size_t)n + 1);
    if (!buf)
        return fsc_error(FSC_ERR_NOMEM, "%s: no memory for a %llu-byte header", p,
                         (unsigned long long)n);
    rc = fsc_pread_full(f->fd, buf, (size_t)n, 8, p);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *json = buf;
    *len = (size_t)n;
    f->data_start = 8 + n;
    f->data_size = size - 8 - n;
    return FSC_OK;
}

static int parse_json(const char *path, const char *text, size_t len, cJSON **root) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return fsc_error(FSC_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu)", path,
                         at);
    }
    for (const char *c = end; c < text + len; c++)
        if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r') {
            cJSON_Delete(j);
            return fsc_error(FSC_ERR_FORMAT,
                             "%s: unexpected bytes after the JSON header (at byte %zu)", path,
                             (size_t)(c - text));
        }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fsc_error(FSC_ERR_FORMAT, "%s: header must be a JSON object", path);
    }
    *root = j;
    return FSC_OK;
}

/* ---- entries ----------------------------------------------------------------- */

/* safetensors dtypes fsc has no tensors of: a tensor of one is checked
 * (shape against byte count) and then left out of the index, with a note,
 * so one unused buffer (GPT-2's boolean attention mask) does not make the
 * whole file unreadable; a model that needs it finds it missing. */
static size_t foreign_dtype_size(const char *name) {
    static const struct {
        const char *name;
        size_t size;
    } t[] = {{"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"I16", 2}, {"U32", 4}, {"U64", 8}, {"F64", 8}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(name, t[i].name)) return t[i].size;
    return 0;
}

static int parse_dtype(const char *path, const char *name, const cJSON *j, fsc_dtype *dt) {
    if (!j) return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\" has no \"dtype\"", path, name);
    if (!cJSON_IsString(j))
        return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\": \"dtype\" must be a string", path,
                         name);
    if (fsc_dtype_parse(j->valuestring, dt) != FSC_OK && foreign_dtype_size(j->valuestring))
        return FSC_OK; /* parse_entry checks and skips it */
    if (fsc_dtype_parse(j->valuestring, dt) != FSC_OK)
        return fsc_error(FSC_ERR_DTYPE,
                         "%s: tensor \"%s\": unknown dtype \"%s\" (expected F32, BF16, F16, I32, "
                         "I64, U16)",
                         path, name, j->valuestring);
    return FSC_OK;
}

/* Parses the shape and returns the element count in *numel (overflow-checked). */
static int parse_shape(const char *path, fsc_st_entry *e, const cJSON *j, uint64_t *numel) {
    const char *name = e->name;
    if (!j) return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\" has no \"shape\"", path, name);
    if (!cJSON_IsArray(j))
        return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\": \"shape\" must be an array", path,
                         name);
    int ndim = cJSON_GetArraySize(j), i = 0;
    if (ndim > FILE_MAX_DIMS)
        return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\" has %d dims (at most %d)", path, name,
                         ndim, FILE_MAX_DIMS);
    uint64_t prod = 1, dims[FILE_MAX_DIMS] = {0};
    int overflow = 0;
    for (const cJSON *d = j->child; d; d = d->next, i++) {
        if (!json_uint(d, &dims[i]))
            return fsc_error(FSC_ERR_FORMAT,
                             "%s: tensor \"%s\": shape[%d] must be a non-negative integer "
                             "(at most 2^53)",
                             path, name, i);
        if (dims[i] && prod > UINT64_MAX / dims[i])
            overflow = 1;
        else
            prod *= dims[i];
    }
    if (ndim > FSC_MAX_DIMS)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: tensor \"%s\" has %d dims; fsc tensors have at most %d", path, name,
                         ndim, FSC_MAX_DIMS);
    for (i = 0; i < ndim; i++)
        if (dims[i] == 0) { /* an empty tensor: any product of the rest is fine */
            overflow = 0;
            prod = 0;
        }
    if (overflow)
        return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\": the product of its shape overflows",
                         path, name);
    e->ndim = ndim;
    for (i = 0; i < ndim; i++) e->shape[i] = (int64_t)dims[i];
    *numel = prod;
    return FSC_OK;
}

static int parse_offsets(const char *path, const char *name, const cJSON *j, uint64_t *begin,
                         uint64_t *end) {
    if (!j)
        return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\" has no \"data_offsets\"", path, name);
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: tensor \"%s\": \"data_offsets\" must be an array of 2 integers", path,
                         name);
    if (!json_uint(j->child, begin) || !json_uint(j->child->next, end))
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: tensor \"%s\": data_offsets must be non-negative integers", path,
                         name);
    if (*begin > *end)
        return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\": data_offsets begin %llu > end %llu",
                         path, name, (unsigned long long)*begin, (unsigned long long)*end);
    return FSC_OK;
}

/* FSC_OK, or 1 for a tensor of a foreign dtype (checked, to be skipped). */
static int parse_entry(fsc_st_file *f, const cJSON *item, fsc_st_entry *e) {
    const char *path = f->path;
    e->name = own_string(f, item->string);
    if (!e->name) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    if (!cJSON_IsObject(item))
        return fsc_error(FSC_ERR_FORMAT, "%s: tensor \"%s\" must be a JSON object", path, e->name);
    uint64_t numel = 0, begin = 0, end = 0;
    int rc = parse_dtype(path, e->name, cJSON_GetObjectItemCaseSensitive(item, "dtype"), &e->dtype);
    if (!rc) rc = parse_shape(f->path, e, cJSON_GetObjectItemCaseSensitive(item, "shape"), &numel);
    if (!rc)
        rc = parse_offsets(path, e->name, cJSON_GetObjectItemCaseSensitive(item, "data_offsets"),
                           &begin, &end);
    if (rc) return rc;
    const cJSON *dtj = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const size_t foreign = foreign_dtype_size(dtj->valuestring);
    uint64_t esize = foreign ? foreign : fsc_dtype_size(e->dtype);
    const char *dtname = foreign ? dtj->valuestring : fsc_dtype_name(e->dtype);
    if (numel > UINT64_MAX / esize)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: tensor \"%s\": %llu elements of %s overflow a 64-bit byte count",
                         path, e->name, (unsigned long long)numel, dtname);
    if (numel * esize != end - begin)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: tensor \"%s\": shape holds %llu elements of %s (%llu bytes) but "
                         "data_offsets span %llu bytes",
                         path, e->name, (unsigned long long)numel, dtname,
                         (unsigned long long)(numel * esize), (unsigned long long)(end - begin));
    if (end > f->data_size)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: tensor \"%s\": data ends at byte %llu but the data region has only "
                         "%llu bytes (truncated file?)",
                         path, e->name, (unsigned long long)end, (unsigned long long)f->data_size);
    e->offset = f->data_start + begin;
    e->nbytes = end - begin;
    if (foreign) {
        fsc_log(FSC_LOG_INFO, "%s: tensor \"%s\" is %s, which fsc does not read: skipped", path,
                e->name, dtname);
        return 1;
    }
    return FSC_OK;
}

static int parse_metadata(fsc_st_file *f, const cJSON *meta) {
    if (!cJSON_IsObject(meta))
        return fsc_error(FSC_ERR_FORMAT, "%s: \"%s\" must be an object of strings", f->path,
                         META_KEY);
    int n = cJSON_GetArraySize(meta), i = 0;
    f->meta_key = calloc((size_t)n + 1, sizeof *f->meta_key);
    f->meta_val = calloc((size_t)n + 1, sizeof *f->meta_val);
    if (!f->meta_key || !f->meta_val) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    for (const cJSON *m = meta->child; m; m = m->next, i++) {
        if (!cJSON_IsString(m))
            return fsc_error(FSC_ERR_FORMAT, "%s: metadata \"%s\" must be a string", f->path,
                             m->string);
        f->meta_key[i] = own_string(f, m->string);
        f->meta_val[i] = own_string(f, m->valuestring);
        if (!f->meta_key[i] || !f->meta_val[i])
            return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    }
    f->nmeta = n;
    const char **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    if (!sorted) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    memcpy(sorted, f->meta_key, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str_ptr);
    int rc = FSC_OK;
    for (i = 1; i < n && !rc; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0)
            rc = fsc_error(FSC_ERR_FORMAT, "%s: duplicate metadata key \"%s\"", f->path, sorted[i]);
    free(sorted);
    return rc;
}

/* ---- whole-file checks --------------------------------------------------------- */

int st_index_names(fsc_st_file *f) {
    f->by_name = malloc(((size_t)f->n + 1) * sizeof *f->by_name);
    if (!f->by_name) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->n; i++) f->by_name[i] = &f->entries[i];
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_entry_name);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            return fsc_error(FSC_ERR_FORMAT, "%s: duplicate tensor name \"%s\"", f->path,
                             f->by_name[i]->name);
    return FSC_OK;
}

/* Entries sorted by offset; a non-empty range may not start before the end of
 * an earlier non-empty one. */
static int check_overlaps(const fsc_st_file *f) {
    const fsc_st_entry *last = NULL;
    for (int i = 0; i < f->n; i++) {
        const fsc_st_entry *e = &f->entries[i];
        if (e->nbytes == 0) continue;
        if (last && e->offset < last->offset + last->nbytes)
            return fsc_error(FSC_ERR_FORMAT, "%s: data of tensors \"%s\" and \"%s\" overlap",
                             f->path, last->name, e->name);
        if (!last || e->offset + e->nbytes > last->offset + last->nbytes) last = e;
    }
    return FSC_OK;
}

/* Every owned string has a slot: one name per tensor, a key and a value per
 * metadata item. Counted first so the slots never need to grow. */
static size_t count_strings(const cJSON *root) {
    size_t n = 0;
    for (const cJSON *it = root->child; it; it = it->next)
        n += strcmp(it->string, META_KEY) == 0 ? 2 * (size_t)cJSON_GetArraySize(it) : 1;
    return n;
}

static int build_index(fsc_st_file *f, const cJSON *root) {
    int rc = FSC_OK, seen_meta = 0;
    f->entries = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *f->entries);
    f->strings = calloc(count_strings(root) + 1, sizeof *f->strings);
    if (!f->entries || !f->strings) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    for (const cJSON *it = root->child; it && !rc; it = it->next) {
        if (strcmp(it->string, META_KEY) != 0) {
            if ((rc = parse_entry(f, it, &f->entries[f->n++])) == 1)
                rc = FSC_OK, f->n--; /* a foreign dtype: left out */
        } else if (seen_meta++)
            rc = fsc_error(FSC_ERR_FORMAT, "%s: duplicate \"%s\"", f->path, META_KEY);
        else
            rc = parse_metadata(f, it);
    }
    if (rc) return rc;
    qsort(f->entries, (size_t)f->n, sizeof *f->entries, cmp_entry_offset);
    rc = st_index_names(f);
    return rc ? rc : check_overlaps(f);
}

/* ---- public ------------------------------------------------------------------------ */

fsc_st_file *fsc_st_open(const char *path, int *status) {
    if (st_is_model_dir(path)) return st_open_dir(path, status);
    int st = FSC_OK;
    fsc_st_file *f = calloc(1, sizeof *f);
    uint64_t size = 0;
    char *json = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    if (!f) st = fsc_error(FSC_ERR_NOMEM, "fsc_st_open: out of memory");
    if (!st) {
        f->fd = -1;
        st = fsc_open_read(path, &f->fd, &size);
    }
    if (!st) {
        f->path = malloc(strlen(path) + 1);
        if (f->path)
            strcpy(f->path, path);
        else
            st = fsc_error(FSC_ERR_NOMEM, "fsc_st_open: out of memory");
    }
    if (!st) st = read_header(f, size, &json, &len);
    if (!st) st = parse_json(path, json, len, &root);
    if (!st) st = build_index(f, root);
    cJSON_Delete(root);
    free(json);
    if (status) *status = st;
    if (st) {
        fsc_st_close(f);
        return NULL;
    }
    return f;
}

void fsc_st_close(fsc_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->nparts; i++) fsc_st_close(f->parts[i]);
    free(f->parts);
    free(f->part_of);
    for (int i = 0; i < f->nstrings; i++) free(f->strings[i]);
    free(f->strings);
    free(f->entries);
    free(f->by_name);
    free(f->meta_key);
    free(f->meta_val);
    free(f->path);
    free(f);
}

int fsc_st_count(const fsc_st_file *f) {
    return f ? f->n : 0;
}

const fsc_st_entry *fsc_st_entry_at(const fsc_st_file *f, int i) {
    return f && i >= 0 && i < f->n ? &f->entries[i] : NULL;
}

const fsc_st_entry *fsc_st_find(const fsc_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    fsc_st_entry key = {.name = name};
    const fsc_st_entry *kp = &key;
    const fsc_st_entry **hit =
        bsearch(&kp, f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_entry_name);
    return hit ? *hit : NULL;
}

const char *fsc_st_metadata(const fsc_st_file *f, const char *key) {
    for (int i = 0; f && key && i < f->nmeta; i++)
        if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
    return NULL;
}

int fsc_st_metadata_count(const fsc_st_file *f) {
    return f ? f->nmeta : 0;
}

int fsc_st_metadata_at(const fsc_st_file *f, int i, const char **key, const char **value) {
    if (!f || i < 0 || i >= f->nmeta)
        return fsc_error(FSC_ERR_INVALID, "metadata index %d out of range", i);
    if (key) *key = f->meta_key[i];
    if (value) *value = f->meta_val[i];
    return FSC_OK;
}

/* The file that holds entry e of f: f itself, or a directory's shard. */
static fsc_st_file *holder(fsc_st_file *f, const fsc_st_entry *e) {
    return f->parts ? f->parts[f->part_of[e - f->entries]] : f;
}

int fsc_st_read_bytes(fsc_st_file *f, const fsc_st_entry *e, uint64_t offset, void *dst,
                      size_t nbytes) {
    if (!f || !e || (!dst && nbytes))
        return fsc_error(FSC_ERR_INVALID, "fsc_st_read_bytes: NULL argument");
    if (offset > e->nbytes || nbytes > e->nbytes - offset)
        return fsc_error(FSC_ERR_INVALID,
                         "%s: tensor \"%s\": bytes [%llu, %llu) are outside its %llu bytes",
                         f->path, e->name, (unsigned long long)offset,
                         (unsigned long long)offset + nbytes, (unsigned long long)e->nbytes);
    f = holder(f, e);
    return fsc_pread_full(f->fd, dst, nbytes, e->offset + offset, f->path);
}

static int convertible(fsc_dtype a, fsc_dtype b) {
    int ah = a == FSC_DTYPE_BF16 || a == FSC_DTYPE_F16,
        bh = b == FSC_DTYPE_BF16 || b == FSC_DTYPE_F16;
    return (a == FSC_DTYPE_F32 && bh) || (b == FSC_DTYPE_F32 && ah);
}

/* Reads e in chunks into a bounded buffer and converts into dst. */
static int read_converted(fsc_st_file *f, const fsc_st_entry *e, fsc_tensor *dst) {
    size_t es = fsc_dtype_size(e->dtype), ds = fsc_dtype_size(dst->dtype);
    int64_t total = (int64_t)(e->nbytes / es), chunk = (1 << 20) / 4;
    void *buf = fsc_mem_alloc(FSC_MEM_WORK, (size_t)chunk * es);
    if (!buf) return FSC_ERR_NOMEM;
    int rc = FSC_OK;
    for (int64_t at = 0; at < total && !rc; at += chunk) {
        int64_t m = total - at < chunk ? total - at : chunk;
        rc = fsc_pread_full(f->fd, buf, (size_t)m * es, e->offset + (uint64_t)at * es, f->path);
        fsc_tensor s = fsc_tensor_1d(buf, e->dtype, m);
        fsc_tensor d = fsc_tensor_1d((char *)dst->data + (size_t)at * ds, dst->dtype, m);
        if (!rc) rc = fsc_tensor_convert(&s, &d);
    }
    fsc_mem_free(buf);
    return rc;
}

int fsc_st_read(fsc_st_file *f, const char *name, fsc_tensor *dst) {
    if (!f || !name || !dst) return fsc_error(FSC_ERR_INVALID, "fsc_st_read: NULL argument");
    const fsc_st_entry *e = fsc_st_find(f, name);
    if (!e) return fsc_error(FSC_ERR_NOT_FOUND, "%s: no tensor named \"%s\"", f->path, name);
    int same = dst->ndim == e->ndim;
    for (int i = 0; same && i < e->ndim; i++) same = dst->shape[i] == e->shape[i];
    if (!same) {
        char want[128], got[128];
        fmt_shape(want, sizeof want, e->ndim, e->shape);
        fmt_shape(got, sizeof got, dst->ndim < 0 || dst->ndim > FSC_MAX_DIMS ? 0 : dst->ndim,
                  dst->shape);
        return fsc_error(FSC_ERR_SHAPE,
                         "%s: tensor \"%s\" has shape %s in the file but the "
                         "destination has shape %s",
                         f->path, name, want, got);
    }
    if (!dst->data && e->nbytes)
        return fsc_error(FSC_ERR_INVALID, "fsc_st_read: destination for \"%s\" has no data", name);
    f = holder(f, e);
    if (dst->dtype == e->dtype)
        return fsc_pread_full(f->fd, dst->data, (size_t)e->nbytes, e->offset, f->path);
    if (!convertible(e->dtype, dst->dtype))
        return fsc_error(FSC_ERR_DTYPE,
                         "%s: tensor \"%s\" is %s in the file and cannot be read "
                         "into %s (only F32 <-> BF16/F16 convert)",
                         f->path, name, fsc_dtype_name(e->dtype), fsc_dtype_name(dst->dtype));
    return read_converted(f, e, dst);
}
