/* Requests: the life of one collective from issue to completion, the
 * progress engine that drives every outstanding request, and the waits.
 *
 * The one idea: nothing ever blocks inside MPI. A request advances
 * CONTROL -> READY -> DATA -> DONE whenever anyone polls; data phases of a
 * group start strictly in sequence order (MPI requires collectives on a
 * communicator to start in the same order everywhere), and every wait is a
 * poll loop with a deadline, which is the watchdog.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/profile.h"
#include "heartbeat.h"

static void list_remove(fsc_request *r) {
    if (r->prev)
        r->prev->next = r->next;
    else if (fsc_dist_rt.pending_head == r)
        fsc_dist_rt.pending_head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else if (fsc_dist_rt.pending_tail == r)
        fsc_dist_rt.pending_tail = r->prev;
    r->prev = r->next = NULL;
}

static void request_free(fsc_request *r) {
    if (!r) return;
    list_remove(r);
    fsc_coll_release(r);
    free(r->a.counts);
    free(r->inbox);
    free(r->peers);
    free(r->ctrl);
    free(r->errmsg);
    free(r);
}

/* A request that failed while MPI may still write into its buffers is
 * forgotten, not freed (after a timeout the process is expected to exit). */
void fsc_request_abandon(fsc_request *r) {
    list_remove(r);
}

static void fail(fsc_request *r, int status) {
    r->phase = REQ_FAILED;
    r->status = status;
    free(r->errmsg);
    r->errmsg = strdup(fsc_last_error());
}

int fsc_request_issue(fsc_group *g, const fsc_coll_args *a, fsc_request **out) {
    *out = NULL;
    if (fsc_hb_has_verdict()) { /* a peer is lost: every collective fails with the one verdict */
        char v[900];
        fsc_hb_verdict(v, sizeof v);
        return fsc_error(FSC_ERR_TIMEOUT, "%s", v);
    }
    fsc_hb_note_poll();
    if (g->broken)
        return fsc_error(g->broken, "group %s is unusable after an earlier failure (%s)", g->name,
                         g->broken_msg);
    fsc_request *r = calloc(1, sizeof *r);
    if (!r) return fsc_error(FSC_ERR_NOMEM, "out of memory for a request");
    r->g = g;
    r->a = *a;
    r->a.counts = r->a.displs = NULL;
    if (a->counts) {
        r->a.counts = malloc(2 * (size_t)g->size * sizeof(int64_t));
        if (!r->a.counts) {
            free(r);
            return fsc_error(FSC_ERR_NOMEM, "out of memory for a request");
        }
        r->a.displs = r->a.counts + g->size;
        memcpy(r->a.counts, a->counts, (size_t)g->size * sizeof(int64_t));
        memcpy(r->a.displs, a->displs, (size_t)g->size * sizeof(int64_t));
    }
    bool p2p = a->kind == FSC_COLL_SEND || a->kind == FSC_COLL_RECV;
    r->seq = p2p ? -1 : g->seq++;
    r->checked = p2p ? fsc_dist_rt.full_check && a->root != g->rank : g->size > 1;
    r->t_start = fsc_now();
    if (a->kind < FSC_COLL_KIND_COUNT) g->stats.count[a->kind]++; /* bytes: when data starts */
    fsc_wd_signature(r);
    int rc = fsc_coll_start_early(r); /* first: whether it carries the signature */
    if (!rc) rc = fsc_wd_begin(r);
    if (rc) {
        /* posted messages may be in flight: forget, do not free */
        g->broken = rc;
        fsc_request_abandon(r);
        fsc_dist_rt.abandoned = fsc_dist_rt.abandoned || r->npeers > 0 || r->bop;
        return rc;
    }
    r->prev = fsc_dist_rt.pending_tail;
    if (fsc_dist_rt.pending_tail)
        fsc_dist_rt.pending_tail->next = r;
    else
        fsc_dist_rt.pending_head = r;
    fsc_dist_rt.pending_tail = r;
    *out = r;
    fsc_request_step(r);
    return FSC_OK;
}

int fsc_request_step(fsc_request *r) {
    fsc_group *g = r->g;
    int rc;
    if (r->phase == REQ_CONTROL) {
        bool done;
        rc = fsc_wd_test(r, &done);
        if (rc) {
            fail(r, fsc_wd_peer_failure(r, rc));
            if (rc == FSC_ERR_DESYNC) fsc_coll_settle_early(r); /* every announcement is in */
            return rc;
        }
        if (!done) return FSC_OK;
        r->phase = REQ_READY;
    }
    if (r->phase == REQ_READY) {
        if (g->broken) {
            fail(r, fsc_error(g->broken, "group %s is unusable after an earlier failure (%s)",
                              g->name, g->broken_msg));
            if (r->early) fsc_coll_settle_early(r);
            return r->status;
        }
        if (r->seq >= 0 && r->seq != g->next_data) return FSC_OK; /* an earlier one goes first */
        if (r->seq >= 0) g->next_data++;
        r->phase = REQ_DATA;
        r->early = false; /* checked: an early operation is now an ordinary data phase */
        rc = fsc_coll_start(r);
        if (rc) {
            fail(r, fsc_wd_peer_failure(r, rc));
            return rc;
        }
    }
    if (r->phase == REQ_DATA) {
        bool done = true;
        if (r->bop) {
            rc = g->be->test(r->bop, &done);
            if (rc) {
                fail(r, fsc_wd_peer_failure(r, rc));
                return rc;
            }
        }
        if (!done) return FSC_OK;
        rc = fsc_coll_finish(r);
        if (rc) {
            fail(r, rc);
            return rc;
        }
        fsc_coll_release(r);
        r->phase = REQ_DONE;
    }
    return FSC_OK;
}

static void progress_all(const fsc_group *only) {
    fsc_hb_note_poll();
    fsc_request *p = fsc_dist_rt.pending_head;
    while (p) {
        fsc_request *next = p->next;
        if ((!only || p->g == only) && p->phase < REQ_DONE) fsc_request_step(p);
        p = next;
    }
}

void fsc_group_progress(fsc_group *g) {
    if (g && fsc_dist_rt.initialized) progress_all(g);
}

/* Finished: hand back the outcome and free (or abandon) the request. */
static int collect(fsc_request **req) {
    fsc_request *r = *req;
    *req = NULL;
    if (r->phase == REQ_DONE) {
        request_free(r);
        return FSC_OK;
    }
    int st = r->status;
    fsc_error(st, "%s", r->errmsg ? r->errmsg : fsc_strerror(st));
    if (st == FSC_ERR_TIMEOUT)
        fsc_request_abandon(r);
    else
        request_free(r);
    return st;
}

/* The watchdog: past the timeout, or once the survivors have a verdict. */
static int check_deadline(fsc_request *r) {
    if (r->phase >= REQ_DONE ||
        (fsc_now() - r->t_start <= fsc_dist_rt.timeout_s && !fsc_hb_has_verdict()))
        return FSC_OK;
    /* a peer writing to a slow disk is late, not lost: its own FSC_IO_TIMEOUT_S
     * ends it if the disk never answers, so the wait starts over */
    if (!fsc_hb_has_verdict() && fsc_wd_peer_busy(r)) {
        r->t_start = fsc_now();
        return FSC_OK;
    }
    fail(r, fsc_wd_timeout(r));
    return r->status;
}

int fsc_request_test(fsc_request **req, bool *done) {
    if (done) *done = true;
    if (!req || !*req) return FSC_OK;
    fsc_request *r = *req;
    progress_all(NULL);
    check_deadline(r);
    if (r->phase < REQ_DONE) {
        if (done) *done = false;
        return FSC_OK;
    }
    return collect(req);
}

/* The profiler's span of a wait: the collective, its bytes and how it runs;
 * inside it a "peers" span while the control exchange (every peer's
 * arrival) is not done, so waiting for a late rank and moving data part. */
static bool prof_wait_begin(const fsc_request *r, double *bytes) {
    const fsc_coll_args *a = &r->a;
    int64_t n = a->count;
    for (int i = 0; a->counts && i < r->g->size; i++) n += a->counts[i];
    *bytes = (double)n * (double)fsc_dtype_size(a->dt);
    char detail[192];
    snprintf(detail, sizeof detail, "group %s, %.0f bytes, %s", r->g->name, *bytes,
             r->signed_early ? "eager (signature in the first message)" : "MPI");
    char name[64];
    snprintf(name, sizeof name, "%s %s", fsc_coll_kind_name(a->kind), fsc_dtype_name(a->dt));
    fsc_prof_begin(FSC_PROF_COMM, name, detail);
    if (r->phase >= REQ_DATA) return false;
    fsc_prof_begin(FSC_PROF_COMM_WAIT, "waiting for peers", NULL);
    return true;
}

int fsc_request_wait(fsc_request **req) {
    if (!req || !*req) return FSC_OK;
    fsc_request *r = *req;
    fsc_group *g = r->g;
    double t0 = fsc_now();
    const bool prof = fsc_prof_enabled;
    double bytes = 0;
    bool peers = prof && prof_wait_begin(r, &bytes);
    if (g->size > 1) /* the self group's are not news */
        fsc_hb_note_collective(fsc_coll_kind_name(r->a.kind), r->seq, r->a.root, r->a.tag, g->name);
    else
        fsc_hb_note_wait(NULL, true);
    for (unsigned spins = 0;; spins++) {
        progress_all(NULL);
        if (peers && r->phase >= REQ_DATA) peers = false, fsc_prof_end(0, 0);
        if (r->phase >= REQ_DONE || check_deadline(r)) break;
        /* spin briefly, then give the core away: ranks are often oversubscribed */
        if (spins > 64) sched_yield();
    }
    g->stats.wait_s += fsc_now() - t0;
    if (peers) fsc_prof_end(0, 0);
    if (prof) fsc_prof_end(0, bytes);
    fsc_hb_note_wait(NULL, false);
    return collect(req);
}

int fsc_request_run(fsc_group *g, const fsc_coll_args *a) {
    fsc_request *r;
    int rc = fsc_request_issue(g, a, &r);
    if (rc) return rc;
    return fsc_request_wait(&r);
}
