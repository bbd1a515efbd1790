/* The environment table (src/core/env.c) is the one list of fsc's FSC_*
 * variables: docs/environment.md lists the same, row for row; no source
 * file under src/ or tools/ reads an FSC_* variable past it or names one it
 * lacks; each row's text agrees with its numbers; the getters give the
 * defaults and refuse what the rows refuse.
 *
 * usage: test_env_table [environment.md]   (the sources, and
 * docs/environment.md unless given, are read from $FSC_TEST_DATA/../..). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"

static char readme[4200], root[4096];

static const char *const kind_names[] = {"bool", "int", "double", "string", "enum"};

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* ---- docs/environment.md's list ---------------------------------------------- */

enum { CELLS = 6, MAX_ROWS = 64 };

/* The cells of one table line "| a | b \| c | ..." into cell[], trimmed and
 * unescaped ("\|" is "|"), the backticks around the name dropped; the count. */
static int split_row(const char *line, char cell[CELLS][512]) {
    int n = -1;
    size_t k = 0;
    for (const char *p = line; *p && *p != '\n'; p++) {
        if (*p == '|' && (p == line || p[-1] != '\\')) {
            if (n >= 0 && n < CELLS) {
                while (k && cell[n][k - 1] == ' ') k--;
                cell[n][k] = '\0';
            }
            n++, k = 0;
            continue;
        }
        if (n < 0 || n >= CELLS || (*p == ' ' && k == 0) || (*p == '\\' && p[1] == '|')) continue;
        if (k < 511) cell[n][k++] = *p;
    }
    char *name = cell[0];
    size_t len = strlen(name);
    if (len >= 2 && name[0] == '`' && name[len - 1] == '`')
        memmove(name, name + 1, len - 2), name[len - 2] = '\0';
    return n;
}

/* The row the table wants in docs/environment.md, for the failure message. */
static void print_row(const fsc_env_var *v) {
    char expect[512];
    size_t k = 0;
    for (const char *p = v->expect; *p && k < sizeof expect - 2; p++) {
        if (*p == '|') expect[k++] = '\\';
        expect[k++] = *p;
    }
    expect[k] = '\0';
    fprintf(stderr, "| `%s` | %s | %s | %s | %s | %s |\n", v->name, kind_names[v->kind], expect,
            v->def, v->reader, v->about);
}

static void test_docs_list_the_table(void **state) {
    (void)state;
    char *text = slurp(readme);
    if (!text) fail_msg("cannot read %s", readme);
    char *sec = strstr(text, "\n## The variables\n");
    if (!sec) {
        fail_msg("%s: no \"## The variables\" section", readme);
        return;
    }
    char *end = strstr(sec + 1, "\n## ");
    if (end) *end = '\0';
    bool seen[MAX_ROWS] = {false};
    int bad = 0, n = fsc_env_count();
    assert_true(n <= MAX_ROWS);
    for (char *line = strstr(sec, "\n| `FSC_"); line; line = strstr(line + 1, "\n| `FSC_")) {
        char cell[CELLS][512] = {{0}};
        if (split_row(line + 1, cell) != CELLS) {
            fprintf(stderr, "docs/environment.md: a row of %s without %d cells\n", cell[0], CELLS);
            bad++;
            continue;
        }
        const fsc_env_var *v = fsc_env_find(cell[0]);
        if (!v) {
            fprintf(
                stderr,
                "docs/environment.md lists %s, which the table (src/core/env.c) does not have\n",
                cell[0]);
            bad++;
            continue;
        }
        int i = 0;
        while (fsc_env_at(i) != v) i++;
        const char *want[CELLS] = {v->name, kind_names[v->kind], v->expect,
                                   v->def,  v->reader,           v->about};
        bool same = !seen[i];
        for (int c = 1; c < CELLS; c++) same = same && !strcmp(cell[c], want[c]);
        if (!same) {
            fprintf(stderr,
                    "docs/environment.md's row of %s differs from the table's (or repeats it); the "
                    "table says:\n",
                    v->name);
            print_row(v), bad++;
        }
        seen[i] = true;
    }
    for (int i = 0; i < n; i++)
        if (!seen[i]) {
            fprintf(stderr, "the table has %s, which docs/environment.md does not list; its row:\n",
                    fsc_env_at(i)->name);
            print_row(fsc_env_at(i)), bad++;
        }
    free(text);
    if (bad) fail_msg("%d difference(s) between %s and the environment table", bad, readme);
}

/* ---- the sources read through the table ------------------------------------------ */

static int source_bad;

/* In one file: no getenv("FSC_..."), and every name given to a getter is a row. */
static int scan(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)ftw;
    size_t len = strlen(path);
    if (type != FTW_F || len < 2 || (strcmp(path + len - 2, ".c") && strcmp(path + len - 2, ".h")))
        return 0;
    char *text = slurp(path);
    if (!text) return 0;
    for (char *p = strstr(text, "getenv(\"FSC_"); p; p = strstr(p + 1, "getenv(\"FSC_")) {
        char name[64] = "";
        sscanf(p + 8, "%63[A-Z0-9_]", name);
        fprintf(stderr, "%s reads %s past the environment table (getenv)\n", path, name);
        source_bad++;
    }
    for (char *p = strstr(text, "fsc_env_"); p; p = strstr(p + 1, "fsc_env_")) {
        char *q = strstr(p, "(\"FSC_");
        if (!q || q - p > 16 || memchr(p, '\n', (size_t)(q - p))) continue;
        char name[64] = "";
        sscanf(q + 2, "%63[A-Z0-9_]", name);
        if (!fsc_env_find(name))
            fprintf(stderr, "%s reads %s, which is not in the table\n", path, name), source_bad++;
    }
    free(text);
    return 0;
}

static void test_sources_read_through_the_table(void **state) {
    (void)state;
    const char *dirs[] = {"src", "tools"};
    for (int i = 0; i < 2; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", root, dirs[i]);
        assert_int_equal(nftw(dir, scan, 16, FTW_PHYS), 0);
    }
    if (source_bad) fail_msg("%d read(s) of FSC_* variables outside the table", source_bad);
}

/* ---- the rows ---------------------------------------------------------------------- */

static void test_rows_agree_with_their_text(void **state) {
    (void)state;
    for (int i = 0; i < fsc_env_count(); i++) {
        const fsc_env_var *v = fsc_env_at(i);
        assert_int_equal(strncmp(v->name, "FSC_", 4), 0);
        assert_ptr_equal(fsc_env_find(v->name), v);
        assert_true(*v->reader && *v->expect && *v->about && *v->def);
        assert_null(strchr(v->about, '\n'));
        char range[64];
        snprintf(range, sizeof range, "[%.15g, %.15g]", v->min, v->max);
        if (v->kind == FSC_ENV_INT || v->kind == FSC_ENV_DOUBLE)
            if (!strstr(v->expect, range))
                fail_msg("%s: \"%s\" does not say %s", v->name, v->expect, range);
        if (v->kind == FSC_ENV_BOOL) assert_string_equal(v->expect, "0 or 1");
        if (v->kind == FSC_ENV_ENUM) {
            char words[256];
            snprintf(words, sizeof words, "%s", v->words);
            for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
                if (!strstr(v->expect, w))
                    fail_msg("%s: \"%s\" does not say %s", v->name, v->expect, w);
        } else {
            assert_null(v->words);
        }
    }
}

/* Every default is a value its getter accepts, or (FSC_INIT_TIMEOUT_S, the
 * strings) a description of what the reader derives. */
static void test_defaults(void **state) {
    (void)state;
    for (int i = 0; i < fsc_env_count(); i++) unsetenv(fsc_env_at(i)->name);
    double d;
    int n;
    bool b;
    const char *s = "x";
    assert_int_equal(fsc_env_double("FSC_TIMEOUT_S", &d), FSC_OK), assert_true(d == 300);
    assert_int_equal(fsc_env_double("FSC_INIT_TIMEOUT_S", &d), FSC_OK), assert_true(d == 0);
    assert_int_equal(fsc_env_double("FSC_IO_TIMEOUT_S", &d), FSC_OK), assert_true(d == 600);
    assert_int_equal(fsc_env_double("FSC_MEM_LIMIT_MB", &d), FSC_OK), assert_true(d == 0);
    assert_int_equal(fsc_env_int("FSC_NUM_THREADS", &n), FSC_OK), assert_int_equal(n, 1);
    assert_int_equal(fsc_env_enum("FSC_LOG_LEVEL", &n), FSC_OK), assert_int_equal(n, FSC_LOG_INFO);
    assert_int_equal(fsc_env_enum("FSC_BF16_GEMM", &n), FSC_OK), assert_int_equal(n, 0);
    assert_int_equal(fsc_env_bool("FSC_PARALLEL_IO", &b), FSC_OK), assert_true(b);
    assert_int_equal(fsc_env_bool("FSC_HEARTBEAT_PROC", &b), FSC_OK), assert_true(b);
    assert_int_equal(fsc_env_bool("FSC_DESYNC_CHECK", &b), FSC_OK), assert_false(b);
    assert_int_equal(fsc_env_string("FSC_FAULT", &s), FSC_OK), assert_null(s);
    setenv("FSC_TIMEOUT_S", "", 1); /* empty is unset */
    assert_false(fsc_env_given("FSC_TIMEOUT_S"));
    assert_int_equal(fsc_env_double("FSC_TIMEOUT_S", &d), FSC_OK), assert_true(d == 300);
    unsetenv("FSC_TIMEOUT_S");
    assert_int_equal(fsc_env_check(), FSC_OK);
    for (int i = 0; i < fsc_env_count(); i++)
        assert_int_equal(fsc_env_check_reader(fsc_env_at(i)->reader), FSC_OK);
}

static void test_getters(void **state) {
    (void)state;
    int n;
    double d;
    const char *s;
    setenv("FSC_BF16_GEMM", "On", 1); /* words of this row in any case */
    assert_int_equal(fsc_env_enum("FSC_BF16_GEMM", &n), FSC_OK), assert_int_equal(n, 1);
    setenv("FSC_LOG_LEVEL", "DEBUG", 1); /* of this one, exactly */
    assert_int_equal(fsc_env_enum("FSC_LOG_LEVEL", &n), FSC_ERR_INVALID);
    assert_int_equal(n, FSC_LOG_INFO);
    assert_string_equal(fsc_last_error(),
                        "FSC_LOG_LEVEL=DEBUG: expected one of debug, info, warn, error, off");
    unsetenv("FSC_LOG_LEVEL"), unsetenv("FSC_BF16_GEMM");
    setenv("FSC_TIMEOUT_S", "2.5", 1);
    assert_true(fsc_env_given("FSC_TIMEOUT_S"));
    assert_int_equal(fsc_env_double("FSC_TIMEOUT_S", &d), FSC_OK), assert_true(d == 2.5);
    assert_int_equal(fsc_env_int("FSC_TIMEOUT_S", &n), FSC_ERR_INVALID); /* a double's row */
    assert_non_null(strstr(fsc_last_error(), "FSC_TIMEOUT_S is of kind double"));
    unsetenv("FSC_TIMEOUT_S");
    assert_int_equal(fsc_env_bool("FSC_NO_SUCH", &(bool){0}), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "FSC_NO_SUCH is not in the environment table"));
    /* a tool's variable: its reader checks it, the library's check does not */
    setenv("FSC_FAULT", "exit@-1:5", 1);
    assert_int_equal(fsc_env_check(), FSC_OK);
    assert_int_equal(fsc_env_check_reader("fsc-train"), FSC_ERR_INVALID);
    assert_non_null(
        strstr(fsc_last_error(), "FSC_FAULT=exit@-1:5: expected sleep|exit|kill|inf@RANK:STEP"));
    const char *ok[] = {"exit@0:5", "inf@1:3", "sleep@3:1", "kill@1:9223372036854775807"};
    for (int i = 0; i < 4; i++) {
        setenv("FSC_FAULT", ok[i], 1);
        assert_int_equal(fsc_env_string("FSC_FAULT", &s), FSC_OK);
        assert_string_equal(s, ok[i]);
    }
    const char *bad[] = {"exit@0:0", "boom@0:1", "exit@0:1x", "exit0:1"};
    for (int i = 0; i < 4; i++) {
        setenv("FSC_FAULT", bad[i], 1);
        assert_int_equal(fsc_env_string("FSC_FAULT", &s), FSC_ERR_INVALID);
        assert_null(s);
    }
    unsetenv("FSC_FAULT");
}

int main(int argc, char **argv) {
    const char *data = getenv("FSC_TEST_DATA");
    snprintf(root, sizeof root, "%s/../..", data ? data : "tests/data");
    if (argc > 1)
        snprintf(readme, sizeof readme, "%s", argv[1]);
    else
        snprintf(readme, sizeof readme, "%s/docs/environment.md", root);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_list_the_table),
        cmocka_unit_test(test_sources_read_through_the_table),
        cmocka_unit_test(test_rows_agree_with_their_text),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_getters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
