/* The one-process weights file from expert shards: rank r holds experts
 * [r*El, (r+1)*El) of every MoE layer, with the same entries in the same
 * order on every rank (only the expert index in the names differs), so
 * root can name and place another rank's tensors from its own list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/weights.h"
#include "moe_internal.h"

enum { TAG = 16001 % 16384 };

int moe_expert_index(const char *name, const char **at, const char **after) {
    const char *p = strstr(name, ".experts.");
    if (!p && !strncmp(name, "experts.", 8)) p = name - 1;
    if (!p) return -1;
    char *end;
    long e = strtol(p + 9, &end, 10);
    if (end == p + 9 || *end != '.') return -1;
    *at = p + 9, *after = end;
    return (int)e;
}

/* This rank's expert entries' total floats, El (experts per layer here) and
 * the lowest local index; FSC_ERR_INVALID for a name without its index. */
static int local_experts(const fsc_params *ps, int64_t *floats, int *el, int *lo) {
    int hi = -1;
    *floats = 0, *lo = -1;
    for (int i = 0; i < ps->count; i++) {
        if (!ps->entries[i].param->expert) continue;
        const char *at, *after;
        int e = moe_expert_index(ps->entries[i].name, &at, &after);
        if (e < 0)
            return fsc_error(FSC_ERR_INVALID, "MoE weights: expert parameter %s has no index",
                             ps->entries[i].name);
        if (*lo < 0 || e < *lo) *lo = e;
        if (e > hi) hi = e;
        *floats += ps->entries[i].param->numel;
    }
    *el = hi - *lo + 1;
    return FSC_OK;
}

/* Root's list: its own entries, then every other rank's experts, named by
 * their global index, with data in `remote` (rank order, entry order). */
static int root_write(const fsc_params *ps, int P, int root, int el, int lo, const float *remote,
                      const char *path, int n_meta, const char *const *keys,
                      const char *const *values) {
    int nexp = 0;
    for (int i = 0; i < ps->count; i++) nexp += ps->entries[i].param->expert;
    const int total = ps->count + nexp * (P - 1);
    fsc_params all = {.count = total, .numel = ps->numel};
    all.entries = calloc((size_t)total, sizeof *all.entries);
    fsc_param *fake = calloc((size_t)(nexp * (P - 1) + 1), sizeof *fake);
    if (!all.entries || !fake) {
        free(all.entries);
        free(fake);
        return fsc_error(FSC_ERR_NOMEM, "MoE weights: out of memory");
    }
    memcpy(all.entries, ps->entries, sizeof *all.entries * (size_t)ps->count);
    int n = ps->count, k = 0;
    bool too_long = false;
    const float *src = remote;
    for (int r = 0; r < P; r++) {
        if (r == root) continue;
        for (int i = 0; i < ps->count; i++) {
            const fsc_param *p = ps->entries[i].param;
            if (!p->expert) continue;
            const char *name = ps->entries[i].name, *at = name, *after = name;
            int e = moe_expert_index(name, &at, &after) - lo + r * el;
            fsc_param_entry *d = &all.entries[n++];
            int w = snprintf(d->name, sizeof d->name, "%.*s%d%s", (int)(at - name), name, e, after);
            too_long |= w < 0 || (size_t)w >= sizeof d->name;
            fake[k] = *p;
            fake[k].data = (float *)src;
            fake[k].grad = NULL;
            d->param = &fake[k++];
            src += p->numel;
        }
    }
    int rc = too_long ? fsc_error(FSC_ERR_INVALID, "MoE weights: an expert name is too long")
                      : fsc_weights_save(path, &all, n_meta, keys, values);
    free(all.entries);
    free(fake);
    return rc;
}

int fsc_moe_save_weights(fsc_params *ps, fsc_group *g, const char *path, int root, int n_meta,
                         const char *const *keys, const char *const *values) {
    if (!ps || !g) return fsc_error(FSC_ERR_INVALID, "MoE weights: needs parameters and a group");
    const int P = fsc_group_size(g), me = fsc_group_rank(g);
    int64_t floats = 0;
    int el = 0, lo = 0;
    int rc = local_experts(ps, &floats, &el, &lo);
    float *buf = fsc_mem_alloc(FSC_MEM_COMM,
                               sizeof(float) * (size_t)(floats * (me == root ? P - 1 : 1) + 1));
    if (!rc && !buf) rc = FSC_ERR_NOMEM;
    /* a failure here would leave root waiting: every rank still takes part */
    if (me != root) {
        int64_t at = 0;
        for (int i = 0; buf && i < ps->count; i++)
            if (ps->entries[i].param->expert) {
                memcpy(buf + at, ps->entries[i].param->data,
                       sizeof(float) * (size_t)ps->entries[i].param->numel);
                at += ps->entries[i].param->numel;
            }
        int s = fsc_group_send(g, buf, buf ? floats : 0, FSC_DTYPE_F32, root, TAG);
        if (!rc) rc = s;
    } else {
        for (int r = 0, slot = 0; r < P; r++) {
            if (r == root) continue;
            int s = fsc_group_recv(g, buf ? buf + (int64_t)slot++ * floats : NULL, buf ? floats : 0,
                                   FSC_DTYPE_F32, r, TAG);
            if (!rc) rc = s;
        }
        if (!rc) rc = root_write(ps, P, root, el, lo, buf, path, n_meta, keys, values);
    }
    fsc_mem_free(buf);
    int32_t status = rc;
    int b = fsc_group_broadcast(g, &status, 1, FSC_DTYPE_I32, root);
    if (b) return b;
    if (status && me != root)
        return fsc_error(status, "rank %d could not write %s", root, "the weights");
    return rc;
}
