/* Where the committed test files live: $FSC_TEST_DATA (ctest sets it), else
 * tests/data from the repository root. */
#ifndef FSC_TEST_TEST_DATA_H
#define FSC_TEST_TEST_DATA_H

#include <stdio.h>
#include <stdlib.h>

/* <data dir>/<rel>; the text lives until the fourth call after this one. */
static inline const char *test_data(const char *rel) {
    static char paths[4][600];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "%s/%s",
             getenv("FSC_TEST_DATA") ? getenv("FSC_TEST_DATA") : "tests/data", rel);
    return p;
}

#endif
