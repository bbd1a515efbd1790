/* Weights of a tensor-parallel model by global name: the file a TP group
 * writes is the file one process writes (same header, same bytes), and any
 * TP size reads any other's file.
 *
 * Saving, in three steps so that `path` only ever holds a complete file:
 *  1. rank 0 writes `path.tp-partial` with the safetensors writer: the header
 *     the one-process save would write (same names, global shapes, order and
 *     metadata), replicated tensors whole, sharded tensors as zeros;
 *  2. every rank opens it, learns each tensor's offset from its header, and
 *     writes its own slices in place (pwrite), then fsyncs;
 *  3. once every rank reports success, rank 0 renames it to `path`.
 * A slice is a set of runs: local indices along the split dimension whose
 * global indices are consecutive, times the contiguous inner dimensions. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/io.h"
#include "fsc/weights.h"
#include "tp_internal.h"

/* ---- placement and runs ---------------------------------------------------------------- */
tp_placement tp_place(fsc_module *root, const fsc_param *p) {
    tp_placement pl = {0};
    tp_module *t = NULL;
    pl.s = tp_param_shard(root, p, &t);
    pl.t = t;
    for (int d = 0; d < p->ndim; d++) pl.gshape[d] = p->shape[d];
    if (pl.s) pl.gshape[pl.s->dim] = pl.s->global_dim;
    pl.gnumel = 1;
    for (int d = 0; d < p->ndim; d++) pl.gnumel *= pl.gshape[d];
    return pl;
}

int tp_for_each_run(const tp_placement *pl, const fsc_param *p, tp_run_fn fn, void *user) {
    const tp_shard *s = pl->s;
    int64_t outer = 1, inner = 1, L = p->shape[s->dim];
    for (int d = 0; d < s->dim; d++) outer *= p->shape[d];
    for (int d = s->dim + 1; d < p->ndim; d++) inner *= p->shape[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < L;) {
            int64_t g = tp_global_index(pl->t, s, j), k = j + 1;
            while (k < L && (g < 0 ? tp_global_index(pl->t, s, k) < 0
                                   : tp_global_index(pl->t, s, k) == g + (k - j)))
                k++;
            int rc = fn(user, (o * L + j) * inner, g < 0 ? -1 : (o * s->global_dim + g) * inner,
                        (k - j) * inner);
            if (rc) return rc;
            j = k;
        }
    return FSC_OK;
}

/* ---- save -------------------------------------------------------------------------- */
/* The first failing rank's status and message, on every rank. */
static int agree(fsc_group *g, int rc) {
    return fsc_group_agree(g, rc, "the tensor-parallel save");
}

static int write_header_file(const char *tmp, fsc_module *root, const fsc_params *ps, int n_meta,
                             const char *const *keys, const char *const *values) {
    int rc = FSC_OK;
    fsc_st_writer *w = fsc_st_writer_open(tmp, &rc);
    if (!w) return rc;
    for (int i = 0; !rc && i < n_meta; i++) rc = fsc_st_writer_set_metadata(w, keys[i], values[i]);
    for (int i = 0; !rc && i < ps->count; i++) {
        tp_placement pl = tp_place(root, ps->entries[i].param);
        rc = fsc_st_writer_declare(w, ps->entries[i].name, FSC_DTYPE_F32,
                                   ps->entries[i].param->ndim, pl.gshape);
    }
    enum { ZCHUNK = 1 << 16 };
    float *zeros = rc ? NULL : calloc(ZCHUNK, sizeof(float));
    if (!rc && !zeros) rc = fsc_error(FSC_ERR_NOMEM, "tensor-parallel save: out of memory");
    for (int i = 0; !rc && i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        tp_placement pl = tp_place(root, p);
        if (!pl.s) {
            fsc_tensor t = fsc_param_tensor(p);
            rc = fsc_st_writer_write_tensor(w, ps->entries[i].name, &t);
            continue;
        }
        for (int64_t at = 0; !rc && at < pl.gnumel; at += ZCHUNK) {
            int64_t n = pl.gnumel - at < ZCHUNK ? pl.gnumel - at : ZCHUNK;
            rc = fsc_st_writer_write(w, ps->entries[i].name, zeros, (size_t)n * sizeof(float));
        }
    }
    free(zeros);
    if (rc) {
        fsc_st_writer_abort(w);
        return rc;
    }
    return fsc_st_writer_close(w);
}

typedef struct {
    int fd;
    uint64_t base; /* the tensor's data offset in the file */
    const float *data;
    const char *path;
} slice_writer;

static int write_run(void *user, int64_t local, int64_t global, int64_t n) {
    slice_writer *sw = user;
    if (global < 0) return FSC_OK; /* padding is never saved */
    const char *src = (const char *)(sw->data + local);
    size_t left = (size_t)n * sizeof(float);
    off_t at = (off_t)(sw->base + (uint64_t)global * sizeof(float));
    while (left) {
        ssize_t k = pwrite(sw->fd, src, left, at);
        if (k <= 0) return fsc_error(FSC_ERR_IO, "%s: writing a tensor slice failed", sw->path);
        src += k, left -= (size_t)k, at += k;
    }
    return FSC_OK;
}

static int write_slices(const char *tmp, fsc_module *root, const fsc_params *ps) {
    int rc = FSC_OK;
    fsc_st_file *f = fsc_st_open(tmp, &rc);
    if (!f) return rc;
    int fd = open(tmp, O_WRONLY);
    if (fd < 0) rc = fsc_error(FSC_ERR_IO, "%s: cannot open for writing slices", tmp);
    for (int i = 0; !rc && i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        tp_placement pl = tp_place(root, p);
        if (!pl.s) continue;
        const fsc_st_entry *e = fsc_st_find(f, ps->entries[i].name);
        if (!e) {
            rc = fsc_error(FSC_ERR_INTERNAL, "%s: tensor %s missing", tmp, ps->entries[i].name);
            break;
        }
        slice_writer sw = {fd, e->offset, p->data, tmp};
        rc = tp_for_each_run(&pl, p, write_run, &sw);
    }
    if (fd >= 0) {
        if (!rc && fsync(fd)) rc = fsc_error(FSC_ERR_IO, "%s: fsync failed", tmp);
        close(fd);
    }
    fsc_st_close(f);
    return rc;
}

int fsc_tp_save_weights(const char *path, fsc_module *root, const fsc_params *ps, fsc_group *g,
                        int n_meta, const char *const *keys, const char *const *values) {
    if (!path || !root || !ps || !g || (n_meta > 0 && (!keys || !values)))
        return fsc_error(FSC_ERR_INVALID, "fsc_tp_save_weights: NULL argument");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tp-partial", path) >= (int)sizeof tmp)
        return fsc_error(FSC_ERR_INVALID, "fsc_tp_save_weights: path too long");
    const bool root_rank = fsc_group_rank(g) == 0;
    int rc = root_rank ? write_header_file(tmp, root, ps, n_meta, keys, values) : FSC_OK;
    if ((rc = agree(g, rc))) return rc;
    rc = agree(g, write_slices(tmp, root, ps));
    if (root_rank && !rc && rename(tmp, path))
        rc = fsc_error(FSC_ERR_IO, "%s: cannot rename %s into place", path, tmp);
    if (root_rank && rc) unlink(tmp);
    return agree(g, rc);
}

/* ---- load ---------------------------------------------------------------------------- */
typedef struct {
    fsc_st_file *f;
    const fsc_st_entry *e;
    float *data;
    void *buf; /* one run in the file's dtype */
} slice_reader;

static int read_run(void *user, int64_t local, int64_t global, int64_t n) {
    slice_reader *sr = user;
    float *dst = sr->data + local;
    if (global < 0) {
        memset(dst, 0, (size_t)n * sizeof(float));
        return FSC_OK;
    }
    size_t es = fsc_dtype_size(sr->e->dtype);
    if (sr->e->dtype == FSC_DTYPE_F32)
        return fsc_st_read_bytes(sr->f, sr->e, (uint64_t)global * es, dst, (size_t)n * es);
    int rc = fsc_st_read_bytes(sr->f, sr->e, (uint64_t)global * es, sr->buf, (size_t)n * es);
    fsc_tensor s = fsc_tensor_1d(sr->buf, sr->e->dtype, n),
               d = fsc_tensor_1d(dst, FSC_DTYPE_F32, n);
    return rc ? rc : fsc_tensor_convert(&s, &d);
}

static int check_entry(const char *path, const fsc_st_entry *e, const char *name, int ndim,
                       const int64_t *gshape) {
    if (!e)
        return fsc_error(FSC_ERR_NOT_FOUND,
                         "%s: no tensor %s (is this a checkpoint of the same model?)", path, name);
    bool same = e->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = e->shape[d] == gshape[d];
    if (!same)
        return fsc_error(FSC_ERR_SHAPE,
                         "%s: tensor %s has %d dims (%lld, ...), the model expects "
                         "the global shape (%lld, ...) with %d dims",
                         path, name, e->ndim, (long long)(e->ndim ? e->shape[0] : 0),
                         (long long)gshape[0], ndim);
    if (e->dtype != FSC_DTYPE_F32 && e->dtype != FSC_DTYPE_BF16 && e->dtype != FSC_DTYPE_F16)
        return fsc_error(FSC_ERR_DTYPE, "%s: tensor %s is %s (F32, BF16 or F16 expected)", path,
                         name, fsc_dtype_name(e->dtype));
    return FSC_OK;
}

int fsc_tp_load_weights(const char *path, fsc_module *root, fsc_params *ps, int *n_unused) {
    if (!path || !root || !ps)
        return fsc_error(FSC_ERR_INVALID, "fsc_tp_load_weights: NULL argument");
    int rc = FSC_OK;
    fsc_st_file *f = fsc_st_open(path, &rc);
    if (!f) return rc;
    int64_t longest = 0;
    for (int i = 0; !rc && i < ps->count; i++) { /* everything checked before anything is read */
        const fsc_param *p = ps->entries[i].param;
        tp_placement pl = tp_place(root, p);
        rc = check_entry(path, fsc_weights_find(f, ps->entries[i].name), ps->entries[i].name,
                         p->ndim, pl.gshape);
        longest = p->numel > longest ? p->numel : longest;
    }
    void *buf = rc ? NULL : fsc_mem_alloc(FSC_MEM_WORK, (size_t)(longest ? longest : 1) * 2);
    if (!rc && !buf) rc = FSC_ERR_NOMEM;
    for (int i = 0; !rc && i < ps->count; i++) {
        fsc_param *p = ps->entries[i].param;
        tp_placement pl = tp_place(root, p);
        const fsc_st_entry *e = fsc_weights_find(f, ps->entries[i].name);
        if (!pl.s) {
            fsc_tensor t = fsc_param_tensor(p);
            rc = fsc_st_read(f, e->name, &t);
            continue;
        }
        slice_reader sr = {f, e, p->data, buf};
        rc = tp_for_each_run(&pl, p, read_run, &sr);
    }
    fsc_mem_free(buf);
    if (!rc && n_unused) *n_unused = fsc_st_count(f) > ps->count ? fsc_st_count(f) - ps->count : 0;
    fsc_st_close(f);
    return rc;
}
