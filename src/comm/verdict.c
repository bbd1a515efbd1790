/* What a job's end means to a launcher: whether the watchdog's verdict
 * blames a lost rank (a process that died or no longer answers its
 * heartbeat), the case in which fsc-run relaunches on the survivors. A
 * stalled rank is alive: restarting around it would leave it holding its
 * slot, so it is not this case. */
#include <string.h>

#include "fsc/dist.h"
#include "heartbeat.h"

bool fsc_dist_peer_lost(void) {
    char v[1024];
    /* fsc_hb_describe (watchdog.c) writes "world rank R is lost: ..." */
    return fsc_hb_has_verdict() && fsc_hb_verdict(v, sizeof v) && strstr(v, " is lost") != NULL;
}

int fsc_dist_exit_status(int rc) {
    return rc == FSC_OK ? 0 : fsc_dist_peer_lost() ? FSC_DIST_LOST_EXIT : 1;
}
