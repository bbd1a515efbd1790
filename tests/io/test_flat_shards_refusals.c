/* Flat shards refused: consolidating files that are missing, repeated, of
 * another world, another layout or another save, truncated, corrupt, not
 * shards, or whose stored layout lies; loading a shard into a layout that
 * differs from the file's in any field; a layout that cannot hold its
 * parameters; saving with bad arguments. Each refusal names its problem,
 * and leaves an existing output (and the destination buffers) untouched.
 * What a correct save gives is test_flat_shards.c's; the fixture is
 * flat_shards_test.h. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, truncate */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flat_shards_test.h"
#include "test_main.h"

/* Deep copy, so a test can mutate one field. */
static fsc_flat_layout copy_layout(const fsc_flat_layout *L) {
    fsc_flat_layout c = *L;
    c.units = malloc((size_t)L->nunits * sizeof *c.units + 1);
    c.params = malloc((size_t)L->nparams * sizeof *c.params + 1);
    memcpy(c.units, L->units, (size_t)L->nunits * sizeof *c.units);
    memcpy(c.params, L->params, (size_t)L->nparams * sizeof *c.params);
    return c;
}

/* ---- consolidation ------------------------------------------------------------------ */

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

/* Stored layouts that lie, for one file holding flat.0 [4]: the layout's
 * JSON, the file's rank (NULL: none), and what the refusal must say. */
#define ONE_UNIT(version, world, numel, shard)                                                     \
    "{\"version\":" #version ",\"world\":" #world ",\"units\":[{\"name\":\"\",\"numel\":" #numel   \
    ",\"shard\":" #shard "}],\"params\":"
#define PARAM_W(dim) "[{\"name\":\"w\",\"shape\":[" #dim "],\"unit\":0,\"offset\":0}]}"
static const struct {
    const char *layout, *rank, *needle, *needle2;
} lies[] = {
    {ONE_UNIT(1, 2, 10, 4) "[]}", "0", "stored flat layout", "cannot hold its numel 10"},
    {ONE_UNIT(1, 1, 4, 4) PARAM_W(5), "0", "parameter w [5] at offset 0 does not fit", NULL},
    {ONE_UNIT(1, 1, 4, 4) PARAM_W(-4), "0", "\"shape\"[0] must be an integer", NULL},
    {ONE_UNIT(2, 1, 4, 4) "[]}", "0", "flat layout version 2", NULL},
    {"[1,2]", "0", "is not a JSON object", NULL},
    {ONE_UNIT(1, 1, 4, 4) "[]}", "1", "\"fsc.rank\" is \"1\", not a rank of world 1", NULL},
    {ONE_UNIT(1, 1, 4, 4) "[]}", NULL, "\"fsc.rank\" is missing", NULL},
    {ONE_UNIT(1, 1, 4, 5) "[]}", "0", "tensor flat.0 has shape [4], its layout says [5]", NULL},
};

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
    for (size_t k = 0; k < sizeof lies / sizeof lies[0]; k++) {
        write_fake_shard(F, lies[k].layout, lies[k].rank, 4);
        expect_refused(1, (const char *[]){F}, out, lies[k].needle, lies[k].needle2);
    }
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

FSC_TEST_MAIN(model_setup, model_teardown, cmocka_unit_test(test_consolidate_refusals),
              cmocka_unit_test(test_load_refusals), cmocka_unit_test(test_layout_check_and_save))
