/* The one table of fsc's FSC_* environment variables, and the getters every
 * floor and tool reads them through (fsc/env.h).
 *
 * A row says everything about a variable: its kind, the values it accepts,
 * its default, its reader and what it does. The getters check a value
 * against its row, so the message is the same wherever it is read, and
 * fsc_env_check validates every row itself: the core calls no floor above
 * it to learn what a variable accepts. A new variable is a new row here and
 * in docs/environment.md's list (tests/core/test_env_table.c compares the two).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fsc/core.h"

typedef struct {
    fsc_env_var var;
    bool any_case;               /* ENUM: words compare ignoring case */
    bool (*form)(const char *v); /* STRING: the form accepted; NULL: any text */
} row;

/* fsc-train's FSC_FAULT: KIND@RANK:STEP, as tools/fsc_train.c reads it. */
static bool fault_form(const char *v) {
    char kind[8], tail;
    int r;
    long long s;
    return sscanf(v, "%7[a-z]@%d:%lld%c", kind, &r, &s, &tail) == 3 && r >= 0 && s >= 1 &&
           (!strcmp(kind, "sleep") || !strcmp(kind, "exit") || !strcmp(kind, "kill") ||
            !strcmp(kind, "inf") || !strcmp(kind, "ckpt"));
}

#define SECONDS_MAX 604800 /* a week */

static const row rows[] = {
    /* ---- core */
    {.var = {"FSC_LOG_LEVEL", FSC_ENV_ENUM, "core", 0, 0, "debug|info|warn|error|off", "info",
             "one of debug, info, warn, error, off", "the least severe message fsc_log prints"}},
    {.var = {"FSC_NUM_THREADS", FSC_ENV_INT, "core", 1, 1024, NULL, "1", "an integer in [1, 1024]",
             "the threads of fsc's OpenMP loops, unless fsc_set_num_threads sets them"}},
    {.var = {"FSC_MEM_LIMIT_MB", FSC_ENV_DOUBLE, "core", 0, 1073741824, NULL, "0",
             "a number of MiB in [0, 1073741824] (0: no budget)",
             "a budget for the tagged allocator: an allocation past it fails"}},
    /* ---- kernels */
    {.var = {"FSC_BF16_GEMM", FSC_ENV_ENUM, "kernels", 0, 0, "auto|on|off|1|0", "auto",
             "auto, on, off, 1 or 0",
             "bf16 GEMMs through oneDNN under autocast: auto on CPUs with native bf16, per shape"},
     .any_case = true},
    {.var = {"FSC_FLASH_TILES", FSC_ENV_ENUM, "kernels", 0, 0, "auto|gemm", "auto", "auto or gemm",
             "flash attention's tiles: auto in registers (fp32 on AVX-512, bf16 on "
             "avx512_bf16), gemm as fsc_gemm calls"}},
    /* ---- io */
    {.var = {"FSC_PARALLEL_IO", FSC_ENV_BOOL, "io", 0, 1, NULL, "1", "0 or 1",
             "every rank writes its part of a safetensors file; 0: one writer"}},
    {.var = {"FSC_IO_TIMEOUT_S", FSC_ENV_DOUBLE, "io", 1, SECONDS_MAX, NULL, "600",
             "seconds in [1, 604800]", "the deadline of a stretch of file work (a save, a sync)"}},
    /* ---- comm */
    {.var = {"FSC_TIMEOUT_S", FSC_ENV_DOUBLE, "comm", 0.1, SECONDS_MAX, NULL, "300",
             "a number of seconds in [0.1, 604800]", "the deadline of a collective"}},
    {.var = {"FSC_INIT_TIMEOUT_S", FSC_ENV_DOUBLE, "comm", 0.1, SECONDS_MAX, NULL,
             "60, or FSC_TIMEOUT_S if more", "a number of seconds in [0.1, 604800]",
             "the deadline of MPI's start-up and shut-down"}},
    {.var = {"FSC_DESYNC_CHECK", FSC_ENV_BOOL, "comm", 0, 1, NULL, "0", "0 or 1",
             "exchange tensor layouts before collectives and check point-to-point too"}},
    {.var = {"FSC_HEARTBEAT_PROC", FSC_ENV_BOOL, "comm", 0, 1, NULL, "1", "0 or 1",
             "0 treats every peer as on another host (for the tests)"}},
    /* ---- tools */
    {.var = {"FSC_FAULT", FSC_ENV_STRING, "fsc-train", 0, 0, NULL, "none",
             "sleep|exit|kill|inf@RANK:STEP with RANK in [0, 2147483647] and STEP in [1, 2^63), "
             "or ckpt@RANK:K",
             "fault injection for the tests: rank RANK sleeps, exits, is killed or gets an inf "
             "gradient at step STEP, or (ckpt) is killed at commit point K of its first "
             "checkpoint save (core/fault.h)"},
     .form = fault_form},
    {.var = {"FSC_PEAK_GFLOPS", FSC_ENV_DOUBLE, "fsc-train", 0.1, 1e6, NULL,
             "measured at start-up (sgemm 1024^3)", "GFLOP/s per core in [0.1, 1000000]",
             "the fp32 peak per core that fsc-train's MFU is a share of: fix it to compare runs"}},
    {.var = {"FSC_GPT2_BPE_DIR", FSC_ENV_STRING, "fsc-tokenize", 0, 0, NULL,
             "$XDG_CACHE_HOME/fsc/gpt2, else ~/.cache/fsc/gpt2", "a directory",
             "where GPT-2's encoder.json and vocab.bpe are, when --tokenizer is not given"}},
};

enum { NROWS = (int)(sizeof rows / sizeof *rows) };

int fsc_env_count(void) {
    return NROWS;
}

const fsc_env_var *fsc_env_at(int i) {
    return i >= 0 && i < NROWS ? &rows[i].var : NULL;
}

static const row *find(const char *name) {
    for (int i = 0; name && i < NROWS; i++)
        if (!strcmp(rows[i].var.name, name)) return &rows[i];
    return NULL;
}

const fsc_env_var *fsc_env_find(const char *name) {
    const row *r = find(name);
    return r ? &r->var : NULL;
}

/* The value, NULL when unset or empty. */
static const char *value_of(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

bool fsc_env_given(const char *name) {
    return value_of(name) != NULL;
}

/* The index of v among the '|'-separated words, or -1. */
static int word_index(const row *r, const char *v) {
    size_t n = strlen(v);
    int i = 0;
    for (const char *w = r->var.words; w; i++) {
        const char *bar = strchr(w, '|');
        size_t len = bar ? (size_t)(bar - w) : strlen(w);
        if (len == n && !(r->any_case ? strncasecmp(v, w, n) : strncmp(v, w, n))) return i;
        w = bar ? bar + 1 : NULL;
    }
    return -1;
}

/* Whether v is a value of the row; the number it stands for into *num
 * (BOOL and INT and DOUBLE: the value; ENUM: the word's index). */
static bool parse(const row *r, const char *v, double *num) {
    char *end;
    *num = 0;
    switch (r->var.kind) {
    case FSC_ENV_BOOL:
        if (strcmp(v, "0") && strcmp(v, "1")) return false;
        *num = v[0] == '1';
        return true;
    case FSC_ENV_INT: {
        long n = strtol(v, &end, 10);
        if (end == v || *end || n < r->var.min || n > r->var.max) return false;
        *num = (double)n;
        return true;
    }
    case FSC_ENV_DOUBLE: {
        double x = strtod(v, &end); /* NaN and inf fall outside every range */
        if (end == v || *end || !(x >= r->var.min && x <= r->var.max)) return false;
        *num = x;
        return true;
    }
    case FSC_ENV_ENUM: {
        int i = word_index(r, v);
        *num = i;
        return i >= 0;
    }
    case FSC_ENV_STRING:
        return !r->form || r->form(v);
    }
    return false;
}

/* The default as a number: the row's default when it is a value, else 0. */
static double default_num(const row *r) {
    double x;
    return parse(r, r->var.def, &x) ? x : 0;
}

static const char *const kind_names[] = {"bool", "int", "double", "string", "enum"};

/* Looks the row up and checks the caller asked for its kind; then parses
 * the variable into *num (the default when unset or empty) and *text. */
static int get(const char *fn, const char *name, fsc_env_kind kind, double *num,
               const char **text) {
    const row *r = find(name);
    *num = 0, *text = NULL;
    if (!r)
        return fsc_error(FSC_ERR_INVALID,
                         "%s: %.64s is not in the environment table (src/core/env.c)", fn,
                         name ? name : "(null)");
    if (r->var.kind != kind)
        return fsc_error(FSC_ERR_INVALID, "%s: %s is of kind %s in the environment table, not %s",
                         fn, name, kind_names[r->var.kind], kind_names[kind]);
    *num = default_num(r);
    const char *v = value_of(name);
    if (!v) return FSC_OK;
    double x;
    if (!parse(r, v, &x))
        return fsc_error(FSC_ERR_INVALID, "%s=%.64s: expected %s", name, v, r->var.expect);
    *num = x, *text = v;
    return FSC_OK;
}

int fsc_env_bool(const char *name, bool *out) {
    double x;
    const char *t;
    int rc = get("fsc_env_bool", name, FSC_ENV_BOOL, &x, &t);
    *out = x != 0;
    return rc;
}

int fsc_env_int(const char *name, int *out) {
    double x;
    const char *t;
    int rc = get("fsc_env_int", name, FSC_ENV_INT, &x, &t);
    *out = (int)x;
    return rc;
}

int fsc_env_double(const char *name, double *out) {
    const char *t;
    return get("fsc_env_double", name, FSC_ENV_DOUBLE, out, &t);
}

int fsc_env_enum(const char *name, int *out) {
    double x;
    const char *t;
    int rc = get("fsc_env_enum", name, FSC_ENV_ENUM, &x, &t);
    *out = (int)x;
    return rc;
}

int fsc_env_string(const char *name, const char **out) {
    double x;
    return get("fsc_env_string", name, FSC_ENV_STRING, &x, out);
}

/* Library floors, as docs/architecture.md names them; any other reader is a tool. */
static bool is_floor(const char *reader) {
    static const char *const floors[] = {"core", "kernels", "nn",       "optim",
                                         "comm", "io",      "parallel", "train"};
    for (size_t i = 0; i < sizeof floors / sizeof *floors; i++)
        if (!strcmp(reader, floors[i])) return true;
    return false;
}

static int check_row(const row *r) {
    double x;
    const char *t;
    return get("fsc_env_check", r->var.name, r->var.kind, &x, &t);
}

int fsc_env_check(void) {
    for (int i = 0; i < NROWS; i++) {
        if (!is_floor(rows[i].var.reader)) continue;
        int rc = check_row(&rows[i]);
        if (rc) return rc;
    }
    return FSC_OK;
}

int fsc_env_check_reader(const char *reader) {
    for (int i = 0; reader && i < NROWS; i++) {
        if (strcmp(rows[i].var.reader, reader)) continue;
        int rc = check_row(&rows[i]);
        if (rc) return rc;
    }
    return FSC_OK;
}
