/* What every libFuzzer harness of tests/fuzz shares: a private scratch
 * directory (on /dev/shm when it exists: the readers take paths, and a
 * tmpfs keeps the per-input write cheap) and writing one input to a file.
 *
 * The one idea: the readers are fuzzed through their public, path-taking
 * entry points, exactly as fsc-train reaches them, so the harness tests the
 * code users run, not a parser pulled out for the occasion.
 */
#ifndef FSC_FUZZ_COMMON_H
#define FSC_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/core.h"

/* The scratch directory, created once per process (removed by the OS: it is
 * tiny and reused across millions of inputs). */
static const char *fuzz_dir(void) {
    static char dir[64];
    if (!dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof dir, "%s/fsc_fuzz_XXXXXX", base);
        if (!mkdtemp(dir)) {
            perror("fsc fuzz: mkdtemp");
            abort();
        }
        fsc_log_set_level(FSC_LOG_ERROR); /* refusals are the expected outcome */
    }
    return dir;
}

/* "<scratch>/name" in a static buffer. */
static const char *fuzz_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", fuzz_dir(), name);
    return buf;
}

/* Writes data to path (replacing it); aborts if the scratch file system fails. */
static void fuzz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

#endif
