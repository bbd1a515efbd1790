/* The one validator of pipeline schedules, and the simulator behind it.
 *
 * Every table goes through here before it trains, whoever wrote it. The
 * static checks (each action in range, on its stage's rank, exactly once;
 * every message with both ends; every input produced earlier on the rank)
 * make each rank's list locally sound. What remains is global: whether the
 * ranks can run together. That is answered by running them: sends never
 * block, a receive waits for its send, and if no rank can move the schedule
 * deadlocks. The same run, with a duration per action, yields the makespan,
 * each rank's idle time and its activation memory, so the figures a user
 * reads are those of the exact program the executor will run.
 */
#include <stdlib.h>
#include <string.h>

#include "pipe_schedule_internal.h"

typedef struct {
    const fsc_pipe_schedule *s;
    int p, S, m;
    int *where; /* [op][stage][micro] -> position on its rank, -1 when absent */
} vctx;

static const char *const OPS[FSC_PIPE_OP_COUNT] = {"F",      "B",      "W",     "SEND_F",
                                                   "RECV_F", "SEND_B", "RECV_B"};

/* Text of any action, however broken, for messages. */
static const char *txt(fsc_pipe_action a, char *buf) {
    if ((unsigned)a.op < FSC_PIPE_OP_COUNT)
        snprintf(buf, FSC_PIPE_ACTION_TEXT, "%d%s%d", a.stage, OPS[a.op], a.micro);
    else
        snprintf(buf, FSC_PIPE_ACTION_TEXT, "%d<op %d>%d", a.stage, (int)a.op, a.micro);
    return buf;
}

static int *slot(const vctx *c, fsc_pipe_op op, int stage, int micro) {
    return &c->where[((size_t)op * (size_t)c->S + (size_t)stage) * (size_t)c->m + (size_t)micro];
}

static bool cross(const vctx *c, int a, int b) {
    return a >= 0 && b >= 0 && a < c->S && b < c->S && a % c->p != b % c->p;
}

/* The stage at the other end of a message action (consumer of a send,
 * producer of a receive). */
static int other_stage(fsc_pipe_action a) {
    return a.op == FSC_PIPE_SEND_F || a.op == FSC_PIPE_RECV_B ? a.stage + 1 : a.stage - 1;
}

/* The action at the other end of a message. */
static fsc_pipe_action partner(fsc_pipe_action a) {
    static const fsc_pipe_op twin[FSC_PIPE_OP_COUNT] = {
        FSC_PIPE_F,      FSC_PIPE_B,      FSC_PIPE_W,     FSC_PIPE_RECV_F,
        FSC_PIPE_SEND_F, FSC_PIPE_RECV_B, FSC_PIPE_SEND_B};
    return (fsc_pipe_action){twin[a.op], other_stage(a), a.micro};
}

/* Step 1: every action in range, on its stage's rank, allowed, once. */
static int check_actions(vctx *c) {
    const fsc_pipe_schedule *s = c->s;
    char t[FSC_PIPE_ACTION_TEXT];
    for (int r = 0; r < c->p; r++) {
        for (int k = 0; k < s->count[r]; k++) {
            fsc_pipe_action a = s->acts[r][k];
            if ((unsigned)a.op >= FSC_PIPE_OP_COUNT)
                return fsc_error(FSC_ERR_INVALID, "rank %d, action %d: unknown op %d", r, k,
                                 (int)a.op);
            if (a.stage < 0 || a.stage >= c->S || a.micro < 0 || a.micro >= c->m)
                return fsc_error(FSC_ERR_INVALID,
                                 "rank %d, action %d (%s): stage outside [0, %d) or micro-batch "
                                 "outside [0, %d)",
                                 r, k, txt(a, t), c->S, c->m);
            if (a.stage % c->p != r)
                return fsc_error(FSC_ERR_INVALID,
                                 "rank %d, action %d (%s): stage %d runs on rank %d", r, k,
                                 txt(a, t), a.stage, a.stage % c->p);
            const bool backward = a.op == FSC_PIPE_B || a.op == FSC_PIPE_W ||
                                  a.op == FSC_PIPE_SEND_B || a.op == FSC_PIPE_RECV_B;
            if (backward && s->cfg.forward_only)
                return fsc_error(FSC_ERR_INVALID,
                                 "rank %d, action %d (%s): a forward-only schedule has no "
                                 "backward",
                                 r, k, txt(a, t));
            if (a.op == FSC_PIPE_W && !s->cfg.split_backward)
                return fsc_error(FSC_ERR_INVALID,
                                 "rank %d, action %d (%s): W in a schedule without split "
                                 "backward (there B is the full backward)",
                                 r, k, txt(a, t));
            if (a.op >= FSC_PIPE_SEND_F && !cross(c, a.stage, other_stage(a)))
                return fsc_error(
                    FSC_ERR_INVALID, "rank %d, action %d (%s): no message here: stage %d %s", r, k,
                    txt(a, t), other_stage(a),
                    other_stage(a) < 0 || other_stage(a) >= c->S ? "is past the end of the pipeline"
                                                                 : "is on the same rank");
            int *w = slot(c, a.op, a.stage, a.micro);
            if (*w >= 0)
                return fsc_error(FSC_ERR_INVALID, "rank %d: %s appears twice, at actions %d and %d",
                                 r, txt(a, t), *w, k);
            *w = k;
        }
    }
    return FSC_OK;
}

/* Step 2: one F, B (and W) per (stage, micro); both ends of every message. */
static int check_complete(const vctx *c) {
    char t[FSC_PIPE_ACTION_TEXT], u[FSC_PIPE_ACTION_TEXT];
    int nops = c->s->cfg.forward_only ? 1 : c->s->cfg.split_backward ? 3 : 2;
    for (int st = 0; st < c->S; st++) {
        for (int i = 0; i < c->m; i++) {
            for (int op = 0; op < nops; op++) {
                if (*slot(c, (fsc_pipe_op)op, st, i) < 0) {
                    fsc_pipe_action a = {(fsc_pipe_op)op, st, i};
                    return fsc_error(FSC_ERR_INVALID, "rank %d has no %s: missing action",
                                     st % c->p, txt(a, t));
                }
            }
            for (int op = FSC_PIPE_SEND_F; op < FSC_PIPE_OP_COUNT; op++) {
                int k = *slot(c, (fsc_pipe_op)op, st, i);
                fsc_pipe_action a = {(fsc_pipe_op)op, st, i}, b = partner(a);
                if (k >= 0 && *slot(c, b.op, b.stage, b.micro) < 0)
                    return fsc_error(
                        FSC_ERR_INVALID, "rank %d, action %d (%s) has no matching %s %s on rank %d",
                        st % c->p, k, txt(a, t),
                        op == FSC_PIPE_SEND_F || op == FSC_PIPE_SEND_B ? "receive" : "send",
                        txt(b, u), b.stage % c->p);
            }
        }
    }
    return FSC_OK;
}

/* Step 3: whatever an action reads is made earlier on its own rank. */
static int check_order(const vctx *c) {
    const fsc_pipe_schedule *s = c->s;
    char t[FSC_PIPE_ACTION_TEXT], u[FSC_PIPE_ACTION_TEXT];
    for (int r = 0; r < c->p; r++) {
        for (int k = 0; k < s->count[r]; k++) {
            fsc_pipe_action a = s->acts[r][k], need[2];
            int n = 0, st = a.stage, i = a.micro;
            switch (a.op) {
            case FSC_PIPE_F:
                if (st > 0)
                    need[n++] = cross(c, st - 1, st) ? (fsc_pipe_action){FSC_PIPE_RECV_F, st, i}
                                                     : (fsc_pipe_action){FSC_PIPE_F, st - 1, i};
                break;
            case FSC_PIPE_B:
                need[n++] = (fsc_pipe_action){FSC_PIPE_F, st, i};
                if (st < c->S - 1)
                    need[n++] = cross(c, st + 1, st) ? (fsc_pipe_action){FSC_PIPE_RECV_B, st, i}
                                                     : (fsc_pipe_action){FSC_PIPE_B, st + 1, i};
                break;
            case FSC_PIPE_W:
                need[n++] = (fsc_pipe_action){FSC_PIPE_B, st, i};
                break;
            case FSC_PIPE_SEND_F:
                need[n++] = (fsc_pipe_action){FSC_PIPE_F, st, i};
                break;
            case FSC_PIPE_SEND_B:
                need[n++] = (fsc_pipe_action){FSC_PIPE_B, st, i};
                break;
            default:
                break;
            }
            for (int j = 0; j < n; j++) {
                int at = *slot(c, need[j].op, need[j].stage, need[j].micro);
                if (at < 0)
                    return fsc_error(FSC_ERR_INVALID,
                                     "rank %d, action %d (%s) needs %s before it, and rank %d "
                                     "has none",
                                     r, k, txt(a, t), txt(need[j], u), r);
                if (at > k)
                    return fsc_error(FSC_ERR_INVALID,
                                     "rank %d, action %d (%s) needs %s before it, which comes "
                                     "later (action %d)",
                                     r, k, txt(a, t), txt(need[j], u), at);
            }
        }
    }
    return FSC_OK;
}

static int cost_of(fsc_pipe_op op, const fsc_pipe_costs *c) {
    return op == FSC_PIPE_F ? c->f : op == FSC_PIPE_B ? c->b : op == FSC_PIPE_W ? c->w : 0;
}

/* Names every stuck rank, what it is at and what it waits for. */
static int report_deadlock(const vctx *c, const int *pc) {
    char msg[900], t[FSC_PIPE_ACTION_TEXT], u[FSC_PIPE_ACTION_TEXT];
    size_t len = (size_t)snprintf(msg, sizeof msg, "deadlock: no rank can advance;");
    int shown = 0;
    for (int r = 0; r < c->p && len < sizeof msg; r++) {
        if (pc[r] >= c->s->count[r]) continue;
        if (shown++ == 6) {
            len += (size_t)snprintf(msg + len, sizeof msg - len, " ...");
            break;
        }
        fsc_pipe_action a = c->s->acts[r][pc[r]], b = partner(a);
        len += (size_t)snprintf(msg + len, sizeof msg - len,
                                " rank %d is stuck at action %d (%s), waiting for %s on rank %d;",
                                r, pc[r], txt(a, t), txt(b, u), b.stage % c->p);
    }
    return fsc_error(FSC_ERR_INVALID, "%s", msg);
}

/* Step 4: run the ranks together, timing every action. */
static int simulate(const vctx *c, const fsc_pipe_costs *cost, fsc_pipe_stats *st,
                    fsc_pipe_rank_stats *pr, long long **start, int **dur) {
    const fsc_pipe_schedule *s = c->s;
    int p = c->p, rc = FSC_OK;
    int *pc = calloc((size_t)p, sizeof *pc);
    long long *clock = calloc((size_t)p, sizeof *clock);
    long long **done = calloc((size_t)p, sizeof *done);
    int *cur = calloc((size_t)p * 2, sizeof *cur);
    if (!pc || !clock || !done || !cur) rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
    for (int r = 0; r < p && !rc; r++)
        if (!(done[r] = malloc(((size_t)s->count[r] + 1) * sizeof **done)))
            rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
    fsc_pipe_rank_stats *rs = calloc((size_t)p, sizeof *rs);
    if (!rc && !rs) rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
    bool moved = true;
    while (!rc && moved) {
        moved = false;
        for (int r = 0; r < p; r++) {
            while (pc[r] < s->count[r]) {
                fsc_pipe_action a = s->acts[r][pc[r]];
                if (a.op == FSC_PIPE_RECV_F || a.op == FSC_PIPE_RECV_B) {
                    fsc_pipe_action b = partner(a);
                    int sr = b.stage % p, sk = *slot(c, b.op, b.stage, b.micro);
                    if (pc[sr] <= sk) break; /* its send has not run yet */
                    if (done[sr][sk] > clock[r]) clock[r] = done[sr][sk];
                }
                int d = cost_of(a.op, cost);
                if (start) start[r][pc[r]] = clock[r];
                if (dur) dur[r][pc[r]] = d;
                clock[r] += d;
                rs[r].busy += d;
                done[r][pc[r]++] = clock[r];
                /* activations held: from F until B, and until W when split */
                int *in = &cur[2 * r], *in_w = &cur[2 * r + 1];
                bool last_use =
                    a.op == FSC_PIPE_W || (a.op == FSC_PIPE_B && !s->cfg.split_backward);
                /* forward only: nothing is kept for a backward */
                if (a.op == FSC_PIPE_F && !s->cfg.forward_only) ++*in, ++*in_w;
                if (a.op == FSC_PIPE_B) --*in;
                if (last_use) --*in_w;
                if (*in > rs[r].peak_inflight) rs[r].peak_inflight = *in;
                if (*in_w > rs[r].peak_inflight_w) rs[r].peak_inflight_w = *in_w;
                moved = true;
            }
        }
    }
    bool finished = true;
    for (int r = 0; r < p && !rc; r++) finished = finished && pc[r] == s->count[r];
    if (!rc && !finished) rc = report_deadlock(c, pc);
    if (!rc) {
        fsc_pipe_stats out = {0};
        long long idle = 0;
        for (int r = 0; r < p; r++) {
            rs[r].end = clock[r];
            if (clock[r] > out.makespan) out.makespan = clock[r];
            out.actions += s->count[r];
        }
        for (int r = 0; r < p; r++) {
            rs[r].idle = out.makespan - rs[r].busy;
            rs[r].bubble = out.makespan ? (double)rs[r].idle / (double)out.makespan : 0;
            idle += rs[r].idle;
            if (rs[r].peak_inflight > out.peak_inflight) out.peak_inflight = rs[r].peak_inflight;
            if (rs[r].peak_inflight_w > out.peak_inflight_w)
                out.peak_inflight_w = rs[r].peak_inflight_w;
            for (int k = 0; k < s->count[r]; k++)
                out.messages +=
                    s->acts[r][k].op == FSC_PIPE_SEND_F || s->acts[r][k].op == FSC_PIPE_SEND_B;
        }
        out.bubble = out.makespan ? (double)idle / ((double)p * (double)out.makespan) : 0;
        out.theoretical_bubble =
            s->kind >= 0 ? fsc_pipe_kind_bubble((fsc_pipe_kind)s->kind, p, s->cfg.chunks, c->m)
                         : -1;
        if (st) *st = out;
        if (pr) memcpy(pr, rs, (size_t)p * sizeof *rs);
    }
    for (int r = 0; done && r < p; r++) free(done[r]);
    free(done);
    free(pc);
    free(clock);
    free(cur);
    free(rs);
    return rc;
}

int fsc_pipe_sched_simulate(const fsc_pipe_schedule *s, const fsc_pipe_costs *costs,
                            fsc_pipe_stats *stats, fsc_pipe_rank_stats *per_rank, long long **start,
                            int **cost) {
    if (!s) return fsc_error(FSC_ERR_INVALID, "pipeline schedule is NULL");
    int rc = fsc_pipe_sched_check_config(s->cfg);
    if (rc) return rc;
    fsc_pipe_costs c = costs ? *costs : (fsc_pipe_costs){0};
    if (c.f < 0 || c.b < 0 || c.w < 0)
        return fsc_error(FSC_ERR_INVALID, "negative pipeline cost (f %d, b %d, w %d)", c.f, c.b,
                         c.w);
    if (!c.f) c.f = 1;
    if (!c.b) c.b = s->cfg.split_backward ? 1 : 2;
    if (!c.w) c.w = 1;
    vctx v = {s, s->cfg.ranks, s->cfg.ranks * s->cfg.chunks, s->cfg.micros, NULL};
    size_t n = (size_t)FSC_PIPE_OP_COUNT * (size_t)v.S * (size_t)v.m;
    if (!(v.where = malloc(n * sizeof *v.where)))
        return fsc_error(FSC_ERR_NOMEM, "out of memory validating a pipeline schedule");
    memset(v.where, 0xff, n * sizeof *v.where); /* all -1 */
    rc = check_actions(&v);
    if (!rc) rc = check_complete(&v);
    if (!rc) rc = check_order(&v);
    if (!rc) rc = simulate(&v, &c, stats, per_rank, start, cost);
    free(v.where);
    return rc;
}

int fsc_pipe_schedule_validate(const fsc_pipe_schedule *s, const fsc_pipe_costs *costs,
                               fsc_pipe_stats *stats, fsc_pipe_rank_stats *per_rank) {
    return fsc_pipe_sched_simulate(s, costs, stats, per_rank, NULL, NULL);
}
