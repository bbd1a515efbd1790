/* A rank busy on its disk is busy in fsc: while it writes, syncs or
 * re-reads a file, its peers (waiting for it in a collective) must not take
 * it for a stalled rank, and a disk that never answers must still end the
 * job. So every stretch of file work of the io floor runs inside one scope
 * that tells the heartbeat "busy in fsc: <what>" and arms FSC_IO_TIMEOUT_S
 * (default 600 s) instead of the communication timeout. Scopes nest (a
 * checkpoint's commit around its files' writes); the outermost one speaks
 * for the whole stretch. */
#include <stdbool.h>
#include <stdio.h>

#include "comm/heartbeat.h"
#include "io/io_internal.h"

static _Thread_local int depth;
static _Thread_local bool quiet; /* a background thread: it never speaks for the rank */

void fsc_io_busy_quiet(void) {
    quiet = true;
}

int fsc_io_busy_begin(const char *what) {
    if (quiet || depth++ > 0) return FSC_OK;
    double timeout; /* 600 s unless set; its range is the environment table's */
    int rc = fsc_env_double("FSC_IO_TIMEOUT_S", &timeout);
    if (rc) {
        depth--;
        return rc;
    }
    char doing[160]; /* what peers and the deadline's message show */
    snprintf(doing, sizeof doing, "%.120s (FSC_IO_TIMEOUT_S)", what);
    fsc_hb_note_busy(doing); /* never taken for a stalled peer, even between collectives */
    fsc_hb_arm(timeout, doing);
    return FSC_OK;
}

void fsc_io_busy_end(void) {
    if (quiet || depth == 0 || --depth > 0) return;
    fsc_hb_arm(0, "");
    fsc_hb_note_busy(NULL);
}
