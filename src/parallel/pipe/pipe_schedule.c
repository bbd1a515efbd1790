/* Pipeline schedules as data: the action text form, the generators and the
 * lowering pass.
 *
 * A generator writes only compute actions (F, B, W) in each rank's order; it
 * knows nothing of messages. Lowering then adds them by one local rule (send
 * right after the producer, receive right before the consumer), so a
 * generator cannot get communication wrong, and a compute order that is a
 * valid dataflow order becomes a program that cannot deadlock with
 * non-blocking sends. make() always runs the validator on the result.
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
    if (!strcasecmp(name, "zb1")) {
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

/* ---- generators: compute actions only ---------------------------------------------------- */

/* Fill-drain: every forward, then every backward, last micro-batch first. */
static int gen_gpipe(fsc_pipe_schedule *s) {
    int p = s->cfg.ranks, m = s->cfg.micros, rc = 0;
    for (int r = 0; r < p; r++) {
        for (int i = 0; i < m && !rc; i++) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, r, i);
        for (int i = m - 1; i >= 0 && !rc; i--) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_B, r, i);
    }
    return rc;
}

/* PipeDream-flush: p - r - 1 warm-up forwards, then one forward and one
 * backward in turn, then the remaining backwards. Rank r never holds more
 * than p - r activations; with m < p the warm-up is cut to m. */
static int gen_1f1b(fsc_pipe_schedule *s) {
    int p = s->cfg.ranks, m = s->cfg.micros, rc = 0;
    for (int r = 0; r < p; r++) {
        int warm = p - r - 1 < m ? p - r - 1 : m, f = 0, b = 0;
        while (f < warm && !rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, r, f++);
        while (f < m && !rc) {
            rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, r, f++);
            if (!rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_B, r, b++);
        }
        while (b < m && !rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_B, r, b++);
    }
    return rc;
}

/* Megatron's interleaved 1F1B (forward_backward_pipelining_with_interleaving).
 * Virtual step k of a rank runs chunk (k mod pv) / p on micro-batch
 * (k / pv) * p + k mod p: groups of p micro-batches go through chunk 0, then
 * chunk 1, ...; backward walks the chunks in reverse. Rank r warms up with
 * 2(p - r - 1) + (v - 1)p forwards. Megatron makes every step a warm-up
 * step when m == p; the general rule is kept here, which gives the same
 * makespan and the same peak (rank 0 is all warm-up then either way) and
 * lets the later ranks hold fewer activations. */
static void interleaved_step(int k, int p, int v, bool forward, int *stage_chunk, int *micro) {
    int in_group = k % (p * v), chunk = in_group / p;
    *stage_chunk = forward ? chunk : v - 1 - chunk;
    *micro = (k / (p * v)) * p + k % p;
}

static int gen_interleaved(fsc_pipe_schedule *s) {
    int p = s->cfg.ranks, v = s->cfg.chunks, m = s->cfg.micros, total = v * m, rc = 0;
    for (int r = 0; r < p; r++) {
        int warm = 2 * (p - r - 1) + (v - 1) * p, c, i;
        if (warm > total) warm = total;
        int f = 0, b = 0;
        for (; f < warm && !rc; f++) {
            interleaved_step(f, p, v, true, &c, &i);
            rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, c * p + r, i);
        }
        while (f < total && !rc) {
            interleaved_step(f++, p, v, true, &c, &i);
            rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, c * p + r, i);
            interleaved_step(b++, p, v, false, &c, &i);
            if (!rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_B, c * p + r, i);
        }
        for (; b < total && !rc; b++) {
            interleaved_step(b, p, v, false, &c, &i);
            rc = fsc_pipe_sched_push(s, r, FSC_PIPE_B, c * p + r, i);
        }
    }
    return rc;
}

/* ZB-H1 (Qi et al. 2023, the order of Paddle's ZBH1 pass, generalised to m < p).
 * Rank r runs p - r warm-up forwards (one more than 1F1B), then r rounds of
 * B, F whose W waits, then rounds of B, W, F, then B, W for the rest; the r
 * postponed W fill the cool-down bubble at the end. A rank then holds at
 * most p activations until W, the peak of rank 0 under 1F1B, and at most
 * p - r until B, as 1F1B. Cut to size when m < p. */
static int gen_zbh1(fsc_pipe_schedule *s) {
    int p = s->cfg.ranks, m = s->cfg.micros, rc = 0;
    for (int r = 0; r < p && !rc; r++) {
        int warm = p - r < m ? p - r : m;
        int late = r < m - warm ? r : m - warm; /* rounds whose W is postponed */
        int f = 0, b = 0;
        while (f < warm && !rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, r, f++);
        for (int k = 0; k < late && !rc; k++) {
            rc = fsc_pipe_sched_push(s, r, FSC_PIPE_B, r, b++);
            if (!rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, r, f++);
        }
        while (f < m && !rc) {
            rc = fsc_pipe_sched_push(s, r, FSC_PIPE_B, r, b);
            if (!rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_W, r, b++);
            if (!rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, r, f++);
        }
        while (b < m && !rc) {
            rc = fsc_pipe_sched_push(s, r, FSC_PIPE_B, r, b);
            if (!rc) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_W, r, b++);
        }
        for (int i = 0; i < late && !rc; i++) rc = fsc_pipe_sched_push(s, r, FSC_PIPE_W, r, i);
    }
    return rc;
}

/* Forward only (an evaluation pass), in Megatron's interleaved order: groups
 * of p micro-batches go through chunk 0, then chunk 1, ... (the last group
 * may be shorter). Every list follows one global order of (group, chunk,
 * micro), in which each forward comes after its input's, so none can
 * deadlock; with whole groups no rank idles once its first input came. */
static int gen_forward(fsc_pipe_schedule *s) {
    int p = s->cfg.ranks, v = s->cfg.chunks, m = s->cfg.micros, rc = 0;
    for (int r = 0; r < p; r++)
        for (int g = 0; g < m; g += p)
            for (int c = 0; c < v; c++)
                for (int i = g; i < g + p && i < m && !rc; i++)
                    rc = fsc_pipe_sched_push(s, r, FSC_PIPE_F, c * p + r, i);
    return rc;
}

/* ---- lowering ---------------------------------------------------------------------------- */

int fsc_pipe_schedule_lower(fsc_pipe_schedule *s) {
    if (!s) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_lower: schedule is NULL");
    if (fsc_pipe_sched_has_comm(s))
        return fsc_error(FSC_ERR_INVALID, "schedule already holds sends or receives");
    int p = s->cfg.ranks, S = p * s->cfg.chunks, rc = 0;
    fsc_pipe_schedule *t;
    if ((rc = fsc_pipe_sched_alloc(s->cfg, s->kind, &t))) return rc;
    for (int r = 0; r < p && !rc; r++) {
        for (int k = 0; k < s->count[r] && !rc; k++) {
            fsc_pipe_action a = s->acts[r][k];
            bool fwd = a.op == FSC_PIPE_F, bwd = a.op == FSC_PIPE_B;
            /* the neighbour this action reads from and writes to, if on another rank */
            int from = fwd ? a.stage - 1 : a.stage + 1, to = fwd ? a.stage + 1 : a.stage - 1;
            bool comp = fwd || bwd, in_range = a.stage >= 0 && a.stage < S;
            bool recv = comp && in_range && from >= 0 && from < S && from % p != a.stage % p;
            bool send = comp && in_range && to >= 0 && to < S && to % p != a.stage % p;
            if (recv)
                rc = fsc_pipe_sched_push(t, r, fwd ? FSC_PIPE_RECV_F : FSC_PIPE_RECV_B, a.stage,
                                         a.micro);
            if (!rc) rc = fsc_pipe_sched_push(t, r, a.op, a.stage, a.micro);
            if (send && !rc)
                rc = fsc_pipe_sched_push(t, r, fwd ? FSC_PIPE_SEND_F : FSC_PIPE_SEND_B, a.stage,
                                         a.micro);
        }
    }
    if (rc) {
        fsc_pipe_schedule_free(t);
        return rc;
    }
    /* swap the lists into s, so the caller's handle stays valid */
    fsc_pipe_schedule old = *s;
    s->count = t->count, s->cap = t->cap, s->acts = t->acts;
    t->count = old.count, t->cap = old.cap, t->acts = old.acts;
    fsc_pipe_schedule_free(t);
    return FSC_OK;
}

/* ---- make -------------------------------------------------------------------------------- */

/* Lowers and validates a generated s; frees it on failure. */
static int finish(fsc_pipe_schedule *s, const char *name, fsc_pipe_schedule **out) {
    int rc = fsc_pipe_schedule_lower(s);
    if (!rc) {
        rc = fsc_pipe_schedule_validate(s, NULL, NULL, NULL);
        if (rc) /* a generator bug: say which */
            rc = fsc_error_context(FSC_ERR_INTERNAL, "generated %s (p %d, v %d, m %d): ", name,
                                   s->cfg.ranks, s->cfg.chunks, s->cfg.micros);
    }
    if (rc) {
        fsc_pipe_schedule_free(s);
        return rc;
    }
    *out = s;
    return FSC_OK;
}

int fsc_pipe_schedule_make_forward(int ranks, int chunks, int micros, fsc_pipe_schedule **out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_make_forward: out is NULL");
    fsc_pipe_config cfg = {
        .ranks = ranks, .chunks = chunks ? chunks : 1, .micros = micros, .forward_only = true};
    fsc_pipe_schedule *s = NULL;
    int rc = fsc_pipe_sched_check_config(cfg);
    if (!rc) rc = fsc_pipe_sched_alloc(cfg, -1, &s);
    if (!rc) rc = gen_forward(s);
    if (rc) {
        if (s) fsc_pipe_schedule_free(s);
        return rc;
    }
    return finish(s, "forward-only", out);
}

int fsc_pipe_schedule_make(fsc_pipe_kind kind, int ranks, int chunks, int micros,
                           fsc_pipe_schedule **out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_pipe_schedule_make: out is NULL");
    if ((unsigned)kind >= FSC_PIPE_KIND_COUNT)
        return fsc_error(FSC_ERR_INVALID, "unknown pipeline schedule kind %d", (int)kind);
    bool inter = kind == FSC_PIPE_INTERLEAVED;
    if (chunks == 0) chunks = inter ? 2 : 1;
    if (inter && chunks < 2)
        return fsc_error(FSC_ERR_INVALID,
                         "interleaved needs chunks >= 2 (got %d); use 1f1b for one chunk", chunks);
    if (!inter && chunks != 1)
        return fsc_error(FSC_ERR_INVALID,
                         "%s runs one chunk per rank (got chunks %d); interleaved runs several",
                         fsc_pipe_kind_name(kind), chunks);
    fsc_pipe_config cfg = {.ranks = ranks,
                           .chunks = chunks,
                           .micros = micros,
                           .split_backward = kind == FSC_PIPE_ZB_H1};
    int rc = fsc_pipe_sched_check_config(cfg);
    if (rc) return rc;
    if (inter && micros % ranks != 0)
        return fsc_error(FSC_ERR_INVALID,
                         "interleaved needs micro-batches (%d) to be a multiple of the pipeline "
                         "ranks (%d): Megatron's order runs whole groups of p micro-batches",
                         micros, ranks);
    fsc_pipe_schedule *s;
    if ((rc = fsc_pipe_sched_alloc(cfg, (int)kind, &s))) return rc;
    switch (kind) {
    case FSC_PIPE_GPIPE:
        rc = gen_gpipe(s);
        break;
    case FSC_PIPE_1F1B:
        rc = gen_1f1b(s);
        break;
    case FSC_PIPE_INTERLEAVED:
        rc = gen_interleaved(s);
        break;
    default:
        rc = gen_zbh1(s);
        break;
    }
    if (rc) {
        fsc_pipe_schedule_free(s);
        return rc;
    }
    return finish(s, fsc_pipe_kind_name(kind), out);
}
