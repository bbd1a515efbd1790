/* Pipeline schedules as text: CSV in and out, the grid and the list.
 *
 * The CSV form is the table itself, one line per rank, so a schedule from a
 * paper or from PyTorch's `_dump_csv` can be typed or pasted in, and a
 * generated one edited by hand. The reader only parses (reporting line,
 * column and token); correctness is the validator's job, the same one that
 * checks generated schedules. The grid shows the validator's own timeline.
 */
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "pipe_schedule_internal.h"

#define CSV_MAX_BYTES (64u << 20)

/* ---- reading --------------------------------------------------------------------------- */

static bool blank(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\r';
}

/* Parses the cells of one line (line[0 .. len)) into rank r's list. */
static int parse_line(fsc_pipe_schedule *s, int r, const char *line, size_t len, int lineno) {
    int S = s->cfg.ranks * s->cfg.chunks;
    size_t at = 0;
    while (at <= len) {
        size_t end = at;
        while (end < len && line[end] != ',') end++;
        size_t b = at, e = end;
        while (b < e && blank(line[b])) b++;
        while (e > b && blank(line[e - 1])) e--;
        if (e > b) { /* an empty cell is an idle slot */
            char tok[48];
            size_t n = e - b < sizeof tok - 1 ? e - b : sizeof tok - 1;
            memcpy(tok, line + b, n);
            tok[n] = '\0';
            int col = (int)b + 1;
            fsc_pipe_action a;
            int rc = e - b < sizeof tok - 1
                         ? fsc_pipe_action_parse(tok, &a)
                         : fsc_error(FSC_ERR_FORMAT, "token '%s...' too long", tok);
            if (rc) return fsc_error_context(rc, "line %d, column %d: ", lineno, col);
            if (a.stage >= S)
                return fsc_error(FSC_ERR_FORMAT,
                                 "line %d, column %d: '%s': stage %d outside [0, %d) (%d ranks x "
                                 "%d chunks)",
                                 lineno, col, tok, a.stage, S, s->cfg.ranks, s->cfg.chunks);
            if (a.micro >= s->cfg.micros)
                return fsc_error(FSC_ERR_FORMAT,
                                 "line %d, column %d: '%s': micro-batch %d outside [0, %d)", lineno,
                                 col, tok, a.micro, s->cfg.micros);
            if ((rc = fsc_pipe_sched_push(s, r, a.op, a.stage, a.micro))) return rc;
        }
        at = end + 1;
    }
    return FSC_OK;
}

int fsc_pipe_schedule_parse(const char *text, fsc_pipe_config cfg, fsc_pipe_schedule **out) {
    if (!text || !out) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_parse: NULL argument");
    int rc = fsc_pipe_sched_check_config(cfg);
    if (rc) return rc;
    fsc_pipe_schedule *s;
    if ((rc = fsc_pipe_sched_alloc(cfg, -1, &s))) return rc;
    int rank = 0, lineno = 1;
    for (const char *p = text; *p && !rc; lineno++) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        size_t lead = 0;
        while (lead < len && blank(p[lead])) lead++;
        if (lead < len && p[lead] != '#') { /* blank lines and comments are skipped */
            if (rank == cfg.ranks)
                rc = fsc_error(FSC_ERR_FORMAT,
                               "line %d: extra line: the schedule has %d ranks, one line each",
                               lineno, cfg.ranks);
            else
                rc = parse_line(s, rank++, p, len, lineno);
        }
        p = eol ? eol + 1 : p + len;
    }
    if (!rc && rank < cfg.ranks)
        rc = fsc_error(FSC_ERR_FORMAT,
                       "line %d: missing line for rank %d: expected %d lines, one per rank, "
                       "found %d",
                       lineno, rank, cfg.ranks, rank);
    if (!rc && !fsc_pipe_sched_has_comm(s)) rc = fsc_pipe_schedule_lower(s);
    if (rc) {
        fsc_pipe_schedule_free(s);
        return rc;
    }
    *out = s;
    return FSC_OK;
}

int fsc_pipe_schedule_read_csv(const char *path, fsc_pipe_config cfg, fsc_pipe_schedule **out) {
    if (!path || !out) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_read_csv: NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return fsc_error(FSC_ERR_IO, "%s: cannot open", path);
    char *text = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    int rc = FSC_OK;
    if (size < 0 || (unsigned long)size > CSV_MAX_BYTES || fseek(f, 0, SEEK_SET) != 0)
        rc = fsc_error(FSC_ERR_IO, "%s: unreadable or larger than 64 MiB", path);
    else if (!(text = malloc((size_t)size + 1)))
        rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    else if (fread(text, 1, (size_t)size, f) != (size_t)size)
        rc = fsc_error(FSC_ERR_IO, "%s: read failed", path);
    fclose(f);
    if (!rc) {
        text[size] = '\0';
        if (strlen(text) != (size_t)size)
            rc = fsc_error(FSC_ERR_FORMAT, "%s: NUL byte at offset %zu", path, strlen(text));
    }
    fsc_pipe_schedule *s = NULL;
    if (!rc && (rc = fsc_pipe_schedule_parse(text, cfg, &s)) == FSC_OK)
        rc = fsc_pipe_schedule_validate(s, NULL, NULL, NULL);
    free(text);
    if (rc) {
        fsc_pipe_schedule_free(s);
        return fsc_error_context(rc, "%s: ", path);
    }
    *out = s;
    return FSC_OK;
}

/* ---- writing ----------------------------------------------------------------------------- */

int fsc_pipe_schedule_write_csv(const fsc_pipe_schedule *s, const char *path) {
    if (!s || !path) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_write_csv: NULL");
    fsc_atomic_file af;
    int rc = fsc_atomic_open(&af, path);
    for (int r = 0; r < s->cfg.ranks && !rc; r++) {
        for (int k = 0; k < s->count[r] && !rc; k++) {
            char t[FSC_PIPE_ACTION_TEXT + 1];
            int n = fsc_pipe_action_format(s->acts[r][k], t + 1, sizeof t - 1);
            if (n < 0) rc = fsc_error_context(n, "%s: rank %d, action %d: ", path, r, k);
            if (!rc)
                rc = k ? fsc_atomic_write(&af, (t[0] = ',', t), (size_t)n + 1)
                       : fsc_atomic_write(&af, t + 1, (size_t)n);
        }
        if (!rc) rc = fsc_atomic_write(&af, "\n", 1);
    }
    if (rc) {
        fsc_atomic_abort(&af);
        return rc;
    }
    return fsc_atomic_commit(&af);
}

/* ---- printing ---------------------------------------------------------------------------- */

int fsc_pipe_schedule_print_list(const fsc_pipe_schedule *s, FILE *f) {
    if (!s || !f) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_print_list: NULL");
    char t[FSC_PIPE_ACTION_TEXT];
    for (int r = 0; r < s->cfg.ranks; r++) {
        fprintf(f, "rank %d:", r);
        for (int k = 0; k < s->count[r]; k++)
            fprintf(f, " %s", fsc_pipe_action_format(s->acts[r][k], t, sizeof t) < 0 ? "?" : t);
        fputc('\n', f);
    }
    return ferror(f) ? fsc_error(FSC_ERR_IO, "writing a pipeline schedule failed") : FSC_OK;
}

static int grid(const fsc_pipe_schedule *s, FILE *f, long long **start, int **dur) {
    fsc_pipe_stats st;
    int rc = fsc_pipe_sched_simulate(s, NULL, &st, NULL, start, dur);
    if (rc) return rc;
    long long T = st.makespan;
    char t[FSC_PIPE_ACTION_TEXT];
    int w = snprintf(t, sizeof t, "%lld", T > 0 ? T - 1 : 0);
    for (int r = 0; r < s->cfg.ranks; r++)
        for (int k = 0; k < s->count[r]; k++) {
            int n = fsc_pipe_action_format(s->acts[r][k], t, sizeof t);
            if (dur[r][k] > 0 && n > w) w = n;
        }
    int *cell = malloc((size_t)(T > 0 ? T : 1) * sizeof *cell); /* action index, -1 idle, -2 '~' */
    if (!cell) return fsc_error(FSC_ERR_NOMEM, "out of memory printing a pipeline schedule");
    fprintf(f, "%-6s", "slot");
    for (long long x = 0; x < T; x++) fprintf(f, " %*lld", w, x);
    fputc('\n', f);
    for (int r = 0; r < s->cfg.ranks; r++) {
        for (long long x = 0; x < T; x++) cell[x] = -1;
        for (int k = 0; k < s->count[r]; k++)
            for (int d = 0; d < dur[r][k]; d++) cell[start[r][k] + d] = d ? -2 : k;
        fprintf(f, "pipe %-2d", r); /* the pipeline's rank r, not the world's */
        for (long long x = 0; x < T; x++) {
            const char *c = cell[x] == -1 ? "." : cell[x] == -2 ? "~" : t;
            if (cell[x] >= 0) fsc_pipe_action_format(s->acts[r][cell[x]], t, sizeof t);
            fprintf(f, "%s%-*s", x ? " " : "", x + 1 < T ? w : 0, c);
        }
        fputc('\n', f);
    }
    free(cell);
    fputs("key: sFm = stage s's forward of micro-batch m, sBm = its backward (zbh1: the input "
          "gradient only), sWm = its weight gradients; ~ = the action before goes on, . = idle; "
          "pipe r = the r-th rank of each pipeline\n",
          f);
    return ferror(f) ? fsc_error(FSC_ERR_IO, "writing a pipeline schedule failed") : FSC_OK;
}

int fsc_pipe_schedule_print(const fsc_pipe_schedule *s, FILE *f) {
    if (!s || !f) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_print: NULL argument");
    int p = s->cfg.ranks, rc = FSC_OK;
    long long **start = calloc((size_t)p, sizeof *start);
    int **dur = calloc((size_t)p, sizeof *dur);
    if (!start || !dur) rc = fsc_error(FSC_ERR_NOMEM, "out of memory printing a schedule");
    for (int r = 0; r < p && !rc; r++) {
        start[r] = malloc(((size_t)s->count[r] + 1) * sizeof **start);
        dur[r] = malloc(((size_t)s->count[r] + 1) * sizeof **dur);
        if (!start[r] || !dur[r]) rc = fsc_error(FSC_ERR_NOMEM, "out of memory printing");
    }
    if (!rc) rc = grid(s, f, start, dur);
    for (int r = 0; r < p; r++) {
        if (start) free(start[r]);
        if (dur) free(dur[r]);
    }
    free(start);
    free(dur);
    return rc;
}
