/* One verdict from every rank's status: a step that must succeed everywhere
 * or nowhere (a file written in parts, a checkpoint's commit) asks each rank
 * how its part went, and every rank then returns the same status with the
 * first failing rank's own message, so the job stops naming who failed and
 * why, whichever rank prints. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/dist.h"

/* The latest verdict this thread agreed on and the world rank that found it:
 * a tool prints a verdict once, from that rank (fsc_dist_error_reporter). */
static _Thread_local char agreed_text[1024];
static _Thread_local int agreed_reporter = -1;

/* msg is a verdict this group already agreed on (an inner step's): passed on
 * as it is, not wrapped in a second "rank R of group G failed". */
static bool agreed_before(const char *msg, const fsc_group *g) {
    char name[128];
    int rank, at = 0;
    if (sscanf(msg, "rank %d of group %127s failed %n", &rank, name, &at) < 2 || !at) return false;
    return !strcmp(name, fsc_group_name(g));
}

int fsc_group_agree(fsc_group *g, int rc, const char *what) {
    if (!g || fsc_group_size(g) == 1) return rc;
    const int me = fsc_group_rank(g), world = fsc_group_size(g);
    int32_t *all = calloc((size_t)world, sizeof *all), mine = rc;
    int32_t text[256] = {0}; /* 1024 bytes of message */
    if (!all) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory agreeing on the outcome", what);
    int crc = fsc_group_allgather(g, &mine, all, 1, FSC_DTYPE_I32);
    int q = 0;
    while (!crc && q < world && all[q] == 0) q++;
    const int status = crc ? crc : q < world ? all[q] : FSC_OK;
    free(all);
    if (crc) return fsc_error_context(crc, "%s: ", what);
    if (!status) return FSC_OK;
    if (me == q && agreed_before(fsc_last_error(), g))
        snprintf((char *)text, sizeof text, "%s", fsc_last_error());
    else if (me == q)
        snprintf((char *)text, sizeof text, "rank %d of group %s failed %s: %s", q,
                 fsc_group_name(g), what, fsc_last_error());
    crc = fsc_group_broadcast(g, text, 256, FSC_DTYPE_I32, q);
    if (crc) return fsc_error_context(crc, "%s: ", what);
    ((char *)text)[sizeof text - 1] = '\0';
    snprintf(agreed_text, sizeof agreed_text, "%s", (char *)text);
    agreed_reporter = fsc_group_world_rank(g, q);
    return fsc_error(status, "%s", (char *)text);
}

int fsc_dist_error_reporter(void) {
    /* the verdict still stands while the current message carries it
     * (fsc_error_context prefixes, and may cut the end: its head is enough);
     * any other error is this rank's */
    char head[257];
    const size_t n = strnlen(agreed_text, sizeof head - 1);
    memcpy(head, agreed_text, n);
    head[n] = '\0';
    if (agreed_reporter < 0 || !head[0] || !strstr(fsc_last_error(), head)) return -1;
    return agreed_reporter;
}
