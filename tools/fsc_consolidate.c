/* fsc-consolidate: rebuilds full weights from FSDP's sharded state dict, offline.
 *
 *   fsc-consolidate OUT.safetensors SHARD.safetensors...
 *   fsc-consolidate OUT.safetensors --dir DIR
 *
 * No MPI and no model code: each shard file carries the layout that says where
 * every parameter lives. The output is the file fsc_weights_save writes for
 * the unsharded model. Exit status: 0 done, 1 refused or failed (the message
 * says why; OUT is untouched), 2 usage.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/flat_shards.h"
#include "fsc/io.h"
#include "fsc/version.h"

static void usage(FILE *to) {
    fprintf(to, "usage: fsc-consolidate OUT.safetensors SHARD.safetensors...\n"
                "       fsc-consolidate OUT.safetensors --dir DIR\n"
                "Rebuilds the full state dict (every parameter F32 under its name, in model\n"
                "order, with the saved metadata) from the shard files of one FSDP save, one\n"
                "per rank, in any order. --dir takes every *.safetensors in DIR that carries\n"
                "a \"" FSC_FLAT_LAYOUT_KEY "\" entry. Exit status: 0 done, 1 error, 2 usage.\n"
                "--version prints the version and exits.\n");
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.safetensors in dir that is a shard file, sorted by name. A file that
 * does not open is an error: skipping it would turn a corrupt shard into a
 * confusing "rank missing". */
static int list_dir(const char *dir, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fsc-consolidate: cannot open directory %s\n", dir);
        return 1;
    }
    int cap = 0, rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (!ends_with(e->d_name, ".safetensors")) continue;
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        char *path = malloc(len);
        if (!path) {
            fprintf(stderr, "fsc-consolidate: out of memory listing %s\n", dir);
            rc = 1;
            break;
        }
        snprintf(path, len, "%s/%s", dir, e->d_name);
        int st = 0;
        fsc_st_file *f = fsc_st_open(path, &st);
        int shard = f && fsc_st_metadata(f, FSC_FLAT_LAYOUT_KEY) != NULL;
        fsc_st_close(f);
        if (!f) {
            fprintf(stderr, "fsc-consolidate: %s\n", fsc_last_error());
            rc = 1;
        }
        if (shard && *n == cap) {
            int nc = cap ? 2 * cap : 16;
            char **p = realloc(*out, (size_t)nc * sizeof *p);
            if (!p) {
                fprintf(stderr, "fsc-consolidate: out of memory listing %s\n", dir);
                free(path);
                rc = 1;
                break;
            }
            *out = p;
            cap = nc;
        }
        if (shard)
            (*out)[(*n)++] = path;
        else
            free(path);
    }
    closedir(d);
    if (!rc && *n == 0) {
        fprintf(stderr, "fsc-consolidate: no shard files (*.safetensors with \"%s\") in %s\n",
                FSC_FLAT_LAYOUT_KEY, dir);
        rc = 1;
    }
    if (!rc) qsort(*out, (size_t)*n, sizeof **out, cmp_str);
    return rc;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("fsc-consolidate %s\n", fsc_version());
            return 0;
        }
    int by_dir = argc == 4 && !strcmp(argv[2], "--dir");
    int bad = argc < 3 || (!by_dir && argv[1][0] == '-');
    for (int i = 2; !by_dir && i < argc; i++) bad |= argv[i][0] == '-';
    if (bad) {
        usage(stderr);
        return 2;
    }
    const char *out = argv[1];
    char **paths = NULL;
    int n = 0, rc = 0;
    if (by_dir) {
        rc = list_dir(argv[3], &paths, &n);
    } else {
        paths = argv + 2;
        n = argc - 2;
    }
    if (!rc && fsc_flat_consolidate(n, (const char *const *)paths, out) != FSC_OK) {
        fprintf(stderr, "fsc-consolidate: %s\n", fsc_last_error());
        rc = 1;
    }
    if (!rc) printf("fsc-consolidate: wrote %s from %d shard files\n", out, n);
    if (by_dir) {
        for (int i = 0; i < n; i++) free(paths[i]);
        free(paths);
    }
    return rc;
}
