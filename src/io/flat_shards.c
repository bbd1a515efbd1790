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
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "fsc/flat_shards.h"
#include "fsc/io.h"

#define LAYOUT_VERSION 1
#define MAX_ELEMS ((int64_t)1 << 53)    /* a JSON number (double) holds every count exactly */
#define CHUNK_FLOATS ((int64_t)1 << 20) /* consolidation's buffer: at most 4 MiB */

/* ---- small helpers ------------------------------------------------------------ */

static int is_reserved(const char *key) {
    return strcmp(key, FSC_FLAT_LAYOUT_KEY) == 0 || strcmp(key, FSC_FLAT_RANK_KEY) == 0;
}

static int terminated(const char *s, size_t cap) {
    return memchr(s, '\0', cap) != NULL;
}

/* Element count of a shape, or -1 if a dim is negative or above MAX_ELEMS, or
 * the count (with no zero dim) is above MAX_ELEMS. */
static int64_t shape_numel(int ndim, const int64_t *shape) {
    int zero = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || shape[d] > MAX_ELEMS) return -1;
        zero |= shape[d] == 0;
    }
    if (zero) return 0;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (n > MAX_ELEMS / shape[d]) return -1;
        n *= shape[d];
    }
    return n;
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used +=
            (size_t)snprintf(buf + used, cap - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static void unit_tensor_name(char *buf, size_t cap, int u) {
    snprintf(buf, cap, "flat.%d", u);
}

/* ---- checking a layout ---------------------------------------------------------- */

typedef struct {
    const char *name;
    int unit;
    int64_t begin, end;
} span;

static int cmp_span_name(const void *a, const void *b) {
    return strcmp(((const span *)a)->name, ((const span *)b)->name);
}

static int cmp_span_place(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->unit != y->unit) return x->unit < y->unit ? -1 : 1;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static int check_units(const fsc_flat_layout *L) {
    for (int u = 0; u < L->nunits; u++) {
        const fsc_flat_unit *U = &L->units[u];
        if (!terminated(U->name, sizeof U->name))
            return fsc_error(FSC_ERR_INVALID, "flat layout: unit %d's name is not NUL-terminated",
                             u);
        if (U->numel < 0 || U->shard < 0)
            return fsc_error(FSC_ERR_INVALID,
                             "flat layout: unit %d (\"%s\") has numel %lld and shard %lld; both "
                             "must be >= 0",
                             u, U->name, (long long)U->numel, (long long)U->shard);
        if (U->shard > MAX_ELEMS / L->world)
            return fsc_error(FSC_ERR_INVALID,
                             "flat layout: unit %d (\"%s\"): shard %lld x world %d exceeds 2^53 "
                             "elements",
                             u, U->name, (long long)U->shard, L->world);
        if (U->shard * L->world < U->numel)
            return fsc_error(FSC_ERR_INVALID,
                             "flat layout: unit %d (\"%s\"): shard %lld x world %d = %lld elements "
                             "cannot hold its numel %lld",
                             u, U->name, (long long)U->shard, L->world,
                             (long long)(U->shard * L->world), (long long)U->numel);
    }
    return FSC_OK;
}

/* Each parameter on its own; fills sp[i]. */
static int check_params(const fsc_flat_layout *L, span *sp) {
    for (int i = 0; i < L->nparams; i++) {
        const fsc_flat_param *p = &L->params[i];
        if (!terminated(p->name, sizeof p->name))
            return fsc_error(FSC_ERR_INVALID,
                             "flat layout: parameter %d's name is not NUL-terminated", i);
        if (!p->name[0])
            return fsc_error(FSC_ERR_INVALID, "flat layout: parameter %d has an empty name", i);
        if (p->ndim < 0 || p->ndim > FSC_MAX_DIMS)
            return fsc_error(FSC_ERR_INVALID, "flat layout: parameter %s has ndim %d (0..%d)",
                             p->name, p->ndim, FSC_MAX_DIMS);
        int64_t numel = shape_numel(p->ndim, p->shape);
        char shape[128];
        fmt_shape(shape, sizeof shape, p->ndim, p->shape);
        if (numel < 0)
            return fsc_error(FSC_ERR_INVALID,
                             "flat layout: parameter %s has shape %s (dims must be >= 0, at most "
                             "2^53 elements)",
                             p->name, shape);
        if (p->unit < 0 || p->unit >= L->nunits)
            return fsc_error(FSC_ERR_INVALID,
                             "flat layout: parameter %s is in unit %d, but there are %d units",
                             p->name, p->unit, L->nunits);
        const fsc_flat_unit *U = &L->units[p->unit];
        if (p->offset < 0 || p->offset > U->numel || numel > U->numel - p->offset)
            return fsc_error(FSC_ERR_INVALID,
                             "flat layout: parameter %s %s at offset %lld does not fit in unit %d "
                             "(\"%s\") of numel %lld",
                             p->name, shape, (long long)p->offset, p->unit, U->name,
                             (long long)U->numel);
        sp[i] = (span){p->name, p->unit, p->offset, p->offset + numel};
    }
    return FSC_OK;
}

int fsc_flat_layout_check(const fsc_flat_layout *L) {
    if (!L) return fsc_error(FSC_ERR_INVALID, "flat layout: NULL");
    if (L->world < 1)
        return fsc_error(FSC_ERR_INVALID, "flat layout: world %d (expected >= 1)", L->world);
    if (L->nunits < 0 || L->nparams < 0 || (L->nunits && !L->units) || (L->nparams && !L->params))
        return fsc_error(
            FSC_ERR_INVALID, "flat layout: %d units and %d parameters, with units %s and params %s",
            L->nunits, L->nparams, L->units ? "set" : "NULL", L->params ? "set" : "NULL");
    int rc = check_units(L);
    if (rc) return rc;
    span *sp = malloc(((size_t)L->nparams + 1) * sizeof *sp);
    if (!sp) return fsc_error(FSC_ERR_NOMEM, "flat layout: out of memory");
    rc = check_params(L, sp);
    if (!rc) {
        qsort(sp, (size_t)L->nparams, sizeof *sp, cmp_span_name);
        for (int i = 1; i < L->nparams && !rc; i++)
            if (strcmp(sp[i - 1].name, sp[i].name) == 0)
                rc = fsc_error(FSC_ERR_INVALID, "flat layout: two parameters are named %s",
                               sp[i].name);
    }
    if (!rc) {
        /* sorted by (unit, begin), a non-empty range may not start before the
         * furthest end of the earlier non-empty ones of its unit */
        qsort(sp, (size_t)L->nparams, sizeof *sp, cmp_span_place);
        const span *last = NULL;
        for (int i = 0; i < L->nparams && !rc; i++) {
            const span *s = &sp[i];
            if (last && last->unit != s->unit) last = NULL;
            if (s->begin == s->end) continue;
            if (last && s->begin < last->end)
                rc = fsc_error(FSC_ERR_INVALID,
                               "flat layout: parameters %s [%lld, %lld) and %s [%lld, %lld) "
                               "overlap in unit %d (\"%s\")",
                               last->name, (long long)last->begin, (long long)last->end, s->name,
                               (long long)s->begin, (long long)s->end, s->unit,
                               L->units[s->unit].name);
            if (!last || s->end > last->end) last = s;
        }
    }
    free(sp);
    return rc;
}

void fsc_flat_layout_free(fsc_flat_layout *L) {
    if (!L) return;
    free(L->units);
    free(L->params);
    memset(L, 0, sizeof *L);
}

/* ---- the layout as JSON ------------------------------------------------------------ */

/* An integer as exact decimal text: cJSON prints numbers with 15 significant
 * digits when that round-trips within an epsilon, which loses 2^53. */
static cJSON *json_int(int64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return cJSON_CreateRaw(buf);
}

static int add_int(cJSON *obj, const char *key, int64_t v) {
    cJSON *n = json_int(v);
    if (n && cJSON_AddItemToObject(obj, key, n)) return 1;
    cJSON_Delete(n);
    return 0;
}

/* {"version":1,"world":W,"units":[{"name","numel","shard"}..],
 *  "params":[{"name","shape","unit","offset"}..]}; NULL when out of memory. */
static char *layout_json(const fsc_flat_layout *L) {
    cJSON *root = cJSON_CreateObject();
    cJSON *units = NULL, *params = NULL;
    int ok = root && add_int(root, "version", LAYOUT_VERSION) && add_int(root, "world", L->world) &&
             (units = cJSON_AddArrayToObject(root, "units")) &&
             (params = cJSON_AddArrayToObject(root, "params"));
    for (int u = 0; ok && u < L->nunits; u++) {
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(units, o);
        if (!ok) {
            cJSON_Delete(o);
            break;
        }
        ok = cJSON_AddStringToObject(o, "name", L->units[u].name) &&
             add_int(o, "numel", L->units[u].numel) && add_int(o, "shard", L->units[u].shard);
    }
    for (int i = 0; ok && i < L->nparams; i++) {
        const fsc_flat_param *p = &L->params[i];
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(params, o);
        if (!ok) {
            cJSON_Delete(o);
            break;
        }
        cJSON *shape = NULL;
        ok = cJSON_AddStringToObject(o, "name", p->name) &&
             (shape = cJSON_AddArrayToObject(o, "shape"));
        for (int d = 0; ok && d < p->ndim; d++) {
            cJSON *n = json_int(p->shape[d]);
            ok = n && cJSON_AddItemToArray(shape, n);
            if (!ok) cJSON_Delete(n);
        }
        ok = ok && add_int(o, "unit", p->unit) && add_int(o, "offset", p->offset);
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* obj[key] as an integer in [0, max]; what names obj in messages ("units[2]"). */
static int get_int(const char *path, const cJSON *obj, const char *what, const char *key,
                   int64_t max, int64_t *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    double d = cJSON_IsNumber(j) ? j->valuedouble : -1.0;
    if (!(d >= 0.0) || d > (double)max || d != (double)(int64_t)d)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: stored flat layout: %s\"%s\" must be an integer in [0, %lld]", path,
                         what, key, (long long)max);
    *out = (int64_t)d;
    return FSC_OK;
}

static int get_name(const char *path, const cJSON *obj, const char *what, char *dst, size_t cap) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, "name");
    if (!cJSON_IsString(j) || strlen(j->valuestring) >= cap)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: stored flat layout: %s\"name\" must be a string of at most %zu bytes",
                         path, what, cap - 1);
    strcpy(dst, j->valuestring);
    return FSC_OK;
}

/* An array member of root, with its size. */
static int get_array(const char *path, const cJSON *root, const char *key, const cJSON **arr,
                     int *n) {
    *arr = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsArray(*arr))
        return fsc_error(FSC_ERR_FORMAT, "%s: stored flat layout: \"%s\" must be an array", path,
                         key);
    *n = cJSON_GetArraySize(*arr);
    return FSC_OK;
}

static int parse_unit(const char *path, const cJSON *o, int u, fsc_flat_unit *U) {
    char what[48];
    snprintf(what, sizeof what, "units[%d].", u);
    if (!cJSON_IsObject(o))
        return fsc_error(FSC_ERR_FORMAT, "%s: stored flat layout: units[%d] must be an object",
                         path, u);
    int rc = get_name(path, o, what, U->name, sizeof U->name);
    if (!rc) rc = get_int(path, o, what, "numel", MAX_ELEMS, &U->numel);
    if (!rc) rc = get_int(path, o, what, "shard", MAX_ELEMS, &U->shard);
    return rc;
}

static int parse_param(const char *path, const cJSON *o, int i, fsc_flat_param *p) {
    char what[48];
    snprintf(what, sizeof what, "params[%d].", i);
    if (!cJSON_IsObject(o))
        return fsc_error(FSC_ERR_FORMAT, "%s: stored flat layout: params[%d] must be an object",
                         path, i);
    int64_t unit = 0;
    int rc = get_name(path, o, what, p->name, sizeof p->name);
    if (!rc) rc = get_int(path, o, what, "unit", 1 << 30, &unit);
    if (!rc) rc = get_int(path, o, what, "offset", MAX_ELEMS, &p->offset);
    if (rc) return rc;
    p->unit = (int)unit;
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > FSC_MAX_DIMS)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: stored flat layout: %s\"shape\" must be an array of at most %d "
                         "integers",
                         path, what, FSC_MAX_DIMS);
    p->ndim = 0;
    for (const cJSON *d = shape->child; d && !rc; d = d->next) {
        double v = cJSON_IsNumber(d) ? d->valuedouble : -1.0;
        if (!(v >= 0.0) || v > (double)MAX_ELEMS || v != (double)(int64_t)v)
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: stored flat layout: %s\"shape\"[%d] must be an integer in [0, "
                           "2^53]",
                           path, what, p->ndim);
        else
            p->shape[p->ndim++] = (int64_t)v;
    }
    return rc;
}

/* Parses text into *L (zeroed first; arrays freed on failure) and checks it. */
static int parse_layout(const char *path, const char *text, fsc_flat_layout *L) {
    memset(L, 0, sizeof *L);
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fsc_error(FSC_ERR_FORMAT, "%s: metadata \"%s\" is not a JSON object", path,
                         FSC_FLAT_LAYOUT_KEY);
    }
    int64_t version = 0, world = 0;
    const cJSON *units = NULL, *params = NULL;
    int rc = get_int(path, root, "", "version", MAX_ELEMS, &version);
    if (!rc && version != LAYOUT_VERSION)
        rc = fsc_error(FSC_ERR_UNSUPPORTED,
                       "%s: flat layout version %lld; this build reads version %d", path,
                       (long long)version, LAYOUT_VERSION);
    if (!rc) rc = get_int(path, root, "", "world", 1 << 30, &world);
    if (!rc) rc = get_array(path, root, "units", &units, &L->nunits);
    if (!rc) rc = get_array(path, root, "params", &params, &L->nparams);
    if (!rc) {
        L->world = (int)world;
        L->units = calloc((size_t)L->nunits + 1, sizeof *L->units);
        L->params = calloc((size_t)L->nparams + 1, sizeof *L->params);
        if (!L->units || !L->params) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    }
    int i = 0;
    for (const cJSON *o = units ? units->child : NULL; o && !rc; o = o->next, i++)
        rc = parse_unit(path, o, i, &L->units[i]);
    i = 0;
    for (const cJSON *o = params ? params->child : NULL; o && !rc; o = o->next, i++)
        rc = parse_param(path, o, i, &L->params[i]);
    cJSON_Delete(root);
    if (!rc && (rc = fsc_flat_layout_check(L)))
        rc = fsc_error_context(FSC_ERR_FORMAT, "%s: stored ", path);
    if (rc) fsc_flat_layout_free(L);
    return rc;
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
            fmt_shape(shape, sizeof shape, e->ndim, e->shape);
            return fsc_error(FSC_ERR_FORMAT, "%s: tensor %s has shape %s, its layout says [%lld]",
                             s->path, name, shape, (long long)U->shard);
        }
    }
    return FSC_OK;
}

/* Opens and validates path completely: safetensors, layout, rank, tensors. */
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
    if (!rc) rc = parse_layout(path, text, &s->L);
    if (!rc) rc = parse_rank(path, fsc_st_metadata(s->f, FSC_FLAT_RANK_KEY), s->L.world, &s->rank);
    if (!rc) rc = check_tensors(s);
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
            fmt_shape(sa, sizeof sa, a->ndim, a->shape);
            fmt_shape(sb, sizeof sb, b->ndim, b->shape);
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

static int check_save_args(const char *path, const fsc_flat_layout *L, int rank,
                           const float *const *shards, int n_meta, const char *const *keys,
                           const char *const *values) {
    if (!path) return fsc_error(FSC_ERR_INVALID, "fsc_flat_shard_save: path is NULL");
    int rc = fsc_flat_layout_check(L);
    if (rc) return fsc_error_context(rc, "%s: ", path);
    if (rank < 0 || rank >= L->world)
        return fsc_error(FSC_ERR_INVALID, "%s: rank %d is outside world %d", path, rank, L->world);
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
    char *json = layout_json(L);
    if (!json) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory writing the layout", path);
    char rank_s[16], name[32];
    snprintf(rank_s, sizeof rank_s, "%d", rank);
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    if (w) {
        rc = fsc_st_writer_set_metadata(w, FSC_FLAT_LAYOUT_KEY, json);
        if (!rc) rc = fsc_st_writer_set_metadata(w, FSC_FLAT_RANK_KEY, rank_s);
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
    if (!path) return fsc_error(FSC_ERR_INVALID, "fsc_flat_shard_load: path is NULL");
    int rc = fsc_flat_layout_check(L);
    if (rc) return fsc_error_context(rc, "%s: ", path);
    if (rank < 0 || rank >= L->world)
        return fsc_error(FSC_ERR_INVALID, "%s: rank %d is outside world %d", path, rank, L->world);
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
    int64_t left = shape_numel(p->ndim, p->shape);
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
        int64_t numel = shape_numel(L->params[i].ndim, L->params[i].shape);
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
