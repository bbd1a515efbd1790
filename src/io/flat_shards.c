/* Flat shards: FSDP's per-rank state dict and its offline consolidation.
 *
 * The layout stored in each shard file is the only link between the bytes and
 * the model, so consolidation needs neither MPI nor the model code. Nothing in
 * a file is trusted: the layout is parsed strictly, checked like a caller's,
 * and compared across every file before the first output byte is written.
 * Consolidation goes through the atomic safetensors writer in the same order
 * (metadata, declarations, data) as fsc_weights_save, which is what makes the
 * two files byte-identical.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "fsc/flat_shards.h"
#include "fsc/io.h"
#include "flat_layout.h"

#define CHUNK_FLOATS ((int64_t)1 << 20) /* consolidation's buffer: at most 4 MiB */

/* ---- small helpers ------------------------------------------------------------ */

static int is_reserved(const char *key) {
    return strcmp(key, FSC_FLAT_LAYOUT_KEY) == 0 || strcmp(key, FSC_FLAT_RANK_KEY) == 0 ||
           strcmp(key, FSC_FLAT_CRC_KEY) == 0;
}

static void unit_tensor_name(char *buf, size_t cap, int u) {
    snprintf(buf, cap, "flat.%d", u);
}

/* ---- opening a shard file ------------------------------------------------------------- */

typedef struct {
    const char *path;
    fsc_st_file *f;
    fsc_flat_layout L;
    int rank;
} shard_file;

static void shard_close(shard_file *s) {
    fsc_st_close(s->f);
    fsc_flat_layout_free(&s->L);
    s->f = NULL;
}

/* "fsc.rank": a plain decimal in [0, world). */
static int parse_rank(const char *path, const char *text, int world, int *rank) {
    long v = -1;
    size_t len = text ? strlen(text) : 0;
    if (len >= 1 && len <= 9 && strspn(text, "0123456789") == len) v = strtol(text, NULL, 10);
    if (v < 0 || v >= world)
        return fsc_error(FSC_ERR_FORMAT, "%s: metadata \"%s\" is %s%s%s, not a rank of world %d",
                         path, FSC_FLAT_RANK_KEY, text ? "\"" : "", text ? text : "missing",
                         text ? "\"" : "", world);
    *rank = (int)v;
    return FSC_OK;
}

/* Exactly the tensors flat.0 .. flat.<nunits-1>, each F32 [shard_u]. */
static int check_tensors(const shard_file *s) {
    if (fsc_st_count(s->f) != s->L.nunits)
        return fsc_error(FSC_ERR_FORMAT, "%s: holds %d tensors, but its layout has %d units",
                         s->path, fsc_st_count(s->f), s->L.nunits);
    for (int u = 0; u < s->L.nunits; u++) {
        char name[32];
        unit_tensor_name(name, sizeof name, u);
        const fsc_st_entry *e = fsc_st_find(s->f, name);
        const fsc_flat_unit *U = &s->L.units[u];
        if (!e)
            return fsc_error(FSC_ERR_FORMAT, "%s: no tensor %s (unit %d, \"%s\")", s->path, name, u,
                             U->name);
        if (e->dtype != FSC_DTYPE_F32)
            return fsc_error(FSC_ERR_FORMAT, "%s: tensor %s is %s, expected F32", s->path, name,
                             fsc_dtype_name(e->dtype));
        if (e->ndim != 1 || e->shape[0] != U->shard) {
            char shape[128];
            flat_fmt_shape(shape, sizeof shape, e->ndim, e->shape);
            return fsc_error(FSC_ERR_FORMAT, "%s: tensor %s has shape %s, its layout says [%lld]",
                             s->path, name, shape, (long long)U->shard);
        }
    }
    return FSC_OK;
}

/* The CRC-32 of every unit's shard bytes, in unit order: recorded in the
 * file at save (FSC_FLAT_CRC_KEY) and checked at every open, so a damaged
 * shard is refused instead of loaded or consolidated into a model. */
static uint32_t shards_crc(const fsc_flat_layout *L, const float *const *shards) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int u = 0; u < L->nunits; u++)
        for (int64_t at = 0; at < L->units[u].shard;) { /* crc32 takes at most 4 GiB a call */
            const int64_t m = L->units[u].shard - at < (1 << 28) ? L->units[u].shard - at : 1 << 28;
            crc = crc32(crc, (const Bytef *)(shards[u] + at), (uInt)(m * (int64_t)sizeof(float)));
            at += m;
        }
    return (uint32_t)crc;
}

/* The file's recorded CRC against its data, streamed; a file saved before
 * the key existed has none and is taken as it is. */
static int check_crc(const shard_file *s) {
    const char *want = fsc_st_metadata(s->f, FSC_FLAT_CRC_KEY);
    if (!want) return FSC_OK;
    enum { CHUNK = 1 << 16 };
    float *buf = malloc(CHUNK * sizeof(float));
    if (!buf) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory checking its data", s->path);
    uLong crc = crc32(0L, Z_NULL, 0);
    int rc = FSC_OK;
    for (int u = 0; !rc && u < s->L.nunits; u++) {
        char name[32];
        unit_tensor_name(name, sizeof name, u);
        const fsc_st_entry *e = fsc_st_find(s->f, name);
        for (int64_t at = 0; !rc && at < s->L.units[u].shard; at += CHUNK) {
            const int64_t m = s->L.units[u].shard - at < CHUNK ? s->L.units[u].shard - at : CHUNK;
            rc = fsc_st_read_bytes(s->f, e, (uint64_t)at * sizeof(float), buf,
                                   (size_t)m * sizeof(float));
            if (!rc) crc = crc32(crc, (const Bytef *)buf, (uInt)(m * (int64_t)sizeof(float)));
        }
    }
    free(buf);
    char got[16];
    snprintf(got, sizeof got, "%08lx", (unsigned long)crc);
    if (!rc && strcmp(got, want))
        rc = fsc_error(FSC_ERR_FORMAT,
                       "%s: its data does not match its checksum (CRC-32 %s, recorded %s): the "
                       "shard is damaged",
                       s->path, got, want);
    return rc;
}

/* Opens and validates path completely: safetensors, layout, rank, tensors, data. */
static int shard_open(const char *path, shard_file *s) {
    memset(s, 0, sizeof *s);
    s->path = path;
    int rc = FSC_OK;
    s->f = fsc_st_open(path, &rc);
    if (!s->f) return rc;
    const char *text = fsc_st_metadata(s->f, FSC_FLAT_LAYOUT_KEY);
    if (!text)
        rc = fsc_error(FSC_ERR_FORMAT,
                       "%s: no \"%s\" metadata: not a flat shard file (fsc_flat_shard_save "
                       "writes them)",
                       path, FSC_FLAT_LAYOUT_KEY);
    if (!rc) rc = flat_layout_parse(path, text, &s->L);
    if (!rc) rc = parse_rank(path, fsc_st_metadata(s->f, FSC_FLAT_RANK_KEY), s->L.world, &s->rank);
    if (!rc) rc = check_tensors(s);
    if (!rc) rc = check_crc(s);
    if (rc) shard_close(s);
    return rc;
}

/* ---- comparing ------------------------------------------------------------------------ */

/* got (the layout of the file at path) against want. `has` completes "saved
 * with world 4, <has> 2"; `in` completes "offset 12 in the file, 16 <in>". */
static int layout_diff(const char *path, const fsc_flat_layout *got, const fsc_flat_layout *want,
                       const char *has, const char *in) {
    if (got->world != want->world)
        return fsc_error(FSC_ERR_INVALID, "%s: saved with world %d, %s %d", path, got->world, has,
                         want->world);
    if (got->nunits != want->nunits)
        return fsc_error(FSC_ERR_INVALID, "%s: saved with %d units, %s %d", path, got->nunits, has,
                         want->nunits);
    for (int u = 0; u < got->nunits; u++) {
        const fsc_flat_unit *a = &got->units[u], *b = &want->units[u];
        if (strcmp(a->name, b->name) != 0)
            return fsc_error(FSC_ERR_INVALID, "%s: unit %d is \"%s\" in the file, \"%s\" %s", path,
                             u, a->name, b->name, in);
        if (a->numel != b->numel)
            return fsc_error(FSC_ERR_INVALID,
                             "%s: unit %d (\"%s\") has numel %lld in the file, %lld %s", path, u,
                             a->name, (long long)a->numel, (long long)b->numel, in);
        if (a->shard != b->shard)
            return fsc_error(FSC_ERR_INVALID,
                             "%s: unit %d (\"%s\") has shard %lld in the file, %lld %s", path, u,
                             a->name, (long long)a->shard, (long long)b->shard, in);
    }
    if (got->nparams != want->nparams)
        return fsc_error(FSC_ERR_INVALID, "%s: saved with %d parameters, %s %d", path, got->nparams,
                         has, want->nparams);
    for (int i = 0; i < got->nparams; i++) {
        const fsc_flat_param *a = &got->params[i], *b = &want->params[i];
        if (strcmp(a->name, b->name) != 0)
            return fsc_error(FSC_ERR_INVALID, "%s: parameter %d is %s in the file, %s %s", path, i,
                             a->name, b->name, in);
        int same = a->ndim == b->ndim;
        for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
        if (!same) {
            char sa[128], sb[128];
            flat_fmt_shape(sa, sizeof sa, a->ndim, a->shape);
            flat_fmt_shape(sb, sizeof sb, b->ndim, b->shape);
            return fsc_error(FSC_ERR_INVALID, "%s: parameter %s has shape %s in the file, %s %s",
                             path, a->name, sa, sb, in);
        }
        if (a->unit != b->unit)
            return fsc_error(FSC_ERR_INVALID, "%s: parameter %s is in unit %d in the file, %d %s",
                             path, a->name, a->unit, b->unit, in);
        if (a->offset != b->offset)
            return fsc_error(FSC_ERR_INVALID,
                             "%s: parameter %s has offset %lld in the file, %lld %s", path, a->name,
                             (long long)a->offset, (long long)b->offset, in);
    }
    return FSC_OK;
}

/* The caller's metadata pairs of a shard file: every pair but the reserved ones. */
static int user_meta(const fsc_st_file *f, int k, const char **key, const char **value) {
    for (int i = 0, seen = 0; i < fsc_st_metadata_count(f); i++) {
        fsc_st_metadata_at(f, i, key, value);
        if (!is_reserved(*key) && seen++ == k) return 1;
    }
    return 0;
}

/* The consolidated file can carry only one set of metadata, so all files must agree. */
static int meta_diff(const shard_file *a, const shard_file *b) {
    for (int k = 0;; k++) {
        const char *ka = NULL, *va = NULL, *kb = NULL, *vb = NULL;
        int ha = user_meta(a->f, k, &ka, &va), hb = user_meta(b->f, k, &kb, &vb);
        if (!ha && !hb) return FSC_OK;
        if (!ha || !hb || strcmp(ka, kb) != 0)
            return fsc_error(FSC_ERR_INVALID,
                             "%s: metadata pair %d is %s%s%s, in %s it is %s%s%s: the files are "
                             "not from one save",
                             b->path, k, hb ? "\"" : "", hb ? kb : "absent", hb ? "\"" : "",
                             a->path, ha ? "\"" : "", ha ? ka : "absent", ha ? "\"" : "");
        if (strcmp(va, vb) != 0)
            return fsc_error(FSC_ERR_INVALID,
                             "%s: metadata \"%s\" is \"%s\", in %s it is \"%s\": the files are "
                             "not from one save",
                             b->path, kb, vb, a->path, va);
    }
}

/* ---- save and load ------------------------------------------------------------------------ */

/* What a save and a load both check first: a path, a valid layout and a
 * rank of its world. */
static int check_path_rank(const char *fn, const char *path, const fsc_flat_layout *L, int rank) {
    if (!path) return fsc_error(FSC_ERR_INVALID, "%s: path is NULL", fn);
    int rc = fsc_flat_layout_check(L);
    if (rc) return fsc_error_context(rc, "%s: ", path);
    if (rank < 0 || rank >= L->world)
        return fsc_error(FSC_ERR_INVALID, "%s: rank %d is outside world %d", path, rank, L->world);
    return FSC_OK;
}

static int check_save_args(const char *path, const fsc_flat_layout *L, int rank,
                           const float *const *shards, int n_meta, const char *const *keys,
                           const char *const *values) {
    int rc = check_path_rank("fsc_flat_shard_save", path, L, rank);
    if (rc) return rc;
    for (int u = 0; u < L->nunits; u++)
        if (L->units[u].shard && (!shards || !shards[u]))
            return fsc_error(FSC_ERR_INVALID, "%s: no shard data for unit %d (\"%s\")", path, u,
                             L->units[u].name);
    if (n_meta < 0 || (n_meta && (!keys || !values)))
        return fsc_error(FSC_ERR_INVALID, "%s: %d metadata pairs but no keys or values", path,
                         n_meta);
    for (int i = 0; i < n_meta; i++) {
        if (!keys[i] || !values[i])
            return fsc_error(FSC_ERR_INVALID, "%s: metadata pair %d has a NULL key or value", path,
                             i);
        if (is_reserved(keys[i]))
            return fsc_error(FSC_ERR_INVALID, "%s: metadata key \"%s\" is reserved for the layout",
                             path, keys[i]);
    }
    return FSC_OK;
}

int fsc_flat_shard_save(const char *path, const fsc_flat_layout *L, int rank,
                        const float *const *shards, int n_meta, const char *const *keys,
                        const char *const *values) {
    int rc = check_save_args(path, L, rank, shards, n_meta, keys, values);
    if (rc) return rc;
    char *json = flat_layout_json(L);
    if (!json) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory writing the layout", path);
    char rank_s[16], name[32];
    snprintf(rank_s, sizeof rank_s, "%d", rank);
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    if (w) {
        rc = fsc_st_writer_set_metadata(w, FSC_FLAT_LAYOUT_KEY, json);
        if (!rc) rc = fsc_st_writer_set_metadata(w, FSC_FLAT_RANK_KEY, rank_s);
        char crc_s[16];
        snprintf(crc_s, sizeof crc_s, "%08lx", (unsigned long)shards_crc(L, shards));
        if (!rc) rc = fsc_st_writer_set_metadata(w, FSC_FLAT_CRC_KEY, crc_s);
        for (int i = 0; !rc && i < n_meta; i++)
            rc = fsc_st_writer_set_metadata(w, keys[i], values[i]);
        for (int u = 0; !rc && u < L->nunits; u++) {
            unit_tensor_name(name, sizeof name, u);
            rc = fsc_st_writer_declare(w, name, FSC_DTYPE_F32, 1, &L->units[u].shard);
        }
        for (int u = 0; !rc && u < L->nunits; u++) {
            unit_tensor_name(name, sizeof name, u);
            if (L->units[u].shard)
                rc = fsc_st_writer_write(w, name, shards[u],
                                         (size_t)L->units[u].shard * sizeof(float));
        }
        if (rc)
            fsc_st_writer_abort(w);
        else
            rc = fsc_st_writer_close(w);
    }
    cJSON_free(json);
    return rc;
}

int fsc_flat_shard_load(const char *path, const fsc_flat_layout *L, int rank,
                        float *const *shards) {
    int rc = check_path_rank("fsc_flat_shard_load", path, L, rank);
    if (rc) return rc;
    for (int u = 0; u < L->nunits; u++)
        if (L->units[u].shard && (!shards || !shards[u]))
            return fsc_error(FSC_ERR_INVALID, "%s: no destination for unit %d (\"%s\")", path, u,
                             L->units[u].name);
    shard_file s;
    rc = shard_open(path, &s);
    if (rc) return rc;
    rc = layout_diff(path, &s.L, L, "this run has", "here");
    if (!rc && s.rank != rank)
        rc = fsc_error(FSC_ERR_INVALID, "%s: is rank %d's shard, this is rank %d", path, s.rank,
                       rank);
    for (int u = 0; !rc && u < L->nunits; u++) {
        char name[32];
        unit_tensor_name(name, sizeof name, u);
        rc = fsc_st_read_bytes(s.f, fsc_st_find(s.f, name), 0, shards[u],
                               (size_t)L->units[u].shard * sizeof(float));
    }
    shard_close(&s);
    return rc;
}

int fsc_flat_layout_read(const char *path, fsc_flat_layout *out, int *rank) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_flat_layout_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return fsc_error(FSC_ERR_INVALID, "fsc_flat_layout_read: path is NULL");
    shard_file s;
    int rc = shard_open(path, &s);
    if (rc) return rc;
    *out = s.L;
    if (rank) *rank = s.rank;
    fsc_st_close(s.f);
    return FSC_OK;
}

/* ---- consolidation ------------------------------------------------------------------------ */

/* Opens every file, checks they are one save (same layout and metadata), and
 * fills by_rank[r] with the index of rank r's file. */
static int open_all(int n, const char *const *paths, shard_file *s, int **by_rank) {
    int rc = FSC_OK;
    char has[1100], in[1100];
    for (int i = 0; i < n && !rc; i++) {
        rc = shard_open(paths[i], &s[i]);
        if (rc || i == 0) continue;
        snprintf(has, sizeof has, "%s has", paths[0]);
        snprintf(in, sizeof in, "in %s", paths[0]);
        rc = layout_diff(paths[i], &s[i].L, &s[0].L, has, in);
        if (!rc) rc = meta_diff(&s[0], &s[i]);
        fsc_flat_layout_free(&s[i].L); /* s[0]'s is the one used: keep one copy in memory */
    }
    if (rc) return rc;
    int world = s[0].L.world;
    *by_rank = malloc((size_t)world * sizeof **by_rank);
    if (!*by_rank) return fsc_error(FSC_ERR_NOMEM, "fsc_flat_consolidate: out of memory");
    for (int r = 0; r < world; r++) (*by_rank)[r] = -1;
    for (int i = 0; i < n; i++) {
        int *slot = &(*by_rank)[s[i].rank];
        if (*slot >= 0)
            return fsc_error(FSC_ERR_INVALID, "%s and %s are both rank %d's shard (world %d)",
                             paths[*slot], paths[i], s[i].rank, world);
        *slot = i;
    }
    for (int r = 0; r < world; r++)
        if ((*by_rank)[r] < 0)
            return fsc_error(FSC_ERR_NOT_FOUND,
                             "rank %d's shard is missing: %d files given, saved with world %d", r,
                             n, world);
    return FSC_OK;
}

/* Refuses to replace an input: a consolidation must never lose a shard. */
static int check_out_path(int n, const char *const *paths, const char *out_path) {
    struct stat so, si;
    if (stat(out_path, &so) != 0) return FSC_OK;
    for (int i = 0; i < n; i++)
        if (stat(paths[i], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
            return fsc_error(FSC_ERR_INVALID,
                             "output %s is the shard file %s; it would be overwritten", out_path,
                             paths[i]);
    return FSC_OK;
}

/* Streams parameter p, elements [offset, offset+numel) of its unit, from the
 * rank files covering them into w, through buf (cap floats). */
static int copy_param(fsc_st_writer *w, const shard_file *s, const int *by_rank,
                      const fsc_flat_param *p, float *buf, int64_t cap) {
    const fsc_flat_layout *L = &s[0].L;
    int64_t shard = L->units[p->unit].shard, g = p->offset;
    int64_t left = flat_shape_numel(p->ndim, p->shape);
    char name[32];
    unit_tensor_name(name, sizeof name, p->unit);
    int rc = FSC_OK;
    while (left > 0 && !rc) {
        int64_t m = left < cap ? left : cap;
        for (int64_t at = 0; at < m && !rc;) {
            int64_t r = (g + at) / shard, local = (g + at) % shard;
            int64_t take = m - at < shard - local ? m - at : shard - local;
            const shard_file *f = &s[by_rank[r]];
            rc = fsc_st_read_bytes(f->f, fsc_st_find(f->f, name), (uint64_t)local * sizeof(float),
                                   buf + at, (size_t)take * sizeof(float));
            at += take;
        }
        if (!rc) rc = fsc_st_writer_write(w, p->name, buf, (size_t)m * sizeof(float));
        g += m;
        left -= m;
    }
    return rc;
}

/* Writes the full state dict: metadata, declarations, data; as fsc_weights_save. */
static int write_full(const char *out_path, const shard_file *s, const int *by_rank) {
    const fsc_flat_layout *L = &s[0].L;
    int64_t cap = 1;
    for (int i = 0; i < L->nparams; i++) {
        int64_t numel = flat_shape_numel(L->params[i].ndim, L->params[i].shape);
        if (numel > cap) cap = numel;
    }
    if (cap > CHUNK_FLOATS) cap = CHUNK_FLOATS;
    float *buf = fsc_mem_alloc(FSC_MEM_WORK, (size_t)cap * sizeof(float));
    if (!buf) return fsc_error_context(FSC_ERR_NOMEM, "%s: ", out_path);
    int rc = FSC_OK;
    fsc_st_writer *w = fsc_st_writer_open(out_path, &rc);
    for (int k = 0; w && !rc; k++) {
        const char *key, *value;
        if (!user_meta(s[0].f, k, &key, &value)) break;
        rc = fsc_st_writer_set_metadata(w, key, value);
    }
    for (int i = 0; w && !rc && i < L->nparams; i++) {
        const fsc_flat_param *p = &L->params[i];
        rc = fsc_st_writer_declare(w, p->name, FSC_DTYPE_F32, p->ndim, p->shape);
    }
    for (int i = 0; w && !rc && i < L->nparams; i++)
        rc = copy_param(w, s, by_rank, &L->params[i], buf, cap);
    if (w) {
        if (rc)
            fsc_st_writer_abort(w);
        else
            rc = fsc_st_writer_close(w);
    }
    fsc_mem_free(buf);
    return rc;
}

int fsc_flat_consolidate(int n, const char *const *paths, const char *out_path) {
    if (n < 1 || !paths || !out_path)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_flat_consolidate: needs at least one shard file and an output "
                         "path (%d files given)",
                         n);
    for (int i = 0; i < n; i++)
        if (!paths[i])
            return fsc_error(FSC_ERR_INVALID, "fsc_flat_consolidate: shard path %d is NULL", i);
    int rc = check_out_path(n, paths, out_path);
    if (rc) return rc;
    shard_file *s = calloc((size_t)n, sizeof *s);
    int *by_rank = NULL;
    if (!s) return fsc_error(FSC_ERR_NOMEM, "fsc_flat_consolidate: out of memory");
    rc = open_all(n, paths, s, &by_rank);
    if (!rc) rc = write_full(out_path, s, by_rank);
    for (int i = 0; i < n; i++) shard_close(&s[i]);
    free(s);
    free(by_rank);
    return rc;
}
