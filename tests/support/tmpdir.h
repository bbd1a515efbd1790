/* A scratch directory per test program: created by setup, emptied and removed
 * by teardown (cmocka group fixtures), with paths inside it from tmp(). */
#ifndef FSC_TEST_TMPDIR_H
#define FSC_TEST_TMPDIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

/* "dir/name"; four rotating buffers, so a call can use two or three paths. */
static const char *tmp(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int setup(void **state) {
    (void)state;
    strcpy(dir, "/tmp/fsc_test_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int teardown(void **state) {
    (void)state;
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); /* rm -r */
    return 0;
}

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, n, fp), n);
    fclose(fp);
}

#endif
