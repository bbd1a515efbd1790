/* When the executor may wait for a micro-batch's sends (pipe.c).
 *
 * After a micro-batch's last action on a rank the executor waits for that
 * micro-batch's sends to be taken and gives its arena back to the pool, so
 * the pool holds no more arenas than the schedule holds micro-batches. The
 * validator proves a schedule runs with sends that never block; this wait
 * does block, until the peer posts the receive, and a hand-written order may
 * put that receive behind one the waiting rank has yet to send for: a hang
 * the validator cannot see. So every rank's list is run once more here with
 * these waits, and each wait that would never end is made lazy: that
 * micro-batch's arena goes back once its sends are seen complete, as in an
 * evaluation pass. Generated schedules keep every wait. */
#include <stdlib.h>

#include "pipe_exec_internal.h"

typedef struct {
    const fsc_pipe_action *acts;
    int n, pc; /* actions done */
    int wait;  /* the micro-batch whose sends this rank waits for, or -1 */
    int *last; /* per micro-batch: its last action here, -1 if none */
    int *peer; /* per action: the index of its message's other end on the peer */
    bool *lazy;
} sim_rank;

/* The other end of a message action: a send's receive and the reverse. */
static fsc_pipe_action twin(fsc_pipe_action a) {
    switch (a.op) {
    case FSC_PIPE_SEND_F:
        return (fsc_pipe_action){FSC_PIPE_RECV_F, a.stage + 1, a.micro};
    case FSC_PIPE_RECV_F:
        return (fsc_pipe_action){FSC_PIPE_SEND_F, a.stage - 1, a.micro};
    case FSC_PIPE_SEND_B:
        return (fsc_pipe_action){FSC_PIPE_RECV_B, a.stage - 1, a.micro};
    default:
        return (fsc_pipe_action){FSC_PIPE_SEND_B, a.stage + 1, a.micro};
    }
}

static bool is_message(fsc_pipe_op op) {
    return op == FSC_PIPE_SEND_F || op == FSC_PIPE_RECV_F || op == FSC_PIPE_SEND_B ||
           op == FSC_PIPE_RECV_B;
}

static int index_of(const sim_rank *q, fsc_pipe_action a) {
    for (int i = 0; i < q->n; i++)
        if (q->acts[i].op == a.op && q->acts[i].stage == a.stage && q->acts[i].micro == a.micro)
            return i;
    return -1;
}

/* Whether rank q has posted its action i: done, or next with no wait before it. */
static bool posted(const sim_rank *q, int i) {
    return q->pc > i || (q->pc == i && q->wait < 0);
}

/* Whether rank r's wait ends: every send of its micro-batch so far is taken. */
static bool wait_ends(const fsc_pipe_schedule *s, const sim_rank *sim, int r) {
    const sim_rank *R = &sim[r];
    for (int k = 0; k < R->pc; k++) {
        const fsc_pipe_action a = R->acts[k];
        if (a.micro != R->wait || (a.op != FSC_PIPE_SEND_F && a.op != FSC_PIPE_SEND_B)) continue;
        if (!posted(&sim[fsc_pipe_action_peer(s, a)], R->peer[k])) return false;
    }
    return true;
}

/* One pass over the ranks: each moves as far as it can. Whether any moved. */
static bool advance(const fsc_pipe_schedule *s, sim_rank *sim, int ranks) {
    bool moved = false;
    for (int r = 0; r < ranks; r++) {
        sim_rank *R = &sim[r];
        for (;;) {
            if (R->wait >= 0 && !wait_ends(s, sim, r)) break;
            if (R->wait >= 0) R->wait = -1, moved = true;
            if (R->pc == R->n) break;
            const fsc_pipe_action a = R->acts[R->pc];
            /* a receive completes once its send is posted (sends never block) */
            if ((a.op == FSC_PIPE_RECV_F || a.op == FSC_PIPE_RECV_B) &&
                sim[fsc_pipe_action_peer(s, a)].pc <= R->peer[R->pc])
                break;
            R->pc++, moved = true;
            if (R->last[a.micro] == R->pc - 1 && !R->lazy[a.micro]) R->wait = a.micro;
        }
    }
    return moved;
}

static int simulate(const fsc_pipe_schedule *s, sim_rank *sim, int ranks, int micros) {
    for (int r = 0; r < ranks; r++) {
        sim_rank *R = &sim[r];
        int rc = fsc_pipe_schedule_actions(s, r, &R->acts, &R->n);
        R->wait = -1;
        R->last = malloc(sizeof *R->last * (size_t)micros);
        R->peer = malloc(sizeof *R->peer * (size_t)(R->n ? R->n : 1));
        R->lazy = calloc((size_t)micros, sizeof *R->lazy);
        if (rc) return rc;
        if (!R->last || !R->peer || !R->lazy)
            return fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
        for (int i = 0; i < micros; i++) R->last[i] = -1;
        for (int k = 0; k < R->n; k++) R->last[R->acts[k].micro] = k;
    }
    for (int r = 0; r < ranks; r++)
        for (int k = 0; k < sim[r].n; k++) {
            const fsc_pipe_action a = sim[r].acts[k];
            sim[r].peer[k] =
                is_message(a.op) ? index_of(&sim[fsc_pipe_action_peer(s, a)], twin(a)) : -1;
            if (is_message(a.op) && sim[r].peer[k] < 0)
                return fsc_error(FSC_ERR_INVALID,
                                 "pipeline: rank %d's message %d has no other end "
                                 "(validate the schedule first)",
                                 r, k);
        }
    for (;;) {
        if (advance(s, sim, ranks)) continue;
        bool stuck = false, done = true;
        for (int r = 0; r < ranks; r++) {
            if (sim[r].wait >= 0) /* would never end: lazy, and on */
                sim[r].lazy[sim[r].wait] = true, sim[r].wait = -1, stuck = true;
            done = done && sim[r].pc == sim[r].n;
        }
        if (done && !stuck) return FSC_OK;
        if (!stuck)
            return fsc_error(FSC_ERR_INVALID, "pipeline: the schedule deadlocks even with sends "
                                              "that never block (validate it first)");
    }
}

int pipe_plan_release(fsc_pipe *p) {
    const int ranks = p->cfg.ranks, micros = p->cfg.micros;
    sim_rank *sim = calloc((size_t)ranks, sizeof *sim);
    int rc = sim ? simulate(p->sched, sim, ranks, micros)
                 : fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    if (!rc) p->lazy = sim[p->rank].lazy, sim[p->rank].lazy = NULL;
    for (int r = 0; sim && r < ranks; r++) free(sim[r].last), free(sim[r].peer), free(sim[r].lazy);
    free(sim);
    return rc;
}
