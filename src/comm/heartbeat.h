/* Internal to src/comm: the heartbeat thread (heartbeat.c) and the verdicts
 * the watchdog builds from it (watchdog.c).
 *
 * The one idea: a rank is alive when its heartbeat thread answers a ping,
 * whatever its main thread is doing; the survivors of a failure report one
 * verdict, chosen by the lowest live rank (see heartbeat.c).
 */
#ifndef FSC_DIST_HEARTBEAT_H
#define FSC_DIST_HEARTBEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dist_internal.h"

/* What the main thread is in, as a peer's answer reports it. */
enum { FSC_HB_INIT = 0, FSC_HB_RUN, FSC_HB_FINALIZE };

/* One rank as a probe saw it. */
typedef struct hb_peer {
    bool alive;     /* answered this probe */
    bool known;     /* the heartbeat reaches it (answered once, or on this host) */
    bool same_host; /* state and pid are from /proc */
    bool waiting;   /* its main thread is in an fsc wait */
    bool busy;      /* ... or on file work under FSC_IO_TIMEOUT_S (fsc_hb_note_busy) */
    char state;     /* /proc state on this host ('R', 'S', 'T' stopped, 'Z'/'X' gone) */
    int phase;      /* FSC_HB_* */
    int pid;
    double idle_s;   /* seconds since its main thread last polled fsc */
    char doing[160]; /* its latest collective, "allreduce #12 on group world" */
} hb_peer;

/* Starts the thread and its socket (before MPI_Init_thread, so the start-up
 * deadline works); FSC_ERR_IO if either fails (the runtime then runs without). */
int fsc_hb_start(void);
/* Collective over MPI_COMM_WORLD: every rank learns every rank's address. */
int fsc_hb_connect(void);
/* Stops and joins the thread (after MPI_Finalize). */
void fsc_hb_stop(void);
/* Arms the deadline of a blocking MPI call (`what`); seconds <= 0 disarms.
 * Past it the thread prints what it knows and _exits FSC_DIST_DEADLINE_EXIT. */
void fsc_hb_arm(double seconds, const char *what);
/* The main thread reports: it polled fsc; it waits (or not) on `doing`. */
void fsc_hb_note_poll(void);
void fsc_hb_note_wait(const char *doing, bool waiting);
/* Busy in fsc on file work (`doing`), across the collectives inside it:
 * peers never take this rank for stalled until fsc_hb_note_busy(NULL). */
void fsc_hb_note_busy(const char *doing);
/* fsc_hb_note_wait(that collective, true), formatted only if a peer asks:
 * kind a static string, seq < 0 for point-to-point (peer, tag), group the
 * group's name (48 bytes). */
void fsc_hb_note_collective(const char *kind, int64_t seq, int peer, int tag, const char *group);
void fsc_hb_set_phase(int phase);
/* Connected, with peers to ask. */
bool fsc_hb_available(void);
int fsc_hb_size(void); /* world size once connected, else 0 */
/* Pings every rank for up to grace seconds; out[world size]. false without a heartbeat. */
bool fsc_hb_probe(hb_peer *out, double grace);
/* A verdict is in force (an atomic load: cheap enough for every poll). */
bool fsc_hb_has_verdict(void);
/* The verdict in force, if any, into out. */
bool fsc_hb_verdict(char *out, size_t n);
/* Agrees on one verdict with the other live ranks of st (a probe's result):
 * the lowest live rank keeps the first proposal it sees; out gets it. */
void fsc_hb_agree(const hb_peer *st, const char *proposal, double grace, char *out, size_t n);

/* heartbeat_host.c. Ranks with one identity see each other's /proc and
 * reach each other's loopback: the same kernel (boot id), PID namespace and
 * network namespace (two network namespaces on one kernel are two hosts to
 * the heartbeat: tests/tools/multihost.py runs ranks so). FSC_HEARTBEAT_PROC=0
 * makes it this process's own, so every peer is remote. */
void fsc_hb_host_identity(char *out, size_t n);
/* This host's IPv4 addresses but loopback, network order, at most max;
 * returns how many. */
int fsc_hb_local_ips(uint32_t *ip, int max);
/* 'R', 'S', 'T' ... from /proc/<pid>/stat; 0 if the process is gone (or
 * not ours to see). */
char fsc_hb_proc_state(int pid);

/* watchdog.c: writes "world rank 2 is lost: ...; world rank 3 is ..." for the
 * ranks of st that are lost, or stalled (alive but outside fsc for stall_s or
 * more; 0: not judged; never_joined[q], if given, adds that q never announced
 * the collective), or already in MPI_Finalize, or, at_finalize, alive but not
 * yet in MPI_Finalize. Live ranks are not blamed when some rank is lost.
 * Returns the characters written (0: nobody to blame). */
int fsc_hb_describe(const hb_peer *st, int n, const bool *never_joined, char *buf, size_t cap,
                    double stall_s, bool at_finalize);

#endif
