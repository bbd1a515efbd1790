/* core/grow.h's doubling array, through the typed pointer it is named by:
 *  - it starts at `first` elements and doubles until `need` fits, keeping
 *    the contents; a need that already fits reallocates nothing;
 *  - the element size is the pointer's own (sizeof *p): a struct array
 *    grows by whole structs;
 *  - when realloc fails the caller's pointer and capacity are kept (the
 *    array still usable, nothing leaked) and the status is FSC_ERR_NOMEM
 *    with the caller's message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "test_main.h"

/* The failing realloc asks for 2^50 bytes: glibc refuses it; under
 * AddressSanitizer the allocator must return NULL rather than abort. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1";
}

typedef struct {
    double a, b, c;
} wide;

static void test_doubles_from_first(void **state) {
    (void)state;
    int *v = NULL, cap = 0;
    assert_int_equal(FSC_GROW_ARRAY(v, &cap, 1, 4, "oom"), FSC_OK);
    assert_int_equal(cap, 4);
    for (int i = 0; i < 4; i++) v[i] = 10 * i;
    int *before = v;
    assert_int_equal(FSC_GROW_ARRAY(v, &cap, 4, 4, "oom"), FSC_OK); /* fits: untouched */
    assert_ptr_equal(v, before);
    assert_int_equal(cap, 4);
    assert_int_equal(FSC_GROW_ARRAY(v, &cap, 5, 4, "oom"), FSC_OK);
    assert_int_equal(cap, 8);
    assert_int_equal(FSC_GROW_ARRAY(v, &cap, 33, 4, "oom"), FSC_OK); /* 8 -> 16 -> 32 -> 64 */
    assert_int_equal(cap, 64);
    for (int i = 0; i < 4; i++) assert_int_equal(v[i], 10 * i);
    v[63] = 7; /* the whole capacity is there (ASan would say otherwise) */
    free(v);
}

static void test_element_is_the_pointers_own(void **state) {
    (void)state;
    wide *w = NULL;
    int cap = 0;
    assert_int_equal(FSC_GROW_ARRAY(w, &cap, 3, 16, "oom"), FSC_OK);
    assert_int_equal(cap, 16);
    memset(w, 0, (size_t)cap * sizeof *w); /* 16 whole structs, not 16 bytes */
    free(w);
}

static void test_failure_keeps_the_array(void **state) {
    (void)state;
    typedef struct {
        unsigned char bytes[1 << 20];
    } mib;
    mib *m = NULL;
    int cap = 0;
    assert_int_equal(FSC_GROW_ARRAY(m, &cap, 1, 1, "oom"), FSC_OK);
    assert_int_equal(cap, 1);
    m[0].bytes[0] = 42, m[0].bytes[sizeof m[0].bytes - 1] = 43;
    mib *kept = m;
    /* 2^30 MiB: more than any address space holds */
    assert_int_equal(FSC_GROW_ARRAY(m, &cap, 1 << 30, 1, "test list: out of memory"),
                     FSC_ERR_NOMEM);
    assert_string_equal(fsc_last_error(), "test list: out of memory");
    assert_ptr_equal(m, kept);
    assert_int_equal(cap, 1);
    assert_int_equal(m[0].bytes[0] + m[0].bytes[sizeof m[0].bytes - 1], 85);
    free(m);
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_doubles_from_first),
              cmocka_unit_test(test_element_is_the_pointers_own),
              cmocka_unit_test(test_failure_keeps_the_array))
