/* Parameters to and from safetensors by full name. Loading is two-phase: every
 * tensor is checked (present, right shape) before any parameter is written,
 * so a bad file never leaves a model half-loaded. Saving declares the same
 * tensors in the same order on every path (one writer, or every rank of a
 * group through MPI-IO), so the bytes never depend on the path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/io.h"
#include "fsc/kernels.h"
#include "fsc/weights.h"
#include "io/st_parallel.h"

int st_declare_weights(fsc_st_writer *w, const fsc_params *ps, int n_meta,
                       const char *const *keys, const char *const *values) {
    int status = FSC_OK;
    for (int i = 0; !status && i < n_meta; i++)
        status = fsc_st_writer_set_metadata(w, keys[i], values[i]);
    for (int i = 0; !status && i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        status = fsc_st_writer_declare(w, ps->entries[i].name, FSC_DTYPE_F32, p->ndim, p->shape);
    }
    return status;
}

int fsc_weights_save(const char *path, const fsc_params *ps, int n_meta, const char *const *keys,
                     const char *const *values) {
    int status = FSC_OK;
    fsc_st_writer *w = fsc_st_writer_open(path, &status);
    if (!w) return status;
    status = st_declare_weights(w, ps, n_meta, keys, values);
    for (int i = 0; !status && i < ps->count; i++) {
        fsc_tensor t = fsc_param_tensor(ps->entries[i].param);
        status = fsc_st_writer_write_tensor(w, ps->entries[i].name, &t);
    }
    if (status) {
        fsc_st_writer_abort(w);
        return status;
    }
    return fsc_st_writer_close(w);
}

/* Every rank holds ps alike: each writes an even share of the bytes. */
static int save_tiled(fsc_group *g, int root, const char *path, const fsc_params *ps, int n_meta,
                      const char *const *keys, const char *const *values) {
    const int me = fsc_group_rank(g), world = fsc_group_size(g);
    int rc = FSC_OK;
    fsc_st_writer *plan = st_plan_new(me == root ? path : "(the root's path)", &rc);
    if (plan) rc = st_declare_weights(plan, ps, n_meta, keys, values);
    st_pieces pc = {0};
    for (int i = 0; !rc && i < ps->count; i++) {
        int64_t e0, e1;
        st_plan_tile(plan, i, me, world, &e0, &e1);
        rc = st_pieces_add(&pc, i, e0, e1 - e0, ps->entries[i].param->data + e0, FSC_DTYPE_F32);
    }
    rc = st_parallel_save(g, root, path, plan, &pc, rc);
    st_pieces_free(&pc);
    return rc;
}

int fsc_weights_save_group(fsc_group *g, int root, const char *path, const fsc_params *ps,
                           int n_meta, const char *const *keys, const char *const *values) {
    if (!g || !ps || root < 0 || root >= fsc_group_size(g) || n_meta < 0)
        return fsc_error(FSC_ERR_INVALID, "fsc_weights_save_group: needs a group, parameters, a "
                                          "root of the group and n_meta >= 0");
    bool parallel;
    int rc = st_parallel_mode(g, &parallel);
    if (rc) return rc;
    if (parallel) return save_tiled(g, root, path, ps, n_meta, keys, values);
    rc = fsc_group_rank(g) == root ? fsc_weights_save(path, ps, n_meta, keys, values) : FSC_OK;
    if (fsc_group_size(g) == 1) return rc;
    int32_t status = rc; /* everyone learns the one writer's outcome */
    int crc = fsc_group_broadcast(g, &status, 1, FSC_DTYPE_I32, root);
    if (crc) return crc;
    if (status && fsc_group_rank(g) != root)
        return fsc_error(status, "rank %d could not write the weights (see its error)", root);
    return rc;
}

const fsc_st_entry *fsc_weights_find(const fsc_st_file *f, const char *name) {
    const fsc_st_entry *e = fsc_st_find(f, name);
    if (e) return e;
    char prefixed[FSC_NAME_MAX * 2 + 16];
    snprintf(prefixed, sizeof prefixed, "transformer.%s", name);
    return fsc_st_find(f, prefixed);
}

/* Position embeddings longer than the model's: the model uses the first
 * rows (a GPT-2 file of 1024 positions trained on at --seq 256). */
static bool leading_rows(const fsc_st_entry *e, const fsc_param *p) {
    const size_t n = strlen(e->name), k = strlen("wpe.weight");
    return p->ndim == 2 && e->ndim == 2 && e->shape[1] == p->shape[1] &&
           e->shape[0] > p->shape[0] && n >= k && !strcmp(e->name + n - k, "wpe.weight");
}

static int read_leading_rows(fsc_st_file *f, const fsc_st_entry *e, fsc_tensor *dst) {
    const size_t es = fsc_dtype_size(dst->dtype);
    char *buf = malloc((size_t)e->shape[0] * (size_t)e->shape[1] * es);
    if (!buf) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", e->name);
    fsc_tensor full = fsc_tensor_2d(buf, dst->dtype, e->shape[0], e->shape[1]);
    int rc = fsc_st_read(f, e->name, &full); /* whole, converted; then its first rows */
    if (!rc) memcpy(dst->data, buf, (size_t)fsc_tensor_numel(dst) * es);
    free(buf);
    return rc;
}

int fsc_weights_load(const char *path, fsc_params *ps, int *n_unused) {
    int status = FSC_OK;
    fsc_st_file *f = fsc_st_open(path, &status);
    if (!f) return status;
    for (int i = 0; !status && i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        const fsc_st_entry *e = fsc_weights_find(f, ps->entries[i].name);
        if (!e) {
            status = fsc_error(FSC_ERR_NOT_FOUND,
                               "%s: no tensor %s (is this a checkpoint of "
                               "the same model?)",
                               path, ps->entries[i].name);
            break;
        }
        bool same = e->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = e->shape[d] == p->shape[d];
        if (!same && !leading_rows(e, p)) {
            char want[64], got[64];
            int a = 0, b = 0;
            for (int d = 0; d < p->ndim; d++)
                a += snprintf(want + a, sizeof want - (size_t)a, d ? ",%lld" : "%lld",
                              (long long)p->shape[d]);
            for (int d = 0; d < e->ndim; d++)
                b += snprintf(got + b, sizeof got - (size_t)b, d ? ",%lld" : "%lld",
                              (long long)e->shape[d]);
            status =
                fsc_error(FSC_ERR_SHAPE, "%s: tensor %s has shape [%s], the model expects [%s]",
                          path, e->name, got, want);
        }
    }
    for (int i = 0; !status && i < ps->count; i++) {
        fsc_tensor t = fsc_param_tensor(ps->entries[i].param);
        const fsc_st_entry *e = fsc_weights_find(f, ps->entries[i].name);
        status = leading_rows(e, ps->entries[i].param) ? read_leading_rows(f, e, &t)
                                                       : fsc_st_read(f, e->name, &t);
    }
    fsc_weights_changed(); /* even a partial read has written parameters */
    if (!status && n_unused) {
        int used = ps->count;
        *n_unused = fsc_st_count(f) - used > 0 ? fsc_st_count(f) - used : 0;
    }
    fsc_st_close(f);
    return status;
}
