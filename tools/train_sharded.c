/* --init-from a --save-sharded directory (issue 29, item 8): the files
 * DIR/shard-<r>-of-<N>.safetensors that fsdp wrote, one per rank.
 *
 * At the world size that saved them, under fsdp, each rank reads its own
 * file (fsc_strategy_load_sharded: nothing gathered, a different layout
 * refused by name). At any other world size, or under a strategy that reads
 * no shard files (FSC_ERR_UNSUPPORTED, hsdp, pipelines), rank 0 rebuilds
 * the full state dict beside them (fsc_flat_consolidate: the bytes --save
 * writes) and every rank loads it by global name, as any --init-from file;
 * the rebuilt file is removed afterwards. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsc/flat_shards.h"
#include "train_common.h"

bool train_sharded_dir(const char *path, int *world) {
    struct stat sb;
    if (!path || stat(path, &sb) || !S_ISDIR(sb.st_mode)) return false;
    DIR *d = opendir(path);
    if (!d) return false;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int r, w;
        char tail[32];
        if (sscanf(e->d_name, "shard-%5d-of-%5d%31s", &r, &w, tail) == 3 && r == 0 && w > 0 &&
            !strcmp(tail, ".safetensors"))
            n = w;
    }
    closedir(d);
    if (world) *world = n;
    return n > 0;
}

static void shard_path(char *out, size_t size, const char *dir, int r, int n) {
    snprintf(out, size, "%s/shard-%05d-of-%05d.safetensors", dir, r, n);
}

int train_sharded_first(const char *dir, char *out, size_t size) {
    int n;
    if (!train_sharded_dir(dir, &n))
        return fsc_error(FSC_ERR_NOT_FOUND, "%s: no shard-00000-of-N.safetensors in it", dir);
    shard_path(out, size, dir, 0, n);
    return FSC_OK;
}

/* Rank 0 consolidates the n files into *tmp (a fresh name in dir); every
 * rank learns whether it could. */
static int consolidate(const char *dir, int n, char *tmp, size_t size) {
    snprintf(tmp, size, "%s/.init-from-%ld.safetensors", dir, (long)getpid());
    size_t len = strlen(tmp);
    int rc = FSC_OK;
    if (fsc_dist_rank() == 0) {
        char **paths = calloc((size_t)n, sizeof *paths);
        for (int r = 0; paths && r < n && !rc; r++)
            if (!(paths[r] = malloc(4096)))
                rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
            else
                shard_path(paths[r], 4096, dir, r, n);
        if (!paths) rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
        if (!rc) rc = fsc_flat_consolidate(n, (const char *const *)paths, tmp);
        for (int r = 0; paths && r < n; r++) free(paths[r]);
        free(paths);
    }
    /* rank 0's name (its pid) reaches every rank */
    int32_t words[1024] = {0};
    memcpy(words, tmp, len < 4095 ? (size_t)len + 1 : 4095);
    fsc_group *all = fsc_group_world();
    if (fsc_group_broadcast(all, words, 1024, FSC_DTYPE_I32, 0)) return FSC_ERR_MPI;
    memcpy(tmp, words, size < 4096 ? size : 4096);
    tmp[size - 1] = 0;
    return fsc_group_agree(all, rc, "rebuilding the full state dict from the shards");
}

int train_sharded_load(trainer *t, const char *dir) {
    int n = 0;
    if (!train_sharded_dir(dir, &n))
        return fsc_error(FSC_ERR_NOT_FOUND, "%s: no shard-00000-of-N.safetensors in it", dir);
    char path[4096];
    int rc = FSC_ERR_UNSUPPORTED;
    if (n == t->world) { /* fsdp reads its own file; other rows say they cannot */
        shard_path(path, sizeof path, dir, t->rank, n);
        rc = fsc_strategy_load_sharded(t->s, path);
        if (rc != FSC_ERR_UNSUPPORTED) return rc;
    }
    rc = consolidate(dir, n, path, sizeof path);
    if (rc) return rc;
    int unused = 0;
    rc = fsc_strategy_load_weights(t->s, path, &unused);
    rc = fsc_group_agree(fsc_group_world(), rc, "loading the rebuilt state dict");
    if (fsc_dist_rank() == 0) unlink(path);
    if (!rc && fsc_dist_rank() == 0)
        fsc_log(FSC_LOG_INFO, "--init-from %s: %d shard files rebuilt and loaded on %d ranks", dir,
                n, t->world);
    return rc;
}
