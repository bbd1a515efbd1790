/* fsc's FSC_* environment variables: one table, typed getters.
 *
 * Part of floor 1 (core; fsc/core.h includes it). Every FSC_* variable that
 * the library or its tools read is one row of a table in src/core/env.c: its
 * kind, the values it accepts, its default, which floor or tool reads it and
 * a one-line description. Every reader goes through the getters below, which
 * check the value against its row, so a variable is refused with the same
 * message wherever it is read: "NAME=VALUE: expected WHAT". Unset or empty
 * means the default. docs/environment.md's list of variables is the same table
 * (tests/core/test_env_table.c compares them).
 */
#ifndef FSC_ENV_H
#define FSC_ENV_H

#include <stdbool.h>

#include "fsc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FSC_ENV_BOOL,   /* exactly 0 or 1 */
    FSC_ENV_INT,    /* a decimal integer in [min, max] */
    FSC_ENV_DOUBLE, /* a number (strtod's syntax) in [min, max] */
    FSC_ENV_STRING, /* text, of a form the row checks, if any */
    FSC_ENV_ENUM,   /* one of the words of the row */
} fsc_env_kind;

/* One row. All strings are static. */
typedef struct {
    const char *name;  /* "FSC_TIMEOUT_S" */
    fsc_env_kind kind; /* what the value is */
    const char
        *reader;       /* the floor that reads it ("core", "comm", ...) or the tool ("fsc-train") */
    double min, max;   /* INT and DOUBLE: the closed range accepted */
    const char *words; /* ENUM: the words accepted, '|'-separated ("debug|info|..."); else NULL */
    /* The default as text. For BOOL, INT, DOUBLE and ENUM it is a value of
     * the kind, which the getters return when the variable is unset or empty,
     * unless it is a description ("60, or FSC_TIMEOUT_S if more"): then the
     * getter returns 0 and the reader derives the default. STRING getters
     * return NULL when unset; their default is always a description. */
    const char *def;
    const char *expect; /* what a refusal says is expected ("seconds in [1, 604800]") */
    const char *about;  /* one line: what the variable does */
} fsc_env_var;

/* The number of rows in the table. */
FSC_API int fsc_env_count(void);
/* Row i, for i in [0, fsc_env_count()), NULL otherwise; rows are grouped by
 * reader, the floors from the bottom up, then the tools. */
FSC_API const fsc_env_var *fsc_env_at(int i);
/* The row of `name`, or NULL when fsc reads no such variable. */
FSC_API const fsc_env_var *fsc_env_find(const char *name);

/* The getters. Each sets *out to the row's default when the variable is
 * unset or empty and to its value when that is valid, and returns FSC_OK.
 * An invalid value leaves *out at the default and returns FSC_ERR_INVALID
 * with "NAME=VALUE: expected WHAT" (the value cut at 64 characters); so does
 * a name that is not in the table or is of another kind (a bug in the caller,
 * named as such; *out is then 0, false or NULL). */
FSC_API int fsc_env_bool(const char *name, bool *out);     /* BOOL rows */
FSC_API int fsc_env_int(const char *name, int *out);       /* INT rows */
FSC_API int fsc_env_double(const char *name, double *out); /* DOUBLE rows */
/* ENUM: *out is the index of the value among the row's words ("debug|info":
 * info is 1); words compare exactly, except FSC_BF16_GEMM's (any case). */
FSC_API int fsc_env_enum(const char *name, int *out);
/* STRING: *out is the value, or NULL when unset or empty (valid until the
 * environment changes). */
FSC_API int fsc_env_string(const char *name, const char **out);
/* Whether the variable is set to something other than "" (valid or not). */
FSC_API bool fsc_env_given(const char *name);

/* Checks every variable the library reads (every row whose reader is a floor,
 * not a tool) against its row. Returns FSC_OK, or FSC_ERR_INVALID naming the
 * first invalid variable in table order, its value and what is expected. The
 * library reports an invalid value at its first use too (FSC_MEM_LIMIT_MB:
 * every allocation then fails with that message); tools call this at
 * start-up to refuse it before any work. */
FSC_API int fsc_env_check(void);
/* The same for the rows of one reader: a floor ("comm": fsc_dist_init checks
 * its variables before starting MPI) or a tool ("fsc-train"). */
FSC_API int fsc_env_check_reader(const char *reader);

#ifdef __cplusplus
}
#endif

#endif
