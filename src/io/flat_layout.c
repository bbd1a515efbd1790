/* The flat-shard layout: its checks (fsc_flat_layout_check, the same for a
 * caller's layout and one read from a file) and its JSON form, parsed
 * strictly since nothing in a file is trusted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fsc/io.h"
#include "flat_layout.h"

/* ---- small helpers ------------------------------------------------------------ */

static int terminated(const char *s, size_t cap) {
    return memchr(s, '\0', cap) != NULL;
}

int64_t flat_shape_numel(int ndim, const int64_t *shape) {
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

void flat_fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used +=
            (size_t)snprintf(buf + used, cap - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
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
        int64_t numel = flat_shape_numel(p->ndim, p->shape);
        char shape[128];
        flat_fmt_shape(shape, sizeof shape, p->ndim, p->shape);
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
char *flat_layout_json(const fsc_flat_layout *L) {
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

/* An entry of array `list` must be an object; `what` gets its prefix for
 * the messages of its fields ("units[3]."). */
static int entry_object(const char *path, const cJSON *o, const char *list, int i, char *what,
                        size_t n) {
    snprintf(what, n, "%s[%d].", list, i);
    if (!cJSON_IsObject(o))
        return fsc_error(FSC_ERR_FORMAT, "%s: stored flat layout: %s[%d] must be an object", path,
                         list, i);
    return FSC_OK;
}

static int parse_unit(const char *path, const cJSON *o, int u, fsc_flat_unit *U) {
    char what[48];
    int rc = entry_object(path, o, "units", u, what, sizeof what);
    if (!rc) rc = get_name(path, o, what, U->name, sizeof U->name);
    if (!rc) rc = get_int(path, o, what, "numel", MAX_ELEMS, &U->numel);
    if (!rc) rc = get_int(path, o, what, "shard", MAX_ELEMS, &U->shard);
    return rc;
}

static int parse_param(const char *path, const cJSON *o, int i, fsc_flat_param *p) {
    char what[48];
    int64_t unit = 0;
    int rc = entry_object(path, o, "params", i, what, sizeof what);
    if (!rc) rc = get_name(path, o, what, p->name, sizeof p->name);
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
int flat_layout_parse(const char *path, const char *text, fsc_flat_layout *L) {
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
