/* The fixture of the flat-shards tests (test_flat_shards.c, which checks
 * that a save consolidates and loads back exactly, and
 * test_flat_shards_refusals.c, which checks every refusal): a real module
 * tree with distinct values everywhere, FSDP-style layouts of it for worlds
 * 1 to 4 (plans[]), each unit's padded flat buffer, every rank's shard
 * saved, the unsharded reference file, and a file that must survive every
 * refusal. Include after cmocka.h. */
#ifndef FSC_TEST_FLAT_SHARDS_TEST_H
#define FSC_TEST_FLAT_SHARDS_TEST_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/flat_shards.h"
#include "fsc/io.h"
#include "fsc/weights.h"

#include "tmpdir.h"

static fsc_module *model;
static fsc_params ps;

static const char *meta_keys[] = {"format", "step", "note"};
static const char *meta_vals[] = {"pt", "1200", "tab\there, \"quoted\", caf\xc3\xa9"};

/* ---- the model and its layouts ------------------------------------------------------ */

/* in.weight [7,5], in.bias, ln.weight, ln.bias [7], blk.fc.weight [9,7], blk.fc.bias [9],
 * blk.proj.weight [3,9] (no bias), ln_f.weight, ln_f.bias [3]: 9 parameters. */
static inline int model_setup(void **state) {
    if (setup(state)) return -1;
    fsc_module *blk[2] = {fsc_linear_new("fc", 7, 9, true, FSC_WEIGHT_OUT_IN, 0.02f),
                          fsc_linear_new("proj", 9, 3, false, FSC_WEIGHT_IN_OUT, 0.02f)};
    fsc_module *parts[4] = {fsc_linear_new("in", 5, 7, true, FSC_WEIGHT_OUT_IN, 0.02f),
                            fsc_layernorm_new("ln", 7, 1e-5f), fsc_sequential_new("blk", 2, blk),
                            fsc_layernorm_new("ln_f", 3, 1e-5f)};
    model = fsc_sequential_new("model", 4, parts);
    if (!model || fsc_params_bind(model, 1234, false, &ps) != FSC_OK || ps.count != 9) return -1;
    /* distinct values everywhere (layer norms start at 0 and 1), so a parameter
     * read from a wrong place can never look right */
    for (int i = 0; i < ps.count; i++) {
        fsc_param *p = ps.entries[i].param;
        for (int64_t j = 0; j < p->numel; j++) p->data[j] += (float)(i * 1000 + j) * 1e-3f;
    }
    return 0;
}

static inline int model_teardown(void **state) {
    fsc_params_free(&ps);
    fsc_module_free(model);
    return teardown(state);
}

static inline int64_t param_numel(const fsc_flat_param *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

typedef struct {
    int world, nunits;
    int unit_of[9]; /* per parameter, in model order */
    int align;      /* offsets rounded up to a multiple of this */
    int shard_align;
    int reverse; /* unit 1's parameters placed in reverse model order */
} plan;

static const char *unit_names[] = {"", "blk", "ln_f"};

static inline fsc_flat_layout make_layout(const plan *pl) {
    fsc_flat_layout L = {.world = pl->world, .nunits = pl->nunits, .nparams = ps.count};
    L.units = calloc((size_t)L.nunits, sizeof *L.units);
    L.params = calloc((size_t)L.nparams, sizeof *L.params);
    assert_true(L.units && L.params);
    for (int i = 0; i < ps.count; i++) {
        fsc_flat_param *p = &L.params[i];
        const fsc_param *q = ps.entries[i].param;
        strcpy(p->name, ps.entries[i].name);
        p->ndim = q->ndim;
        memcpy(p->shape, q->shape, sizeof p->shape);
        p->unit = pl->unit_of[i];
    }
    for (int u = 0; u < L.nunits; u++) {
        strcpy(L.units[u].name, unit_names[u]);
        int64_t off = 0;
        for (int k = 0; k < ps.count; k++) {
            int i = pl->reverse && u == 1 ? ps.count - 1 - k : k;
            if (L.params[i].unit != u) continue;
            off = (off + pl->align - 1) / pl->align * pl->align;
            L.params[i].offset = off;
            off += param_numel(&L.params[i]);
        }
        int64_t shard = (off + pl->world - 1) / pl->world;
        L.units[u].numel = off;
        L.units[u].shard = (shard + pl->shard_align - 1) / pl->shard_align * pl->shard_align;
    }
    return L;
}

static inline void free_layout(fsc_flat_layout *L) {
    free(L->units);
    free(L->params);
}

/* Each unit's padded flat buffer (world * shard floats): gaps and padding hold
 * a NaN with a payload, parameters their values. */
static inline float **make_flats(const fsc_flat_layout *L) {
    float **flat = calloc((size_t)L->nunits, sizeof *flat);
    uint32_t junk = 0x7fc0beefu;
    for (int u = 0; u < L->nunits; u++) {
        size_t n = (size_t)(L->units[u].shard * L->world);
        flat[u] = malloc(n * sizeof(float) + 4);
        for (size_t j = 0; j < n; j++) memcpy(&flat[u][j], &junk, 4);
    }
    for (int i = 0; i < L->nparams; i++) {
        const fsc_flat_param *p = &L->params[i];
        memcpy(flat[p->unit] + p->offset, ps.entries[i].param->data,
               (size_t)param_numel(p) * sizeof(float));
    }
    return flat;
}

static inline void free_flats(const fsc_flat_layout *L, float **flat) {
    for (int u = 0; u < L->nunits; u++) free(flat[u]);
    free(flat);
}

static inline const char *shard_path(const char *tag, int rank) {
    char name[128];
    snprintf(name, sizeof name, "%s_r%d.safetensors", tag, rank);
    return tmp(name);
}

/* Saves every rank of L under tag, with the given value for "step". */
static inline void save_all(const fsc_flat_layout *L, float **flat, const char *tag,
                            const char *step) {
    const char *vals[3] = {meta_vals[0], step, meta_vals[2]};
    for (int r = 0; r < L->world; r++) {
        const float *sh[3];
        for (int u = 0; u < L->nunits; u++) sh[u] = flat[u] + r * L->units[u].shard;
        int rc = fsc_flat_shard_save(shard_path(tag, r), L, r, sh, 3, meta_keys, vals);
        if (rc) print_error("save %s rank %d: %s\n", tag, r, fsc_last_error());
        assert_int_equal(rc, FSC_OK);
    }
}

static inline unsigned char *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_int_equal(fread(b, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    *n = (size_t)len;
    return b;
}

static inline void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    if (na != nb || memcmp(x, y, na) != 0) print_error("%s and %s differ\n", a, b);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
}

/* tmp() paths rotate through four buffers: the long-lived ones get their own. */
static inline const char *reference(void) {
    static char path[512];
    snprintf(path, sizeof path, "%s", tmp("ref.safetensors"));
    assert_int_equal(fsc_weights_save(path, &ps, 3, meta_keys, meta_vals), FSC_OK);
    return path;
}

/* The plans: together they have gaps, padding, several units per world, a unit
 * whose parameters are not contiguous in model order, offsets not increasing in
 * model order, an empty unit, parameters spanning 2 and 3 ranks, and ranks
 * whose shard is all padding (checked in test_consolidate_matches_full). */
static const plan plans[] = {
    {.world = 1, .nunits = 2, .unit_of = {0}, .align = 1, .shard_align = 1},
    {.world = 2, .nunits = 2, .unit_of = {0, 0, 1, 1, 1, 1, 1, 0, 0}, .align = 4, .shard_align = 1},
    {.world = 3,
     .nunits = 3,
     .unit_of = {0, 0, 0, 0, 1, 1, 1, 2, 2},
     .align = 16,
     .shard_align = 1,
     .reverse = 1},
    {.world = 4, .nunits = 3, .unit_of = {0, 0, 0, 0, 1, 1, 1, 2, 2}, .align = 4, .shard_align = 4},
};
#define D_PLAN (&plans[3]) /* world 4: the files the refusal and tool tests use */

/* A path whose bytes must survive every refusal. */
static inline const char *keep_path(void) {
    static char p[512];
    snprintf(p, sizeof p, "%s", tmp("keep.safetensors"));
    write_raw(p, "precious old weights", 20);
    return p;
}

static inline void assert_kept(const char *p) {
    size_t n;
    unsigned char *b = slurp(p, &n);
    assert_int_equal(n, 20);
    assert_memory_equal(b, "precious old weights", 20);
    free(b);
    /* and no temporary left behind */
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (strstr(e->d_name, ".tmp.")) print_error("left behind: %s\n", e->d_name);
        assert_null(strstr(e->d_name, ".tmp."));
    }
    closedir(d);
}

#endif
