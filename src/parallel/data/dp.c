/* DP: data parallelism over threads in one process (like torch DataParallel).
 *
 * The stateless module contract made visible: each worker has its own replica
 * of the module tree (configuration only, cheap) whose parameter views point at
 * the one shared parameter buffer, its own gradient buffer and its own arena.
 * A micro-batch is split by rows; workers run forward and backward at once on
 * the same weights; their gradients are then summed into the main buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/fault.h"
#include "fsc/kernels.h"
#include "fsc/parallel.h"

typedef struct worker {
    fsc_module *replica;
    fsc_params layout; /* the replica's entries; storage rebound, not owned */
    float *grad;
    fsc_arena *arena;
    float loss;
    int status;
    char error[512];
} worker;

struct fsc_dp {
    fsc_params *params;
    int n;
    worker *w;
};

static int same_layout(const fsc_params *a, const fsc_params *b) {
    if (a->count != b->count || a->numel != b->numel)
        return fsc_error(FSC_ERR_INVALID,
                         "DP: the replica has %d parameters (%lld elements), the "
                         "model %d (%lld)",
                         b->count, (long long)b->numel, a->count, (long long)a->numel);
    for (int i = 0; i < a->count; i++)
        if (strcmp(a->entries[i].name, b->entries[i].name) ||
            a->entries[i].offset != b->entries[i].offset)
            return fsc_error(FSC_ERR_INVALID, "DP: replica parameter %d is %s, the model's is %s",
                             i, b->entries[i].name, a->entries[i].name);
    return FSC_OK;
}

int fsc_dp_new(fsc_replica_fn make, void *make_user, fsc_params *params, int threads,
               fsc_dp **out) {
    *out = NULL;
    if (threads < 1) return fsc_error(FSC_ERR_INVALID, "DP: threads %d must be >= 1", threads);
    if (!params || !params->grad)
        return fsc_error(FSC_ERR_INVALID,
                         "DP: the model's parameters must be bound with gradients");
    fsc_dp *dp = calloc(1, sizeof *dp);
    if (!dp || !(dp->w = calloc((size_t)threads, sizeof *dp->w))) {
        free(dp);
        return fsc_error(FSC_ERR_NOMEM, "DP: out of memory");
    }
    dp->params = params;
    dp->n = threads;
    int rc = FSC_OK;
    for (int i = 0; !rc && i < threads; i++) {
        worker *w = &dp->w[i];
        w->replica = make(make_user);
        if (!w->replica) rc = fsc_error_context(FSC_ERR_INVALID, "DP replica: ");
        if (!rc) rc = fsc_params_collect(w->replica, &w->layout);
        if (!rc) rc = same_layout(params, &w->layout);
        for (int e = 0; !rc && e < params->count; e++) /* replicas skip what the model froze */
            w->layout.entries[e].param->frozen |= params->entries[e].param->frozen;
        w->grad = rc ? NULL : fsc_mem_alloc(FSC_MEM_GRADS, (size_t)params->numel * sizeof(float));
        w->arena = rc ? NULL : fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
        if (!rc && (!w->grad || !w->arena)) rc = fsc_error(FSC_ERR_NOMEM, "DP: out of memory");
        if (!rc) fsc_params_rebind(&w->layout, params->data, w->grad);
    }
    if (rc) {
        fsc_dp_free(dp);
        return rc;
    }
    *out = dp;
    return FSC_OK;
}

void fsc_dp_free(fsc_dp *dp) {
    if (!dp) return;
    for (int i = 0; i < dp->n; i++) {
        worker *w = &dp->w[i];
        fsc_module_free(w->replica);
        free(w->layout.entries); /* storage belongs to the model and to w->grad */
        fsc_mem_free(w->grad);
        fsc_arena_free(w->arena);
    }
    free(dp->w);
    free(dp);
}

int fsc_dp_threads(const fsc_dp *dp) {
    return dp->n;
}

int fsc_dp_run(fsc_dp *dp, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
               float *loss) {
    if (rows < dp->n)
        return fsc_error(FSC_ERR_INVALID, "DP: %d rows cannot be split across %d threads", rows,
                         dp->n);
#pragma omp parallel for num_threads(dp->n) schedule(static, 1)
    for (int i = 0; i < dp->n; i++) {
        worker *w = &dp->w[i];
        int row0 = (int)((int64_t)rows * i / dp->n), end = (int)((int64_t)rows * (i + 1) / dp->n);
        fsc_arena_reset(w->arena);
        fsc_ctx c = *ctx;
        c.arena = w->arena;
        c.sample0 = ctx->sample0 + row0;
        w->loss = 0;
        w->status = fn(w->replica, &c, row0, end - row0, user, &w->loss);
        if (w->status) snprintf(w->error, sizeof w->error, "%s", fsc_last_error()); /* per thread */
    }
    /* Sum worker gradients into the model's, and clear them for the next run. */
    int64_t n = dp->params->numel;
    float total = 0;
    for (int i = 0; i < dp->n; i++) {
        worker *w = &dp->w[i];
        if (w->status) return fsc_error(w->status, "DP worker %d: %s", i, w->error);
        if (!(i == dp->n - 1 && fsc_fault_is(FSC_FAULT_DROP_GRAD)))
            fsc_add_inplace(dp->params->grad, w->grad, n);
        if (i == 0 && fsc_fault_fires(FSC_FAULT_REDUCE_TWICE))
            fsc_add_inplace(dp->params->grad, w->grad, n);
        memset(w->grad, 0, (size_t)n * sizeof(float));
        total += w->loss;
    }
    *loss = total;
    return FSC_OK;
}
