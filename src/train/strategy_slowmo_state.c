/* The slowmo row's checkpoint file (strategy.safetensors of a checkpoint):
 * what rank 0's weights and optimizer state leave out. Every tensor is
 * stored whole under its global parameter name, so the file does not
 * depend on how the outer state was sharded:
 *   slowmo.old.<name>, slowmo.buf.<name>  the outer state (with an outer update)
 *   rank<r>.<state>.<name>                rank r's local optimizer state
 *   rank<r>.param.<name>                  rank r's replica (r >= 1), only when
 *                                         the step was not an averaging one
 * and in the metadata the local step count and the row's settings.
 *
 * The one idea: the root writes one flat buffer's worth at a time (its own,
 * or received from the rank that holds it), so it never holds more than one
 * extra copy of the parameters, and every rank walks the same sequence. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/io.h"
#include "fsc/zero.h"
#include "slowmo_internal.h"

#define STATE_TAG 11 /* point-to-point tag of the pieces sent to the root */
#define FORMAT "fsc-strategy-state"

static const char *state_name(const fsc_optim_config *c, int k) {
    return c->kind == FSC_OPTIM_SGD ? "momentum" : k == 0 ? "exp_avg" : "exp_avg_sq";
}

static int name_of(char *dst, size_t size, const char *prefix, const char *param) {
    int n = snprintf(dst, size, "%s.%s", prefix, param);
    if (n < 0 || (size_t)n >= size)
        return fsc_error(FSC_ERR_INVALID, "slowmo state: name %s.%s is too long", prefix, param);
    return FSC_OK;
}

/* This rank's local optimizer state `k` laid out as the flat parameters
 * (zeros where it keeps none: frozen parameters, padding); with unpack, the
 * other way. */
static int flat_state(fsc_strategy *s, int k, float *flat, bool unpack) {
    const fsc_partition *p = fsc_oss_partition(s->oss);
    for (int i = 0; i < p->nranges[0]; i++) {
        const fsc_shard_range *r = &p->ranges[0][i];
        float *st;
        int rc = fsc_optim_state(s->optim, i, k, &st);
        if (rc) return rc;
        float *at = flat + s->params.entries[r->entry].offset + r->begin;
        if (st && unpack)
            memcpy(st, at, sizeof(float) * (size_t)r->count);
        else if (st)
            memcpy(at, st, sizeof(float) * (size_t)r->count);
    }
    return FSC_OK;
}

/* ---- save ---------------------------------------------------------------------- */
typedef struct saver {
    fsc_strategy *s;
    fsc_st_writer *w; /* root only */
    int root, K;
    fsc_optim_config cfg;
    bool replicas;
    float *flat; /* P floats: the root's assembly buffer, a sender's packing buffer */
} saver;

static int declare(saver *v, const char *prefix) {
    char name[FSC_NAME_MAX * 3];
    for (int e = 0; e < v->s->params.count; e++) {
        const fsc_param *p = v->s->params.entries[e].param;
        int rc = name_of(name, sizeof name, prefix, v->s->params.entries[e].name);
        if (!rc) rc = fsc_st_writer_declare(v->w, name, FSC_DTYPE_F32, p->ndim, p->shape);
        if (rc) return rc;
    }
    return FSC_OK;
}

/* The root writes the flat buffer as prefix.<name> tensors. A failed writer
 * keeps its first error, so the root carries on receiving (the senders'
 * sequence must complete) and the status comes out at close. */
static void write_flat(saver *v, const char *prefix) {
    char name[FSC_NAME_MAX * 3];
    for (int e = 0; e < v->s->params.count; e++) {
        const fsc_param_entry *pe = &v->s->params.entries[e];
        if (!name_of(name, sizeof name, prefix, pe->name))
            (void)fsc_st_writer_write(v->w, name, v->flat + pe->offset,
                                      sizeof(float) * (size_t)pe->param->numel);
    }
}

/* Rank r's n floats, flat elements [b, b + n), reach the root's buffer. */
static int collect(saver *v, int r, const float *src, int64_t b, int64_t n) {
    fsc_strategy *s = v->s;
    if (n <= 0) return FSC_OK;
    if (r == v->root) {
        if (s->rank == r) memcpy(v->flat + b, src, sizeof(float) * (size_t)n);
        return FSC_OK;
    }
    if (s->rank == r) return fsc_group_send(s->group, src, n, FSC_DTYPE_F32, v->root, STATE_TAG);
    if (s->rank == v->root)
        return fsc_group_recv(s->group, v->flat + b, n, FSC_DTYPE_F32, r, STATE_TAG);
    return FSC_OK;
}

/* The outer state `which` (0 old, 1 buf): each rank's shard to the root. */
static int save_outer(saver *v, int which) {
    struct slowmo_state *st = v->s->slowmo;
    const int64_t P = v->s->params.numel;
    if (v->s->rank == v->root) memset(v->flat, 0, sizeof(float) * (size_t)P);
    for (int r = 0; r < v->s->world; r++) {
        int64_t b = st->shard * r < P ? st->shard * r : P,
                n = b + st->shard < P ? st->shard : P - b;
        int rc = collect(v, r, which ? st->buf : st->old, b, n);
        if (rc) return rc;
    }
    if (v->s->rank == v->root) write_flat(v, which ? "slowmo.buf" : "slowmo.old");
    return FSC_OK;
}

static int declare_all(saver *v) {
    fsc_strategy *s = v->s;
    struct slowmo_state *st = s->slowmo;
    char prefix[64], val[64];
    int rc = FSC_OK;
    if (st->outer) rc = declare(v, "slowmo.old");
    if (!rc && st->outer) rc = declare(v, "slowmo.buf");
    for (int r = 0; r < s->world && !rc; r++)
        for (int k = 0; k < v->K && !rc; k++) {
            snprintf(prefix, sizeof prefix, "rank%d.%s", r, state_name(&v->cfg, k));
            rc = declare(v, prefix);
        }
    for (int r = 1; v->replicas && r < s->world && !rc; r++) {
        snprintf(prefix, sizeof prefix, "rank%d.param", r);
        rc = declare(v, prefix);
    }
#define META(key, fmt, x)                                                                          \
    do {                                                                                           \
        snprintf(val, sizeof val, fmt, x);                                                         \
        if (!rc) rc = fsc_st_writer_set_metadata(v->w, key, val);                                  \
    } while (0)
    META("format", "%s", FORMAT);
    META("strategy", "%s", "slowmo");
    META("world", "%d", s->world);
    META("updates", "%" PRId64, st->updates);
    META("localsgd_frequency", "%d", st->localsgd_every);
    META("slowmo_frequency", "%d", st->slowmo_every);
    META("slowmo_momentum", "%.17g", st->momentum);
    META("slowmo_lr", "%.17g", st->lr);
    META("state", "%s", v->K == 0 ? "" : v->K == 1 ? "momentum" : "exp_avg,exp_avg_sq");
    META("replicas", "%s", v->replicas ? "true" : "false");
#undef META
    return rc;
}

int slowmo_save_state(fsc_strategy *s, const char *path, int root) {
    struct slowmo_state *st = s->slowmo;
    const int64_t P = s->params.numel;
    saver v = {.s = s, .root = root, .cfg = fsc_optim_get_config(s->optim)};
    v.K = fsc_optim_state_count(&v.cfg);
    /* right after an average every replica is rank 0's, which the weights
     * file holds; between averages each rank's own is needed */
    v.replicas = s->world > 1 && st->updates % st->localsgd_every != 0;
    int rc =
        root < 0 || root >= s->world
            ? fsc_error(FSC_ERR_INVALID, "slowmo state: root %d not in [0, %d)", root, s->world)
            : FSC_OK;
    if (!rc && s->rank == root && !path)
        rc = fsc_error(FSC_ERR_INVALID, "slowmo state: path must not be NULL on the root");
    if (!rc && !(v.flat = fsc_mem_alloc(FSC_MEM_WORK, sizeof(float) * (size_t)(P + 1))))
        rc = fsc_error(FSC_ERR_NOMEM, "slowmo state: %lld floats of staging: out of memory",
                       (long long)P);
    if (!rc && s->rank == root) {
        v.w = fsc_st_writer_open(path, &rc);
        if (v.w) rc = declare_all(&v);
    }
    /* from here on every rank takes part in every transfer */
    rc = fsc_group_agree(s->group, rc, "starting the slowmo state file");
    for (int which = 0; which < 2 && st->outer && !rc; which++) rc = save_outer(&v, which);
    char prefix[64];
    for (int r = 0; r < s->world && !rc; r++)
        for (int k = 0; k < v.K && !rc; k++) {
            if (s->rank == r && r != root) memset(v.flat, 0, sizeof(float) * (size_t)P);
            if (s->rank == root) memset(v.flat, 0, sizeof(float) * (size_t)P);
            if (s->rank == r) rc = flat_state(s, k, v.flat, false);
            rc = fsc_group_agree(s->group, rc, "reading a rank's optimizer state");
            if (!rc && s->rank == r && r != root)
                rc = fsc_group_send(s->group, v.flat, P, FSC_DTYPE_F32, root, STATE_TAG);
            else if (!rc && s->rank == root && r != root)
                rc = fsc_group_recv(s->group, v.flat, P, FSC_DTYPE_F32, r, STATE_TAG);
            snprintf(prefix, sizeof prefix, "rank%d.%s", r, state_name(&v.cfg, k));
            if (!rc && s->rank == root) write_flat(&v, prefix);
        }
    for (int r = 1; v.replicas && r < s->world && !rc; r++) {
        rc = collect(&v, r, s->params.data, 0, P);
        snprintf(prefix, sizeof prefix, "rank%d.param", r);
        if (!rc && s->rank == root) write_flat(&v, prefix);
    }
    if (s->rank == root && v.w) {
        int crc = rc ? (fsc_st_writer_abort(v.w), rc) : fsc_st_writer_close(v.w);
        if (!rc) rc = crc;
    }
    fsc_mem_free(v.flat);
    return fsc_group_agree(s->group, rc, "writing the slowmo state");
}

/* ---- load ---------------------------------------------------------------------- */
/* Metadata `key` of f as this run's value `want` (printed the way the save
 * prints it), or a refusal naming both. */
static int expect_meta(fsc_st_file *f, const char *path, const char *key, const char *want) {
    const char *have = fsc_st_metadata(f, key);
    if (have && !strcmp(have, want)) return FSC_OK;
    return fsc_error(FSC_ERR_INVALID, "%s: saved with %s %s, this run has %s", path, key,
                     have ? have : "(none)", want);
}

static int validate(fsc_strategy *s, fsc_st_file *f, const char *path, int *world, int64_t *updates,
                    bool *replicas) {
    const struct slowmo_state *st = s->slowmo;
    const fsc_optim_config cfg = fsc_optim_get_config(s->optim);
    const int K = fsc_optim_state_count(&cfg);
    const char *fmt = fsc_st_metadata(f, "format"), *strat = fsc_st_metadata(f, "strategy");
    if (!fmt || strcmp(fmt, FORMAT) || !strat || strcmp(strat, "slowmo"))
        return fsc_error(FSC_ERR_FORMAT, "%s: not a slowmo state file (format %s, strategy %s)",
                         path, fmt ? fmt : "(none)", strat ? strat : "(none)");
    char want[64];
    int rc = FSC_OK;
#define EXPECT(key, fmt, x)                                                                        \
    do {                                                                                           \
        snprintf(want, sizeof want, fmt, x);                                                       \
        if (!rc) rc = expect_meta(f, path, key, want);                                             \
    } while (0)
    EXPECT("localsgd_frequency", "%d", st->localsgd_every);
    EXPECT("slowmo_frequency", "%d", st->slowmo_every);
    EXPECT("slowmo_momentum", "%.17g", st->momentum);
    EXPECT("slowmo_lr", "%.17g", st->lr);
    EXPECT("state", "%s", K == 0 ? "" : K == 1 ? "momentum" : "exp_avg,exp_avg_sq");
#undef EXPECT
    if (rc) return rc;
    const char *w = fsc_st_metadata(f, "world"), *u = fsc_st_metadata(f, "updates"),
               *rp = fsc_st_metadata(f, "replicas");
    char *end1 = NULL, *end2 = NULL;
    long wl = w ? strtol(w, &end1, 10) : 0;
    long long ul = u ? strtoll(u, &end2, 10) : -1;
    if (!w || *end1 || wl < 1 || wl > 1 << 20 || !u || *end2 || ul < 0 || !rp ||
        (strcmp(rp, "true") && strcmp(rp, "false")))
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: metadata world, updates or replicas missing or "
                         "out of range",
                         path);
    *world = (int)wl, *updates = ul, *replicas = !strcmp(rp, "true");
    /* every tensor this load reads, present in the parameter's shape */
    char name[FSC_NAME_MAX * 3], prefix[64];
    for (int e = 0; e < s->params.count; e++) {
        const fsc_param *p = s->params.entries[e].param;
        for (int j = 0; j < 2 + *world * (K + 1); j++) {
            if (j < 2) {
                if (!st->outer) continue;
                snprintf(prefix, sizeof prefix, "slowmo.%s", j ? "buf" : "old");
            } else if (j - 2 < *world * K) {
                snprintf(prefix, sizeof prefix, "rank%d.%s", (j - 2) / K,
                         state_name(&cfg, (j - 2) % K));
            } else {
                int r = j - 2 - *world * K;
                if (!*replicas || r == 0) continue;
                snprintf(prefix, sizeof prefix, "rank%d.param", r);
            }
            rc = name_of(name, sizeof name, prefix, s->params.entries[e].name);
            if (rc) return rc;
            const fsc_st_entry *t = fsc_st_find(f, name);
            bool same = t && t->dtype == FSC_DTYPE_F32 && t->ndim == p->ndim;
            for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
            if (!same)
                return fsc_error(t ? FSC_ERR_SHAPE : FSC_ERR_NOT_FOUND,
                                 "%s: tensor %s is %s (a slowmo state of another model or "
                                 "optimizer?)",
                                 path, name, t ? "not F32 in the parameter's shape" : "missing");
        }
    }
    return FSC_OK;
}

/* prefix.<name> tensors into the flat buffer (validated before). */
static int read_flat(fsc_strategy *s, fsc_st_file *f, const char *prefix, float *flat) {
    char name[FSC_NAME_MAX * 3];
    for (int e = 0; e < s->params.count; e++) {
        const fsc_param_entry *pe = &s->params.entries[e];
        int rc = name_of(name, sizeof name, prefix, pe->name);
        if (!rc)
            rc = fsc_st_read_bytes(f, fsc_st_find(f, name), 0, flat + pe->offset,
                                   sizeof(float) * (size_t)pe->param->numel);
        if (rc) return rc;
    }
    return FSC_OK;
}

/* The mean over the saved ranks of prefix "rank<j>.<what>" (j from `first`;
 * with first 1, rank 0's values are `own`), summed in double in rank order:
 * every rank computes the same floats. */
static int read_mean(fsc_strategy *s, fsc_st_file *f, const char *what, int world, int first,
                     const float *own, float *out, float *tmp) {
    const int64_t P = s->params.numel;
    double *sum = calloc((size_t)P + 1, sizeof *sum);
    if (!sum) return fsc_error(FSC_ERR_NOMEM, "slowmo state: out of memory");
    if (first) memset(out, 0, sizeof(float) * (size_t)P);
    for (int64_t i = 0; first && i < P; i++) sum[i] = own[i];
    int rc = FSC_OK;
    char prefix[64];
    for (int j = first; j < world && !rc; j++) {
        snprintf(prefix, sizeof prefix, "rank%d.%s", j, what);
        memset(tmp, 0, sizeof(float) * (size_t)P);
        rc = read_flat(s, f, prefix, tmp);
        for (int64_t i = 0; !rc && i < P; i++) sum[i] += tmp[i];
    }
    for (int64_t i = 0; !rc && i < P; i++) out[i] = (float)(sum[i] / world);
    free(sum);
    return rc;
}

int slowmo_load_state(fsc_strategy *s, const char *path) {
    struct slowmo_state *st = s->slowmo;
    if (!path) {
        if (s->rank == 0)
            fsc_log(FSC_LOG_WARN, "slowmo: the checkpoint carries no slowmo state (saved by "
                                  "another strategy): the averaging phase restarts at 0 and the "
                                  "slow momentum at zero");
        return FSC_OK;
    }
    const fsc_optim_config cfg = fsc_optim_get_config(s->optim);
    const int K = fsc_optim_state_count(&cfg);
    const int64_t P = s->params.numel;
    int world = 0, rc = FSC_OK;
    int64_t updates = 0;
    bool replicas = false;
    fsc_st_file *f = fsc_st_open(path, &rc);
    if (!f && !rc) rc = FSC_ERR_IO;
    if (!rc) rc = validate(s, f, path, &world, &updates, &replicas);
    const bool same = world == s->world, take_params = replicas && (!same || s->rank > 0);
    /* staged: K state arrays, the replica, old and buf, all flat; one spare */
    const int nbuf = K + 4;
    float *stage = NULL;
    if (!rc && !(stage = fsc_mem_alloc(FSC_MEM_WORK, sizeof(float) * (size_t)nbuf * (size_t)P)))
        rc = fsc_error(FSC_ERR_NOMEM, "slowmo state: staging %d x %lld floats: out of memory", nbuf,
                       (long long)P);
    float *params = stage ? stage + (size_t)K * P : NULL, *old = params ? params + P : NULL,
          *buf = old ? old + P : NULL, *tmp = buf ? buf + P : NULL;
    char prefix[64];
    for (int k = 0; k < K && !rc; k++) {
        float *dst = stage + (size_t)k * P;
        memset(dst, 0, sizeof(float) * (size_t)P);
        snprintf(prefix, sizeof prefix, "rank%d.%s", s->rank, state_name(&cfg, k));
        rc = same ? read_flat(s, f, prefix, dst)
                  : read_mean(s, f, state_name(&cfg, k), world, 0, NULL, dst, tmp);
    }
    if (!rc && take_params && same) {
        memset(params, 0, sizeof(float) * (size_t)P);
        snprintf(prefix, sizeof prefix, "rank%d.param", s->rank);
        rc = read_flat(s, f, prefix, params);
    } else if (!rc && take_params) { /* the loaded weights are rank 0's replica */
        rc = read_mean(s, f, "param", world, 1, s->params.data, params, tmp);
    }
    if (!rc && st->outer) {
        memcpy(old, s->params.data, sizeof(float) * (size_t)P), memset(buf, 0, sizeof(float) * P);
        rc = read_flat(s, f, "slowmo.old", old);
        if (!rc) rc = read_flat(s, f, "slowmo.buf", buf);
    }
    fsc_st_close(f);
    if (rc) fsc_error_context(rc, "slowmo state (rank %d): ", s->rank);
    rc = fsc_group_agree(s->group, rc, "loading the slowmo state");
    if (!rc) { /* commit: nothing above touched the row */
        for (int k = 0; k < K && !rc; k++) rc = flat_state(s, k, stage + (size_t)k * P, true);
        if (take_params) memcpy(s->params.data, params, sizeof(float) * (size_t)P);
        if (st->outer) {
            const size_t n = (size_t)(st->end - st->begin);
            memcpy(st->old, old + st->begin, sizeof(float) * n);
            memcpy(st->buf, buf + st->begin, sizeof(float) * n);
        }
        st->updates = updates;
        if (!same && s->rank == 0)
            fsc_log(FSC_LOG_INFO,
                    "slowmo: state saved by %d ranks resumed on %d: each rank starts from the "
                    "mean of the saved ranks' optimizer states%s",
                    world, s->world, replicas ? " and replicas" : "");
    }
    fsc_mem_free(stage);
    return rc;
}
