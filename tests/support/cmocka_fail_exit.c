/* Linked into the cmocka programs of a sanitizer build (tests/CMakeLists.txt,
 * -Wl,--wrap=_cmocka_run_group_tests): once a test has failed, the process
 * ends without LeakSanitizer's exit-time check. A failed assertion jumps out
 * of its test past the test's frees, and the leak report of those was a
 * second, misleading failure under the one that mattered. Passing runs keep
 * the leak check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int __real__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown);
int __wrap__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown);

static int failed_tests;

/* Registered after the sanitizer's own exit hook, so it runs first. */
static void exit_without_leak_check(void) {
    if (!failed_tests) return;
    fprintf(stderr, "(%d failed test(s): leak check skipped, the failures above are the report)\n",
            failed_tests);
    fflush(stdout);
    fflush(stderr);
    _exit(1);
}

int __wrap__cmocka_run_group_tests(const char *group_name, const struct CMUnitTest *const tests,
                                   const size_t num_tests, CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown) {
    static int registered;
    if (!registered) registered = !atexit(exit_without_leak_check);
    int failed =
        __real__cmocka_run_group_tests(group_name, tests, num_tests, group_setup, group_teardown);
    failed_tests += failed;
    return failed;
}
