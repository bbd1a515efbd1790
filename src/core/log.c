/* Levelled logging to stderr. The level comes from FSC_LOG_LEVEL once, then
 * from fsc_log_set_level; messages below it cost one comparison. A value
 * outside the documented set is an error, never a silent default. */
#include <stdio.h>

#include "fsc/core.h"

static int level = -1; /* -1: not read from the environment yet */

static void init_level(void) {
    int l; /* the table's words are in fsc_log_level's order */
    if (fsc_env_enum("FSC_LOG_LEVEL", &l)) /* said once, at first use, whatever the level */
        fprintf(stderr, "fsc error: %s (using info)\n", fsc_last_error());
    level = l;
}

void fsc_log_set_level(fsc_log_level l) {
    level = (int)l;
}

fsc_log_level fsc_log_get_level(void) {
    if (level < 0) init_level();
    return (fsc_log_level)level;
}

void fsc_log(fsc_log_level l, const char *fmt, ...) {
    if ((int)l < (int)fsc_log_get_level()) return;
    static const char *tags[] = {"debug", "info", "warn", "error"};
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fsc %s: %s\n", tags[l < FSC_LOG_OFF ? l : FSC_LOG_ERROR], line);
}
