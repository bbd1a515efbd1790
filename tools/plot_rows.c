/* fsc-plot's reader of one --metrics line (plot_rows.h): JSON as fsc-train
 * writes it, with C's bare nan/inf words taken as absent values. Apart from
 * fsc_plot.c so that its libFuzzer harness (tests/fuzz/fuzz_plot_rows.c) and
 * the allocation-failure loop (tests/io/test_alloc_failures.c) reach the very
 * code fsc-plot runs. */
#include "plot_rows.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* plot_rows.h: a copy of a JSON line in which bare words other than true/false/null (C's
 * printf writes "nan", "-nan", "inf" for non-finite doubles, which JSON lacks)
 * become null, so that the rest of the row still counts. */
char *plot_row_nonfinite_to_null(const char *s) {
    size_t n = strlen(s);
    char *out = malloc(4 * n + 1), *o = out; /* a one-letter word becomes "null": 4x */
    if (!out) return NULL;
    bool in_string = false;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (in_string) {
            *o++ = c, i++;
            if (c == '\\' && i < n)
                *o++ = s[i++];
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true, *o++ = c, i++;
            continue;
        }
        /* a word starts after a separator, optionally with a sign (not an exponent's e) */
        size_t w = i;
        if ((c == '-' || c == '+') && i + 1 < n && isalpha((unsigned char)s[i + 1])) w = i + 1;
        bool after_sep = i == 0 || strchr(" \t:,[", s[i - 1]);
        if (after_sep && isalpha((unsigned char)s[w])) {
            size_t e = w;
            while (e < n && isalnum((unsigned char)s[e])) e++;
            size_t len = e - w;
            bool keyword = (len == 4 && !strncmp(s + w, "true", 4)) ||
                           (len == 5 && !strncmp(s + w, "false", 5)) ||
                           (len == 4 && !strncmp(s + w, "null", 4));
            if (keyword && w == i)
                memcpy(o, s + w, len), o += len;
            else
                memcpy(o, "null", 4), o += 4;
            i = e;
            continue;
        }
        *o++ = c, i++;
    }
    *o = '\0';
    return out;
}

int plot_row_parse(const char *line, const char *const *keys, int nkeys, double *step, double *v) {
    cJSON *j = cJSON_Parse(line);
    if (!j) {
        char *fixed = plot_row_nonfinite_to_null(line);
        j = fixed ? cJSON_Parse(fixed) : NULL;
        free(fixed);
        if (!j) return -1;
    }
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    /* steps are counts (below 2^53); values past 1e300 would make a span of
     * inf and NaN coordinates: both are taken as absent */
    int rc = cJSON_IsNumber(s) && fabs(s->valuedouble) <= 9007199254740992.0;
    if (rc) {
        *step = s->valuedouble;
        for (int k = 0; k < nkeys; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
            v[k] = cJSON_IsNumber(x) && fabs(x->valuedouble) <= 1e300 ? x->valuedouble : NAN;
        }
    }
    cJSON_Delete(j);
    return rc;
}
