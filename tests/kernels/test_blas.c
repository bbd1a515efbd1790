/* The BLAS loader's advice on a slow OPENBLAS_CORETYPE: which (user choice,
 * CPUID choice) pairs earn a hint and what it says, through the internal
 * comparison that takes both names, so the answers do not depend on this CPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/kernels.h"
#include "kernels/blas_internal.h"
#include "test_main.h"

/* Older families than the CPU's best earn one line naming the faster choice. */
static void test_older_choice_gets_a_hint(void **state) {
    (void)state;
    char line[256];
    static const char *slower[][2] = {
        {"Haswell", "SkylakeX"},   {"Sandybridge", "SkylakeX"}, {"Nehalem", "SkylakeX"},
        {"Prescott", "SkylakeX"},  {"Core2", "SkylakeX"},       {"Zen", "SkylakeX"},
        {"Haswell", "Cooperlake"}, {"Sandybridge", "Haswell"},  {"Nehalem", "Haswell"},
        {"Prescott", "Haswell"},
    };
    for (size_t i = 0; i < sizeof slower / sizeof *slower; i++) {
        const char *user = slower[i][0], *best = slower[i][1];
        assert_true(fsc_blas_coretype_hint(line, sizeof line, user, best));
        char want[64];
        snprintf(want, sizeof want, "OPENBLAS_CORETYPE=%s is set;", user);
        assert_non_null(strstr(line, want));
        snprintf(want, sizeof want, "set OPENBLAS_CORETYPE=%s", best);
        assert_non_null(strstr(line, want));
        assert_null(strchr(line, '\n')); /* one line */
    }
    /* the exact wording for the case this machine's environment hits */
    assert_true(fsc_blas_coretype_hint(line, sizeof line, "Haswell", "SkylakeX"));
    assert_string_equal(line, "OPENBLAS_CORETYPE=Haswell is set; this CPU supports SkylakeX "
                              "kernels (AVX-512 rather than AVX2: about 1.9x the sgemm speed): "
                              "unset it or set OPENBLAS_CORETYPE=SkylakeX");
}

/* As fast or faster than the CPUID choice, or not a name fsc can rank: silence. */
static void test_no_hint(void **state) {
    (void)state;
    char line[256] = "untouched";
    static const char *quiet[][2] = {
        {"SkylakeX", "SkylakeX"}, {"Cooperlake", "SkylakeX"}, {"SkylakeX", "Cooperlake"},
        {"Haswell", "Haswell"},   {"Zen", "Haswell"},         {"SkylakeX", "Haswell"},
        {"Bogus", "SkylakeX"},    {"", "SkylakeX"},           {"Haswell", "Bogus"},
    };
    for (size_t i = 0; i < sizeof quiet / sizeof *quiet; i++) {
        assert_false(fsc_blas_coretype_hint(line, sizeof line, quiet[i][0], quiet[i][1]));
        assert_string_equal(line, "");
    }
    /* unset variable, or a CPU fsc has no opinion on (not x86-64) */
    assert_false(fsc_blas_coretype_hint(line, sizeof line, NULL, "SkylakeX"));
    assert_false(fsc_blas_coretype_hint(line, sizeof line, "Haswell", NULL));
}

/* OpenBLAS reads the variable without case; so does the comparison, and the
 * line repeats the user's spelling but names the faster kernels canonically. */
static void test_names_compare_without_case(void **state) {
    (void)state;
    char line[256];
    assert_true(fsc_blas_coretype_hint(line, sizeof line, "haswell", "skylakex"));
    assert_non_null(strstr(line, "OPENBLAS_CORETYPE=haswell is set"));
    assert_non_null(strstr(line, "set OPENBLAS_CORETYPE=SkylakeX"));
    assert_false(fsc_blas_coretype_hint(line, sizeof line, "SKYLAKEX", "SkylakeX"));
}

/* A short buffer truncates rather than overflows. */
static void test_short_buffer(void **state) {
    (void)state;
    char line[16];
    memset(line, 'x', sizeof line);
    assert_true(fsc_blas_coretype_hint(line, sizeof line, "Haswell", "SkylakeX"));
    assert_int_equal(strlen(line), sizeof line - 1);
}

/* The public call reads the environment: with the variable unset, or set to
 * the newest family there is, no CPU can do better. */
static void test_public_hint_environment(void **state) {
    (void)state;
    const char *saved = getenv("OPENBLAS_CORETYPE");
    char keep[64] = "";
    if (saved) snprintf(keep, sizeof keep, "%s", saved);
    unsetenv("OPENBLAS_CORETYPE");
    assert_null(fsc_blas_hint());
    setenv("OPENBLAS_CORETYPE", "SapphireRapids", 1);
    assert_null(fsc_blas_hint());
    if (saved)
        setenv("OPENBLAS_CORETYPE", keep, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_older_choice_gets_a_hint),
              cmocka_unit_test(test_no_hint), cmocka_unit_test(test_names_compare_without_case),
              cmocka_unit_test(test_short_buffer), cmocka_unit_test(test_public_hint_environment))
