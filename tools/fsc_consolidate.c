/* fsc-consolidate: rebuilds full weights from FSDP's sharded state dict, offline.
 *
 *   fsc-consolidate OUT.safetensors SHARD.safetensors...
 *   fsc-consolidate OUT.safetensors --dir DIR
 *
 * No MPI and no model code: each shard file carries the layout that says where
 * every parameter lives. The output is the file fsc_weights_save writes for
 * the unsharded model. Exit status: 0 done, 1 refused or failed (the message
 * says why; OUT is untouched), 2 usage. Flags as every tool (tool_flags.h).
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/flat_shards.h"
#include "fsc/io.h"
#include "tool_flags.h"

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

static const char *USAGE =
    "usage: fsc-consolidate OUT.safetensors SHARD.safetensors...\n"
    "       fsc-consolidate OUT.safetensors --dir DIR\n"
    "Rebuilds the full state dict (every parameter F32 under its name, in model\n"
    "order, with the saved metadata) from the shard files of one FSDP save, one\n"
    "per rank, in any order. Exit status: 0 done, 1 error, 2 usage.";

typedef struct {
    const char *dir;
} consolidate_options;

static const tool_flag FLAGS[] = {
    {.name = "dir",
     .kind = ARG_STR,
     .offset = offsetof(consolidate_options, dir),
     .meta = "DIR",
     .help = "every *.safetensors in DIR that carries a \"" FSC_FLAT_LAYOUT_KEY "\" entry"},
};

int main(int argc, char **argv) {
    const tool_cli cli = {.prog = "fsc-consolidate",
                          .usage = USAGE,
                          .flags = FLAGS,
                          .nflags = (int)(sizeof FLAGS / sizeof *FLAGS)};
    consolidate_options o = {0};
    int first = 0, rc = tool_flags_parse(&cli, &o, NULL, argc, argv, &first);
    if (rc == TOOL_FLAGS_DONE) return 0;
    const int npos = argc - first;
    const char *why = rc                   ? fsc_last_error()
                      : npos < 1           ? "no OUT.safetensors given"
                      : o.dir && npos > 1  ? "give shard files or --dir, not both"
                      : !o.dir && npos < 2 ? "no shard files given (or --dir DIR)"
                                           : NULL;
    if (why) {
        fprintf(stderr, "fsc-consolidate: %s\n%s\n", why, USAGE);
        return 2;
    }
    const bool by_dir = o.dir != NULL;
    const char *out = argv[first]; /* then the shard files */
    char **paths = NULL;
    int n = 0;
    if (by_dir) {
        rc = list_dir(o.dir, &paths, &n);
    } else {
        paths = argv + first + 1;
        n = npos - 1;
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
