/* Where the tests find GPT-2's own BPE files (vocab.bpe, encoder.json):
 * FSC_GPT2_BPE_DIR, else ~/.cache/fsc/gpt2; NULL when they are not there
 * (the tests that need them skip). */
#ifndef FSC_TESTS_GPT2_FILES_H
#define FSC_TESTS_GPT2_FILES_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static inline const char *gpt2_dir(void) {
    static char path[512];
    const char *env = getenv("FSC_GPT2_BPE_DIR"), *home = getenv("HOME");
    if (env)
        snprintf(path, sizeof path, "%s", env);
    else
        snprintf(path, sizeof path, "%s/.cache/fsc/gpt2", home ? home : "");
    char probe[600];
    snprintf(probe, sizeof probe, "%s/vocab.bpe", path);
    struct stat st;
    return stat(probe, &st) ? NULL : path;
}

#endif
