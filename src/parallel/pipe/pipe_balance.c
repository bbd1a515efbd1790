/* Automatic balance: each layer of the model (for the GPT under fsc-train,
 * each part: the embedding, each block's three, the head) is built alone,
 * timed through forward and backward on one micro-batch of the activation
 * planned at its cut (the last layer with the loss the pipeline runs
 * there, so the head's stage is not undercounted: fused into a TP head, else
 * a cross-entropy on its logits), and weighed (parameters, gradients and
 * optimizer state; activations kept for backward). Every rank profiles
 * every layer in the same order, so the ranks of a TP group run each
 * layer's collectives together (and a cp group its ring attention, under
 * opt->seq), and the times are averaged over the
 * group, so all ranks choose the same cut. The cut is the contiguous split
 * into stages that minimises the slowest stage, among those whose memory
 * (state + the schedule's activations in flight on that stage's rank) fits
 * the allocator's budget (FSC_MEM_LIMIT_MB) when one is set. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/pipe.h"
#include "fsc/tp.h"

enum { REPS = 3 };

/* (B, T) token ids in [0, vocab): the first layer's input, a fused head's targets. */
static fsc_tensor ids_for(const fsc_pipe_options *opt, fsc_arena *a, int vocab, int64_t mul) {
    const int64_t T = opt->seq_len > 0 ? opt->seq_len : opt->act_shape[1];
    fsc_tensor x = fsc_tensor_arena(a, FSC_DTYPE_I32, 2, (int64_t[]){opt->act_shape[0], T});
    int32_t *ids = x.data;
    for (int64_t i = 0; ids && i < opt->act_shape[0] * T; i++)
        ids[i] = (int32_t)((i * mul) % vocab);
    return x;
}

/* Fills a tensor of the shape planned at layer's cut (or ids for the first layer). */
static fsc_tensor input_for(const fsc_pipe_options *opt, int layer, fsc_arena *a, int vocab) {
    if (layer == 0) return ids_for(opt, a, vocab, 7919);
    int64_t shape[FSC_MAX_DIMS];
    memcpy(shape, opt->act_shape, sizeof shape);
    if (opt->act_shape_at) opt->act_shape_at(opt->stage_user, layer, shape);
    fsc_tensor x = fsc_tensor_arena(a, FSC_DTYPE_F32, opt->act_ndim, shape);
    float *v = x.data;
    for (int64_t i = 0; v && i < fsc_tensor_numel(&x); i++) v[i] = (float)((i % 17) - 8) / 16.f;
    return x;
}

/* dloss/dy written over y: the last layer's logits over vocab get the
 * cross-entropy the pipeline's loss computes there (timed with it), other
 * outputs small values. */
static int output_gradient(const fsc_pipe_options *opt, int l, int vocab, fsc_arena *a,
                           fsc_tensor *y) {
    const int64_t n = fsc_tensor_numel(y), last = y->ndim ? y->shape[y->ndim - 1] : 0;
    float *d = y->data;
    if (l < opt->layers - 1 || y->dtype != FSC_DTYPE_F32 || y->ndim < 2 || last != vocab) {
        for (int64_t i = 0; i < n; i++) d[i] = 1e-3f;
        return FSC_OK;
    }
    fsc_tensor t = fsc_tensor_arena(a, FSC_DTYPE_I32, y->ndim - 1, y->shape);
    int32_t *ids = t.data;
    if (!ids) return fsc_error(FSC_ERR_NOMEM, "balance: out of memory");
    for (int64_t i = 0; i < n / vocab; i++) ids[i] = (int32_t)((i * 104729) % vocab);
    float loss;
    return fsc_cross_entropy(&loss, y, &t, -1, (double)(n / vocab), a);
}

/* Times layer l's forward + backward (best of REPS); *act_bytes gets what
 * forward keeps for backward, *work_bytes what backward needs on top. */
static int profile_layer(const fsc_pipe_options *opt, int l, int vocab, double *seconds,
                         double *act_bytes, double *work_bytes, double *param_bytes) {
    fsc_module *m = opt->make_stage(opt->stage_user, l, l + 1);
    if (!m) return fsc_error_context(FSC_ERR_INVALID, "balance: layer %d: ", l);
    fsc_params ps;
    /* TP stages as the pipeline binds them: slices, padding rows zero */
    int rc = opt->tp ? fsc_tp_params_bind(m, opt->seed, true, &ps)
                     : fsc_params_bind(m, opt->seed, true, &ps);
    fsc_arena *a = rc ? NULL : fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    if (!rc && !a) rc = fsc_error(FSC_ERR_NOMEM, "balance: out of memory");
    *seconds = DBL_MAX;
    for (int r = 0; !rc && r < REPS; r++) {
        fsc_arena_reset(a);
        fsc_tensor x = input_for(opt, l, a, vocab), y = {0}, dy, dx;
        /* the last layer gets the targets, as the pipeline's does when it fuses its head */
        fsc_tensor targets = l == opt->layers - 1 ? ids_for(opt, a, vocab, 104729) : x;
        const fsc_head_loss hl = {.targets = targets.data,
                                  .ignore_index = -1,
                                  .norm = (double)fsc_tensor_numel(&targets)};
        const size_t before = fsc_arena_used(a);
        fsc_ctx ctx = {.arena = a,
                       .training = true,
                       .seed = opt->seed,
                       .keyed = true,
                       .seq = opt->seq,
                       .head_loss = l == opt->layers - 1 ? &hl : NULL};
        void *saved;
        double t0 = fsc_now();
        rc = x.data && targets.data ? fsc_module_forward(m, &ctx, &x, &y, &saved) : FSC_ERR_NOMEM;
        const size_t kept = fsc_arena_used(a);
        *act_bytes = (double)(kept - before);
        dy = y;
        if (!rc && ctx.head_loss && y.ndim == 1 && y.shape[0] == 1) { /* fused: its loss */
            dy = fsc_tensor_arena(a, FSC_DTYPE_F32, 1, (int64_t[]){1});
            rc = dy.data ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "balance: out of memory");
            if (!rc) *(float *)dy.data = 1.f; /* d(loss)/d(loss); the head runs in backward */
        } else if (!rc) {
            rc = output_gradient(opt, l, vocab, a, &y);
        }
        ctx.head_loss = NULL;
        if (!rc) rc = fsc_module_backward(m, &ctx, saved, &dy, l == 0 ? NULL : &dx);
        double dt = fsc_now() - t0;
        if (dt < *seconds) *seconds = dt;
        *work_bytes = (double)(fsc_arena_high_water(a) - kept);
    }
    *param_bytes = 4.0 * (double)ps.numel;
    fsc_arena_free(a);
    if (!rc || ps.entries) fsc_params_free(&ps);
    fsc_module_free(m);
    return rc;
}

/* Layers [j, l) on one stage: parameters, gradients and optimizer state,
 * and `inflight` micro-batch arenas, each of which keeps its activations
 * plus the largest backward's workspace (an arena keeps its high water). */
static double stage_bytes(const double *t, const double *par, const double *act, const double *work,
                          int j, int l, int optim_floats, int inflight) {
    (void)t;
    double state = 0, held = 0, extra = 0;
    for (int q = j; q < l; q++) {
        state += par[q], held += act[q];
        if (work[q] > extra) extra = work[q];
    }
    return state * (2 + optim_floats) + (held + extra) * inflight;
}

int fsc_pipe_balance_auto(fsc_group *g, const fsc_pipe_options *opt, const fsc_pipe_schedule *s,
                          int vocab, int optim_floats, int *balance, fsc_pipe_balance_report *rep) {
    fsc_pipe_config cfg;
    int rc = fsc_pipe_schedule_config(s, &cfg);
    if (rc || !opt || !opt->make_stage || !balance || vocab < 1)
        return fsc_error(FSC_ERR_INVALID, "balance: needs the options, a schedule and vocab >= 1");
    const int L = opt->layers, S = cfg.ranks * cfg.chunks;
    if (L < S) return fsc_error(FSC_ERR_INVALID, "balance: %d layers cannot fill %d stages", L, S);
    double *t = calloc((size_t)L * 4, sizeof *t), *act = t + L, *par = t + 2 * L, *work = t + 3 * L;
    if (!t) return fsc_error(FSC_ERR_NOMEM, "balance: out of memory");
    for (int l = 0; !rc && l < L; l++)
        rc = profile_layer(opt, l, vocab, &t[l], &act[l], &work[l], &par[l]);
    /* one figure everywhere: the group's mean time */
    if (!rc && g && fsc_group_size(g) > 1) {
        float *f = malloc(sizeof *f * (size_t)L);
        for (int l = 0; f && l < L; l++) f[l] = (float)t[l];
        rc = f ? fsc_group_allreduce(g, f, L, FSC_DTYPE_F32, FSC_REDUCE_SUM)
               : fsc_error(FSC_ERR_NOMEM, "balance: out of memory");
        for (int l = 0; !rc && l < L; l++) t[l] = f[l] / fsc_group_size(g);
        free(f);
    }
    /* activations a stage holds: the validator's peak in flight on its rank */
    fsc_pipe_rank_stats *per = calloc((size_t)cfg.ranks, sizeof *per);
    if (!rc) rc = per ? fsc_pipe_schedule_validate(s, NULL, NULL, per) : FSC_ERR_NOMEM;
    const double budget = (double)fsc_mem_get_limit();
    /* best[k][l]: the slowest stage of the best cut of layers [0, l) into k stages */
    double *best = malloc(sizeof *best * (size_t)(S + 1) * (size_t)(L + 1));
    int *cut = malloc(sizeof *cut * (size_t)(S + 1) * (size_t)(L + 1));
    if (!rc && (!best || !cut)) rc = fsc_error(FSC_ERR_NOMEM, "balance: out of memory");
    for (int i = 0; !rc && i < (S + 1) * (L + 1); i++) best[i] = DBL_MAX, cut[i] = -1;
    if (!rc) best[0] = 0;
    for (int k = 1; !rc && k <= S; k++)
        for (int l = k; l <= L; l++)
            for (int j = k - 1; j < l; j++) { /* stage k-1 holds layers [j, l) */
                const double mem = stage_bytes(t, par, act, work, j, l, optim_floats,
                                               per[(k - 1) % cfg.ranks].peak_inflight);
                double time = 0;
                for (int q = j; q < l; q++) time += t[q];
                if (budget > 0 && mem > budget) continue;
                const double slowest = best[(k - 1) * (L + 1) + j];
                const double v = slowest > time ? slowest : time;
                if (slowest < DBL_MAX && v < best[k * (L + 1) + l])
                    best[k * (L + 1) + l] = v, cut[k * (L + 1) + l] = j;
            }
    if (!rc && best[S * (L + 1) + L] == DBL_MAX)
        rc = fsc_error(FSC_ERR_NOMEM,
                       "balance: no cut of %d layers into %d stages fits the memory budget of "
                       "%.0f MiB per process",
                       L, S, budget / 1048576.0);
    for (int k = S, l = L; !rc && k > 0; k--) {
        int j = cut[k * (L + 1) + l];
        balance[k - 1] = l - j;
        if (rep && k - 1 < FSC_PIPE_MAX_STAGES) {
            rep->stage_seconds[k - 1] = 0;
            for (int q = j; q < l; q++) rep->stage_seconds[k - 1] += t[q];
            rep->stage_bytes[k - 1] = stage_bytes(t, par, act, work, j, l, optim_floats,
                                                  per[(k - 1) % cfg.ranks].peak_inflight);
        }
        l = j;
    }
    if (!rc && rep) rep->stages = S;
    free(best), free(cut), free(per), free(t);
    return rc;
}
