/* The pipeline's parameters across its ranks: which ones several ranks hold
 * (found by name, so the GPT's tied wte needs no special case), summing
 * their gradients over those ranks, the global gradient norm with each
 * parameter counted once, the update, and the weights file of the whole
 * model. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "fsc/tp.h"
#include "fsc/weights.h"
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
                                 .n = q->numel,
                                 .decay = q->weight_decay,
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
        bool in = (masks[i] >> p->rank) & 1;
        rc = fsc_group_split(p->g, in ? 0 : -1, p->rank, "pipe-shared", &p->groups[i]);
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

/* The optimizer's ranges are the parameters this rank owns (cut to its
 * slice among sharded replicas), each element owned by one rank of the
 * norm's group, so the sharded norm counts a shared parameter once; its
 * copies are not scaled: they receive the owner's update. Of a parameter
 * every TP rank holds, TP rank 0's ranges count (pipe_state.c); every
 * rank scales all of its own. */
int fsc_pipe_clip_grad_norm(fsc_pipe *p, float max_norm, float *total) {
    float norm = 0;
    int rc = sharded_clip_grad_norm(pipe_dp_norm_group(p), p->counted, p->ncounted, FLT_MAX, false,
                                    &norm, "pipeline clip");
    if (total) *total = norm;
    return rc ? rc
              : fsc_clip_grads_scale(p->ranges, p->nranges, max_norm > 0 ? max_norm : FLT_MAX,
                                     norm);
}

int fsc_pipe_set_lr(fsc_pipe *p, double lr) {
    return fsc_optim_set_lr(p->optim, lr);
}

/* Sharded replicas gather their updated slices; then the owners of shared
 * parameters send them to the copies (SHARD_PARAMS: at the next gather). */
int fsc_pipe_step(fsc_pipe *p) {
    int rc = fsc_optim_step(p->optim);
    if (!rc) rc = pipe_dp_share_update(p);
    if (!rc && p->gathered) rc = pipe_share_updates(p);
    return rc;
}

fsc_optim *fsc_pipe_optim(fsc_pipe *p) {
    return p->optim;
}

/* Sharded parameters are read whole and then cut to this rank's slices. */
int fsc_pipe_load_weights(fsc_pipe *p, const char *path) {
    const bool was_gathered = p->gathered;
    int rc = pipe_dp_commit(p);
    for (int c = 0; !rc && c < p->nchunks; c++) {
        int unused = 0;
        rc = p->opt.tp ? fsc_tp_weights_load(path, p->chunk[c], &p->params[c], &unused)
                       : fsc_weights_load(path, &p->params[c], &unused);
        if (rc) fsc_error_context(rc, "pipeline stage %d: ", fsc_pipe_chunk_stage(p, c));
    }
    int rrc = was_gathered ? FSC_OK : pipe_dp_release(p);
    return rc ? rc : rrc;
}

/* Root: receives rank r's parameters, in r's own order, into the whole
 * model's by name (r's layout comes from making r's stages here unbound). */
static int receive_rank(fsc_pipe *p, int r, fsc_params *whole) {
    int rc = FSC_OK;
    for (int c = 0; !rc && c < p->cfg.chunks; c++) {
        int s = c * p->cfg.ranks + r;
        fsc_module *m = p->opt.make_stage(p->opt.stage_user, p->first[s], p->first[s + 1]);
        fsc_params ps;
        rc = m ? fsc_params_collect(m, &ps) : FSC_ERR_INVALID;
        for (int e = 0; !rc && e < ps.count; e++) {
            fsc_param_entry *w = fsc_params_find(whole, ps.entries[e].name);
            if (!w || w->param->numel != ps.entries[e].param->numel) {
                rc = fsc_error(FSC_ERR_INVALID,
                               "pipeline save: '%s' of stage %d is not the "
                               "whole model's",
                               ps.entries[e].name, s);
                break;
            }
            rc = fsc_group_recv(p->g, w->param->data, w->param->numel, FSC_DTYPE_F32, r, 1);
        }
        if (m) fsc_params_free(&ps);
        fsc_module_free(m);
    }
    return rc;
}

/* With TP stages: the root stage's TP group, each rank holding its slices
 * of the whole model, writes the one-process file together (the path is TP
 * rank 0's), once every one of them has assembled its part. */
static int save_tp(fsc_pipe *p, const char *path, fsc_module *whole, const fsc_params *all,
                   int n_meta, const char *const *keys, const char *const *values, int rc) {
    int32_t worst = -rc, n = path ? (int32_t)strlen(path) : -1;
    char where[4096]; /* a multiple of 4 bytes: it travels as int32 words */
    if (fsc_group_allreduce(p->opt.tp, &worst, 1, FSC_DTYPE_I32, FSC_REDUCE_MAX))
        return FSC_ERR_MPI;
    if (rc) return rc;
    if (worst) return fsc_error(-worst, "pipeline save: another TP rank could not assemble");
    if (p->tp_rank == 0 && (size_t)n >= sizeof where) n = -1;
    if (fsc_group_broadcast(p->opt.tp, &n, 1, FSC_DTYPE_I32, 0)) return FSC_ERR_MPI;
    if (n < 0)
        return fsc_error(FSC_ERR_INVALID, "pipeline save: no path (or too long) on the root");
    if (p->tp_rank == 0) memcpy(where, path, (size_t)n + 1);
    if (fsc_group_broadcast(p->opt.tp, where, (n + 4) / 4, FSC_DTYPE_I32, 0)) return FSC_ERR_MPI;
    return fsc_tp_weights_save(where, whole, all, p->opt.tp, n_meta, keys, values);
}

static int save_replica(fsc_pipe *p, const char *path, int root, int n_meta,
                        const char *const *keys, const char *const *values) {
    int rc = FSC_OK;
    if (p->rank != root) { /* stream every parameter to root, in this rank's order */
        for (int c = 0; !rc && c < p->nchunks; c++)
            for (int e = 0; !rc && e < p->params[c].count; e++) {
                const fsc_param *q = p->params[c].entries[e].param;
                rc = fsc_group_send(p->g, q->data, q->numel, FSC_DTYPE_F32, root, 1);
            }
    } else {
        fsc_module *whole = p->opt.make_stage(p->opt.stage_user, 0, p->opt.layers);
        fsc_params all = {0};
        rc = whole ? fsc_params_bind(whole, 0, false, &all) : FSC_ERR_INVALID;
        for (int c = 0; !rc && c < p->nchunks; c++)
            for (int e = 0; e < p->params[c].count; e++) {
                const fsc_param_entry *en = &p->params[c].entries[e];
                fsc_param_entry *w = fsc_params_find(&all, en->name);
                if (w) memcpy(w->param->data, en->param->data, sizeof(float) * en->param->numel);
            }
        for (int r = 0; !rc && r < p->cfg.ranks; r++)
            if (r != root) rc = receive_rank(p, r, &all);
        if (p->opt.tp)
            rc = save_tp(p, path, whole, &all, n_meta, keys, values, rc);
        else if (!rc)
            rc = fsc_weights_save(path, &all, n_meta, keys, values);
        if (whole) fsc_params_free(&all);
        fsc_module_free(whole);
    }
    int32_t status = rc;
    if (fsc_group_broadcast(p->g, &status, 1, FSC_DTYPE_I32, root)) return FSC_ERR_MPI;
    if (status && p->rank != root)
        return fsc_error(status, "pipeline: rank %d could not save", root);
    return rc;
}

/* Sharded parameters are gathered for the while; the first replica writes. */
int fsc_pipe_save_weights(fsc_pipe *p, const char *path, int root, int n_meta,
                          const char *const *keys, const char *const *values) {
    const bool was_gathered = p->gathered;
    int rc = pipe_dp_gather(p);
    if (!rc && p->dp_rank == 0) rc = save_replica(p, path, root, n_meta, keys, values);
    int rrc = was_gathered ? FSC_OK : pipe_dp_release(p);
    return pipe_replicas_agree(p, rc ? rc : rrc, "could not save the weights");
}

/* ---- the last run as a Chrome trace ------------------------------------------------------ */

int fsc_pipe_write_trace(fsc_pipe *p, const char *path) {
    const int P = p->cfg.ranks;
    const fsc_pipe_action *acts;
    int n, rc = fsc_pipe_schedule_actions(p->sched, p->rank, &acts, &n);
    if (rc) return rc;
    n = p->ntrace;
    /* every rank's events as int64 rows: op, stage, micro, start us, end us */
    enum { W = 5 };
    int32_t mine = n, *counts32 = calloc((size_t)P, sizeof *counts32);
    int64_t *counts = calloc((size_t)P, sizeof *counts),
            *displs = calloc((size_t)P, sizeof *displs);
    int64_t *ev = calloc((size_t)(n ? n : 1) * W, sizeof *ev), total = 0;
    if (!counts32 || !counts || !displs || !ev)
        rc = fsc_error(FSC_ERR_NOMEM, "trace: out of memory");
    for (int k = 0; !rc && k < n; k++) {
        int64_t *e = ev + (size_t)k * W;
        e[0] = acts[k].op, e[1] = acts[k].stage, e[2] = acts[k].micro;
        e[3] = (int64_t)(1e6 * p->trace_t0[k]), e[4] = (int64_t)(1e6 * p->trace_t1[k]);
    }
    if (!rc) rc = fsc_group_allgather(p->g, &mine, counts32, 1, FSC_DTYPE_I32);
    for (int r = 0; !rc && r < P; r++)
        counts[r] = (int64_t)counts32[r] * W, displs[r] = total, total += counts[r];
    int64_t *all = rc ? NULL : calloc((size_t)(total ? total : 1), sizeof *all);
    if (!rc && !all) rc = fsc_error(FSC_ERR_NOMEM, "trace: out of memory");
    if (!rc) rc = fsc_group_allgatherv(p->g, ev, all, counts, displs, FSC_DTYPE_I64);
    int wrc = FSC_OK;
    if (!rc && p->rank == 0) {
        FILE *f = fopen(path, "w");
        if (!f) {
            wrc = fsc_error(FSC_ERR_IO, "trace %s: cannot open for writing", path);
        } else {
            fprintf(f, "{\"traceEvents\": [");
            bool first = true;
            for (int r = 0; r < P; r++) {
                fprintf(f,
                        "%s\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, "
                        "\"tid\": %d, \"args\": {\"name\": \"rank %d\"}}",
                        first ? "" : ",", r, r);
                first = false;
                for (int64_t i = displs[r]; i < displs[r] + counts[r]; i += W) {
                    const int64_t *e = all + i;
                    char name[FSC_PIPE_ACTION_TEXT];
                    fsc_pipe_action a = {
                        .op = (fsc_pipe_op)e[0], .stage = (int)e[1], .micro = (int)e[2]};
                    if (fsc_pipe_action_format(a, name, sizeof name) < 0) snprintf(name, 2, "?");
                    fprintf(f,
                            ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, "
                            "\"ts\": %lld, \"dur\": %lld}",
                            name, r, (long long)e[3], (long long)(e[4] - e[3]));
                }
            }
            fprintf(f, "\n]}\n");
            if (fclose(f)) wrc = fsc_error(FSC_ERR_IO, "trace %s: write failed", path);
        }
    }
    free(counts32), free(counts), free(displs), free(ev), free(all);
    if (rc) return rc;
    int32_t status = wrc;
    if (fsc_group_broadcast(p->g, &status, 1, FSC_DTYPE_I32, 0)) return FSC_ERR_MPI;
    return status && !wrc ? fsc_error(status, "trace: rank 0 could not write %s", path) : wrc;
}
