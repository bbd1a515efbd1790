/* The heartbeat: who is alive, agreed by the survivors before anyone reports
 * (docs/architecture.md, decision 8), and the deadline of MPI's start-up and shut-down.
 *
 * The one idea: liveness is asked of a thread, not of MPI. Every process runs
 * one small thread that never calls MPI (MPI runs FUNNELED): it answers UDP
 * pings on a socket whose address every rank learnt at start-up, reporting
 * what its main thread is doing. A rank killed or stopped (SIGSTOP) does not
 * answer; a live rank answers even while its main thread computes or sleeps.
 * When a collective times out or a transfer fails, the rank pings everyone;
 * the lowest rank that answered is the coordinator and keeps the first
 * verdict it is given (its own or a peer's), which every survivor then
 * fetches or is sent: so the message is one text, identical on every
 * survivor, and names only ranks that did not answer (or that answer but
 * have left fsc for most of the timeout: stalled). The same thread watches
 * MPI_Init_thread and MPI_Finalize: past their deadline it prints what it
 * knows and ends the process, instead of a silent hang.
 *
 * Peers on this host (same boot id and PID namespace) are also looked up in
 * /proc, which tells at once whether a silent one exited or is stopped; the
 * others get the whole grace period to answer. (FSC_HEARTBEAT_PROC=0 treats
 * every peer as remote: tests of that path on one machine.)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "heartbeat.h"

enum { HB_PING = 1, HB_PONG, HB_PROPOSE, HB_VERDICT, HB_ACK };
#define HB_MAGIC 0x46534348u /* "FSCH" */
#define HB_MAX_IPS 4
#define HB_TEXT 900

typedef struct {
    uint32_t magic, type;
    uint64_t token;
    int32_t from, phase, waiting, busy; /* busy: on file work (fsc_hb_note_busy) */
    int64_t idle_us;
    char text[HB_TEXT]; /* PONG: the main thread's last collective; PROPOSE/VERDICT: the message */
} hb_msg;

typedef struct {
    uint32_t ip[HB_MAX_IPS]; /* network order */
    int32_t nip, port, pid;
    char host[64]; /* boot id + PID and network namespaces (fsc_hb_host_identity) */
} hb_addr;

static struct {
    pthread_mutex_t mu;
    pthread_t thread;
    bool running;
    atomic_bool stop;
    int sock;
    int rank, size;
    uint64_t token;
    atomic_bool connected; /* set (release) once the fields below are */
    hb_addr me, *peers;    /* [size] once connected */
    bool *reachable;       /* [size] answered once (or on this host) */
    hb_peer *seen;         /* [size] latest answer of each rank */
    double *seen_at;       /* [size] when (fsc_now), 0: never */
    bool *acked;           /* [size] took our verdict */
    /* the main thread's doings, for PONGs */
    _Atomic int64_t last_poll_us;
    atomic_int phase, waiting;
    char doing[160];
    /* file work in progress (fsc_hb_note_busy): counts as waiting in fsc
     * whatever collectives come and go inside it */
    atomic_int busy;
    char busy_doing[160];
    /* or, when coll_kind is set, a collective's fields: formatted only when
     * asked, since a wait is noted on every blocking call */
    const char *coll_kind;
    int64_t coll_seq;
    int coll_peer, coll_tag;
    char coll_group[48];
    /* the verdict: set once, then every failure reports it */
    atomic_bool has_verdict;
    char verdict[HB_TEXT];
    /* deadline of MPI's start-up or shut-down; 0: none */
    double deadline, armed_at;
    char armed_what[64];
    int next_hello; /* round-robin: unreached peers pinged in the background */
} hb = {.mu = PTHREAD_MUTEX_INITIALIZER, .sock = -1};

static int64_t now_us(void) {
    return (int64_t)(fsc_now() * 1e6);
}

/* ---- this process ------------------------------------------------------------ */

/* What the main thread is doing, as text; the caller holds hb.mu. */
static void format_doing(char *out, size_t n) {
    if (atomic_load(&hb.busy) && !atomic_load(&hb.waiting))
        snprintf(out, n, "%s", hb.busy_doing);
    else if (!hb.coll_kind)
        snprintf(out, n, "%s", hb.doing);
    else if (hb.coll_seq >= 0)
        snprintf(out, n, "%s #%lld on group %s", hb.coll_kind, (long long)hb.coll_seq,
                 hb.coll_group);
    else
        snprintf(out, n, "%s with rank %d, tag %d, on group %s", hb.coll_kind, hb.coll_peer,
                 hb.coll_tag, hb.coll_group);
}

static bool connected(void) {
    return atomic_load_explicit(&hb.connected, memory_order_acquire);
}

static bool same_host(int q) {
    return !strcmp(hb.peers[q].host, hb.me.host);
}

/* ---- datagrams ------------------------------------------------------------------ */

static void send_to(int q, hb_msg *m) {
    if (!connected() || q < 0 || q >= hb.size || q == hb.rank || !hb.peers[q].port) return;
    m->magic = HB_MAGIC;
    m->token = hb.token;
    m->from = hb.rank;
    size_t len = offsetof(hb_msg, text) + strnlen(m->text, HB_TEXT - 1) + 1;
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hb.peers[q].port)};
    if (same_host(q) || hb.peers[q].nip == 0) {
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sendto(hb.sock, m, len, MSG_DONTWAIT, (struct sockaddr *)&to, sizeof to);
        return;
    }
    for (int i = 0; i < hb.peers[q].nip; i++) {
        to.sin_addr.s_addr = hb.peers[q].ip[i];
        sendto(hb.sock, m, len, MSG_DONTWAIT, (struct sockaddr *)&to, sizeof to);
    }
}

static void send_type(int q, uint32_t type, const char *text) {
    hb_msg m;
    memset(&m, 0, offsetof(hb_msg, text));
    m.type = type;
    snprintf(m.text, sizeof m.text, "%s", text ? text : "");
    send_to(q, &m);
}

/* Sets the verdict unless one is set; returns the one in force (into out). */
static void adopt(const char *text, char *out, size_t n) {
    pthread_mutex_lock(&hb.mu);
    if (!atomic_load(&hb.has_verdict)) {
        snprintf(hb.verdict, sizeof hb.verdict, "%s", text);
        atomic_store(&hb.has_verdict, true);
    }
    if (out) snprintf(out, n, "%s", hb.verdict);
    pthread_mutex_unlock(&hb.mu);
}

static void handle(const hb_msg *m, size_t len) {
    if (len < offsetof(hb_msg, text) + 1 || m->magic != HB_MAGIC || m->token != hb.token ||
        !connected() || m->from < 0 || m->from >= hb.size)
        return;
    char text[HB_TEXT];
    size_t tl = len - offsetof(hb_msg, text);
    memcpy(text, m->text, tl < sizeof text ? tl : sizeof text);
    text[(tl < sizeof text ? tl : sizeof text) - 1] = '\0';
    int q = m->from;
    switch (m->type) {
    case HB_PING: {
        hb_msg r;
        memset(&r, 0, offsetof(hb_msg, text));
        r.type = HB_PONG;
        r.phase = atomic_load(&hb.phase);
        r.busy = atomic_load(&hb.busy);
        r.waiting = atomic_load(&hb.waiting) || r.busy;
        r.idle_us = now_us() - atomic_load(&hb.last_poll_us);
        pthread_mutex_lock(&hb.mu);
        format_doing(r.text, sizeof r.text);
        pthread_mutex_unlock(&hb.mu);
        send_to(q, &r);
        break;
    }
    case HB_PONG:
        pthread_mutex_lock(&hb.mu);
        hb.reachable[q] = true;
        hb.seen[q].phase = m->phase;
        hb.seen[q].waiting = m->waiting != 0;
        hb.seen[q].busy = m->busy != 0;
        hb.seen[q].idle_s = (double)m->idle_us * 1e-6;
        snprintf(hb.seen[q].doing, sizeof hb.seen[q].doing, "%.159s", text);
        hb.seen_at[q] = fsc_now();
        pthread_mutex_unlock(&hb.mu);
        break;
    case HB_PROPOSE: { /* we coordinate: the first verdict we hear of stands */
        char v[HB_TEXT];
        bool first = !atomic_load(&hb.has_verdict);
        adopt(text, v, sizeof v);
        send_type(q, HB_VERDICT, v);
        for (int p = 0; first && p < hb.size; p++)
            if (p != q) send_type(p, HB_VERDICT, v);
        break;
    }
    case HB_VERDICT:
        adopt(text, NULL, 0);
        send_type(q, HB_ACK, "");
        break;
    case HB_ACK:
        pthread_mutex_lock(&hb.mu);
        hb.acked[q] = true;
        pthread_mutex_unlock(&hb.mu);
        break;
    }
}

/* Reads every datagram waiting, for up to wait_ms. */
static void pump(int wait_ms) {
    struct pollfd p = {.fd = hb.sock, .events = POLLIN};
    if (poll(&p, 1, wait_ms) <= 0) return;
    hb_msg m;
    ssize_t n;
    while ((n = recv(hb.sock, &m, sizeof m, MSG_DONTWAIT)) > 0) handle(&m, (size_t)n);
}

/* ---- probing -------------------------------------------------------------------- */

/* Pings every peer for up to grace seconds (until all answered); out[q] gets
 * what q said, or alive = false. own_pump: the caller is the thread itself. */
static void probe(hb_peer *out, double grace, bool own_pump) {
    double t0 = fsc_now(), last_ping = -1;
    for (;;) {
        double t = fsc_now();
        int silent = 0;
        pthread_mutex_lock(&hb.mu);
        for (int q = 0; q < hb.size; q++) {
            if (q == hb.rank) continue;
            if (hb.seen_at[q] >= t0) continue;
            char st = same_host(q) ? fsc_hb_proc_state(hb.peers[q].pid) : 'R';
            if (same_host(q) && (st == 0 || st == 'Z' || st == 'X' || st == 'T')) continue;
            silent++;
        }
        pthread_mutex_unlock(&hb.mu);
        if (!silent || t - t0 >= grace) break;
        if (t - last_ping >= 0.05) {
            pthread_mutex_lock(&hb.mu);
            for (int q = 0; q < hb.size; q++)
                if (q != hb.rank && hb.seen_at[q] < t0) send_type(q, HB_PING, "");
            pthread_mutex_unlock(&hb.mu);
            last_ping = t;
        }
        if (own_pump)
            pump(5);
        else
            usleep(2000);
    }
    pthread_mutex_lock(&hb.mu);
    for (int q = 0; q < hb.size; q++) {
        out[q] = hb.seen[q];
        out[q].alive = q == hb.rank || hb.seen_at[q] >= t0;
        out[q].known = out[q].alive || hb.reachable[q] || same_host(q);
        out[q].state = q != hb.rank && same_host(q) ? fsc_hb_proc_state(hb.peers[q].pid) : 'R';
        if (!out[q].state) out[q].state = 'X';
        out[q].pid = hb.peers[q].pid;
        out[q].same_host = q != hb.rank && same_host(q);
    }
    hb_peer *self = &out[hb.rank];
    self->phase = atomic_load(&hb.phase);
    self->waiting = true; /* whatever it does, this rank is not the one to blame */
    self->idle_s = 0;
    format_doing(self->doing, sizeof self->doing);
    pthread_mutex_unlock(&hb.mu);
}

static void agree(const hb_peer *st, const char *proposal, double grace, char *out, size_t n,
                  bool own_pump);

/* ---- the thread ----------------------------------------------------------------- */

/* early: a peer was found lost before the deadline (armed_peer_lost) */
static void deadline_passed(bool early) {
    char msg[HB_TEXT], proposal[HB_TEXT];
    int len = early ? snprintf(proposal, sizeof proposal,
                               "fsc: %s cannot complete (after %.1f s of its %g s deadline)",
                               hb.armed_what, fsc_now() - hb.armed_at, hb.deadline - hb.armed_at)
                    : snprintf(proposal, sizeof proposal, "fsc: %s did not return within %g s",
                               hb.armed_what, hb.deadline - hb.armed_at);
    hb_peer *st = connected() && hb.size > 1 ? calloc((size_t)hb.size, sizeof *st) : NULL;
    /* MPI_Finalize, or a blocking call while running (a group split) */
    bool at_finalize = atomic_load(&hb.phase) == FSC_HB_FINALIZE;
    if (st && !fsc_hb_verdict(msg, sizeof msg)) {
        probe(st, 0.5, true);
        len += snprintf(proposal + len, sizeof proposal - (size_t)len, ": ");
        if (!fsc_hb_describe(st, hb.size, NULL, proposal + len, sizeof proposal - (size_t)len, 0.0,
                             at_finalize))
            snprintf(proposal + len, sizeof proposal - (size_t)len, "%s",
                     at_finalize ? "every rank answers the heartbeat and is in MPI_Finalize"
                                 : "every rank answers the heartbeat");
        agree(st, proposal, 1.0, msg, sizeof msg, true);
    } else if (st) {
        /* the verdict was reached elsewhere; still say what this rank was in,
         * unless the verdict already does (a peer's deadline on the same
         * call, e.g. MPI_Finalize: the survivors then print one text) */
        char verdict[HB_TEXT], mine[HB_TEXT];
        fsc_hb_verdict(verdict, sizeof verdict);
        snprintf(mine, sizeof mine, "fsc: %s ", hb.armed_what);
        if (!strncmp(verdict, mine, strlen(mine)))
            snprintf(msg, sizeof msg, "%s", verdict);
        else
            snprintf(msg, sizeof msg, "%.300s: %.590s", proposal, verdict);
    } else {
        const char *r = getenv("OMPI_COMM_WORLD_RANK"), *n = getenv("OMPI_COMM_WORLD_SIZE");
        if (!r) r = getenv("PMI_RANK"), n = getenv("PMI_SIZE");
        if (!r) r = getenv("PMIX_RANK");
        snprintf(msg, sizeof msg,
                 "%.200s (world rank %.16s of %.16s, as the launcher says): a peer process did not "
                 "start, died or stalled",
                 proposal, r ? r : "?", n ? n : "?");
    }
    free(st);
    fprintf(stderr, "%s; ending this process (status %d)\n", msg, FSC_DIST_DEADLINE_EXIT);
    fflush(stderr);
    _exit(FSC_DIST_DEADLINE_EXIT);
}

/* Whether a peer is lost while a blocking call of the running phase is
 * armed (a group split, an MPI-IO save under FSC_IO_TIMEOUT_S): such a call
 * would otherwise wait for its whole deadline on a dead peer. A peer counts
 * as lost when its process on this host has exited, or when it misses two
 * probes of `grace` seconds in a row (a loaded peer may miss one). */
static bool armed_peer_lost(int *missed, double grace) {
    if (!connected() || hb.size < 2 || atomic_load(&hb.phase) != FSC_HB_RUN) return false;
    hb_peer *st = calloc((size_t)hb.size, sizeof *st);
    if (!st) return false;
    probe(st, grace, true);
    bool lost = false;
    for (int q = 0; q < hb.size; q++) {
        const hb_peer *p = &st[q];
        const bool gone = !p->alive && p->same_host && (p->state == 'X' || p->state == 'Z');
        const bool silent = !p->alive && (p->known || p->same_host);
        missed[q] = silent ? missed[q] + 1 : 0;
        lost = lost || gone || missed[q] >= 2;
    }
    free(st);
    return lost;
}

static void *thread_main(void *arg) {
    (void)arg;
    int *missed = NULL; /* per peer: probes missed in a row while armed */
    double checked = 0; /* when armed_peer_lost last ran */
    while (!atomic_load(&hb.stop)) {
        pump(50);
        pthread_mutex_lock(&hb.mu);
        double d = hb.deadline, at = hb.armed_at;
        pthread_mutex_unlock(&hb.mu);
        /* a probe a second, each waiting up to 2 s for answers; under a
         * communication timeout T below 8 s, every T/4 and T/4: a remote peer
         * (no /proc to ask) is then found lost within 3T/4 (a check's wait,
         * two missed probes), and with the verdict's agreement within T + 1 s,
         * as the watchdog names one elsewhere */
        const double t = fsc_dist_rt.timeout_s > 0 ? fsc_dist_rt.timeout_s : 300;
        const double now = fsc_now(), every = t / 4 < 1.0 ? t / 4 : 1.0;
        const double grace = t / 4 < 2.0 ? t / 4 : 2.0;
        if (d > 0 && now > d) deadline_passed(false);
        if (d > 0 && now - at >= every && now - checked >= every && connected() && hb.size > 1) {
            if (!missed) missed = calloc((size_t)hb.size, sizeof *missed);
            checked = now;
            if (missed && armed_peer_lost(missed, grace)) deadline_passed(true);
        } else if (d <= 0 && missed) {
            memset(missed, 0, sizeof *missed * (size_t)hb.size);
        }
        /* learn, a peer at a time, which remote peers the heartbeat reaches */
        if (connected() && hb.size > 1) {
            int q = hb.next_hello++ % hb.size;
            if (q != hb.rank && !hb.reachable[q]) send_type(q, HB_PING, "");
        }
    }
    free(missed);
    return NULL;
}

int fsc_hb_start(void) {
    if (hb.running) return FSC_OK;
    hb.sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t al = sizeof a;
    if (hb.sock < 0 || bind(hb.sock, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(hb.sock, (struct sockaddr *)&a, &al) != 0) {
        if (hb.sock >= 0) close(hb.sock);
        hb.sock = -1;
        return fsc_error(FSC_ERR_IO, "heartbeat: no UDP socket (%s)", strerror(errno));
    }
    hb.me.port = ntohs(a.sin_port);
    hb.me.pid = (int32_t)getpid();
    fsc_hb_host_identity(hb.me.host, sizeof hb.me.host);
    hb.me.nip = fsc_hb_local_ips(hb.me.ip, HB_MAX_IPS);
    atomic_store(&hb.stop, false);
    atomic_store(&hb.last_poll_us, now_us());
    if (pthread_create(&hb.thread, NULL, thread_main, NULL) != 0) {
        close(hb.sock);
        hb.sock = -1;
        return fsc_error(FSC_ERR_IO, "heartbeat: cannot start its thread");
    }
    hb.running = true;
    return FSC_OK;
}

int fsc_hb_connect(void) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    hb_addr *peers = calloc((size_t)size, sizeof *peers);
    bool *reach = calloc(2 * (size_t)size, sizeof *reach);
    hb_peer *seen = calloc((size_t)size, sizeof *seen);
    double *at = calloc((size_t)size, sizeof *at);
    uint64_t token = 0; /* rank 0's, unguessable: datagrams without it are dropped */
    if (getrandom(&token, sizeof token, GRND_NONBLOCK) != (ssize_t)sizeof token)
        token = ((uint64_t)getpid() << 32) ^ (uint64_t)now_us();
    if (!peers || !reach || !seen || !at) {
        free(peers), free(reach), free(seen), free(at);
        return fsc_error(FSC_ERR_NOMEM, "heartbeat: out of memory");
    }
    int rc = MPI_Allgather(&hb.me, (int)sizeof hb.me, MPI_BYTE, peers, (int)sizeof hb.me, MPI_BYTE,
                           MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(&token, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS || !hb.running) { /* without one here: what MPI shows, as before */
        free(peers), free(reach), free(seen), free(at);
        return rc != MPI_SUCCESS ? fsc_dist_mpi_error(rc, "MPI_Allgather(heartbeat addresses)")
                                 : FSC_OK;
    }
    pthread_mutex_lock(&hb.mu);
    hb.rank = rank;
    hb.size = size;
    hb.token = token;
    hb.reachable = reach;
    hb.acked = reach + size;
    hb.seen = seen;
    hb.seen_at = at;
    hb.peers = peers;
    pthread_mutex_unlock(&hb.mu);
    atomic_store_explicit(&hb.connected, true, memory_order_release);
    /* learn now which peers the heartbeat reaches (each answers within
     * milliseconds once connected; the grace covers the slowest to get here) */
    hb_peer *st = size > 1 ? calloc((size_t)size, sizeof *st) : NULL;
    if (st) probe(st, 1.0, false);
    free(st);
    return FSC_OK;
}

void fsc_hb_stop(void) {
    if (!hb.running) return;
    atomic_store(&hb.stop, true);
    pthread_join(hb.thread, NULL);
    atomic_store(&hb.connected, false);
    close(hb.sock);
    hb.sock = -1;
    hb.running = false;
    pthread_mutex_lock(&hb.mu);
    free(hb.peers), free(hb.reachable), free(hb.seen), free(hb.seen_at);
    hb.peers = NULL, hb.reachable = hb.acked = NULL, hb.seen = NULL, hb.seen_at = NULL;
    hb.deadline = 0;
    atomic_store(&hb.has_verdict, false);
    pthread_mutex_unlock(&hb.mu);
}

void fsc_hb_arm(double seconds, const char *what) {
    pthread_mutex_lock(&hb.mu);
    hb.armed_at = fsc_now();
    hb.deadline = seconds > 0 ? hb.armed_at + seconds : 0;
    snprintf(hb.armed_what, sizeof hb.armed_what, "%s", what);
    pthread_mutex_unlock(&hb.mu);
}

/* ---- the main thread's side ------------------------------------------------------ */

void fsc_hb_note_poll(void) {
    atomic_store_explicit(&hb.last_poll_us, now_us(), memory_order_relaxed);
}

void fsc_hb_note_wait(const char *doing, bool waiting) {
    fsc_hb_note_poll();
    atomic_store(&hb.waiting, waiting);
    if (!doing) return;
    pthread_mutex_lock(&hb.mu);
    snprintf(hb.doing, sizeof hb.doing, "%s", doing);
    hb.coll_kind = NULL;
    pthread_mutex_unlock(&hb.mu);
}

void fsc_hb_note_busy(const char *doing) {
    fsc_hb_note_poll();
    if (!doing) {
        atomic_store(&hb.busy, 0);
        return;
    }
    pthread_mutex_lock(&hb.mu);
    snprintf(hb.busy_doing, sizeof hb.busy_doing, "%s", doing);
    pthread_mutex_unlock(&hb.mu);
    atomic_store(&hb.busy, 1);
}

void fsc_hb_note_collective(const char *kind, int64_t seq, int peer, int tag, const char *group) {
    fsc_hb_note_poll();
    atomic_store(&hb.waiting, 1);
    pthread_mutex_lock(&hb.mu);
    hb.coll_kind = kind;
    hb.coll_seq = seq, hb.coll_peer = peer, hb.coll_tag = tag;
    memcpy(hb.coll_group, group, sizeof hb.coll_group); /* a group's name[48], NUL-terminated */
    pthread_mutex_unlock(&hb.mu);
}

void fsc_hb_set_phase(int phase) {
    atomic_store(&hb.phase, phase);
}

bool fsc_hb_has_verdict(void) {
    return atomic_load_explicit(&hb.has_verdict, memory_order_relaxed);
}

bool fsc_hb_verdict(char *out, size_t n) {
    if (!atomic_load(&hb.has_verdict)) return false;
    adopt("", out, n);
    return true;
}

bool fsc_hb_available(void) {
    return hb.running && connected() && hb.size > 1;
}

bool fsc_hb_probe(hb_peer *out, double grace) {
    if (!fsc_hb_available()) return false;
    probe(out, grace, false);
    return true;
}

int fsc_hb_size(void) {
    return connected() ? hb.size : 0;
}

void fsc_hb_agree(const hb_peer *st, const char *proposal, double grace, char *out, size_t n) {
    agree(st, proposal, grace, out, n, false);
}

/* Waits a little: reading the socket when the caller is the thread itself. */
static void nap(bool own_pump) {
    if (own_pump)
        pump(2);
    else
        usleep(2000);
}

static void agree(const hb_peer *st, const char *proposal, double grace, char *out, size_t n,
                  bool own_pump) {
    int c = hb.rank;
    for (int q = 0; q < hb.size; q++)
        if (st[q].alive) {
            c = q;
            break;
        }
    if (c == hb.rank) {
        /* we coordinate: our proposal, unless a peer's came first; then every
         * survivor must hold it before we return (and this process may exit) */
        adopt(proposal, out, n);
        pthread_mutex_lock(&hb.mu);
        for (int q = 0; q < hb.size; q++) hb.acked[q] = false;
        pthread_mutex_unlock(&hb.mu);
        for (int q = 0; q < hb.size; q++) /* the silent too: a stopped rank reads it on waking */
            if (q != hb.rank && !st[q].alive) send_type(q, HB_VERDICT, out);
        for (double t0 = fsc_now(), last = -1; fsc_now() - t0 < grace;) {
            int missing = 0;
            pthread_mutex_lock(&hb.mu);
            for (int q = 0; q < hb.size; q++)
                missing += q != hb.rank && st[q].alive && !hb.acked[q];
            pthread_mutex_unlock(&hb.mu);
            if (!missing) break;
            if (fsc_now() - last >= 0.05) {
                for (int q = 0; q < hb.size; q++)
                    if (q != hb.rank && st[q].alive && !hb.acked[q]) send_type(q, HB_VERDICT, out);
                last = fsc_now();
            }
            nap(own_pump);
        }
        return;
    }
    for (double t0 = fsc_now(), last = -1; fsc_now() - t0 < grace;) {
        if (fsc_hb_verdict(out, n)) return;
        if (fsc_now() - last >= 0.05) {
            send_type(c, HB_PROPOSE, proposal);
            last = fsc_now();
        }
        nap(own_pump);
    }
    adopt(proposal, out, n); /* the coordinator went silent: our own view */
}
