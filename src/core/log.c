/* Levelled logging to stderr, and the check of the core's FSC_* variables.
 * The level comes from FSC_LOG_LEVEL once, then from fsc_log_set_level;
 * messages below it cost one comparison. A value outside the documented
 * set is an error, never a silent default. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"

/* Defined beside the variable each parses (mem.c, gemm_bf16.c); the core has
 * no internal header shared with the kernels, so they are declared here. */
int fsc_mem_env_check(void);
int fsc_bf16_gemm_env_check(void);
int fsc_io_env_check(void); /* io/safetensors_mpiio.c */
int fsc_dist_env_check(void); /* dist/env.c: the runtime's timeouts and switches */

static int level = -1; /* -1: not read from the environment yet */

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

/* FSC_LOG_LEVEL into *out (INFO when unset or empty); FSC_ERR_INVALID naming
 * the accepted values otherwise. */
static int level_from_env(int *out) {
    const char *env = getenv("FSC_LOG_LEVEL");
    *out = FSC_LOG_INFO;
    if (!env || !*env) return FSC_OK;
    for (int i = 0; i < 5; i++)
        if (strcmp(env, level_names[i]) == 0) {
            *out = i;
            return FSC_OK;
        }
    return fsc_error(FSC_ERR_INVALID,
                     "FSC_LOG_LEVEL=%.64s: expected one of debug, info, warn, error, off", env);
}

static void init_level(void) {
    int l;
    if (level_from_env(&l)) /* said once, at first use, whatever the level */
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

/* FSC_NUM_THREADS is read by runtime.c (atoi, at first use); its range is
 * checked here so that tools refuse a bad value at start-up. */
static int num_threads_check(void) {
    const char *env = getenv("FSC_NUM_THREADS");
    if (!env || !*env) return FSC_OK;
    char *end;
    long n = strtol(env, &end, 10);
    if (end == env || *end || n < 1 || n > 1024)
        return fsc_error(FSC_ERR_INVALID, "FSC_NUM_THREADS=%.64s: expected an integer in [1, 1024]",
                         env);
    return FSC_OK;
}

int fsc_env_check(void) {
    int l, rc = level_from_env(&l);
    if (!rc) rc = fsc_mem_env_check();
    if (!rc) rc = fsc_bf16_gemm_env_check();
    if (!rc) rc = num_threads_check();
    if (!rc) rc = fsc_io_env_check();
    if (!rc) rc = fsc_dist_env_check();
    return rc;
}
