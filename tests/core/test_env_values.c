/* The library's FSC_* environment variables: each value outside its
 * documented range is an error naming the variable, the value and the range
 * (fsc_env_check), and FSC_MEM_LIMIT_MB's is one at first use too: every
 * allocation fails with it rather than running without the budget asked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fsc/core.h"
#include "test_main.h"

static void expect_refused(const char *name, const char *value, const char *range) {
    setenv(name, value, 1);
    assert_int_equal(fsc_env_check(), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), name));
    assert_non_null(strstr(fsc_last_error(), value));
    assert_non_null(strstr(fsc_last_error(), range));
    unsetenv(name);
}

static void test_invalid_values_named_with_range(void **state) {
    (void)state;
    expect_refused("FSC_LOG_LEVEL", "loud", "debug, info, warn, error, off");
    expect_refused("FSC_MEM_LIMIT_MB", "abc", "[0, 1073741824]");
    expect_refused("FSC_MEM_LIMIT_MB", "nan", "[0, 1073741824]");
    expect_refused("FSC_MEM_LIMIT_MB", "-5", "[0, 1073741824]");
    expect_refused("FSC_MEM_LIMIT_MB", "12MB", "[0, 1073741824]");
    expect_refused("FSC_MEM_LIMIT_MB", "1e12", "[0, 1073741824]");
    expect_refused("FSC_BF16_GEMM", "fast", "auto, on, off, 1 or 0");
    expect_refused("FSC_NUM_THREADS", "0", "[1, 1024]");
    expect_refused("FSC_NUM_THREADS", "4x", "[1, 1024]");
}

static void test_valid_values_accepted(void **state) {
    (void)state;
    const char *ok[][2] = {{"FSC_LOG_LEVEL", "debug"},   {"FSC_LOG_LEVEL", "off"},
                           {"FSC_LOG_LEVEL", ""},        {"FSC_MEM_LIMIT_MB", "0"},
                           {"FSC_MEM_LIMIT_MB", "0.5"},  {"FSC_MEM_LIMIT_MB", "1073741824"},
                           {"FSC_BF16_GEMM", "AUTO"},    {"FSC_BF16_GEMM", "0"},
                           {"FSC_NUM_THREADS", "1024"}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        setenv(ok[i][0], ok[i][1], 1);
        assert_int_equal(fsc_env_check(), FSC_OK);
        unsetenv(ok[i][0]);
    }
    assert_int_equal(fsc_env_check(), FSC_OK);
}

/* Last: the budget is read once per process. */
static void test_mem_limit_invalid_fails_allocations(void **state) {
    (void)state;
    setenv("FSC_MEM_LIMIT_MB", "lots", 1);
    void *p = fsc_mem_alloc(FSC_MEM_WORK, 64);
    assert_null(p);
    assert_non_null(strstr(fsc_last_error(), "FSC_MEM_LIMIT_MB=lots"));
    assert_non_null(strstr(fsc_last_error(), "[0, 1073741824]"));
    fsc_mem_set_limit(0); /* an explicit budget replaces the variable */
    p = fsc_mem_alloc(FSC_MEM_WORK, 64);
    assert_non_null(p);
    fsc_mem_free(p);
    unsetenv("FSC_MEM_LIMIT_MB");
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_invalid_values_named_with_range),
              cmocka_unit_test(test_valid_values_accepted),
              cmocka_unit_test(test_mem_limit_invalid_fails_allocations))
