/* libFuzzer harness: fsc-plot's reader of one --metrics line
 * (tools/plot_rows.c: plot_row_nonfinite_to_null, plot_row_parse), the code
 * the heap overflow of issue 29 (a one-letter bare word written as "null"
 * into 2n + 1 bytes) lived in.
 *
 * An input is one line as getline hands it over: the bytes up to the first
 * NUL, newline included. The one idea: the rewrite may grow the line at most
 * 4x (each one-letter word becomes "null") and must leave strings and
 * keywords as they were, and a row the parser accepts has a step and values
 * that are finite or absent, which is what the picture's arithmetic needs.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plot_rows.h"

static const char *const KEYS[] = {"loss", "val_loss", "lr", "tokens_per_s"};
#define NKEYS (int)(sizeof KEYS / sizeof *KEYS)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *line = malloc(size + 1);
    if (!line) return 0;
    memcpy(line, data, size);
    line[size] = '\0';
    const size_t n = strlen(line);
    char *fixed = plot_row_nonfinite_to_null(line);
    if (fixed && strlen(fixed) > 4 * n) abort();
    free(fixed);
    double step = NAN, v[NKEYS];
    const int rc = plot_row_parse(line, KEYS, NKEYS, &step, v);
    if (rc < -1 || rc > 1) abort();
    if (rc == 1) {
        if (!isfinite(step) || fabs(step) > 9007199254740992.0) abort();
        for (int k = 0; k < NKEYS; k++)
            if (!isnan(v[k]) && !(fabs(v[k]) <= 1e300)) abort();
    }
    free(line);
    return 0;
}
