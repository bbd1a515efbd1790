/* Levelled logging to stderr. The level comes from FSC_LOG_LEVEL once, then
 * from fsc_log_set_level; messages below it cost one comparison. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"

static int level = -1; /* -1: not read from the environment yet */

static void init_level(void) {
    const char *env = getenv("FSC_LOG_LEVEL");
    level = FSC_LOG_INFO;
    if (!env) return;
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (strcmp(env, names[i]) == 0) level = i;
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
