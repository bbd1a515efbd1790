/* A GPT trainer on a layout (fsc/layout.h): the trainer's data and loss
 * functions for whichever model the plan made: the whole GPT, the TP GPT
 * (its fused vocabulary-parallel loss), or pipeline stages (the first
 * stage's ids kept per micro-batch until its backward, the last stage's
 * loss over the TP group, or its head fused with the loss under tp; under
 * cp both ends at this rank's positions). */
#include <stdlib.h>
#include <string.h>

#include "fsc/cp.h"
#include "fsc/trainer.h"
#include "gpt_layout_internal.h"

/* Under context parallelism the replica's micro-batch (fsc_gpt_plan_data_batch). */
static int load(const fsc_micro_batch *mb, void *user) {
    fsc_gpt_plan *p = user;
    const fsc_micro_batch data = fsc_gpt_plan_data_batch(p, mb);
    return p->batch_fn(&data, p->batch_user, p->x, p->y);
}

static int loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                float *out) {
    return fsc_gpt_plan_train_micro(user, m, ctx, mb, ((fsc_gpt_plan *)user)->x,
                                    ((fsc_gpt_plan *)user)->y, out);
}

/* Under a pipeline: stage 0 keeps each micro-batch's ids until its backward
 * (under cp this rank's positions of them, T / cp per row). */
static int pipe_input(const fsc_micro_batch *mb, void *user, fsc_tensor *x) {
    fsc_gpt_plan *p = user;
    const int T = p->cfg.seq;
    int32_t *ids = p->px + (size_t)mb->micro * mb->batch * T;
    if (p->cp)
        fsc_cp_take(p->cp, p->x, mb->batch, ids);
    else
        memcpy(ids, p->x, sizeof *ids * (size_t)mb->batch * T);
    *x = fsc_tensor_2d(ids, FSC_DTYPE_I32, mb->batch, p->cp ? T / p->layout.cp : T);
    return FSC_OK;
}

/* The last stage's targets: the micro-batch's, or under cp this rank's positions of them. */
static int stage_targets(fsc_gpt_plan *p, const fsc_micro_batch *mb, const int32_t **y, int *T) {
    *y = p->y, *T = p->cfg.seq;
    if (!p->cp) return FSC_OK;
    *T = p->cfg.seq / p->layout.cp;
    int rc = gpt_layout_cp_take(p, NULL, p->y, mb->batch);
    *y = p->cy; /* made by the first take */
    return rc;
}

static int pipe_loss(const fsc_micro_batch *mb, void *user, fsc_tensor *y, fsc_arena *arena,
                     float *out) {
    fsc_gpt_plan *p = user;
    const int32_t *ids;
    int T, rc = stage_targets(p, mb, &ids, &T);
    if (rc) return rc;
    fsc_tensor targets = fsc_tensor_2d((int32_t *)ids, FSC_DTYPE_I32, mb->batch, T);
    return p->layout.tp > 1 ? fsc_tp_cross_entropy(out, y, &targets, p->cfg.vocab, -1, mb->norm,
                                                   p->tp_group, arena)
                            : fsc_cross_entropy(out, y, &targets, -1, mb->norm, arena);
}

/* Under tp with a pipeline: the last stage's head runs fused with the loss. */
static int pipe_targets(const fsc_micro_batch *mb, void *user, const int32_t **targets,
                        int *ignore_index) {
    int T;
    *ignore_index = -1;
    return stage_targets(user, mb, targets, &T);
}

/* Validation: the caller's batches into the same buffers. */
static int eval_load(const fsc_micro_batch *mb, void *user) {
    fsc_gpt_plan *p = user;
    return p->eval_fn(mb, p->eval_user, p->x, p->y);
}

/* Forward only, the rows' mean loss rescaled to mb->norm as in training. */
static int eval_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                     float *out) {
    const fsc_gpt_plan *p = user;
    const int T = p->cfg.seq;
    const int32_t *x = p->x + (size_t)mb->row0 * T, *y = p->y + (size_t)mb->row0 * T;
    float mean = 0;
    int rc = p->layout.tp > 1 ? fsc_tp_gpt_eval_loss(m, ctx, x, y, mb->rows, T, -1, &mean)
                              : fsc_gpt_eval_loss(m, ctx, x, y, mb->rows, T, -1, &mean);
    *out = (float)((double)mean * mb->rows * T / mb->norm);
    return rc;
}

int fsc_gpt_plan_eval_config(fsc_gpt_plan *p, fsc_gpt_batch_fn batch, void *batch_user,
                             fsc_trainer_eval_config *cfg) {
    if (!p || !batch || !cfg)
        return fsc_error(FSC_ERR_INVALID, "fsc_gpt_plan_eval_config: NULL argument");
    if (!p->x)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_gpt_plan_eval_config: call fsc_gpt_plan_trainer_config first (its "
                         "buffers hold the batches)");
    if (p->layout.cp > 1)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "fsc_gpt_plan_eval_config: validation does not split the sequence over "
                         "the %d cp ranks yet",
                         p->layout.cp);
    p->eval_fn = batch, p->eval_user = batch_user;
    cfg->load = eval_load;
    cfg->loss = eval_loss;
    cfg->user = p;
    return FSC_OK;
}

void *fsc_gpt_plan_user(const fsc_gpt_plan *p) {
    return p ? p->batch_user : NULL;
}

int fsc_gpt_plan_trainer_config(fsc_gpt_plan *p, fsc_gpt_batch_fn batch, void *batch_user,
                                fsc_trainer_config *cfg) {
    if (!p || !batch || !cfg)
        return fsc_error(FSC_ERR_INVALID, "fsc_gpt_plan_trainer_config: NULL argument");
    const fsc_gpt_layout *l = &p->layout;
    if (l->batch < 1)
        return fsc_error(FSC_ERR_INVALID, "fsc_gpt_plan_trainer_config: layout.batch %d < 1",
                         l->batch);
    const size_t n = (size_t)l->batch * p->cfg.seq;
    free(p->x), free(p->y), free(p->px);
    p->x = malloc(n * sizeof *p->x);
    p->y = malloc(n * sizeof *p->y);
    p->px = l->pp > 1 ? malloc(n * (size_t)l->micro_batches * sizeof *p->px) : NULL;
    if (!p->x || !p->y || (l->pp > 1 && !p->px)) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    p->batch_fn = batch, p->batch_user = batch_user;
    cfg->batch = l->batch;
    cfg->grad_accum = l->micro_batches;
    cfg->targets_per_sample = fsc_gpt_plan_targets_per_sample(p);
    cfg->load = load;
    cfg->loss = loss;
    cfg->pipe_input = pipe_input;
    cfg->pipe_loss = pipe_loss;
    cfg->pipe_targets = l->tp > 1 ? pipe_targets : NULL;
    gpt_layout_cp_pipe(p, cfg);
    cfg->user = p;
    return fsc_gpt_plan_options(p, &cfg->optim, &cfg->strategy);
}
