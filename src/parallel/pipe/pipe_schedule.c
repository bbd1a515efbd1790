/* Pipeline schedules as data: the table (a config and one action list per
 * rank), the names and text forms of kinds and actions, and each message's
 * peer and tag. The generators and the lowering pass that fill tables are
 * pipe_schedule_gen.c's; the validator that checks them is pipe_validate.c's.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pipe_schedule_internal.h"

static const char *const OP_TEXT[FSC_PIPE_OP_COUNT] = {"F",      "B",      "W",     "SEND_F",
                                                       "RECV_F", "SEND_B", "RECV_B"};
static const char *const KIND_NAME[FSC_PIPE_KIND_COUNT] = {"gpipe", "1f1b", "interleaved", "zbh1"};

/* ---- names and text forms -------------------------------------------------------------- */

const char *fsc_pipe_kind_name(fsc_pipe_kind kind) {
    return (unsigned)kind < FSC_PIPE_KIND_COUNT ? KIND_NAME[kind] : "?";
}

int fsc_pipe_kind_parse(const char *name, fsc_pipe_kind *out) {
    if (!name || !out) return fsc_error(FSC_ERR_INVALID, "pipeline schedule name or out is NULL");
    for (int k = 0; k < FSC_PIPE_KIND_COUNT; k++) {
        if (!strcasecmp(name, KIND_NAME[k])) {
            *out = (fsc_pipe_kind)k;
            return FSC_OK;
        }
    }
    if (!strcasecmp(name, "zb1")) { /* the flag's old spelling: older configs and checkpoints */
        *out = FSC_PIPE_ZB_H1;
        return FSC_OK;
    }
    return fsc_error(FSC_ERR_INVALID,
                     "unknown pipeline schedule '%s' (expected gpipe, 1f1b, interleaved or zbh1)",
                     name);
}

double fsc_pipe_kind_bubble(fsc_pipe_kind kind, int ranks, int chunks, int micros) {
    if (ranks < 1 || micros < 1 || chunks < 1) return -1;
    double p = ranks, m = micros, v = chunks;
    switch (kind) {
    case FSC_PIPE_GPIPE:
    case FSC_PIPE_1F1B:
        return (p - 1) / (m + p - 1);
    case FSC_PIPE_INTERLEAVED:
        return (p - 1) / (v * m + p - 1);
    case FSC_PIPE_ZB_H1: {
        /* makespan with F = B = W = 1: the paper's 3m + (p-1)(F+B-W) once m >= p; with fewer
         * micro-batches rank 0 waits 2p - 1 for its first B, then runs m B and m W */
        double T = m >= p ? 3 * m + p - 1 : 2 * m + 2 * p - 1;
        return (T - 3 * m) / T;
    }
    default:
        return -1;
    }
}

int fsc_pipe_action_format(fsc_pipe_action a, char *buf, size_t size) {
    if (buf && size) buf[0] = '\0';
    if (!buf || (unsigned)a.op >= FSC_PIPE_OP_COUNT || a.stage < 0 || a.micro < 0)
        return fsc_error(FSC_ERR_INVALID, "bad pipeline action (op %d, stage %d, micro %d)",
                         (int)a.op, a.stage, a.micro);
    int n = snprintf(buf, size, "%d%s%d", a.stage, OP_TEXT[a.op], a.micro);
    if (n < 0 || (size_t)n >= size) {
        if (size) buf[0] = '\0';
        return fsc_error(FSC_ERR_INVALID, "buffer of %zu bytes too small for an action", size);
    }
    return n;
}

/* Reads 1-9 decimal digits at *p, advancing it; -1 if there are none or too many. */
static int read_number(const char **p) {
    const char *q = *p;
    int v = 0, n = 0;
    while (isdigit((unsigned char)*q)) {
        if (++n > 9) return -1;
        v = v * 10 + (*q++ - '0');
    }
    if (n == 0) return -1;
    *p = q;
    return v;
}

int fsc_pipe_action_parse(const char *text, fsc_pipe_action *out) {
    if (!text || !out) return fsc_error(FSC_ERR_INVALID, "action text or out is NULL");
    const char *p = text;
    int stage = read_number(&p);
    const char *op_start = p;
    while (isupper((unsigned char)*p) || *p == '_') p++;
    size_t op_len = (size_t)(p - op_start);
    int micro = stage < 0 ? -1 : read_number(&p);
    int op = -1;
    for (int k = 0; k < FSC_PIPE_OP_COUNT && op_len; k++)
        if (strlen(OP_TEXT[k]) == op_len && !strncmp(op_start, OP_TEXT[k], op_len)) op = k;
    if (stage < 0 || op < 0 || micro < 0 || *p)
        return fsc_error(FSC_ERR_FORMAT,
                         "bad action '%.40s' (expected <stage><op><micro> such as 0F3 or "
                         "1RECV_B2, op one of F B W SEND_F RECV_F SEND_B RECV_B)",
                         text);
    *out = (fsc_pipe_action){(fsc_pipe_op)op, stage, micro};
    return FSC_OK;
}

/* ---- the handle -------------------------------------------------------------------------- */

int fsc_pipe_sched_check_config(fsc_pipe_config cfg) {
    if (cfg.ranks < 1 || cfg.ranks > 4096)
        return fsc_error(FSC_ERR_INVALID, "pipeline ranks %d outside [1, 4096]", cfg.ranks);
    if (cfg.chunks < 1 || cfg.chunks > 64)
        return fsc_error(FSC_ERR_INVALID, "pipeline chunks %d outside [1, 64]", cfg.chunks);
    if (cfg.micros < 1 || cfg.micros > (1 << 20))
        return fsc_error(FSC_ERR_INVALID, "micro-batches %d outside [1, 2^20]", cfg.micros);
    if ((long long)cfg.ranks * cfg.chunks * cfg.micros > (1LL << 20))
        return fsc_error(FSC_ERR_INVALID,
                         "%d stages x %d micro-batches is past the limit of 2^20 pairs",
                         cfg.ranks * cfg.chunks, cfg.micros);
    return FSC_OK;
}

int fsc_pipe_sched_alloc(fsc_pipe_config cfg, int kind, fsc_pipe_schedule **out) {
    fsc_pipe_schedule *s = calloc(1, sizeof *s);
    if (s) {
        s->cfg = cfg;
        s->kind = kind;
        s->count = calloc((size_t)cfg.ranks, sizeof *s->count);
        s->cap = calloc((size_t)cfg.ranks, sizeof *s->cap);
        s->acts = calloc((size_t)cfg.ranks, sizeof *s->acts);
    }
    if (!s || !s->count || !s->cap || !s->acts) {
        fsc_pipe_schedule_free(s);
        return fsc_error(FSC_ERR_NOMEM, "out of memory for a pipeline schedule");
    }
    *out = s;
    return FSC_OK;
}

int fsc_pipe_sched_push(fsc_pipe_schedule *s, int r, fsc_pipe_op op, int stage, int micro) {
    if (s->count[r] == s->cap[r]) {
        int cap = s->cap[r] ? 2 * s->cap[r] : 16;
        fsc_pipe_action *a = realloc(s->acts[r], (size_t)cap * sizeof *a);
        if (!a) return fsc_error(FSC_ERR_NOMEM, "out of memory for a pipeline schedule");
        s->acts[r] = a;
        s->cap[r] = cap;
    }
    s->acts[r][s->count[r]++] = (fsc_pipe_action){op, stage, micro};
    return FSC_OK;
}

bool fsc_pipe_sched_has_comm(const fsc_pipe_schedule *s) {
    for (int r = 0; r < s->cfg.ranks; r++)
        for (int k = 0; k < s->count[r]; k++)
            if (s->acts[r][k].op >= FSC_PIPE_SEND_F) return true;
    return false;
}

void fsc_pipe_schedule_free(fsc_pipe_schedule *s) {
    if (!s) return;
    if (s->acts)
        for (int r = 0; r < s->cfg.ranks; r++) free(s->acts[r]);
    free(s->acts);
    free(s->count);
    free(s->cap);
    free(s);
}

int fsc_pipe_schedule_new(fsc_pipe_config cfg, const int *counts,
                          const fsc_pipe_action *const *acts, fsc_pipe_schedule **out) {
    if (!counts || !acts || !out)
        return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_new: NULL argument");
    int rc = fsc_pipe_sched_check_config(cfg);
    if (rc) return rc;
    for (int r = 0; r < cfg.ranks; r++)
        if (counts[r] < 0 || (counts[r] > 0 && !acts[r]))
            return fsc_error(FSC_ERR_INVALID, "rank %d: %d actions at %p", r, counts[r],
                             (const void *)acts[r]);
    fsc_pipe_schedule *s;
    if ((rc = fsc_pipe_sched_alloc(cfg, -1, &s))) return rc;
    for (int r = 0; r < cfg.ranks && !rc; r++)
        for (int k = 0; k < counts[r] && !rc; k++)
            rc = fsc_pipe_sched_push(s, r, acts[r][k].op, acts[r][k].stage, acts[r][k].micro);
    if (rc) {
        fsc_pipe_schedule_free(s);
        return rc;
    }
    *out = s;
    return FSC_OK;
}

int fsc_pipe_schedule_config(const fsc_pipe_schedule *s, fsc_pipe_config *out) {
    if (!s || !out) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_config: NULL argument");
    *out = s->cfg;
    return FSC_OK;
}

int fsc_pipe_schedule_actions(const fsc_pipe_schedule *s, int rank, const fsc_pipe_action **acts,
                              int *n) {
    if (!s || !acts || !n) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_actions: NULL");
    if (rank < 0 || rank >= s->cfg.ranks)
        return fsc_error(FSC_ERR_INVALID, "rank %d outside [0, %d)", rank, s->cfg.ranks);
    *acts = s->acts[rank];
    *n = s->count[rank];
    return FSC_OK;
}

int fsc_pipe_stage_rank(const fsc_pipe_schedule *s, int stage) {
    if (!s || stage < 0 || stage >= s->cfg.ranks * s->cfg.chunks) return -1;
    return stage % s->cfg.ranks;
}

/* The producing stage and direction (0 activations, 1 gradients) of a
 * message, or -1 when a has none. */
static int message_of(const fsc_pipe_schedule *s, fsc_pipe_action a, int *dir) {
    int S = s->cfg.ranks * s->cfg.chunks, from;
    switch (a.op) {
    case FSC_PIPE_SEND_F:
        from = a.stage, *dir = 0;
        break;
    case FSC_PIPE_RECV_F:
        from = a.stage - 1, *dir = 0;
        break;
    case FSC_PIPE_SEND_B:
        from = a.stage, *dir = 1;
        break;
    case FSC_PIPE_RECV_B:
        from = a.stage + 1, *dir = 1;
        break;
    default:
        return -1;
    }
    int to = *dir ? from - 1 : from + 1;
    if (from < 0 || from >= S || to < 0 || to >= S || a.micro < 0 || a.micro >= s->cfg.micros)
        return -1;
    if (from % s->cfg.ranks == to % s->cfg.ranks) return -1; /* same rank: no message */
    return from;
}

int fsc_pipe_action_peer(const fsc_pipe_schedule *s, fsc_pipe_action a) {
    int dir;
    if (!s || message_of(s, a, &dir) < 0) return -1;
    int other = a.op == FSC_PIPE_SEND_F || a.op == FSC_PIPE_RECV_B ? a.stage + 1 : a.stage - 1;
    return other % s->cfg.ranks;
}

int fsc_pipe_action_tag(const fsc_pipe_schedule *s, fsc_pipe_action a) {
    int dir, from = s ? message_of(s, a, &dir) : -1;
    if (from < 0) return -1;
    return 2 * (a.micro * s->cfg.ranks * s->cfg.chunks + from) + dir;
}
