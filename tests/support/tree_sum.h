/* A fingerprint of everything under a directory, for the fault tests'
 * second assertion: a refused input or a killed save leaves what was saved
 * before it exactly as it was.
 *
 * The one idea: every entry contributes a hash of (relative path, type,
 * contents: a file's bytes, a link's target, nothing for a FIFO or device,
 * which are never opened), and the contributions are added, so the sum does
 * not depend on the order readdir gives. Any file changed, added, removed,
 * renamed or retyped changes it (up to 64-bit collisions).
 */
#ifndef FSC_TEST_TREE_SUM_H
#define FSC_TEST_TREE_SUM_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t tree_sum_acc;
static size_t tree_sum_root;

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int tree_sum_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)flag, (void)ftw;
    const char *rel = path + tree_sum_root;
    uint64_t h = fnv1a(14695981039346656037ull, rel, strlen(rel) + 1);
    const unsigned type = st->st_mode & S_IFMT;
    h = fnv1a(h, &type, sizeof type);
    if (S_ISREG(st->st_mode)) {
        FILE *f = fopen(path, "rb");
        if (!f) return -1;
        char buf[1 << 14];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = fnv1a(h, buf, n);
        fclose(f);
    } else if (S_ISLNK(st->st_mode)) {
        char target[4096];
        ssize_t n = readlink(path, target, sizeof target);
        if (n > 0) h = fnv1a(h, target, (size_t)n);
    }
    tree_sum_acc += h;
    return 0;
}

/* The fingerprint of dir and everything under it (links not followed); 0
 * when dir cannot be walked. */
static uint64_t tree_sum(const char *dir) {
    tree_sum_acc = 0;
    tree_sum_root = strlen(dir);
    if (nftw(dir, tree_sum_entry, 16, FTW_PHYS) != 0) return 0;
    return tree_sum_acc;
}

#endif
