/* Pipeline schedules made: the generators and the lowering pass (the table
 * they fill is pipe_schedule.c's, the validator pipe_validate.c's).
 *
 * A generator writes only compute actions (F, B, W) in each rank's order; it
 * knows nothing of messages. Lowering then adds them by one local rule (send
 * right after the producer, receive right before the consumer), so a
 * generator cannot get communication wrong, and a compute order that is a
 * valid dataflow order becomes a program that cannot deadlock with
 * non-blocking sends. make() always runs the validator on the result.
 */

#include "pipe_schedule_internal.h"

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
