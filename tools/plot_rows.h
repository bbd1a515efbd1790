/* fsc-plot's reader of one --metrics line (tools/plot_rows.c). */
#ifndef FSC_TOOLS_PLOT_ROWS_H
#define FSC_TOOLS_PLOT_ROWS_H

/* A malloc'd copy of the JSON line s in which bare words other than
 * true/false/null (C's printf writes "nan", "-nan", "inf" for non-finite
 * doubles, which JSON lacks) become null; NULL when out of memory. */
char *plot_row_nonfinite_to_null(const char *s);

/* Parses one line: 1 for a metrics row (*step, and v[k] the number under
 * keys[k] for k < nkeys, NaN where absent, not a number or past 1e300),
 * 0 for JSON without a usable "step", -1 for a line that is not JSON (or
 * when memory runs out: the line is then counted as unreadable). */
int plot_row_parse(const char *line, const char *const *keys, int nkeys, double *step, double *v);

#endif
