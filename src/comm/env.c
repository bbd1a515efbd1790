/* The distributed runtime's FSC_* environment variables, each with its
 * documented range: read here and nowhere else in src/comm, so a value is
 * refused with the same message wherever it is first used (fsc_dist_init)
 * or checked (fsc_env_check, at a tool's start-up).
 *
 *   FSC_TIMEOUT_S       seconds a collective may take, in [0.1, 604800] (default 300)
 *   FSC_INIT_TIMEOUT_S  seconds MPI's start-up / shut-down may take, same range
 *                       (default: the timeout, at least 60)
 *   FSC_DESYNC_CHECK    0 or 1: exchange layouts and check point-to-point too
 *   FSC_HEARTBEAT_PROC  0 or 1 (default 1): 0 treats every peer as remote (tests)
 *
 * Unset or empty means the default.
 */
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

#define SECONDS_MIN 0.1
#define SECONDS_MAX 604800.0 /* a week */

int fsc_dist_env_seconds(const char *name, double *out) {
    const char *env = getenv(name);
    *out = 0;
    if (!env || !*env) return FSC_OK;
    char *end;
    double v = strtod(env, &end);
    if (end == env || *end || !(v >= SECONDS_MIN && v <= SECONDS_MAX))
        return fsc_error(FSC_ERR_INVALID, "%s=%.64s: expected a number of seconds in [0.1, 604800]",
                         name, env);
    *out = v;
    return FSC_OK;
}

int fsc_dist_env_flag(const char *name, bool fallback, bool *out) {
    const char *env = getenv(name);
    *out = fallback;
    if (!env || !*env) return FSC_OK;
    if (strcmp(env, "0") && strcmp(env, "1"))
        return fsc_error(FSC_ERR_INVALID, "%s=%.64s: expected 0 or 1", name, env);
    *out = env[0] == '1';
    return FSC_OK;
}

int fsc_dist_env_check(void); /* for fsc_env_check (core/log.c) */
int fsc_dist_env_check(void) {
    double s;
    bool b;
    int rc = fsc_dist_env_seconds("FSC_TIMEOUT_S", &s);
    if (!rc) rc = fsc_dist_env_seconds("FSC_INIT_TIMEOUT_S", &s);
    if (!rc) rc = fsc_dist_env_flag("FSC_DESYNC_CHECK", false, &b);
    if (!rc) rc = fsc_dist_env_flag("FSC_HEARTBEAT_PROC", true, &b);
    return rc;
}
