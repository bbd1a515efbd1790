/* Flat shards: a real module tree is laid out in FSDP-style units (gaps,
 * padding, parameters spanning ranks, ranks holding only padding) for worlds
 * 1 to 4, sliced, saved per rank and consolidated offline; the result must be
 * byte-identical to fsc_weights_save of the unsharded model, and every rank's
 * shard and the layout load back exactly. Run as `test_flat_shards --tool
 * PATH` it drives the fsc-consolidate binary instead. The refusals are
 * test_flat_shards_refusals.c's; the fixture is flat_shards_test.h. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, truncate */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flat_shards_test.h"
#include "run_tool.h"

static const char *tool_path; /* fsc-consolidate, in --tool mode */

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
        cmocka_unit_test(test_layout_numbers_exact),
    };
    return cmocka_run_group_tests(tests, model_setup, model_teardown);
}
