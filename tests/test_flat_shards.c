/* Flat shards: a real module tree is laid out in FSDP-style units (gaps,
 * padding, parameters spanning ranks, ranks holding only padding) for worlds
 * 1 to 4, sliced, saved per rank and consolidated offline; the result must be
 * byte-identical to fsc_weights_save of the unsharded model. Every refusal
 * names its problem and leaves an existing output untouched. Run as
 * `test_flat_shards --tool PATH` it drives the fsc-consolidate binary instead. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, truncate */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsc/flat_shards.h"
#include "fsc/io.h"
#include "fsc/weights.h"

#include "run_tool.h"
#include "tmpdir.h"

static const char *tool_path; /* fsc-consolidate, in --tool mode */

static fsc_module *model;
static fsc_params ps;

static const char *meta_keys[] = {"format", "step", "note"};
static const char *meta_vals[] = {"pt", "1200", "tab\there, \"quoted\", caf\xc3\xa9"};

/* ---- the model and its layouts ------------------------------------------------------ */

/* in.weight [7,5], in.bias, ln.weight, ln.bias [7], blk.fc.weight [9,7], blk.fc.bias [9],
 * blk.proj.weight [3,9] (no bias), ln_f.weight, ln_f.bias [3]: 9 parameters. */
static int model_setup(void **state) {
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

static int model_teardown(void **state) {
    fsc_params_free(&ps);
    fsc_module_free(model);
    return teardown(state);
}

static int64_t param_numel(const fsc_flat_param *p) {
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

static fsc_flat_layout make_layout(const plan *pl) {
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

/* Deep copy, so a test can mutate one field. */
static fsc_flat_layout copy_layout(const fsc_flat_layout *L) {
    fsc_flat_layout c = *L;
    c.units = malloc((size_t)L->nunits * sizeof *c.units + 1);
    c.params = malloc((size_t)L->nparams * sizeof *c.params + 1);
    memcpy(c.units, L->units, (size_t)L->nunits * sizeof *c.units);
    memcpy(c.params, L->params, (size_t)L->nparams * sizeof *c.params);
    return c;
}

static void free_layout(fsc_flat_layout *L) {
    free(L->units);
    free(L->params);
}

/* Each unit's padded flat buffer (world * shard floats): gaps and padding hold
 * a NaN with a payload, parameters their values. */
static float **make_flats(const fsc_flat_layout *L) {
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

static void free_flats(const fsc_flat_layout *L, float **flat) {
    for (int u = 0; u < L->nunits; u++) free(flat[u]);
    free(flat);
}

static const char *shard_path(const char *tag, int rank) {
    char name[128];
    snprintf(name, sizeof name, "%s_r%d.safetensors", tag, rank);
    return tmp(name);
}

/* Saves every rank of L under tag, with the given value for "step". */
static void save_all(const fsc_flat_layout *L, float **flat, const char *tag, const char *step) {
    const char *vals[3] = {meta_vals[0], step, meta_vals[2]};
    for (int r = 0; r < L->world; r++) {
        const float *sh[3];
        for (int u = 0; u < L->nunits; u++) sh[u] = flat[u] + r * L->units[u].shard;
        int rc = fsc_flat_shard_save(shard_path(tag, r), L, r, sh, 3, meta_keys, vals);
        if (rc) print_error("save %s rank %d: %s\n", tag, r, fsc_last_error());
        assert_int_equal(rc, FSC_OK);
    }
}

static unsigned char *slurp(const char *path, size_t *n) {
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

static void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    if (na != nb || memcmp(x, y, na) != 0) print_error("%s and %s differ\n", a, b);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
}

/* tmp() paths rotate through four buffers: the long-lived ones get their own. */
static const char *reference(void) {
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
#define D_PLAN (&plans[3]) /* world 4: the files the refusal tests use */

/* ---- consolidation ------------------------------------------------------------------ */

static void test_consolidate_matches_full(void **state) {
    (void)state;
    const char *ref = reference();
    int max_span = 0, padding_only = 0;
    for (size_t k = 0; k < sizeof plans / sizeof plans[0]; k++) {
        fsc_flat_layout L = make_layout(&plans[k]);
        assert_int_equal(fsc_flat_layout_check(&L), FSC_OK);
        for (int i = 0; i < L.nparams; i++) {
            const fsc_flat_param *p = &L.params[i];
            int64_t s = L.units[p->unit].shard, n = param_numel(p);
            int span = n ? (int)((p->offset + n - 1) / s - p->offset / s + 1) : 0;
            if (span > max_span) max_span = span;
        }
        for (int u = 0; u < L.nunits; u++)
            if (L.units[u].shard && L.units[u].numel <= (L.world - 1) * L.units[u].shard)
                padding_only = 1;
        float **flat = make_flats(&L);
        char tag[32];
        snprintf(tag, sizeof tag, "w%d", L.world);
        save_all(&L, flat, tag, "1200");

        /* files in a scrambled order: each says its rank */
        const char *paths[4];
        for (int r = 0; r < L.world; r++) {
            int rank =
                (L.world + 1 - r) % L.world; /* a permutation; not the identity for world > 1 */
            paths[r] = strdup(shard_path(tag, rank));
        }
        size_t before = fsc_mem_current(FSC_MEM_WORK);
        fsc_mem_reset_peaks();
        char full[512];
        snprintf(full, sizeof full, "%s", tmp("full.safetensors"));
        int rc = fsc_flat_consolidate(L.world, paths, full);
        if (rc) print_error("world %d: %s\n", L.world, fsc_last_error());
        assert_int_equal(rc, FSC_OK);
        /* streams: never more than one parameter (blk.fc.weight, the largest: 63 floats) */
        assert_true(fsc_mem_peak(FSC_MEM_WORK) - before <= 63 * sizeof(float));
        assert_same_file(full, ref);

        /* load round trip: every rank's shard comes back bit for bit, padding included */
        for (int r = 0; r < L.world; r++) {
            float *dst[3];
            for (int u = 0; u < L.nunits; u++)
                dst[u] = calloc((size_t)L.units[u].shard + 1, sizeof(float));
            rc = fsc_flat_shard_load(shard_path(tag, r), &L, r, dst);
            if (rc) print_error("%s\n", fsc_last_error());
            assert_int_equal(rc, FSC_OK);
            for (int u = 0; u < L.nunits; u++) {
                assert_memory_equal(dst[u], flat[u] + r * L.units[u].shard,
                                    (size_t)L.units[u].shard * sizeof(float));
                free(dst[u]);
            }
        }

        /* the stored layout reads back as given */
        fsc_flat_layout R;
        int rank = -1;
        assert_int_equal(fsc_flat_layout_read(shard_path(tag, L.world - 1), &R, &rank), FSC_OK);
        assert_int_equal(rank, L.world - 1);
        assert_int_equal(R.world, L.world);
        assert_int_equal(R.nunits, L.nunits);
        assert_int_equal(R.nparams, L.nparams);
        assert_memory_equal(R.units, L.units, (size_t)L.nunits * sizeof *L.units);
        for (int i = 0; i < L.nparams; i++) {
            assert_string_equal(R.params[i].name, L.params[i].name);
            assert_int_equal(R.params[i].ndim, L.params[i].ndim);
            assert_memory_equal(R.params[i].shape, L.params[i].shape,
                                (size_t)L.params[i].ndim * sizeof(int64_t));
            assert_int_equal(R.params[i].unit, L.params[i].unit);
            assert_int_equal(R.params[i].offset, L.params[i].offset);
        }
        fsc_flat_layout_free(&R);
        assert_null(R.units);

        for (int r = 0; r < L.world; r++) free((void *)paths[r]);
        free_flats(&L, flat);
        free_layout(&L);
    }
    assert_true(max_span >= 3);
    assert_true(padding_only);
}

/* A path whose bytes must survive every refusal. */
static const char *keep_path(void) {
    static char p[512];
    snprintf(p, sizeof p, "%s", tmp("keep.safetensors"));
    write_raw(p, "precious old weights", 20);
    return p;
}

static void assert_kept(const char *p) {
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

static void expect_refused(int n, const char *const *paths, const char *out, const char *needle,
                           const char *needle2) {
    int rc = fsc_flat_consolidate(n, paths, out);
    const char *msg = fsc_last_error();
    if (rc == FSC_OK || !strstr(msg, needle) || (needle2 && !strstr(msg, needle2)))
        print_error("status %d, message \"%s\" (want \"%s\"%s%s)\n", rc, msg, needle,
                    needle2 ? " and " : "", needle2 ? needle2 : "");
    assert_int_not_equal(rc, FSC_OK);
    assert_non_null(strstr(msg, needle));
    if (needle2) assert_non_null(strstr(msg, needle2));
}

/* A safetensors file with the given layout metadata and rank and one tensor flat.0 [n]. */
static void write_fake_shard(const char *path, const char *layout, const char *rank, int64_t n) {
    int rc;
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    assert_non_null(w);
    assert_int_equal(fsc_st_writer_set_metadata(w, FSC_FLAT_LAYOUT_KEY, layout), FSC_OK);
    if (rank) assert_int_equal(fsc_st_writer_set_metadata(w, FSC_FLAT_RANK_KEY, rank), FSC_OK);
    assert_int_equal(fsc_st_writer_declare(w, "flat.0", FSC_DTYPE_F32, 1, &n), FSC_OK);
    float z[16] = {0};
    assert_true(n <= 16);
    if (n) assert_int_equal(fsc_st_writer_write(w, "flat.0", z, (size_t)n * 4), FSC_OK);
    assert_int_equal(fsc_st_writer_close(w), FSC_OK);
}

static void test_consolidate_refusals(void **state) {
    (void)state;
    fsc_flat_layout L = make_layout(D_PLAN), C = make_layout(&plans[2]);
    float **flat = make_flats(&L), **cflat = make_flats(&C);
    save_all(&L, flat, "d", "1200");
    save_all(&C, cflat, "c", "1200");
    const char *out = keep_path();
    char p[4][512];
    for (int r = 0; r < 4; r++) snprintf(p[r], sizeof p[r], "%s", shard_path("d", r));

    /* a missing rank, a duplicate rank, too many files */
    expect_refused(3, (const char *[]){p[0], p[1], p[3]}, out, "rank 2's shard is missing",
                   "3 files given, saved with world 4");
    assert_kept(out);
    expect_refused(4, (const char *[]){p[0], p[1], p[3], p[1]}, out, "both rank 1's shard", p[1]);
    assert_kept(out);
    expect_refused(5, (const char *[]){p[0], p[1], p[2], p[3], p[2]}, out, "both rank 2's shard",
                   NULL);
    assert_kept(out);
    /* files of another save of another world */
    char c0[512];
    snprintf(c0, sizeof c0, "%s", shard_path("c", 0));
    expect_refused(4, (const char *[]){p[0], p[1], c0, p[3]}, out, "saved with world 3", c0);
    assert_kept(out);
    expect_refused(3, (const char *[]){c0, shard_path("c", 1), p[2]}, out, "saved with world 4",
                   p[2]);
    assert_kept(out);

    /* same world, one parameter moved (the unit's numel and shard unchanged) */
    fsc_flat_layout M = copy_layout(&L);
    assert_int_equal(M.params[1].offset, 36); /* in.bias, after in.weight's 35 and a gap */
    M.params[1].offset = 35;
    assert_int_equal(fsc_flat_layout_check(&M), FSC_OK);
    float **mflat = make_flats(&M);
    save_all(&M, mflat, "m", "1200");
    expect_refused(4, (const char *[]){p[0], shard_path("m", 1), p[2], p[3]}, out,
                   "parameter in.bias has offset 35 in the file, 36 in ", p[0]);
    assert_kept(out);

    /* same layout, another save (metadata differs) */
    save_all(&L, flat, "s", "1300");
    expect_refused(4, (const char *[]){p[0], p[1], shard_path("s", 2), p[3]}, out,
                   "metadata \"step\" is \"1300\"", "not from one save");
    assert_kept(out);

    /* a truncated file, a corrupt header, a file that is not a shard */
    size_t n;
    unsigned char *b = slurp(p[2], &n);
    write_raw(tmp("trunc.safetensors"), b, n - 10);
    expect_refused(4, (const char *[]){p[0], p[1], tmp("trunc.safetensors"), p[3]}, out,
                   "trunc.safetensors", "truncated");
    assert_kept(out);
    memcpy(b + 8, "{\"x\":[1,2", 9);
    write_raw(tmp("corrupt.safetensors"), b, n);
    expect_refused(4, (const char *[]){p[0], p[1], tmp("corrupt.safetensors"), p[3]}, out,
                   "corrupt.safetensors", "not valid JSON");
    assert_kept(out);
    free(b);
    expect_refused(4, (const char *[]){p[0], p[1], reference(), p[3]}, out, "ref.safetensors",
                   "not a flat shard file");
    assert_kept(out);
    expect_refused(1, (const char *[]){tmp("absent.safetensors")}, out, "absent.safetensors", NULL);
    assert_kept(out);

    /* lying layouts, checked before use */
    char F[512];
    snprintf(F, sizeof F, "%s", tmp("fake.safetensors"));
    write_fake_shard(F,
                     "{\"version\":1,\"world\":2,\"units\":[{\"name\":\"\",\"numel\":10,\"shard\":"
                     "4}],\"params\":[]}",
                     "0", 4);
    expect_refused(1, (const char *[]){F}, out, "stored flat layout", "cannot hold its numel 10");
    write_fake_shard(F,
                     "{\"version\":1,\"world\":1,\"units\":[{\"name\":\"\",\"numel\":4,\"shard\":4}"
                     "],\"params\":[{\"name\":\"w\",\"shape\":[5],\"unit\":0,\"offset\":0}]}",
                     "0", 4);
    expect_refused(1, (const char *[]){F}, out, "parameter w [5] at offset 0 does not fit", NULL);
    write_fake_shard(F,
                     "{\"version\":1,\"world\":1,\"units\":[{\"name\":\"\",\"numel\":4,\"shard\":4}"
                     "],\"params\":[{\"name\":\"w\",\"shape\":[-4],\"unit\":0,\"offset\":0}]}",
                     "0", 4);
    expect_refused(1, (const char *[]){F}, out, "\"shape\"[0] must be an integer", NULL);
    write_fake_shard(F,
                     "{\"version\":2,\"world\":1,\"units\":[{\"name\":\"\",\"numel\":4,\"shard\":4}"
                     "],\"params\":[]}",
                     "0", 4);
    expect_refused(1, (const char *[]){F}, out, "flat layout version 2", NULL);
    write_fake_shard(F, "[1,2]", "0", 4);
    expect_refused(1, (const char *[]){F}, out, "is not a JSON object", NULL);
    write_fake_shard(F,
                     "{\"version\":1,\"world\":1,\"units\":[{\"name\":\"\",\"numel\":4,\"shard\":4}"
                     "],\"params\":[]}",
                     "1", 4);
    expect_refused(1, (const char *[]){F}, out, "\"fsc.rank\" is \"1\", not a rank of world 1",
                   NULL);
    write_fake_shard(F,
                     "{\"version\":1,\"world\":1,\"units\":[{\"name\":\"\",\"numel\":4,\"shard\":4}"
                     "],\"params\":[]}",
                     NULL, 4);
    expect_refused(1, (const char *[]){F}, out, "\"fsc.rank\" is missing", NULL);
    write_fake_shard(F,
                     "{\"version\":1,\"world\":1,\"units\":[{\"name\":\"\",\"numel\":4,\"shard\":5}"
                     "],\"params\":[]}",
                     "0", 4);
    expect_refused(1, (const char *[]){F}, out, "tensor flat.0 has shape [4], its layout says [5]",
                   NULL);
    assert_kept(out);

    /* the output may not be one of the inputs; the input survives */
    b = slurp(p[3], &n);
    expect_refused(4, (const char *[]){p[0], p[1], p[2], p[3]}, p[3], "would be overwritten", NULL);
    size_t n2;
    unsigned char *b2 = slurp(p[3], &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(b, b2, n);
    free(b);
    free(b2);
    expect_refused(0, (const char *[]){NULL}, out, "at least one shard file", NULL);
    assert_kept(out);

    /* and after all that, the real thing works over the kept file */
    assert_int_equal(fsc_flat_consolidate(4, (const char *[]){p[3], p[2], p[1], p[0]}, out),
                     FSC_OK);
    assert_same_file(out, reference());

    free_flats(&M, mflat);
    free_layout(&M);
    free_flats(&C, cflat);
    free_flats(&L, flat);
    free_layout(&C);
    free_layout(&L);
}

/* ---- load and save ------------------------------------------------------------------ */

static void expect_load_refused(const fsc_flat_layout *L, int rank, const char *path,
                                const char *needle) {
    float *dst[3];
    for (int u = 0; u < L->nunits; u++) {
        dst[u] = malloc((size_t)L->units[u].shard * sizeof(float) + 4);
        for (int64_t j = 0; j < L->units[u].shard; j++) dst[u][j] = -42.f;
    }
    int rc = fsc_flat_shard_load(path, L, rank, dst);
    if (rc == FSC_OK || !strstr(fsc_last_error(), needle))
        print_error("status %d, message \"%s\" (want \"%s\")\n", rc, fsc_last_error(), needle);
    assert_int_not_equal(rc, FSC_OK);
    assert_non_null(strstr(fsc_last_error(), needle));
    for (int u = 0; u < L->nunits; u++) { /* nothing written on a refusal */
        for (int64_t j = 0; j < L->units[u].shard; j++) assert_true(dst[u][j] == -42.f);
        free(dst[u]);
    }
}

static void test_load_refusals(void **state) {
    (void)state;
    fsc_flat_layout L = make_layout(D_PLAN);
    float **flat = make_flats(&L);
    save_all(&L, flat, "d", "1200");
    const char *p1 = strdup(shard_path("d", 1));

    plan two = *D_PLAN;
    two.world = 2;
    fsc_flat_layout W = make_layout(&two);
    char want[600];
    snprintf(want, sizeof want, "%s: saved with world 4, this run has 2", p1);
    expect_load_refused(&W, 1, p1, want);
    free_layout(&W);

    fsc_flat_layout M = copy_layout(&L);
    M.params[1].offset = 35;
    expect_load_refused(&M, 1, p1, "parameter in.bias has offset 36 in the file, 35 here");
    memcpy(M.params, L.params, (size_t)L.nparams * sizeof *L.params);
    strcpy(M.params[1].name, "in.b");
    expect_load_refused(&M, 1, p1, "parameter 1 is in.bias in the file, in.b here");
    memcpy(M.params, L.params, (size_t)L.nparams * sizeof *L.params);
    M.params[7].ndim = 2; /* ln_f.weight [3] -> [3, 1] */
    M.params[7].shape[1] = 1;
    expect_load_refused(&M, 1, p1, "parameter ln_f.weight has shape [3] in the file, [3, 1] here");
    memcpy(M.params, L.params, (size_t)L.nparams * sizeof *L.params);
    M.units[2].shard = 8;
    expect_load_refused(&M, 1, p1, "unit 2 (\"ln_f\") has shard 4 in the file, 8 here");
    M.units[2].shard = L.units[2].shard;
    strcpy(M.units[1].name, "h.0");
    expect_load_refused(&M, 1, p1, "unit 1 is \"blk\" in the file, \"h.0\" here");
    free_layout(&M);

    expect_load_refused(&L, 2, p1, "is rank 1's shard, this is rank 2");
    expect_load_refused(&L, 1, reference(), "not a flat shard file");
    expect_load_refused(&L, 4, p1, "rank 4 is outside world 4");

    free((void *)p1);
    free_flats(&L, flat);
    free_layout(&L);
}

static void expect_check_fails(const fsc_flat_layout *L, const char *needle) {
    int rc = fsc_flat_layout_check(L);
    if (rc != FSC_ERR_INVALID || !strstr(fsc_last_error(), needle))
        print_error("status %d, message \"%s\" (want \"%s\")\n", rc, fsc_last_error(), needle);
    assert_int_equal(rc, FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), needle));
}

static void test_layout_check_and_save(void **state) {
    (void)state;
    fsc_flat_layout L = make_layout(D_PLAN);
    assert_int_equal(fsc_flat_layout_check(&L), FSC_OK);
    fsc_flat_layout M = copy_layout(&L);
#define RESET()                                                                                    \
    memcpy(M.units, L.units, (size_t)L.nunits * sizeof *L.units),                                  \
        memcpy(M.params, L.params, (size_t)L.nparams * sizeof *L.params), M.world = L.world
    M.world = 0;
    expect_check_fails(&M, "world 0");
    RESET();
    M.units[1].shard = 25; /* blk: numel 103 > 4 x 25 */
    expect_check_fails(&M, "unit 1 (\"blk\"): shard 25 x world 4 = 100 elements cannot hold its "
                           "numel 103");
    RESET();
    M.params[8].offset = 6; /* ln_f.bias [3] in a unit of numel 7 */
    expect_check_fails(&M, "parameter ln_f.bias [3] at offset 6 does not fit in unit 2");
    RESET();
    M.params[1].offset = 30;
    expect_check_fails(&M, "parameters in.weight [0, 35) and in.bias [30, 37) overlap in unit 0");
    RESET();
    M.params[3].offset = 36; /* ln.bias onto in.bias exactly */
    expect_check_fails(&M, "overlap in unit 0");
    RESET();
    strcpy(M.params[5].name, "in.weight");
    expect_check_fails(&M, "two parameters are named in.weight");
    RESET();
    M.params[2].name[0] = '\0';
    expect_check_fails(&M, "parameter 2 has an empty name");
    RESET();
    M.params[2].unit = 3;
    expect_check_fails(&M, "parameter ln.weight is in unit 3, but there are 3 units");
    RESET();
    M.params[2].shape[0] = -7;
    expect_check_fails(&M, "parameter ln.weight has shape [-7]");
    RESET();
    M.params[2].ndim = 5;
    expect_check_fails(&M, "parameter ln.weight has ndim 5");
    RESET();
    memset(M.params[2].name, 'x', sizeof M.params[2].name);
    expect_check_fails(&M, "parameter 2's name is not NUL-terminated");
    RESET();
    assert_int_equal(fsc_flat_layout_check(&M), FSC_OK);
    expect_check_fails(NULL, "NULL");

    /* save refuses bad arguments and keeps an existing file */
    float **flat = make_flats(&L);
    const float *sh[3] = {flat[0], flat[1], flat[2]};
    const char *out = keep_path();
    M.world = 0;
    assert_int_equal(fsc_flat_shard_save(out, &M, 0, sh, 0, NULL, NULL), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "keep.safetensors: flat layout: world 0"));
    RESET();
    assert_int_equal(fsc_flat_shard_save(out, &L, 4, sh, 0, NULL, NULL), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "rank 4 is outside world 4"));
    const char *k[] = {"fsc.rank"}, *v[] = {"0"};
    assert_int_equal(fsc_flat_shard_save(out, &L, 0, sh, 1, k, v), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "\"fsc.rank\" is reserved"));
    const char *k2[] = {"a", "a"}, *v2[] = {"1", "2"};
    assert_int_not_equal(fsc_flat_shard_save(out, &L, 0, sh, 2, k2, v2), FSC_OK);
    assert_non_null(strstr(fsc_last_error(), "\"a\" set twice"));
    const float *sh_null[3] = {flat[0], NULL, flat[2]};
    assert_int_equal(fsc_flat_shard_save(out, &L, 0, sh_null, 0, NULL, NULL), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "no shard data for unit 1 (\"blk\")"));
    assert_kept(out);
#undef RESET
    free_flats(&L, flat);
    free_layout(&M);
    free_layout(&L);
}

/* Integers up to 2^53 survive the JSON layout exactly (cJSON's own number
 * printing would round 2^53 to 15 digits). Only an empty tensor can carry
 * such a dim without the data to match. */
static void test_layout_numbers_exact(void **state) {
    (void)state;
    const int64_t big = (int64_t)1 << 53, odd = ((int64_t)1 << 52) + 1;
    fsc_flat_unit u = {.name = "", .numel = 0, .shard = 0};
    fsc_flat_param p[2] = {{.name = "a", .ndim = 2, .shape = {big, 0}},
                           {.name = "b", .ndim = 3, .shape = {0, odd, 3}}};
    fsc_flat_layout L = {.world = 3, .nunits = 1, .units = &u, .nparams = 2, .params = p};
    char path[512];
    snprintf(path, sizeof path, "%s", tmp("big.safetensors"));
    for (int r = 0; r < 3; r++) {
        char name[64];
        snprintf(name, sizeof name, "big%d.safetensors", r);
        int rc = fsc_flat_shard_save(tmp(name), &L, r, NULL, 0, NULL, NULL);
        if (rc) print_error("%s\n", fsc_last_error());
        assert_int_equal(rc, FSC_OK);
    }
    fsc_flat_layout R;
    int rank = -1;
    assert_int_equal(fsc_flat_layout_read(tmp("big1.safetensors"), &R, &rank), FSC_OK);
    assert_int_equal(rank, 1);
    assert_true(R.params[0].shape[0] == big && R.params[1].shape[1] == odd);
    fsc_flat_layout_free(&R);
    assert_int_equal(
        fsc_flat_consolidate(3,
                             (const char *[]){tmp("big2.safetensors"), tmp("big0.safetensors"),
                                              tmp("big1.safetensors")},
                             path),
        FSC_OK);
    int rc;
    fsc_st_file *f = fsc_st_open(path, &rc);
    assert_non_null(f);
    assert_int_equal(fsc_st_count(f), 2);
    assert_true(fsc_st_find(f, "a")->shape[0] == big && fsc_st_find(f, "b")->shape[1] == odd);
    fsc_st_close(f);
}

/* ---- the fsc-consolidate tool ------------------------------------------------------- */

/* Runs the tool with argv (NULL-terminated, argv[0] omitted); output to tool.log. */
static int run_tool(const char *const *args, char *log, size_t cap) {
    return run_tool_logged(tool_path, args, tmp("tool.log"), log, cap);
}

static void test_tool(void **state) {
    (void)state;
    fsc_flat_layout L = make_layout(D_PLAN);
    float **flat = make_flats(&L);
    save_all(&L, flat, "d", "1200");
    char log[4096], p[4][512], sub[512];
    for (int r = 0; r < 4; r++) snprintf(p[r], sizeof p[r], "%s", shard_path("d", r));
    const char *ref = reference();

    assert_int_equal(run_tool((const char *[]){NULL}, log, sizeof log), 2);
    assert_non_null(strstr(log, "usage: fsc-consolidate"));
    assert_int_equal(run_tool((const char *[]){"x.safetensors", "--bogus", NULL}, log, sizeof log),
                     2);
    assert_int_equal(run_tool((const char *[]){"--help", NULL}, log, sizeof log), 0);
    assert_non_null(strstr(log, "--dir DIR"));

    char out[512], out2[512];
    snprintf(out, sizeof out, "%s", tmp("tool_full.safetensors"));
    assert_int_equal(run_tool((const char *[]){out, p[2], p[0], p[3], p[1], NULL}, log, sizeof log),
                     0);
    assert_same_file(out, ref);

    /* --dir: the shard files plus an ordinary weights file, which is skipped */
    snprintf(sub, sizeof sub, "%s", tmp("shards"));
    assert_int_equal(mkdir(sub, 0755), 0);
    for (int r = 0; r < 4; r++) {
        char dst[600], name[64];
        snprintf(name, sizeof name, "shards/rank%d.safetensors", r);
        snprintf(dst, sizeof dst, "%s", tmp(name));
        size_t n;
        unsigned char *b = slurp(p[r], &n);
        write_raw(dst, b, n);
        free(b);
    }
    assert_int_equal(fsc_weights_save(tmp("shards/plain.safetensors"), &ps, 0, NULL, NULL), FSC_OK);
    snprintf(out2, sizeof out2, "%s", tmp("tool_dir.safetensors"));
    assert_int_equal(run_tool((const char *[]){out2, "--dir", sub, NULL}, log, sizeof log), 0);
    assert_same_file(out2, ref);

    /* a refusal: exit 1, the reason printed, the output untouched */
    const char *kept = keep_path();
    assert_int_equal(run_tool((const char *[]){kept, p[0], p[1], p[3], NULL}, log, sizeof log), 1);
    assert_non_null(strstr(log, "rank 2's shard is missing"));
    assert_kept(kept);
    remove(tmp("shards/rank2.safetensors"));
    assert_int_equal(run_tool((const char *[]){kept, "--dir", sub, NULL}, log, sizeof log), 1);
    assert_non_null(strstr(log, "rank 2's shard is missing"));
    assert_int_equal(
        run_tool((const char *[]){kept, "--dir", tmp("nowhere"), NULL}, log, sizeof log), 1);
    assert_non_null(strstr(log, "cannot open directory"));
    assert_kept(kept);

    free_flats(&L, flat);
    free_layout(&L);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--tool") == 0) {
        tool_path = argv[2];
        const struct CMUnitTest tool_tests[] = {cmocka_unit_test(test_tool)};
        return cmocka_run_group_tests(tool_tests, model_setup, model_teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_consolidate_matches_full),
        cmocka_unit_test(test_consolidate_refusals),
        cmocka_unit_test(test_load_refusals),
        cmocka_unit_test(test_layout_check_and_save),
        cmocka_unit_test(test_layout_numbers_exact),
    };
    return cmocka_run_group_tests(tests, model_setup, model_teardown);
}
