/* The libFuzzer harnesses of tests/fuzz without libFuzzer: every file named
 * on the command line (a directory: each file in it, in name order) goes once
 * through the harness's LLVMFuzzerTestOneInput, as `fsc_fuzz_<name> -runs=0
 * corpus/` does under libFuzzer.
 *
 * The one idea: the committed corpora (the regression seeds among them)
 * replay as ordinary tests in every pass of scripts/test.sh, the sanitizer
 * pass included, with the compiler that builds the suite; libFuzzer and
 * clang are needed only to search for new inputs (scripts/fuzz.sh).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads path whole and runs it through the harness; 1 when it cannot be read. */
static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t cap = 4096, n = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    const int bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: cannot read\n", path);
        free(buf);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, n); /* a failed check aborts, as under libFuzzer */
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int inputs = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad |= replay_file(argv[i]), inputs++;
            continue;
        }
        struct dirent **names;
        const int n = scandir(argv[i], &names, NULL, alphasort);
        if (n < 0) {
            perror(argv[i]);
            return 1;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
            if (names[k]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode))
                bad |= replay_file(path), inputs++;
            free(names[k]);
        }
        free(names);
    }
    printf("%s: %d inputs replayed\n", argv[0], inputs);
    return bad || inputs == 0; /* no input at all: a wrong corpus path */
}
