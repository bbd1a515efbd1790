/* The pipeline's top-level update and files: the global gradient norm with
 * each parameter counted once, the step (and the shared parameters' copies
 * that follow their owner's update), the weights file of the whole model,
 * and the last run as a Chrome trace. The plumbing of parameters several
 * ranks hold is pipe_params.c's; the replicas' reductions pipe_dp.c's. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/tp.h"
#include "fsc/weights.h"
#include "pipe_exec_internal.h"
#include "parallel/shard/sharded_internal.h"

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
        rc = p->opt.tp ? fsc_tp_load_weights(path, p->chunk[c], &p->params[c], &unused)
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
    int32_t n = path ? (int32_t)strlen(path) : -1;
    char where[4096]; /* a multiple of 4 bytes: it travels as int32 words */
    rc = fsc_group_agree(p->opt.tp, rc, "assembling the weights to save");
    if (rc) return rc;
    if (p->tp_rank == 0 && (size_t)n >= sizeof where) n = -1;
    if (fsc_group_broadcast(p->opt.tp, &n, 1, FSC_DTYPE_I32, 0)) return FSC_ERR_MPI;
    if (n < 0)
        return fsc_error(FSC_ERR_INVALID, "pipeline save: no path (or too long) on the root");
    if (p->tp_rank == 0) memcpy(where, path, (size_t)n + 1);
    if (fsc_group_broadcast(p->opt.tp, where, (n + 4) / 4, FSC_DTYPE_I32, 0)) return FSC_ERR_MPI;
    return fsc_tp_save_weights(where, whole, all, p->opt.tp, n_meta, keys, values);
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
    /* every stage learns the outcome, and the failing rank's message */
    return fsc_group_agree(p->g, rc, "saving the pipeline's weights");
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
