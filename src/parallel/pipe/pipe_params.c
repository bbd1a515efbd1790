/* The pipeline's parameters across its ranks: which ones several ranks hold
 * (found by name, so the GPT's tied wte needs no special case), the
 * partition that gives each of them one owner, summing their gradients over
 * their holders and sending the owner's update to the copies. The step,
 * clipping and the files built on this are pipe_step.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "pipe_exec_internal.h"
#include "parallel/shard/sharded_internal.h"

enum { NAME_BYTES = FSC_NAME_MAX * 2 }; /* fsc_param_entry.name */

/* Every rank's parameter names, gathered: names[r][k], counts per rank. */
typedef struct {
    char *all;     /* NAME_BYTES per name, rank by rank */
    int *count;    /* per rank */
    int64_t *disp; /* per rank: first name's index */
} name_table;

static int gather_names(fsc_pipe *p, name_table *t) {
    const int P = p->cfg.ranks;
    int mine = 0;
    for (int c = 0; c < p->nchunks; c++) mine += p->params[c].count;
    char *local = calloc((size_t)(mine ? mine : 1), NAME_BYTES);
    t->count = calloc((size_t)P, sizeof *t->count);
    t->disp = calloc((size_t)P + 1, sizeof *t->disp);
    int64_t *counts = calloc((size_t)P, sizeof *counts),
            *displs = calloc((size_t)P, sizeof *displs);
    int rc = local && t->count && t->disp && counts && displs
                 ? FSC_OK
                 : fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    int k = 0;
    for (int c = 0; !rc && c < p->nchunks; c++)
        for (int e = 0; e < p->params[c].count; e++, k++)
            snprintf(local + (size_t)k * NAME_BYTES, NAME_BYTES, "%s",
                     p->params[c].entries[e].name);
    for (int i = 0; !rc && i < mine; i++) /* one rank never holds a name twice */
        for (int j = 0; j < i; j++)
            if (!strcmp(local + (size_t)i * NAME_BYTES, local + (size_t)j * NAME_BYTES))
                rc = fsc_error(FSC_ERR_INVALID,
                               "pipeline rank %d holds parameter '%s' in two stages; place "
                               "stages that share a parameter on different ranks",
                               p->rank, local + (size_t)i * NAME_BYTES);
    if (!rc) rc = fsc_group_allgather(p->g, &mine, t->count, 1, FSC_DTYPE_I32);
    int64_t total = 0;
    for (int r = 0; !rc && r < P; r++) {
        t->disp[r] = total;
        counts[r] = (int64_t)t->count[r] * NAME_BYTES / 4, displs[r] = total * NAME_BYTES / 4;
        total += t->count[r];
    }
    t->disp[P] = total;
    if (!rc && !(t->all = calloc((size_t)(total ? total : 1), NAME_BYTES)))
        rc = fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    if (!rc) /* names travel as int32 words */
        rc = fsc_group_allgatherv(p->g, local, t->all, counts, displs, FSC_DTYPE_I32);
    free(local), free(counts), free(displs);
    return rc;
}

/* Bit r set when rank r holds `name`. */
static uint64_t holders(const fsc_pipe *p, const name_table *t, const char *name) {
    uint64_t mask = 0;
    for (int r = 0; r < p->cfg.ranks; r++)
        for (int64_t i = t->disp[r]; i < t->disp[r + 1]; i++)
            if (!strcmp(t->all + i * NAME_BYTES, name)) mask |= 1ull << r;
    return mask;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The whole model's listing, and the partition of its entries: each owned
 * by the lowest rank that holds it (whole tensors, in entry order). */
static int make_partition(fsc_pipe *p, const name_table *t) {
    const int P = p->cfg.ranks;
    p->whole = p->opt.make_stage(p->opt.stage_user, 0, p->opt.layers);
    if (!p->whole) return fsc_error_context(FSC_ERR_INVALID, "pipeline: the whole model: ");
    int rc = fsc_params_collect(p->whole, &p->whole_ps);
    if (rc) return rc;
    const int n = p->whole_ps.count;
    fsc_partition *q = &p->part;
    q->world = P;
    q->policy = FSC_PARTITION_GREEDY;
    q->nranges = calloc((size_t)P, sizeof *q->nranges);
    q->ranges = calloc((size_t)P, sizeof *q->ranges);
    q->elems = calloc((size_t)P, sizeof *q->elems);
    for (int r = 0; q->ranges && r < P; r++)
        if (!(q->ranges[r] = calloc((size_t)(n ? n : 1), sizeof **q->ranges))) break;
    if (!q->nranges || !q->ranges || !q->elems || (P && !q->ranges[P - 1]))
        return fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    for (int e = 0; e < n; e++) {
        uint64_t m = holders(p, t, p->whole_ps.entries[e].name);
        if (!m)
            return fsc_error(FSC_ERR_INVALID, "pipeline: no stage holds parameter '%s'",
                             p->whole_ps.entries[e].name);
        int owner = 0;
        while (!((m >> owner) & 1)) owner++;
        const int64_t numel = p->whole_ps.entries[e].param->numel;
        q->ranges[owner][q->nranges[owner]++] = (fsc_shard_range){.entry = e, .count = numel};
        q->elems[owner] += numel;
    }
    return FSC_OK;
}

/* This rank's parameter entry of that name, or NULL. */
static const fsc_param_entry *local_entry(fsc_pipe *p, const char *name) {
    for (int c = 0; c < p->nchunks; c++) {
        const fsc_param_entry *e = fsc_params_find(&p->params[c], name);
        if (e) return e;
    }
    return NULL;
}

int pipe_owned_ranges(fsc_pipe *p, fsc_optim_range **out, int *n) {
    const int k = p->part.nranges[p->rank];
    fsc_optim_range *r = calloc((size_t)(k ? k : 1), sizeof *r);
    if (!r) return fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    for (int i = 0; i < k; i++) {
        const fsc_param_entry *w = &p->whole_ps.entries[p->part.ranges[p->rank][i].entry];
        const fsc_param_entry *e = local_entry(p, w->name);
        const fsc_param *q = e->param;
        r[i] = (fsc_optim_range){.param = q->data,
                                 .grad = q->grad,
                                 .n = q->frozen ? 0 : q->numel, /* no state, no update */
                                 .decay = q->weight_decay,
                                 .lr_scale = q->lr_scale, /* its param group */
                                 .wd_set = q->wd_set,
                                 .wd = q->wd,
                                 .name = w->name};
    }
    *out = r, *n = k;
    return FSC_OK;
}

int pipe_share_updates(fsc_pipe *p) {
    for (int i = 0; i < p->nshared; i++) { /* group rank 0 is the owner: the lowest rank */
        int rc = fsc_group_broadcast(p->shared[i].g, p->shared[i].data, p->shared[i].n,
                                     FSC_DTYPE_F32, 0);
        if (rc) return fsc_error_context(rc, "pipeline: sharing an updated parameter: ");
    }
    return FSC_OK;
}

int pipe_find_shared(fsc_pipe *p) {
    if (p->cfg.ranks > 64)
        return fsc_error(FSC_ERR_UNSUPPORTED, "pipeline: more than 64 stages' ranks");
    name_table t = {0};
    int rc = gather_names(p, &t);
    /* every rank sees every name: the same sorted list of holder sets */
    int64_t total = t.disp ? t.disp[p->cfg.ranks] : 0;
    uint64_t *masks = calloc((size_t)(total ? total : 1), sizeof *masks);
    int nmasks = 0;
    if (!rc && !masks) rc = fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    for (int64_t i = 0; !rc && i < total; i++) {
        uint64_t m = holders(p, &t, t.all + i * NAME_BYTES);
        if (m & (m - 1)) masks[nmasks++] = m;
    }
    if (!rc) qsort(masks, (size_t)nmasks, sizeof *masks, cmp_u64);
    int distinct = 0;
    for (int i = 0; i < nmasks; i++)
        if (!distinct || masks[i] != masks[distinct - 1]) masks[distinct++] = masks[i];
    if (!rc && distinct && !(p->groups = calloc((size_t)distinct, sizeof *p->groups)))
        rc = fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    for (int i = 0; !rc && i < distinct; i++) { /* collective over g, once per holder set */
        rc = fsc_mesh_subgroup(p->layout, FSC_MESH_PP, masks[i], "pipe-shared", &p->groups[i]);
        p->ngroups = i + 1;
    }
    int mine = 0;
    for (int c = 0; c < p->nchunks; c++) mine += p->params[c].count;
    if (!rc && mine && !(p->shared = calloc((size_t)mine, sizeof *p->shared)))
        rc = fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    for (int c = 0; !rc && c < p->nchunks; c++)
        for (int e = 0; e < p->params[c].count; e++) {
            const fsc_param_entry *en = &p->params[c].entries[e];
            uint64_t m = holders(p, &t, en->name);
            if (!(m & (m - 1))) continue;
            int gi = 0;
            while (masks[gi] != m) gi++;
            p->shared[p->nshared++] = (pipe_shared){.data = en->param->data,
                                                    .grad = en->param->grad,
                                                    .n = en->param->numel,
                                                    .g = p->groups[gi]};
        }
    if (!rc) rc = make_partition(p, &t);
    free(masks), free(t.all), free(t.count), free(t.disp);
    return rc;
}

void pipe_free_shared(fsc_pipe *p) {
    for (int r = 0; p->part.ranges && r < p->part.world; r++) free(p->part.ranges[r]);
    free(p->part.ranges), free(p->part.nranges), free(p->part.elems);
    memset(&p->part, 0, sizeof p->part);
    if (p->whole) fsc_params_free(&p->whole_ps);
    fsc_module_free(p->whole);
    p->whole = NULL;
    for (int i = 0; i < p->ngroups; i++) fsc_group_free(p->groups[i]);
    free(p->groups);
    free(p->shared);
    p->groups = NULL, p->shared = NULL, p->ngroups = p->nshared = 0;
}

int pipe_sum_shared(fsc_pipe *p) {
    if (fsc_fault_is(FSC_FAULT_DROP_GRAD)) return FSC_OK; /* test-only: the copies drift apart */
    for (int i = 0; i < p->nshared; i++) {
        int rc = fsc_group_allreduce(p->shared[i].g, p->shared[i].grad, p->shared[i].n,
                                     FSC_DTYPE_F32, FSC_REDUCE_SUM);
        if (rc) return fsc_error_context(rc, "pipeline: summing a shared parameter's gradient: ");
    }
    return FSC_OK;
}
