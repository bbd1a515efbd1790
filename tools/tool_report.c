/* A tool's errors after MPI start-up, said once per job (tool_report.h). */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "tool_report.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fsc/dist.h"

void tool_report(const char *tool, const char *context, ...) {
    const int world = fsc_dist_size(), me = fsc_dist_rank();
    const int reporter = world > 1 ? fsc_dist_error_reporter() : me;
    if (reporter >= 0 && reporter != me) {
        /* the reporter prints; Open MPI ends the job at the first non-zero
         * exit, which must not come before the reporter's line */
        fflush(NULL);
        struct timespec wait = {2, 0};
        nanosleep(&wait, NULL);
        return;
    }
    char ctx[512];
    va_list ap;
    va_start(ap, context);
    vsnprintf(ctx, sizeof ctx, context, ap);
    va_end(ap);
    if (reporter < 0)
        fprintf(stderr, "%s: rank %d: %s%s\n", tool, me, ctx, fsc_last_error());
    else
        fprintf(stderr, "%s: %s%s\n", tool, ctx, fsc_last_error());
    fflush(stderr);
}

int tool_agree(int rc, const char *what) {
    fsc_group *world = fsc_group_world();
    if (fsc_dist_size() < 2 || !world) return rc;
    char own[1024];
    snprintf(own, sizeof own, "%s", rc ? fsc_last_error() : "");
    /* a failed rank waits for the others a short while, not the watchdog's
     * minutes: peers busy elsewhere (not failing) mean the error is its own */
    const fsc_dist_options quick = {.timeout_s = 10};
    if (rc) fsc_dist_init(NULL, NULL, &quick);
    const int agreed = fsc_group_agree(world, rc, what);
    if (rc && agreed && fsc_dist_error_reporter() < 0) /* no verdict: say our own */
        return fsc_error(rc, "%s", own);
    return agreed;
}
