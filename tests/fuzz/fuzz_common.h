/* What every libFuzzer harness of tests/fuzz shares: a private scratch
 * directory (on /dev/shm when it exists: the readers take paths, and a
 * tmpfs keeps the per-input write cheap), writing one input to a file, and
 * splitting an input into the parts of several files.
 *
 * The one idea: the readers are fuzzed through their public, path-taking
 * entry points, exactly as fsc-train reaches them, so the harness tests the
 * code users run, not a parser pulled out for the occasion.
 */
#ifndef FSC_FUZZ_COMMON_H
#define FSC_FUZZ_COMMON_H

#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/core.h"

static char fuzz_scratch[64];

static int fuzz_remove(const char *p, const struct stat *s, int flag, struct FTW *ftw) {
    (void)s, (void)flag, (void)ftw;
    return remove(p);
}

/* At exit: /dev/shm keeps what is left in it until the machine restarts. */
static void fuzz_cleanup(void) {
    nftw(fuzz_scratch, fuzz_remove, 16, FTW_DEPTH | FTW_PHYS);
}

/* The scratch directory, created once per process, reused across millions
 * of inputs and removed when the process exits normally (a crash leaves it
 * for the post-mortem). */
static const char *fuzz_dir(void) {
    char *dir = fuzz_scratch;
    if (!dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof fuzz_scratch, "%s/fsc_fuzz_XXXXXX", base);
        if (!mkdtemp(dir)) {
            perror("fsc fuzz: mkdtemp");
            abort();
        }
        atexit(fuzz_cleanup);
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

/* The harnesses that read several files from one input split it at the
 * two bytes FF FF (never in valid JSON or text files): the part of
 * data[*at, size) before the next FF FF or the end, in *len bytes; *at moves
 * past the separator. */
static inline const uint8_t *fuzz_part(const uint8_t *data, size_t size, size_t *at, size_t *len) {
    const uint8_t *p = data + *at;
    size_t i = *at;
    while (i + 1 < size && !(data[i] == 0xFF && data[i + 1] == 0xFF)) i++;
    if (i + 1 >= size) i = size;
    *len = i - *at;
    *at = i < size ? i + 2 : size;
    return p;
}

#endif
