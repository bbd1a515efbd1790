/* Sharded optimizer state by global parameter name (OSS and FSDP): a
 * safetensors file that any world size, partition policy or strategy can
 * write and read.
 *
 * Saving streams tensor by tensor: for each parameter, in entry order, and
 * each state kind, the owners of its pieces send them to the root (whose own
 * pieces are copied), which assembles the tensor in one reused buffer and
 * writes it. Every rank walks the same sequence, so the root's receives match
 * the owners' sends one for one, and the root never holds more than one
 * tensor's state. Loading is validate, stage, agree, commit: every rank checks
 * the whole file against its model and optimizer, reads its slices into a
 * staging buffer, and only if every rank succeeded copies them into the state,
 * so a refused file changes nothing anywhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/io.h"
#include "io/st_parallel.h"
#include "sharded_internal.h"

#define STATE_TAG 7 /* point-to-point tag of state pieces */

/* The fields derived from the group and the optimizer. */
static void fill_in(optim_shards *o) {
    o->rank = fsc_group_rank(o->g), o->world = fsc_group_size(o->g);
    o->cfg = fsc_optim_get_config(o->local);
    o->K = fsc_optim_state_count(&o->cfg);
    o->nranges = o->part->nranges[o->rank];
}

static const char *kind_name(fsc_optim_kind k) {
    return k == FSC_OPTIM_SGD ? "SGD" : k == FSC_OPTIM_ADAM ? "Adam" : "AdamW";
}

/* Name of state `which` for optimizer cfg: "momentum", "exp_avg", "exp_avg_sq". */
static const char *state_name(const fsc_optim_config *c, int which) {
    if (c->kind == FSC_OPTIM_SGD) return "momentum";
    return which == 0 ? "exp_avg" : "exp_avg_sq";
}

/* State `which` of this rank's piece k: where it starts in its local range. */
static int piece_state(optim_shards *o, int k, int which, float **st) {
    int rc = fsc_optim_state(o->local, o->local_of_piece ? o->local_of_piece[k] : k, which, st);
    if (!rc && *st && o->offset_of_piece) *st += o->offset_of_piece[k];
    return rc;
}

/* "momentum", "exp_avg,exp_avg_sq" or "" (SGD without momentum). */
static const char *state_list(const optim_shards *o) {
    return o->K == 0 ? "" : o->K == 1 ? "momentum" : "exp_avg,exp_avg_sq";
}

static int tensor_name(char *dst, size_t size, const optim_shards *o, int which,
                       const char *param) {
    int n = snprintf(dst, size, "optim.%s.%s", state_name(&o->cfg, which), param);
    if (n < 0 || (size_t)n >= size)
        return fsc_error(FSC_ERR_INVALID, "optim state name for '%s' is too long", param);
    return FSC_OK;
}

/* Every rank returns the first failing rank's status and message. */
static int agree(optim_shards *o, int rc, const char *what, const char *path) {
    char doing[4400];
    snprintf(doing, sizeof doing, "%s (%s %.4095s)", o->who, what, path);
    return fsc_group_agree(o->g, rc, doing);
}

/* ---- save ---------------------------------------------------------------------- */
static int declare_all(optim_shards *o, fsc_st_writer *w) {
    char name[FSC_NAME_MAX * 3], v[64];
    int rc = FSC_OK;
    for (int i = 0; i < o->ps->count && !rc; i++) {
        const fsc_param *p = o->ps->entries[i].param;
        for (int k = 0; k < o->K && !rc; k++) {
            rc = tensor_name(name, sizeof name, o, k, o->ps->entries[i].name);
            if (!rc) rc = fsc_st_writer_declare(w, name, FSC_DTYPE_F32, p->ndim, p->shape);
        }
    }
    const fsc_optim_config c = fsc_optim_get_config(o->local);
#define META(key, fmt, val)                                                                        \
    do {                                                                                           \
        if (!rc) {                                                                                 \
            snprintf(v, sizeof v, fmt, val);                                                       \
            rc = fsc_st_writer_set_metadata(w, key, v);                                            \
        }                                                                                          \
    } while (0)
    META("format", "%s", "fsc-optim-state");
    META("kind", "%s", kind_name(c.kind));
    META("state", "%s", state_list(o));
    META("step", "%lld", (long long)fsc_optim_get_step(o->local));
    META("lr", "%.17g", c.lr);
    META("weight_decay", "%.17g", c.weight_decay);
    META("decay_all", "%s", c.decay_all ? "true" : "false");
    if (c.kind == FSC_OPTIM_SGD) {
        META("momentum", "%.17g", c.momentum);
        META("dampening", "%.17g", c.dampening);
        META("nesterov", "%s", c.nesterov ? "true" : "false");
    } else {
        META("beta1", "%.17g", c.beta1);
        META("beta2", "%.17g", c.beta2);
        META("eps", "%.17g", c.eps);
    }
    META("world", "%d", o->world);
    META("policy", "%s", o->policy);
#undef META
    return rc;
}

/* State `which` of rank r's pieces of entry e, from its range cursor *at on:
 * r sends them to root; the root receives them (or, its own, copies them)
 * into buf at their place in the tensor. Leaves *at past the entry's ranges. */
static int move_pieces(optim_shards *o, int r, int *at, int e, int which, int root, float *buf) {
    const fsc_partition *p = o->part;
    int k = *at, rc = FSC_OK;
    for (; k < p->nranges[r] && p->ranges[r][k].entry == e && !rc; k++) {
        const fsc_shard_range *s = &p->ranges[r][k];
        if (o->ps->entries[e].param->frozen) { /* no state anywhere: zeros, nothing sent */
            if (o->rank == root) memset(buf + s->begin, 0, (size_t)s->count * sizeof(float));
        } else if (r == o->rank) {
            float *st;
            rc = piece_state(o, k, which, &st);
            if (rc) break;
            if (r == root)
                memcpy(buf + s->begin, st, (size_t)s->count * sizeof(float));
            else
                rc = fsc_group_send(o->g, st, s->count, FSC_DTYPE_F32, root, STATE_TAG);
        } else {
            rc = fsc_group_recv(o->g, buf + s->begin, s->count, FSC_DTYPE_F32, r, STATE_TAG);
        }
    }
    *at = k;
    return rc;
}

/* Every rank writes its own pieces at their offsets in the file the
 * streaming save writes (the same declare_all: the same bytes); state
 * replicated on io's ranks (g is this process alone) is tiled over them. */
static int save_parallel(optim_shards *o, const char *path, int root) {
    const int me = fsc_group_rank(o->io), n = fsc_group_size(o->io);
    const bool tiled = o->world == 1;
    int rc = FSC_OK;
    fsc_st_writer *plan = st_plan_new(me == root ? path : "(the root's path)", &rc);
    if (plan) rc = declare_all(o, plan);
    st_pieces pc = {0};
    /* frozen parameters hold no state; the file carries theirs as zeros */
    int64_t most_frozen = 0;
    for (int i = 0; i < o->nranges; i++) {
        const fsc_shard_range *s = &o->part->ranges[o->rank][i];
        if (o->ps->entries[s->entry].param->frozen && s->count > most_frozen)
            most_frozen = s->count;
    }
    float *zeros = most_frozen ? calloc((size_t)most_frozen, sizeof(float)) : NULL;
    if (most_frozen && !zeros && !rc) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", o->who);
    for (int i = 0; !rc && i < o->nranges; i++) {
        const fsc_shard_range *s = &o->part->ranges[o->rank][i];
        for (int k = 0; !rc && k < o->K; k++) {
            float *st = NULL;
            int t = s->entry * o->K + k; /* declare_all's order: by entry, then state */
            int64_t lo = s->begin, hi = s->begin + s->count, e0, e1;
            if (tiled) {
                st_plan_tile(plan, t, me, n, &e0, &e1);
                lo = e0 > lo ? e0 : lo, hi = e1 < hi ? e1 : hi;
            }
            rc = piece_state(o, i, k, &st);
            if (!rc && o->ps->entries[s->entry].param->frozen) st = zeros;
            if (!rc && hi > lo && !st)
                rc = fsc_error(FSC_ERR_INVALID, "%s: no state for piece %d", o->who, i);
            if (!rc && hi > lo)
                rc = st_pieces_add(&pc, t, lo, hi - lo, st + (lo - s->begin), FSC_DTYPE_F32);
        }
    }
    if (rc) fsc_error_context(rc, "%s (rank %d): ", o->who, me);
    rc = st_parallel_save(o->io, root, path, plan, &pc, rc);
    st_pieces_free(&pc);
    free(zeros);
    return rc;
}

static int save_streaming(optim_shards *o, const char *path, int root);

int optim_shards_save(optim_shards *o, const char *path, int root) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "optimizer state: o must not be NULL");
    fill_in(o);
    const bool replicated = o->io && o->world == 1 && fsc_group_size(o->io) > 1;
    if (!replicated && o->io != o->g) return save_streaming(o, path, root);
    if (root < 0 || root >= fsc_group_size(o->io))
        return fsc_error(FSC_ERR_INVALID, "%s: root %d not in [0, %d)", o->who, root,
                         fsc_group_size(o->io));
    bool parallel;
    int rc = st_parallel_mode(o->io, &parallel);
    if (rc) return rc;
    if (parallel) return save_parallel(o, path, root);
    if (!replicated) return save_streaming(o, path, root);
    /* one writer of replicated state: io's root, alone; the others learn how it went */
    rc = fsc_group_rank(o->io) == root ? save_streaming(o, path, 0) : FSC_OK;
    int32_t status = rc;
    int crc = fsc_group_broadcast(o->io, &status, 1, FSC_DTYPE_I32, root);
    if (crc) return crc;
    if (status && fsc_group_rank(o->io) != root)
        return fsc_error(status, "%s: rank %d could not write %s (see its error)", o->who, root,
                         "the optimizer state");
    return rc;
}

/* The root writes; the owners stream their pieces to it, tensor by tensor. */
static int save_streaming(optim_shards *o, const char *path, int root) {
    if (root < 0 || root >= o->world)
        return fsc_error(FSC_ERR_INVALID, "%s: root %d not in [0, %d)", o->who, root, o->world);
    const bool is_root = o->rank == root;
    if (is_root && !path)
        return fsc_error(FSC_ERR_INVALID, "%s: path must not be NULL on the root", o->who);
    const char *where = path ? path : "(root's path)";
    int wrc = FSC_OK, crc = FSC_OK; /* the file's status (root) and the transfers' */
    fsc_st_writer *w = NULL;
    float *buf = NULL;
    /* per rank: the range cursor, and where the current entry's ranges start */
    int *cursor = calloc(2 * (size_t)o->world, sizeof *cursor), *start = cursor + o->world;
    if (!cursor) crc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", o->who);
    if (is_root && !crc) {
        int64_t most = 0;
        for (int i = 0; i < o->ps->count; i++)
            if (o->ps->entries[i].param->numel > most) most = o->ps->entries[i].param->numel;
        if (o->K > 0 && most > 0 && !(buf = fsc_mem_alloc(FSC_MEM_COMM, (size_t)most * 4)))
            crc = fsc_error_context(FSC_ERR_NOMEM, "%s: one-tensor buffer: ", o->who);
        if (!crc && !(w = fsc_st_writer_open(path, &wrc))) wrc = wrc ? wrc : FSC_ERR_IO;
        if (w) wrc = declare_all(o, w);
    }
    if (crc || wrc) fsc_error_context(crc ? crc : wrc, "%s (rank %d): ", o->who, o->rank);
    /* Nobody sends unless every rank (the root above all) is ready. */
    int rc = agree(o, crc ? crc : wrc, "another rank could not start saving", where);
    /* A write failure from here on does not stop the transfers: the owners'
     * sends must be matched, so the root keeps receiving and only skips writing. */
    if (rc) crc = rc;
    for (int e = 0; e < o->ps->count && !crc; e++) {
        const int64_t numel = o->ps->entries[e].param->numel;
        memcpy(start, cursor, (size_t)o->world * sizeof *start);
        for (int k = 0; k < o->K && !crc; k++) {
            for (int r = 0; r < o->world && !crc; r++) {
                if (!is_root && r != o->rank) continue;
                cursor[r] = start[r];
                crc = move_pieces(o, r, &cursor[r], e, k, root, buf);
            }
            if (is_root && !crc && !wrc && numel > 0) {
                char name[FSC_NAME_MAX * 3];
                wrc = tensor_name(name, sizeof name, o, k, o->ps->entries[e].name);
                if (!wrc) wrc = fsc_st_writer_write(w, name, buf, (size_t)numel * sizeof(float));
            }
        }
    }
    if (w) {
        if (wrc || crc)
            fsc_st_writer_abort(w);
        else
            wrc = fsc_st_writer_close(w);
    }
    fsc_mem_free(buf);
    free(cursor);
    if (rc) return rc; /* already agreed on */
    rc = crc ? crc : wrc;
    if (rc) fsc_error_context(rc, "%s %s (rank %d): ", o->who, where, o->rank);
    return agree(o, rc, "another rank failed saving", where);
}

/* ---- load ---------------------------------------------------------------------- */
static bool is_expected(const optim_shards *o, const char *name) {
    if (strncmp(name, "optim.", 6) != 0) return false;
    for (int k = 0; k < o->K; k++) {
        const char *s = state_name(&o->cfg, k);
        size_t n = strlen(s);
        if (strncmp(name + 6, s, n) == 0 && name[6 + n] == '.' &&
            fsc_params_find(o->ps, name + 7 + n))
            return true;
    }
    return false;
}

static void shape_str(char *dst, size_t size, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(dst, size, "(");
    for (int d = 0; d < ndim && at < size; d++)
        at += (size_t)snprintf(dst + at, size - at, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (at < size) snprintf(dst + at, size - at, ")");
}

/* Checks kind, state kinds, step, and every tensor's presence, dtype and shape. */
static int validate(optim_shards *o, fsc_st_file *f, const char *path, int64_t *step) {
    const char *kind = fsc_st_metadata(f, "kind"), *state = fsc_st_metadata(f, "state"),
               *st = fsc_st_metadata(f, "step");
    const char *want = kind_name(o->cfg.kind);
    if (!kind || !state || !st)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: not an optimizer state file (metadata 'kind', 'state' and 'step' "
                         "required)",
                         path);
    if (strcmp(kind, want) != 0)
        return fsc_error(FSC_ERR_INVALID, "%s: holds %s state, but this optimizer is %s", path,
                         kind, want);
    if (strcmp(state, state_list(o)) != 0)
        return fsc_error(FSC_ERR_INVALID,
                         "%s: holds state [%s], but this %s optimizer keeps [%s] (momentum on "
                         "one side only?)",
                         path, state, want, state_list(o));
    char *end;
    long long s = strtoll(st, &end, 10);
    if (end == st || *end || s < 0)
        return fsc_error(FSC_ERR_FORMAT, "%s: step '%s' is not a count >= 0", path, st);
    *step = s;
    char name[FSC_NAME_MAX * 3], a[96], b[96];
    for (int i = 0; i < o->ps->count; i++) {
        const fsc_param *p = o->ps->entries[i].param;
        for (int k = 0; k < o->K; k++) {
            int rc = tensor_name(name, sizeof name, o, k, o->ps->entries[i].name);
            if (rc) return rc;
            const fsc_st_entry *e = fsc_st_find(f, name);
            if (!e)
                return fsc_error(FSC_ERR_NOT_FOUND,
                                 "%s: no tensor %s (a state file of another model?)", path, name);
            if (e->dtype != FSC_DTYPE_F32)
                return fsc_error(FSC_ERR_DTYPE, "%s: tensor %s is %s, expected F32", path, name,
                                 fsc_dtype_name(e->dtype));
            bool same = e->ndim == p->ndim;
            for (int d = 0; same && d < p->ndim; d++) same = e->shape[d] == p->shape[d];
            if (!same) {
                shape_str(a, sizeof a, e->ndim, e->shape);
                shape_str(b, sizeof b, p->ndim, p->shape);
                return fsc_error(FSC_ERR_SHAPE, "%s: tensor %s has shape %s, parameter %s has %s",
                                 path, name, a, o->ps->entries[i].name, b);
            }
        }
    }
    for (int i = 0; i < fsc_st_count(f); i++) {
        const char *n = fsc_st_entry_at(f, i)->name;
        if (!is_expected(o, n))
            return fsc_error(FSC_ERR_INVALID,
                             "%s: tensor %s names no state of this model's parameters (a state "
                             "file of another model?)",
                             path, n);
    }
    return FSC_OK;
}

/* Reads this rank's slices of every state kind into stage (K x owned floats,
 * state-major, ranges in order). */
static int read_slices(optim_shards *o, fsc_st_file *f, float *stage) {
    char name[FSC_NAME_MAX * 3];
    int64_t at = 0;
    for (int k = 0; k < o->K; k++)
        for (int i = 0; i < o->nranges; i++) {
            const fsc_shard_range *s = &o->part->ranges[o->rank][i];
            int rc = tensor_name(name, sizeof name, o, k, o->ps->entries[s->entry].name);
            if (!rc)
                rc = fsc_st_read_bytes(f, fsc_st_find(f, name), (uint64_t)s->begin * 4, stage + at,
                                       (size_t)s->count * 4);
            if (rc) return rc;
            at += s->count;
        }
    return FSC_OK;
}

int optim_shards_load(optim_shards *o, const char *path) {
    if (!o || !path)
        return fsc_error(FSC_ERR_INVALID, "optimizer state: o and path must not be NULL");
    fill_in(o);
    const int64_t owned = o->part->elems[o->rank];
    int64_t step = 0;
    float *stage = NULL;
    int rc = FSC_OK;
    fsc_st_file *f = fsc_st_open(path, &rc);
    if (!f && !rc) rc = FSC_ERR_IO;
    if (!rc) rc = validate(o, f, path, &step);
    if (!rc && o->K > 0 && owned > 0 &&
        !(stage = fsc_mem_alloc(FSC_MEM_WORK, (size_t)o->K * (size_t)owned * sizeof(float))))
        rc = fsc_error_context(FSC_ERR_NOMEM, "%s: staging %lld state floats: ", path,
                               (long long)(o->K * owned));
    if (!rc && stage) rc = read_slices(o, f, stage);
    fsc_st_close(f);
    if (rc) fsc_error_context(rc, "%s (rank %d): ", o->who, o->rank);
    rc = agree(o, rc, "another rank refused", path);
    if (!rc) { /* commit: nothing above touched the optimizer */
        int64_t at = 0;
        for (int k = 0; k < o->K && !rc; k++)
            for (int i = 0; i < o->nranges && !rc; i++) {
                float *st;
                rc = piece_state(o, i, k, &st);
                int64_t n = o->part->ranges[o->rank][i].count;
                if (!rc && st) memcpy(st, stage + at, (size_t)n * sizeof(float));
                at += n;
            }
        if (!rc) rc = fsc_optim_set_step(o->local, step);
    }
    fsc_mem_free(stage);
    return rc;
}
