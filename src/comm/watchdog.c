/* The watchdog and desync guard (docs/architecture.md, decision 8): every collective's
 * sequence number and signature, the control exchange that proves every
 * peer joined the same collective, and the messages for desyncs and
 * timeouts.
 *
 * The one idea: on entering collective #N a rank sends a tiny announcement
 * (seq, kind, dtype, op, count, root) to each peer on the group's control
 * communicator and posts receives for theirs. When all have arrived every
 * rank holds every rank's signature, so a mismatch is reported identically
 * on all of them, naming each rank's collective. If the deadline passes
 * first, the receives still pending are exactly the ranks that never joined,
 * and the latest announcement seen from each tells where it is instead.
 * Cost: 2(P-1) messages of 56 bytes, a few microseconds on shared memory.
 * Point-to-point send/recv are checked (count and dtype agree) only with the
 * full check (FSC_DESYNC_CHECK=1), where the extra round trip is accepted.
 * On a group of two an early allreduce's first data message carries a hash
 * of the signature instead (eager.c): the announcement then goes only when
 * the peer's message carries another signature or the peer announced, so a
 * desync is still named alike on both sides, from both full signatures.
 * The hash lets a desync of equal-sized messages pass once in 2^18 (Open
 * MPI's tag space); the full check announces always.
 *
 * A control message cannot tell a dead rank from a slow one, nor who is
 * alive once a transfer stalls mid-way: so before reporting, the rank asks
 * the heartbeat (heartbeat.c) who answers. Ranks that do not answer (killed,
 * stopped) or that answer but have stayed out of fsc for half the timeout
 * (stalled) are named in one verdict the survivors agree on; only when
 * nobody is lost or stalled does the control-plane message above stand.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heartbeat.h"

static bool is_p2p(int kind) {
    return kind == FSC_COLL_SEND || kind == FSC_COLL_RECV;
}

static int64_t hash_words(const int64_t *w, int n, int64_t h) {
    uint64_t x = (uint64_t)h ^ 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < n; i++) {
        x ^= (uint64_t)w[i];
        x *= 0x100000001B3ull;
        x ^= x >> 29;
    }
    return (int64_t)(x & 0x7FFFFFFFFFFFFFFFull);
}

int64_t fsc_wd_sig_hash(const int64_t *sig) {
    return hash_words(sig, SIG_WORDS, 7);
}

void fsc_wd_signature(fsc_request *r) {
    const fsc_coll_args *a = &r->a;
    int64_t *s = r->sig;
    s[SIG_SEQ] = r->seq;
    s[SIG_KIND] = a->kind;
    s[SIG_DTYPE] = a->kind == FSC_KIND_SPLIT || a->kind == FSC_COLL_BARRIER ? -1 : (int64_t)a->dt;
    s[SIG_OP] = a->kind == FSC_COLL_ALLREDUCE || a->kind == FSC_COLL_REDUCE ||
                        a->kind == FSC_COLL_REDUCE_SCATTER
                    ? (int64_t)a->op
                    : -1;
    s[SIG_COUNT] = a->count;
    s[SIG_ROOT] = a->kind == FSC_COLL_REDUCE || a->kind == FSC_COLL_BROADCAST ? a->root
                  : is_p2p(a->kind)                                           ? a->tag
                                                                              : -1;
    s[SIG_VHASH] = 0;
    if (a->counts && fsc_dist_rt.full_check) {
        s[SIG_VHASH] = hash_words(a->counts, r->g->size, 1);
        s[SIG_VHASH] = hash_words(a->displs, r->g->size, s[SIG_VHASH]);
    }
}

/* "allreduce(F32, count 8, sum)" */
static void describe_sig(const int64_t *s, char *buf, size_t n) {
    static const char *ops[] = {"sum", "avg", "max"};
    int k = (int)s[SIG_KIND];
    int len = snprintf(buf, n, "%s", fsc_coll_kind_name(k));
    if (k == FSC_KIND_SPLIT || k == FSC_COLL_BARRIER || len < 0 || (size_t)len >= n) return;
    len += snprintf(buf + len, n - (size_t)len, "(%s, count %lld",
                    s[SIG_DTYPE] >= 0 && s[SIG_DTYPE] < FSC_DTYPE_COUNT
                        ? fsc_dtype_name((fsc_dtype)s[SIG_DTYPE])
                        : "?",
                    (long long)s[SIG_COUNT]);
    if (s[SIG_OP] >= 0 && s[SIG_OP] <= 2 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, ", %s", ops[s[SIG_OP]]);
    if (s[SIG_ROOT] >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, is_p2p(k) ? ", tag %lld" : ", root %lld",
                        (long long)s[SIG_ROOT]);
    if (s[SIG_VHASH] && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, ", layout %04llx",
                        (unsigned long long)(s[SIG_VHASH] & 0xffff));
    if ((size_t)len < n) snprintf(buf + len, n - (size_t)len, ")");
}

void fsc_wd_describe(const fsc_request *r, char *buf, size_t n) {
    describe_sig(r->sig, buf, n);
}

static int ctrl_tag(const fsc_request *r) {
    return is_p2p(r->a.kind) ? FSC_CTRL_P2P_BASE + r->a.tag % FSC_CTRL_P2P_BASE
                             : (int)(r->seq % FSC_CTRL_P2P_BASE);
}

/* This rank's signature to every peer whose receive is posted. */
static int announce(fsc_request *r) {
    int np = is_p2p(r->a.kind) ? 1 : r->g->size - 1;
    r->announced = true;
    for (int i = 0; i < r->npeers; i++) {
        int rc = MPI_Isend(r->sig, SIG_WORDS, MPI_INT64_T, r->peers[i], ctrl_tag(r), r->g->ctrl,
                           &r->ctrl[np + i]);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Isend(control)");
        fsc_dist_rt.announcements++;
    }
    return FSC_OK;
}

/* Receives for every peer's announcement (npeers of them). */
static int listen(fsc_request *r) {
    r->listening = true;
    for (int i = 0; i < r->npeers; i++) {
        int rc = MPI_Irecv(r->inbox + (size_t)i * SIG_WORDS, SIG_WORDS, MPI_INT64_T, r->peers[i],
                           ctrl_tag(r), r->g->ctrl, &r->ctrl[i]);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Irecv(control)");
    }
    return FSC_OK;
}

int fsc_wd_begin(fsc_request *r) {
    fsc_group *g = r->g;
    r->npeers = 0;
    if (!r->checked) return FSC_OK;
    int np = is_p2p(r->a.kind) ? 1 : g->size - 1;
    r->inbox = malloc((size_t)np * SIG_WORDS * sizeof(int64_t));
    r->peers = malloc((size_t)np * sizeof(int));
    r->ctrl = malloc(2 * (size_t)np * sizeof(MPI_Request));
    if (!r->inbox || !r->peers || !r->ctrl)
        return fsc_error(FSC_ERR_NOMEM, "out of memory for the control exchange");
    if (is_p2p(r->a.kind)) {
        r->peers[0] = r->a.root;
    } else {
        for (int i = 0, q = 0; q < g->size; q++)
            if (q != g->rank) r->peers[i++] = q;
    }
    for (int i = 0; i < 2 * np; i++) r->ctrl[i] = MPI_REQUEST_NULL;
    r->npeers = np;
    if (r->signed_early) return FSC_OK; /* listens only if the peer announces after all */
    int rc = listen(r);
    return rc ? rc : announce(r);
}

/* A signed early allreduce (one peer, eager.c): the peer's first message
 * carries its signature, and no receive waits for an announcement. The same
 * signature: the check passed (*same). Another, or the peer's announcement
 * instead (it issued something else): listen and announce after all, so
 * that both can name both collectives, and finish as any check does. */
static int signed_check(fsc_request *r, bool *same) {
    *same = false;
    int flag = 0;
    fsc_early_peek v = FSC_EARLY_WAIT;
    int rc = r->g->be->early_peek(r->bop, &v);
    if (rc) return rc;
    if (v == FSC_EARLY_SAME) {
        memcpy(r->inbox, r->sig, sizeof r->sig);
        *same = true;
        return FSC_OK;
    }
    if (v == FSC_EARLY_WAIT && (rc = MPI_Iprobe(r->peers[0], ctrl_tag(r), r->g->ctrl, &flag,
                                                MPI_STATUS_IGNORE)) != MPI_SUCCESS)
        return fsc_dist_mpi_error(rc, "MPI_Iprobe(control)");
    if (!flag && v == FSC_EARLY_WAIT) return FSC_OK;
    rc = listen(r);
    return rc ? rc : announce(r);
}

/* Did the peer's announcement match ours? Point-to-point: a send matches a
 * receive of the same count, dtype and tag. */
static bool matches(const fsc_request *r, const int64_t *theirs) {
    const int64_t *mine = r->sig;
    if (is_p2p(r->a.kind))
        return theirs[SIG_KIND] != mine[SIG_KIND] && theirs[SIG_DTYPE] == mine[SIG_DTYPE] &&
               theirs[SIG_COUNT] == mine[SIG_COUNT] && theirs[SIG_ROOT] == mine[SIG_ROOT];
    for (int w = 0; w < SIG_WORDS; w++)
        if (theirs[w] != mine[w]) return false;
    return true;
}

static int desync_error(const fsc_request *r) {
    fsc_group *g = r->g;
    char msg[900], one[160];
    int len;
    if (is_p2p(r->a.kind)) {
        describe_sig(r->sig, one, sizeof one);
        len = snprintf(msg, sizeof msg, "desync on group %s: rank %d issued %s but rank %d ",
                       g->name, g->rank, one, r->peers[0]);
        describe_sig(r->inbox, one, sizeof one);
        snprintf(msg + len, sizeof msg - (size_t)len, "issued %s", one);
        return fsc_error(FSC_ERR_DESYNC, "%s", msg);
    }
    len = snprintf(msg, sizeof msg,
                   "desync on group %s (%d ranks) at collective #%lld: ranks issued different "
                   "collectives:",
                   g->name, g->size, (long long)r->seq);
    for (int q = 0, i = 0; q < g->size && len > 0 && (size_t)len < sizeof msg; q++) {
        const int64_t *s = q == g->rank ? r->sig : r->inbox + (size_t)(i++) * SIG_WORDS;
        describe_sig(s, one, sizeof one);
        len += snprintf(msg + len, sizeof msg - (size_t)len, " rank %d #%lld %s%s", q,
                        (long long)s[SIG_SEQ], one, q + 1 < g->size ? ";" : "");
    }
    return fsc_error(FSC_ERR_DESYNC, "%s", msg);
}

int fsc_wd_test(fsc_request *r, bool *done) {
    *done = true;
    if (r->npeers == 0) return FSC_OK;
    int flag = 0, rc;
    if (!r->announced) { /* signed: Testall below then finds every request complete */
        bool same;
        rc = signed_check(r, &same);
        if (rc || (!same && !r->announced)) {
            *done = false;
            return rc;
        }
    }
    rc = MPI_Testall(2 * r->npeers, r->ctrl, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Testall(control)");
    *done = flag != 0;
    if (!flag) return FSC_OK;
    fsc_group *g = r->g;
    bool ok = true;
    for (int i = 0; i < r->npeers; i++) {
        const int64_t *s = r->inbox + (size_t)i * SIG_WORDS;
        int q = r->peers[i];
        if (!is_p2p(r->a.kind) && s[SIG_SEQ] > g->last_seq[q]) {
            g->last_seq[q] = s[SIG_SEQ];
            g->last_kind[q] = (int)s[SIG_KIND];
        }
        if (!matches(r, s)) ok = false;
    }
    r->npeers = 0; /* every control request has completed */
    if (ok) return FSC_OK;
    rc = desync_error(r);
    g->broken = FSC_ERR_DESYNC;
    snprintf(g->broken_msg, sizeof g->broken_msg, "desync at collective #%lld", (long long)r->seq);
    return rc;
}

/* Latest collective we know rank q entered: from completed announcements,
 * including those of requests not yet tested. */
static int64_t last_seen(const fsc_group *g, int q, int *kind) {
    int64_t best = g->last_seq[q];
    *kind = g->last_kind[q];
    for (const fsc_request *p = fsc_dist_rt.pending_head; p; p = p->next) {
        if (p->g != g || p->npeers == 0 || !p->listening || is_p2p(p->a.kind)) continue;
        for (int i = 0; i < p->npeers; i++) {
            if (p->peers[i] != q) continue;
            int flag = 0;
            MPI_Status st;
            MPI_Request_get_status(p->ctrl[i], &flag, &st);
            if (flag && p->inbox[(size_t)i * SIG_WORDS + SIG_SEQ] > best) {
                best = p->inbox[(size_t)i * SIG_WORDS + SIG_SEQ];
                *kind = (int)p->inbox[(size_t)i * SIG_WORDS + SIG_KIND];
            }
        }
    }
    return best;
}

static int rank_label(const fsc_group *g, int q, char *buf, size_t n) {
    if (g == fsc_dist_rt.world) return snprintf(buf, n, "rank %d", q);
    return snprintf(buf, n, "rank %d (world rank %d)", q, g->world_ranks[q]);
}

int fsc_hb_describe(const hb_peer *st, int n, const bool *never_joined, char *buf, size_t cap,
                    double stall_s, bool at_finalize) {
    int len = 0;
    bool lost = false; /* when some rank is lost, the others are not blamed for waiting on it */
    for (int q = 0; q < n; q++) lost = lost || (!st[q].alive && (st[q].known || st[q].same_host));
    for (int q = 0; q < n && (size_t)len + 2 < cap; q++) {
        const hb_peer *p = &st[q];
        if (len) len += snprintf(buf + len, cap - (size_t)len, "; ");
        int at = len;
        size_t left = cap - (size_t)len;
        if (!p->alive && p->same_host && (p->state == 'X' || p->state == 'Z'))
            len += snprintf(buf + len, left,
                            "world rank %d is lost: its process (pid %d, this "
                            "host) has exited",
                            q, p->pid);
        else if (!p->alive && p->same_host && p->state == 'T')
            len += snprintf(buf + len, left,
                            "world rank %d is lost: no heartbeat, and its "
                            "process (pid %d, this host) is stopped",
                            q, p->pid);
        else if (!p->alive && p->known)
            len += snprintf(buf + len, left,
                            "world rank %d is lost: no heartbeat (died, "
                            "stopped or unreachable)",
                            q);
        else if (!p->alive && at_finalize)
            len += snprintf(buf + len, left,
                            "world rank %d does not answer (the heartbeat never "
                            "reached it)",
                            q);
        else if (p->alive && at_finalize && p->phase != FSC_HB_FINALIZE)
            len += snprintf(buf + len, left,
                            "world rank %d has not reached MPI_Finalize "
                            "(alive; last: %s)",
                            q, p->doing[0] ? p->doing : "no collective");
        else if (p->alive && !lost && !at_finalize && p->phase == FSC_HB_FINALIZE)
            len += snprintf(buf + len, left,
                            "world rank %d has left: it is in MPI_Finalize (last: %s)", q,
                            p->doing[0] ? p->doing : "no collective");
        else if (p->alive && !lost && stall_s > 0 && !p->waiting && p->idle_s >= stall_s)
            len += snprintf(buf + len, left,
                            "world rank %d is stalled: %salive, but outside "
                            "fsc for %.1f s (last: %s)",
                            q, never_joined && never_joined[q] ? "it never joined; " : "",
                            p->idle_s, p->doing[0] ? p->doing : "no collective");
        if (len == at && at >= 2) buf[len = at - 2] = '\0'; /* nothing said of q: drop "; " */
    }
    return (size_t)len < cap ? len : (int)cap - 1;
}

/* The heartbeat's verdict on a failed request: true with out set when some
 * rank is lost or stalled (every survivor gets the same text), false when
 * everyone is alive and in fsc (the control plane's account then stands). */
static bool judge(const fsc_request *r, const char *head, char *out, size_t n) {
    if (fsc_hb_verdict(out, n)) return true;
    int size = fsc_hb_size();
    hb_peer *st = size > 1 ? calloc((size_t)size, sizeof *st) : NULL;
    if (!st) return false;
    double t = fsc_dist_rt.timeout_s, grace = t / 4 < 0.1 ? 0.1 : t / 4 > 0.5 ? 0.5 : t / 4;
    bool found = false, *never = calloc((size_t)size, sizeof *never);
    for (int i = 0; never && !is_p2p(r->a.kind) && i < r->npeers; i++) {
        int flag = 0;
        MPI_Status ms;
        MPI_Request_get_status(r->ctrl[i], &flag, &ms);
        if (!flag) never[r->g->world_ranks[r->peers[i]]] = true;
    }
    bool probed = never && fsc_hb_probe(st, grace);
    if (probed && fsc_hb_verdict(out, n)) {
        found = true; /* a peer's verdict arrived while we probed */
    } else if (probed) {
        char proposal[900];
        int len = snprintf(proposal, sizeof proposal, "%s: ", head);
        int blamed = fsc_hb_describe(st, size, never, proposal + len, sizeof proposal - (size_t)len,
                                     t / 2, false);
        if (blamed > 0) {
            len += blamed;
            int alive = 0;
            for (int q = 0; q < size; q++) alive += st[q].alive;
            if ((size_t)len < sizeof proposal)
                snprintf(proposal + len, sizeof proposal - (size_t)len,
                         " (verdict of the %d of %d world ranks that answer the heartbeat)", alive,
                         size);
            fsc_hb_agree(st, proposal, 1.0, out, n);
            found = true;
        }
    }
    free(never);
    free(st);
    return found;
}

bool fsc_wd_peer_busy(const fsc_request *r) {
    const int size = fsc_hb_size();
    hb_peer *st = size > 1 ? calloc((size_t)size, sizeof *st) : NULL;
    if (!st) return false;
    const double t = fsc_dist_rt.timeout_s, grace = t / 4 < 0.1 ? 0.1 : t / 4 > 0.5 ? 0.5 : t / 4;
    bool busy = false;
    if (fsc_hb_probe(st, grace))
        for (int i = 0; i < r->g->size && !busy; i++) {
            if (i == r->g->rank) continue; /* this rank's own scope does not excuse its peers */
            const int q = r->g->world_ranks[i];
            busy = q >= 0 && q < size && st[q].alive && st[q].busy;
        }
    free(st);
    return busy;
}

int fsc_wd_timeout(fsc_request *r) {
    fsc_group *g = r->g;
    if (r->npeers && !r->listening) listen(r); /* a signed check: who never came shows so */
    char msg[900], who[64], head[300];
    int len;
    const char *kind = fsc_coll_kind_name(r->a.kind);
    if (is_p2p(r->a.kind)) {
        rank_label(g, r->a.root, who, sizeof who);
        snprintf(head, sizeof head,
                 "%s of %lld %s %s %s, tag %d, on group %s, did not complete "
                 "within %g s",
                 kind, (long long)r->a.count, fsc_dtype_name(r->a.dt),
                 r->a.kind == FSC_COLL_SEND ? "to" : "from", who, r->a.tag, g->name,
                 fsc_dist_rt.timeout_s);
        snprintf(msg, sizeof msg, "%s: %s never %s", head, who,
                 r->a.kind == FSC_COLL_SEND ? "received it" : "sent it");
    } else {
        snprintf(head, sizeof head, "%s #%lld on group %s (%d ranks) did not complete within %g s",
                 kind, (long long)r->seq, g->name, g->size, fsc_dist_rt.timeout_s);
        len = snprintf(msg, sizeof msg, "%s:", head);
        int missing = 0;
        for (int i = 0; i < r->npeers && len > 0 && (size_t)len < sizeof msg; i++) {
            int flag = 0;
            MPI_Status st;
            MPI_Request_get_status(r->ctrl[i], &flag, &st);
            if (flag) continue;
            int q = r->peers[i], lk;
            int64_t ls = last_seen(g, q, &lk);
            rank_label(g, q, who, sizeof who);
            if (ls >= 0)
                len += snprintf(msg + len, sizeof msg - (size_t)len,
                                "%s %s never joined (it is at collective #%lld, %s)",
                                missing ? ";" : "", who, (long long)ls, fsc_coll_kind_name(lk));
            else
                len += snprintf(msg + len, sizeof msg - (size_t)len,
                                "%s %s never joined (it has issued no collective on this group)",
                                missing ? ";" : "", who);
            missing++;
        }
        if (!missing && len > 0 && (size_t)len < sizeof msg)
            snprintf(msg + len, sizeof msg - (size_t)len,
                     " every rank joined, but the data transfer did not finish (a peer stalled "
                     "or died)");
    }
    char verdict[900];
    const char *text = judge(r, head, verdict, sizeof verdict) ? verdict : msg;
    g->broken = FSC_ERR_TIMEOUT;
    snprintf(g->broken_msg, sizeof g->broken_msg, "%s #%lld timed out", kind, (long long)r->seq);
    fsc_dist_rt.abandoned = true;
    return fsc_error(FSC_ERR_TIMEOUT, "%s", text);
}

int fsc_wd_peer_failure(fsc_request *r, int rc) {
    if (rc != FSC_ERR_MPI || !fsc_hb_available()) return rc;
    if (r->npeers && !r->listening) listen(r);
    char head[600], verdict[900];
    snprintf(head, sizeof head, "%s #%lld on group %s (%d ranks) failed (%.400s)",
             fsc_coll_kind_name(r->a.kind), (long long)r->seq, r->g->name, r->g->size,
             fsc_last_error());
    if (!judge(r, head, verdict, sizeof verdict)) return rc;
    r->g->broken = FSC_ERR_TIMEOUT;
    snprintf(r->g->broken_msg, sizeof r->g->broken_msg, "a peer was lost");
    fsc_dist_rt.abandoned = true;
    return fsc_error(FSC_ERR_TIMEOUT, "%s", verdict);
}
