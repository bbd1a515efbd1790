/* FSDP between steps: full parameters on demand (summon), and state dicts —
 * full (each rank writing its shards' pieces through MPI-IO, or streamed
 * unit by unit to one writer with FSC_PARALLEL_IO=0), sharded (a rank's
 * flat shards with their layout), and optimizer state by global name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/flat_shards.h"
#include "fsc/io.h"
#include "fsc/weights.h"
#include "fsdp_internal.h"
#include "io/st_parallel.h"

/* Every rank returns the first failing rank's status and message. */
static int agree(fsc_fsdp *f, int rc, const char *what, const char *path) {
    char doing[4400];
    snprintf(doing, sizeof doing, "%s %.4095s", what, path);
    return fsc_group_agree(f->g, rc, doing);
}

static bool busy(const fsc_fsdp *f) {
    for (int k = 0; k < f->nunits; k++)
        if (f->units[k].full || f->units[k].rs_pending) return true;
    return false;
}

/* ---- summon ---------------------------------------------------------------------------------- */

int fsc_fsdp_summon_full_params(fsc_fsdp *f) {
    if (!f) return fsc_error(FSC_ERR_INVALID, "FSDP summon: f must not be NULL");
    if (f->summoned) return fsc_error(FSC_ERR_INVALID, "FSDP summon: already summoned");
    if (busy(f))
        return fsc_error(FSC_ERR_INVALID, "FSDP summon: a step is in progress (call it "
                                          "between steps)");
    for (int k = 0; k < f->nunits; k++) {
        int rc = fsdp_gather(f, &f->units[k], true);
        if (rc) {
            for (int j = 0; j <= k; j++) fsdp_release(&f->units[j]);
            return rc;
        }
    }
    f->summoned = true;
    return FSC_OK;
}

int fsc_fsdp_release_full_params(fsc_fsdp *f, bool writeback) {
    if (!f || !f->summoned) return fsc_error(FSC_ERR_INVALID, "FSDP release: nothing summoned");
    for (int k = 0; k < f->nunits; k++) {
        fsdp_unit *u = &f->units[k];
        if (writeback && u->full) fsdp_take_shard(f, u);
        fsdp_release(u);
    }
    f->summoned = false;
    return FSC_OK;
}

/* ---- full state dict --------------------------------------------------------------------------
 */

/* Each rank writes the pieces of its shards at their places in the file
 * (the declarations of fsc_weights_save: the same bytes); nothing is gathered. */
static int save_full_parallel(fsc_fsdp *f, const char *path, int root, int n_meta,
                              const char *const *keys, const char *const *values) {
    int rc = FSC_OK;
    fsc_st_writer *plan = st_plan_new(f->rank == root ? path : "(the root's path)", &rc);
    if (plan) rc = st_declare_weights(plan, &f->ps, n_meta, keys, values);
    st_pieces pc = {0};
    for (int i = 0; !rc && i < f->nranges; i++) {
        const fsc_shard_range *s = &f->part->ranges[f->rank][i];
        rc = st_pieces_add(&pc, s->entry, s->begin, s->count, f->ranges[i].param, FSC_DTYPE_F32);
    }
    if (rc) fsc_error_context(rc, "FSDP save_weights (rank %d): ", f->rank);
    rc = st_parallel_save(f->g, root, path, plan, &pc, rc);
    st_pieces_free(&pc);
    return rc;
}

int fsc_fsdp_save_weights(fsc_fsdp *f, const char *path, int root, int n_meta,
                          const char *const *keys, const char *const *values) {
    if (!f) return fsc_error(FSC_ERR_INVALID, "FSDP save_weights: f must not be NULL");
    if (root < 0 || root >= f->world)
        return fsc_error(FSC_ERR_INVALID, "FSDP save_weights: root %d not in [0, %d)", root,
                         f->world);
    const bool is_root = f->rank == root;
    if (is_root && !path)
        return fsc_error(FSC_ERR_INVALID, "FSDP save_weights: path must not be NULL on the root");
    const char *where = path ? path : "(root's path)";
    if (busy(f) || f->summoned)
        return fsc_error(FSC_ERR_INVALID, "FSDP save_weights %s: call it between steps", where);
    bool parallel;
    int wrc = st_parallel_mode(f->g, &parallel);
    if (wrc) return wrc;
    if (parallel) return save_full_parallel(f, path, root, n_meta, keys, values);
    fsc_st_writer *w = NULL;
    if (is_root) { /* the very sequence fsc_weights_save follows: same bytes */
        w = fsc_st_writer_open(path, &wrc);
        if (!w && !wrc) wrc = FSC_ERR_IO;
        for (int i = 0; w && !wrc && i < n_meta; i++)
            wrc = fsc_st_writer_set_metadata(w, keys[i], values[i]);
        for (int e = 0; w && !wrc && e < f->ps.count; e++) {
            const fsc_param *p = f->ps.entries[e].param;
            wrc = fsc_st_writer_declare(w, f->ps.entries[e].name, FSC_DTYPE_F32, p->ndim, p->shape);
        }
    }
    int rc = agree(f, wrc, "FSDP save_weights: the root could not start", where);
    if (rc) {
        if (w) fsc_st_writer_abort(w);
        return rc;
    }
    /* Entries in model order, each unit gathered when first needed and freed
     * when the next entry belongs to another: one unit at a time. A write
     * failure on the root does not stop the gathers (peers are in them). */
    int crc = FSC_OK;
    fsdp_unit *cur = NULL;
    for (int e = 0; e < f->ps.count && !crc; e++) {
        fsdp_unit *u = &f->units[f->unit_of[e]];
        if (u != cur) {
            if (cur) fsdp_release(cur);
            cur = u;
            crc = fsdp_gather(f, u, true);
        }
        if (is_root && !crc && !wrc) {
            fsc_tensor t = fsc_param_tensor(f->ps.entries[e].param);
            wrc = fsc_st_writer_write_tensor(w, f->ps.entries[e].name, &t);
        }
    }
    if (cur) fsdp_release(cur);
    if (w) {
        if (wrc || crc)
            fsc_st_writer_abort(w);
        else
            wrc = fsc_st_writer_close(w);
    }
    rc = crc ? crc : wrc;
    if (rc) fsc_error_context(rc, "FSDP save_weights %s (rank %d): ", where, f->rank);
    return agree(f, rc, "FSDP save_weights: another rank failed saving", where);
}

/* Checks presence and shape of every parameter (as fsc_weights_load does). */
static int check_full(fsc_fsdp *f, fsc_st_file *file, const char *path) {
    for (int e = 0; e < f->ps.count; e++) {
        const fsc_param *p = f->ps.entries[e].param;
        const fsc_st_entry *t = fsc_weights_find(file, f->ps.entries[e].name);
        if (!t)
            return fsc_error(FSC_ERR_NOT_FOUND,
                             "%s: no tensor %s (is this a checkpoint of the same model?)", path,
                             f->ps.entries[e].name);
        bool same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same)
            return fsc_error(FSC_ERR_SHAPE, "%s: tensor %s has another shape than the model's %s",
                             path, t->name, f->ps.entries[e].name);
    }
    return FSC_OK;
}

/* Reads this rank's pieces into stage (laid out as the shards). F32 tensors
 * are read piece by piece; others whole (converted), one at a time. */
static int read_pieces(fsc_fsdp *f, fsc_st_file *file, float *stage) {
    int64_t biggest = 0;
    for (int e = 0; e < f->ps.count; e++)
        if (f->ps.entries[e].param->numel > biggest) biggest = f->ps.entries[e].param->numel;
    float *whole = NULL;
    int rc = FSC_OK;
    for (int i = 0; i < f->nranges && !rc; i++) {
        const fsc_shard_range *s = &f->part->ranges[f->rank][i];
        const fsc_param_entry *pe = &f->ps.entries[s->entry];
        const fsc_st_entry *t = fsc_weights_find(file, pe->name);
        float *dst = stage + (f->ranges[i].param - f->data);
        if (t->dtype == FSC_DTYPE_F32) {
            rc = fsc_st_read_bytes(file, t, (uint64_t)s->begin * 4, dst, (size_t)s->count * 4);
            continue;
        }
        if (!whole && !(whole = fsc_mem_alloc(FSC_MEM_WORK, (size_t)biggest * sizeof(float))))
            return FSC_ERR_NOMEM;
        fsc_tensor full = fsc_param_tensor(pe->param);
        full.data = whole;
        rc = fsc_st_read(file, t->name, &full);
        if (!rc) memcpy(dst, whole + s->begin, (size_t)s->count * sizeof(float));
    }
    fsc_mem_free(whole);
    return rc;
}

/* A load replaces the shards: only between steps, nothing summoned. */
static int check_load(const fsc_fsdp *f, const char *path, const char *what) {
    if (!f || !path)
        return fsc_error(FSC_ERR_INVALID, "FSDP %s: f and path must not be NULL", what);
    if (busy(f) || f->summoned)
        return fsc_error(FSC_ERR_INVALID, "FSDP %s %s: call it between steps", what, path);
    return FSC_OK;
}

int fsc_fsdp_load_weights(fsc_fsdp *f, const char *path) {
    int rc = check_load(f, path, "load_weights");
    if (rc) return rc;
    float *stage = NULL;
    fsc_st_file *file = fsc_st_open(path, &rc);
    if (!file && !rc) rc = FSC_ERR_IO;
    if (!rc) rc = check_full(f, file, path);
    if (!rc && f->shard_total &&
        !(stage = fsc_mem_alloc(FSC_MEM_WORK, (size_t)f->shard_total * sizeof(float))))
        rc = fsc_error_context(FSC_ERR_NOMEM, "%s: staging the shards: ", path);
    if (!rc && stage) rc = read_pieces(f, file, stage);
    fsc_st_close(file);
    if (rc) fsc_error_context(rc, "FSDP load_weights (rank %d): ", f->rank);
    rc = agree(f, rc, "FSDP load_weights: another rank refused", path);
    if (!rc && stage) /* padding and gaps stay zero: the stage is zero-filled */
        memcpy(f->data, stage, (size_t)f->shard_total * sizeof(float));
    fsc_mem_free(stage);
    return rc;
}

/* ---- sharded state dict ------------------------------------------------------------------------
 */

/* The shard files' layout: each unit's trainable region as a flat unit
 * named by its path, and its frozen region, when it has one, as one more,
 * "<path>[frozen]"; shards[j] (2 * nunits slots) is this rank's slice of
 * flat unit j. */
static int make_layout(const fsc_fsdp *f, fsc_flat_layout *L, float ***shards) {
    memset(L, 0, sizeof *L);
    L->world = f->world;
    L->nparams = f->ps.count;
    L->units = calloc(2 * (size_t)f->nunits, sizeof *L->units);
    L->params = calloc((size_t)f->ps.count + 1, sizeof *L->params);
    *shards = calloc(2 * (size_t)f->nunits, sizeof **shards);
    if (!L->units || !L->params || !*shards) {
        free(L->units), free(L->params), free(*shards);
        return fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
    }
    for (int k = 0; k < f->nunits; k++) {
        const fsdp_unit *u = &f->units[k];
        const int t = L->nunits++, fz = u->shard > u->gshard ? L->nunits++ : -1;
        snprintf(L->units[t].name, sizeof L->units[t].name, "%s", u->name);
        L->units[t].numel = u->gnumel;
        L->units[t].shard = u->gshard;
        (*shards)[t] = u->shard_data;
        if (fz >= 0) {
            snprintf(L->units[fz].name, sizeof L->units[fz].name, "%.*s[frozen]",
                     (int)sizeof L->units[fz].name - 9, u->name);
            L->units[fz].numel = u->fnumel;
            L->units[fz].shard = u->shard - u->gshard;
            (*shards)[fz] = u->shard_data + u->gshard;
        }
        for (int i = 0; i < u->n; i++) {
            const fsc_param_entry *pe = &f->ps.entries[u->entries[i]];
            fsc_flat_param *fp = &L->params[u->entries[i]];
            snprintf(fp->name, sizeof fp->name, "%s", pe->name);
            fp->ndim = pe->param->ndim;
            memcpy(fp->shape, pe->param->shape, sizeof fp->shape);
            fp->unit = pe->param->frozen ? fz : t;
            fp->offset = u->offset[i] - (pe->param->frozen ? u->gpadded : 0);
        }
    }
    return FSC_OK;
}

int fsc_fsdp_save_sharded(fsc_fsdp *f, const char *path, int n_meta, const char *const *keys,
                          const char *const *values) {
    if (!f || !path)
        return fsc_error(FSC_ERR_INVALID, "FSDP save_sharded: f and path must not be NULL");
    fsc_flat_layout L;
    float **shards;
    int rc = make_layout(f, &L, &shards);
    if (rc) return rc;
    rc = fsc_flat_shard_save(path, &L, f->rank, (const float **)shards, n_meta, keys, values);
    free(shards);
    free(L.units), free(L.params);
    return rc;
}

int fsc_fsdp_load_sharded(fsc_fsdp *f, const char *path) {
    int rc = check_load(f, path, "load_sharded");
    if (rc) return rc;
    fsc_flat_layout L;
    float **shards;
    if ((rc = make_layout(f, &L, &shards))) return rc;
    rc = fsc_flat_shard_load(path, &L, f->rank, shards);
    free(shards);
    free(L.units), free(L.params);
    return rc;
}

/* ---- optimizer state by name ---------------------------------------------------------------- */

static optim_shards view(fsc_fsdp *f, const char *who) {
    return (optim_shards){.ps = &f->ps,
                          .part = f->part,
                          .local = f->optim,
                          .g = f->g,
                          .policy = "fsdp",
                          .who = who,
                          .io = f->g};
}

int fsc_fsdp_save_optim(fsc_fsdp *f, const char *path, int root) {
    if (!f) return fsc_error(FSC_ERR_INVALID, "FSDP save_optim_state: f must not be NULL");
    optim_shards v = view(f, "FSDP save_optim");
    return optim_shards_save(&v, path, root);
}

int fsc_fsdp_load_optim(fsc_fsdp *f, const char *path) {
    if (!f) return fsc_error(FSC_ERR_INVALID, "FSDP load_optim_state: f must not be NULL");
    optim_shards v = view(f, "FSDP load_optim");
    return optim_shards_load(&v, path);
}
