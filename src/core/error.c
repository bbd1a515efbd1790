/* Status codes and the per-thread error message (docs/architecture.md, decision 8).
 * A failure records what was wrong where it is detected; callers propagate
 * the status and the outermost caller prints fsc_last_error(). */
#include <stdio.h>
#include <string.h>

#include "fsc/core.h"

static _Thread_local char last_error[1024];

const char *fsc_strerror(int status) {
    switch (status) {
    case FSC_OK:
        return "success";
    case FSC_ERR_INVALID:
        return "invalid argument";
    case FSC_ERR_NOMEM:
        return "out of memory";
    case FSC_ERR_IO:
        return "I/O error";
    case FSC_ERR_FORMAT:
        return "malformed file";
    case FSC_ERR_SHAPE:
        return "shape mismatch";
    case FSC_ERR_DTYPE:
        return "dtype error";
    case FSC_ERR_UNSUPPORTED:
        return "unsupported";
    case FSC_ERR_NOT_FOUND:
        return "not found";
    case FSC_ERR_NUMERIC:
        return "non-finite value";
    case FSC_ERR_INTERNAL:
        return "internal error";
    default:
        return "unknown error";
    }
}

const char *fsc_last_error(void) {
    return last_error;
}

void fsc_clear_error(void) {
    last_error[0] = '\0';
}

int fsc_error(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

int fsc_error_context(int status, const char *fmt, ...) {
    char prefix[512], old[sizeof last_error];
    memcpy(old, last_error, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* a message that already names its context is not named twice ("DDP: DDP: ...") */
    if (!strncmp(old, prefix, strlen(prefix))) return status;
    /* truncating a long message is fine: the specifics come first */
    if (snprintf(last_error, sizeof last_error, "%s%s", prefix, old) < 0) last_error[0] = '\0';
    return status;
}
