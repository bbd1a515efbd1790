/* Reading the golden files of tests/data (written by the scripts of tests/reference/),
 * shared by the golden tests. Include after cmocka.h. */
#ifndef FSC_TEST_GOLDEN_FILES_H
#define FSC_TEST_GOLDEN_FILES_H

#include <stdio.h>
#include <stdlib.h>

#include "fsc/io.h"
#include "fsc/nn.h"

/* Opens tests/data/<file> (or $FSC_TEST_DATA/<file>); fails the test if it cannot. */
static fsc_st_file *open_golden(const char *file) {
    const char *dir = getenv("FSC_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/data", file);
    int status = 0;
    fsc_st_file *f = fsc_st_open(path, &status);
    if (!f) fprintf(stderr, "cannot open golden %s: %s\n", path, fsc_last_error());
    assert_non_null(f);
    return f;
}

/* A new tensor with the file's shape and dtype, read whole (caller frees data). */
static fsc_tensor read_entry(fsc_st_file *f, const char *name) {
    const fsc_st_entry *e = fsc_st_find(f, name);
    if (!e) fprintf(stderr, "golden tensor %s missing\n", name);
    assert_non_null(e);
    fsc_tensor t = fsc_tensor_make(NULL, e->dtype, e->ndim, e->shape);
    t.data = malloc(fsc_tensor_nbytes(&t) + 1);
    assert_non_null(t.data);
    assert_int_equal(fsc_st_read(f, name, &t), FSC_OK);
    return t;
}

/* A layer's golden, <prefix><layer>.safetensors (open_golden), opened, and
 * m's parameters bound into *ps (seed 0, with gradients; the caller loads
 * their values from the file). */
static fsc_st_file *open_golden_layer(const char *prefix, const char *layer, fsc_module *m,
                                      fsc_params *ps) {
    assert_non_null(m);
    char file[128];
    snprintf(file, sizeof file, "%s%s.safetensors", prefix, layer);
    fsc_st_file *f = open_golden(file);
    assert_int_equal(fsc_params_bind(m, 0, true, ps), FSC_OK);
    return f;
}

/* Frees what open_golden_layer gave: the file, m's parameters and m. */
static void close_golden_layer(fsc_st_file *f, fsc_module *m, fsc_params *ps) {
    fsc_params_free(ps);
    fsc_module_free(m);
    fsc_st_close(f);
}

#endif
