/* safetensors writer: declare every tensor, then stream the data in order.
 *
 * Declaring first fixes all offsets, so the header can go out before any data
 * and no tensor is ever buffered: a model larger than memory can be saved
 * shard by shard. The file appears at its path only when close() commits it.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "fsc/io.h"
#include "io/io_internal.h"

typedef struct {
    char *name;
    fsc_dtype dtype;
    int ndim;
    int64_t shape[FSC_MAX_DIMS];
    uint64_t begin, nbytes, written;
} decl;

struct fsc_st_writer {
    fsc_atomic_file af;
    decl *decls;
    int n, cap;
    char **meta; /* key, value, key, value, ... */
    int nmeta, metacap;
    uint64_t total;
    int header_done, cur;
    int status; /* first failure; sticky */
    bool busy;  /* in an io busy scope from open to close or abort (io_busy.c) */
    char msg[512];
};

/* ---- helpers ---------------------------------------------------------------- */

static char *dup_str(const char *s) {
    char *c = malloc(strlen(s) + 1);
    return c ? strcpy(c, s) : NULL;
}

/* Records the first failure (its message too) and returns it. */
static int fail(fsc_st_writer *w, int rc) {
    if (rc && !w->status) {
        w->status = rc;
        snprintf(w->msg, sizeof w->msg, "%s", fsc_last_error());
    }
    return rc;
}

/* Re-raises the first failure so the caller sees its message again. */
static int failed(fsc_st_writer *w) {
    return fsc_error(w->status, "%s", w->msg);
}

/* The writer's lists (declarations, metadata) start at 16 entries. */
#define GROW(p, cap, need) FSC_GROW_ARRAY(p, cap, need, 16, "safetensors writer: out of memory")

/* ---- the JSON header ------------------------------------------------------------ */

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        while (nc < b->len + n + 1) nc *= 2;
        char *p = realloc(b->s, nc);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = nc;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_str(strbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

static void sb_u64(strbuf *b, uint64_t v) {
    char t[24];
    sb_put(b, t, (size_t)snprintf(t, sizeof t, "%llu", (unsigned long long)v));
}

/* A JSON string literal: quotes, backslashes and control bytes escaped. */
static void sb_json_string(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char t[8];
        if (*c == '"' || *c == '\\') {
            t[0] = '\\';
            t[1] = (char)*c;
            sb_put(b, t, 2);
        } else if (*c < 0x20) {
            sb_put(b, t, (size_t)snprintf(t, sizeof t, "\\u%04x", *c));
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_decl(strbuf *b, const decl *d) {
    sb_json_string(b, d->name);
    sb_str(b, ":{\"dtype\":");
    sb_json_string(b, fsc_dtype_name(d->dtype));
    sb_str(b, ",\"shape\":[");
    for (int i = 0; i < d->ndim; i++) {
        if (i) sb_str(b, ",");
        sb_u64(b, (uint64_t)d->shape[i]);
    }
    sb_str(b, "],\"data_offsets\":[");
    sb_u64(b, d->begin);
    sb_str(b, ",");
    sb_u64(b, d->begin + d->nbytes);
    sb_str(b, "]}");
}

/* {"__metadata__":{...},"name":{...},...} padded with spaces to a multiple of 8. */
static void build_header(const fsc_st_writer *w, strbuf *out) {
    strbuf b = {0};
    sb_str(&b, "{");
    if (w->nmeta) {
        sb_str(&b, "\"__metadata__\":{");
        for (int i = 0; i < w->nmeta; i++) {
            if (i) sb_str(&b, ",");
            sb_json_string(&b, w->meta[2 * i]);
            sb_str(&b, ":");
            sb_json_string(&b, w->meta[2 * i + 1]);
        }
        sb_str(&b, "}");
    }
    for (int i = 0; i < w->n; i++) {
        if (i || w->nmeta) sb_str(&b, ",");
        sb_decl(&b, &w->decls[i]);
    }
    sb_str(&b, "}");
    while (b.len % 8) sb_str(&b, " ");
    *out = b;
}

/* The 8-byte little-endian length and the JSON, as one malloc'd block: the
 * file's first *len bytes. Freezes the declarations. */
static int header_bytes(fsc_st_writer *w, unsigned char **bytes, size_t *len) {
    strbuf b = {0};
    build_header(w, &b);
    w->header_done = 1;
    unsigned char *h = b.oom ? NULL : malloc(8 + b.len);
    if (!h) {
        free(b.s);
        return fsc_error(FSC_ERR_NOMEM, "%s: out of memory building the header", w->af.path);
    }
    for (int i = 0; i < 8; i++) h[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    memcpy(h + 8, b.s, b.len);
    free(b.s);
    *bytes = h;
    *len = 8 + b.len;
    return FSC_OK;
}

static int write_header(fsc_st_writer *w) {
    unsigned char *h;
    size_t n;
    int rc = header_bytes(w, &h, &n);
    if (rc) return rc;
    rc = fsc_atomic_write(&w->af, h, n);
    free(h);
    return rc;
}

/* ---- declarations ---------------------------------------------------------------- */

static decl *find_decl(fsc_st_writer *w, const char *name) {
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->decls[i].name, name) == 0) return &w->decls[i];
    return NULL;
}

static int check_declaration(fsc_st_writer *w, const char *name, fsc_dtype dtype, int ndim,
                             const int64_t *shape, uint64_t *nbytes) {
    const char *p = w->af.path;
    if (!name || strcmp(name, "__metadata__") == 0)
        return fsc_error(FSC_ERR_INVALID, "%s: invalid tensor name \"%s\"", p,
                         name ? name : "(null)");
    if (w->header_done)
        return fsc_error(FSC_ERR_INVALID, "%s: tensor \"%s\" declared after data writing began", p,
                         name);
    if (find_decl(w, name))
        return fsc_error(FSC_ERR_INVALID, "%s: tensor \"%s\" declared twice", p, name);
    if (fsc_dtype_size(dtype) == 0)
        return fsc_error(FSC_ERR_DTYPE, "%s: tensor \"%s\": invalid dtype %d", p, name, (int)dtype);
    if (ndim < 0 || ndim > FSC_MAX_DIMS || (ndim && !shape))
        return fsc_error(FSC_ERR_SHAPE, "%s: tensor \"%s\": ndim %d (expected 0..%d)", p, name,
                         ndim, FSC_MAX_DIMS);
    uint64_t n = fsc_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return fsc_error(FSC_ERR_SHAPE, "%s: tensor \"%s\": shape[%d] = %lld is negative", p,
                             name, i, (long long)shape[i]);
        if (shape[i] && n > (UINT64_MAX >> 2) / (uint64_t)shape[i])
            return fsc_error(FSC_ERR_SHAPE, "%s: tensor \"%s\" is too large", p, name);
        n *= (uint64_t)shape[i];
    }
    if (n > (UINT64_MAX >> 2) - w->total)
        return fsc_error(FSC_ERR_SHAPE, "%s: tensors are too large in total", p);
    *nbytes = n;
    return FSC_OK;
}

/* ---- public ------------------------------------------------------------------------ */

fsc_st_writer *fsc_st_writer_open(const char *path, int *status) {
    fsc_st_writer *w = calloc(1, sizeof *w);
    int rc = w ? fsc_atomic_open(&w->af, path)
               : fsc_error(FSC_ERR_NOMEM, "fsc_st_writer_open: out of memory");
    if (status) *status = rc;
    if (rc) {
        free(w);
        return NULL;
    }
    w->busy = fsc_io_busy_begin(path) == FSC_OK; /* the variable was checked at start-up */
    return w;
}

int fsc_st_writer_declare(fsc_st_writer *w, const char *name, fsc_dtype dtype, int ndim,
                          const int64_t *shape) {
    if (!w) return fsc_error(FSC_ERR_INVALID, "fsc_st_writer_declare: writer is NULL");
    if (w->status) return failed(w);
    uint64_t nbytes = 0;
    int rc = check_declaration(w, name, dtype, ndim, shape, &nbytes);
    if (!rc) rc = GROW(w->decls, &w->cap, w->n + 1);
    if (rc) return fail(w, rc);
    decl *d = &w->decls[w->n];
    memset(d, 0, sizeof *d);
    d->name = dup_str(name);
    if (!d->name) return fail(w, fsc_error(FSC_ERR_NOMEM, "safetensors writer: out of memory"));
    d->dtype = dtype;
    d->ndim = ndim;
    for (int i = 0; i < ndim; i++) d->shape[i] = shape[i];
    d->begin = w->total;
    d->nbytes = nbytes;
    w->total += nbytes;
    w->n++;
    return FSC_OK;
}

int fsc_st_writer_set_metadata(fsc_st_writer *w, const char *key, const char *value) {
    if (!w) return fsc_error(FSC_ERR_INVALID, "fsc_st_writer_set_metadata: writer is NULL");
    if (w->status) return failed(w);
    if (!key || !value)
        return fail(w, fsc_error(FSC_ERR_INVALID, "%s: metadata key and value must be non-NULL",
                                 w->af.path));
    if (w->header_done)
        return fail(w,
                    fsc_error(FSC_ERR_INVALID, "%s: metadata \"%s\" set after data writing began",
                              w->af.path, key));
    for (int i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta[2 * i], key) == 0)
            return fail(
                w, fsc_error(FSC_ERR_INVALID, "%s: metadata \"%s\" set twice", w->af.path, key));
    int rc = GROW(w->meta, &w->metacap, 2 * w->nmeta + 2);
    if (rc) return fail(w, rc);
    w->meta[2 * w->nmeta] = dup_str(key);
    w->meta[2 * w->nmeta + 1] = dup_str(value);
    w->nmeta++;
    if (!w->meta[2 * w->nmeta - 2] || !w->meta[2 * w->nmeta - 1])
        return fail(w, fsc_error(FSC_ERR_NOMEM, "safetensors writer: out of memory"));
    return FSC_OK;
}

/* The tensor that must be written next (skipping complete ones), or NULL. */
static decl *next_decl(fsc_st_writer *w) {
    while (w->cur < w->n && w->decls[w->cur].written == w->decls[w->cur].nbytes) w->cur++;
    return w->cur < w->n ? &w->decls[w->cur] : NULL;
}

int fsc_st_writer_write(fsc_st_writer *w, const char *name, const void *data, size_t nbytes) {
    if (!w) return fsc_error(FSC_ERR_INVALID, "fsc_st_writer_write: writer is NULL");
    if (w->status) return failed(w);
    const char *p = w->af.path;
    if (!name || (!data && nbytes))
        return fail(w, fsc_error(FSC_ERR_INVALID, "%s: write needs a name and data", p));
    if (!w->header_done) {
        int rc = write_header(w);
        if (rc) return fail(w, rc);
    }
    decl *named = find_decl(w, name), *d = next_decl(w);
    if (named && nbytes == 0 && named->written == named->nbytes) return FSC_OK; /* e.g. empty */
    if (!named)
        return fail(w, fsc_error(FSC_ERR_NOT_FOUND, "%s: tensor \"%s\" was not declared", p, name));
    if (!d || strcmp(d->name, name) != 0)
        return fail(w, fsc_error(FSC_ERR_INVALID,
                                 "%s: tensor \"%s\" written out of order; next "
                                 "in declaration order is \"%s\"",
                                 p, name, d ? d->name : "(none)"));
    if (nbytes > d->nbytes - d->written)
        return fail(w, fsc_error(FSC_ERR_SHAPE,
                                 "%s: tensor \"%s\": %zu bytes written but only "
                                 "%llu remain of its %llu",
                                 p, name, nbytes, (unsigned long long)(d->nbytes - d->written),
                                 (unsigned long long)d->nbytes));
    int rc = fsc_atomic_write(&w->af, data, nbytes);
    if (rc) return fail(w, rc);
    d->written += nbytes;
    return FSC_OK;
}

int fsc_st_writer_write_tensor(fsc_st_writer *w, const char *name, const fsc_tensor *t) {
    if (!w) return fsc_error(FSC_ERR_INVALID, "fsc_st_writer_write_tensor: writer is NULL");
    if (w->status) return failed(w);
    decl *d = name ? find_decl(w, name) : NULL;
    if (!d || !t)
        return fail(w, fsc_error(FSC_ERR_NOT_FOUND, "%s: tensor \"%s\" was not declared",
                                 w->af.path, name ? name : "(null)"));
    uint64_t numel = d->nbytes / fsc_dtype_size(d->dtype);
    if ((uint64_t)fsc_tensor_numel(t) != numel)
        return fail(w, fsc_error(FSC_ERR_SHAPE,
                                 "%s: tensor \"%s\" declared with %llu elements, "
                                 "given %lld",
                                 w->af.path, name, (unsigned long long)numel,
                                 (long long)fsc_tensor_numel(t)));
    if (t->dtype == d->dtype) return fsc_st_writer_write(w, name, t->data, fsc_tensor_nbytes(t));
    /* convert through a bounded buffer, chunk by chunk */
    size_t ss = fsc_dtype_size(t->dtype), ds = fsc_dtype_size(d->dtype);
    int64_t chunk = (1 << 20) / 4, total = (int64_t)numel;
    void *buf = fsc_mem_alloc(FSC_MEM_WORK, (size_t)chunk * ds);
    if (!buf) return fail(w, FSC_ERR_NOMEM);
    int rc = FSC_OK;
    for (int64_t at = 0; at < total && !rc; at += chunk) {
        int64_t m = total - at < chunk ? total - at : chunk;
        fsc_tensor s = fsc_tensor_1d((char *)t->data + (size_t)at * ss, t->dtype, m);
        fsc_tensor o = fsc_tensor_1d(buf, d->dtype, m);
        rc = fsc_tensor_convert(&s, &o);
        if (rc)
            rc = fail(w, rc);
        else
            rc = fsc_st_writer_write(w, name, buf, (size_t)m * ds);
    }
    fsc_mem_free(buf);
    return rc;
}

static void writer_free(fsc_st_writer *w) {
    if (w->busy) fsc_io_busy_end();
    for (int i = 0; i < w->n; i++) free(w->decls[i].name);
    for (int i = 0; i < 2 * w->nmeta; i++) free(w->meta[i]);
    free(w->decls);
    free(w->meta);
    free(w);
}

void fsc_st_writer_abort(fsc_st_writer *w) {
    if (!w) return;
    fsc_atomic_abort(&w->af);
    writer_free(w);
}

int fsc_st_writer_close(fsc_st_writer *w) {
    if (!w) return fsc_error(FSC_ERR_INVALID, "fsc_st_writer_close: writer is NULL");
    if (!w->status && !w->header_done) fail(w, write_header(w));
    decl *d = w->status ? NULL : next_decl(w);
    if (d)
        fail(w, fsc_error(FSC_ERR_INVALID,
                          "%s: tensor \"%s\" was declared but only %llu of its "
                          "%llu bytes were written; nothing saved",
                          w->af.path, d->name, (unsigned long long)d->written,
                          (unsigned long long)d->nbytes));
    int rc;
    if (w->status) {
        rc = failed(w);
        fsc_atomic_abort(&w->af);
    } else {
        rc = fsc_atomic_commit(&w->af);
    }
    writer_free(w);
    return rc;
}

int fsc_st_save(const char *path, int n, const char *const *names, const fsc_tensor *tensors,
                const char *const *metadata) {
    if (n < 0 || (n > 0 && (!names || !tensors)))
        return fsc_error(FSC_ERR_INVALID, "fsc_st_save: %d tensors but no names or tensors", n);
    int rc;
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    if (!w) return rc;
    for (int i = 0; i < n && !rc; i++)
        rc =
            fsc_st_writer_declare(w, names[i], tensors[i].dtype, tensors[i].ndim, tensors[i].shape);
    for (int i = 0; metadata && metadata[i] && !rc; i += 2)
        rc = fsc_st_writer_set_metadata(w, metadata[i], metadata[i + 1]);
    for (int i = 0; i < n && !rc; i++) rc = fsc_st_writer_write_tensor(w, names[i], &tensors[i]);
    return fsc_st_writer_close(w);
}

/* ---- plans: a writer without a file, for the parallel writer --------------------- */

fsc_st_writer *st_plan_new(const char *path, int *status) {
    fsc_st_writer *w = calloc(1, sizeof *w);
    int rc = !w                ? fsc_error(FSC_ERR_NOMEM, "safetensors plan: out of memory")
             : !path || !*path ? fsc_error(FSC_ERR_INVALID, "output path is empty")
             : !(w->af.path = dup_str(path))
                 ? fsc_error(FSC_ERR_NOMEM, "safetensors plan: out of memory")
                 : FSC_OK;
    if (status) *status = rc;
    if (rc) {
        free(w);
        return NULL;
    }
    return w;
}

int st_plan_header(fsc_st_writer *w, unsigned char **bytes, size_t *len) {
    if (w->status) return failed(w);
    return fail(w, header_bytes(w, bytes, len));
}

int st_plan_count(const fsc_st_writer *w) {
    return w->n;
}

int st_plan_find(const fsc_st_writer *w, const char *name) {
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->decls[i].name, name) == 0) return i;
    return -1;
}

void st_plan_tensor(const fsc_st_writer *w, int i, fsc_dtype *dtype, uint64_t *begin,
                    uint64_t *nbytes) {
    *dtype = w->decls[i].dtype;
    *begin = w->decls[i].begin;
    *nbytes = w->decls[i].nbytes;
}

const char *st_plan_name(const fsc_st_writer *w, int i) {
    return w->decls[i].name;
}

uint64_t st_plan_data_bytes(const fsc_st_writer *w) {
    return w->total;
}
