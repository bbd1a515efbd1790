/* The JSON goldens of tests/data (moe_golden.json, optim_golden.json: written
 * by the scripts of tests/reference/), read and parsed for the tests that
 * compare with them. */
#ifndef FSC_TEST_GOLDEN_JSON_H
#define FSC_TEST_GOLDEN_JSON_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "fsc/io.h"

/* tests/data/<file> (or $FSC_TEST_DATA/<file>) parsed (cJSON_Delete when
 * done); NULL after saying on stderr why it could not be read or parsed. */
static inline cJSON *golden_json(const char *file) {
    const char *dir = getenv("FSC_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/data", file);
    char *text = NULL;
    size_t len = 0;
    if (fsc_file_read_all(path, (size_t)64 << 20, &text, &len) != FSC_OK) {
        fprintf(stderr, "cannot open golden %s: %s\n", path, fsc_last_error());
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) fprintf(stderr, "golden %s is not valid JSON\n", path);
    return j;
}

#endif
