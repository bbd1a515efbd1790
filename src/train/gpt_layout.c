/* A GPT on a layout (fsc/layout.h): what each rank makes of the one model
 * (the whole GPT, the TP model, pipeline stages of parts, TP stages) and
 * the strategy options that say so. The strategy rows stay unnamed here:
 * what differs between them is asked of the table. */
#include <stdlib.h>
#include <string.h>

#include "fsc/checkpoint_wrapper.h"
#include "fsc/cp.h"
#include "fsc/pipe_schedule.h"
#include "gpt_layout_internal.h"

bool fsc_strategy_is_single(const char *name) {
    fsc_strategy_info info;
    return !fsc_strategy_info_get(name, &info) && !info.spans_ranks &&
           !fsc_strategy_takes(name, "threads");
}

bool fsc_strategy_all_reduces(const char *name) {
    fsc_strategy_info info;
    return !fsc_strategy_info_get(name, &info) && info.spans_ranks && info.zero_stage == 0 &&
           !info.local_steps && !info.pipeline;
}

/* The blocks of the model (its decoder layers): the default units of a
 * row that takes units, and what checkpoint_activations recomputes. */
static int gpt_blocks(fsc_module *gpt, fsc_module ***blocks, int *n) {
    if (!(*blocks = calloc((size_t)gpt->nchildren, sizeof **blocks)))
        return fsc_error(FSC_ERR_NOMEM, "out of memory");
    if ((*n = fsc_gpt_blocks(gpt, *blocks, gpt->nchildren)) >= 0) return FSC_OK;
    free(*blocks);
    *blocks = NULL;
    return *n;
}

static int checkpoint_blocks(fsc_module *gpt) {
    int n = 0;
    fsc_module **blocks = NULL;
    int rc = gpt_blocks(gpt, &blocks, &n);
    for (int i = 0; i < n && !rc; i++) rc = fsc_checkpoint_wrap(blocks[i]);
    free(blocks);
    return rc ? fsc_error_context(rc, "--checkpoint-activations: ") : FSC_OK;
}

/* A maker's model with the plan's fine-tuning applied (NULL on failure). */
static fsc_module *finetuned(const fsc_gpt_plan *p, fsc_module *m, bool whole) {
    if (m && gpt_layout_finetune(p, m, whole)) {
        fsc_module_free(m);
        return NULL;
    }
    return m;
}

static fsc_module *make_replica(void *user) {
    const fsc_gpt_plan *p = user;
    return finetuned(p, fsc_gpt_new(&p->cfg), true);
}

/* tp: the GPT of tensor-parallel layers over the strategy's TP group. */
static fsc_module *make_tp_model(void *user, const fsc_tp_options *tp) {
    const fsc_gpt_plan *p = user;
    fsc_module *m = finetuned(p, fsc_tp_gpt_new(&p->cfg, tp), false);
    if (m && p->layout.checkpoint_activations && checkpoint_blocks(m)) {
        fsc_module_free(m);
        return NULL;
    }
    return m;
}

/* Stages in parts (three per block), so a stage may end inside a block. */
static fsc_module *make_stage(void *cfg, int first, int end) {
    /* stage_user is the plan's cfg (act_shape_at reads it), its first member */
    const fsc_gpt_plan *p = (const fsc_gpt_plan *)cfg;
    return finetuned(p, fsc_gpt_stage_parts_new(&p->cfg, first, end), false);
}

/* tp with pp: a stage of TP layers; its group is the loss's too. */
static fsc_module *make_tp_stage(void *user, int first, int end, const fsc_tp_options *tp) {
    fsc_gpt_plan *p = user;
    p->tp_group = tp->group;
    return finetuned(p, fsc_tp_gpt_stage_parts_new(&p->cfg, first, end, tp), false);
}

int fsc_gpt_plan_new(const fsc_gpt_config *cfg, const fsc_gpt_layout *layout, fsc_mesh *mesh,
                     fsc_gpt_plan **out) {
    if (!cfg || !layout || !out)
        return fsc_error(FSC_ERR_INVALID, "fsc_gpt_plan_new: NULL argument");
    *out = NULL;
    fsc_gpt_plan *p = calloc(1, sizeof *p);
    if (!p) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    p->cfg = *cfg;
    p->layout = *layout;
    p->mesh = mesh;
    fsc_gpt_layout *l = &p->layout;
    if (!l->strategy) l->strategy = "single";
    if (l->pp < 1) l->pp = 1;
    if (l->tp < 1) l->tp = 1;
    if (l->micro_batches < 1) l->micro_batches = 1;
    if (!l->pipe_schedule) l->pipe_schedule = "1f1b";
    if (!l->pipe_checkpoint) l->pipe_checkpoint = "never";
    int rc = gpt_layout_finetune_check(p);
    if (!rc) rc = gpt_layout_cp_setup(p);
    /* under pp each rank builds only its stages, under tp the strategy its slices */
    if (!rc && l->pp == 1 && l->tp == 1) {
        if (!(p->model = finetuned(p, fsc_gpt_new(&p->cfg), true)))
            rc = FSC_ERR_INVALID;
        else if (l->checkpoint_activations)
            rc = checkpoint_blocks(p->model);
    }
    if (rc) {
        fsc_gpt_plan_free(p);
        return rc;
    }
    *out = p;
    return FSC_OK;
}

/* pp: the GPT's L + 2 layers over pp x virtual stages. */
static int pipe_options(fsc_gpt_plan *p, const fsc_optim_config *optim, fsc_strategy_options *so) {
    const fsc_gpt_layout *l = &p->layout;
    fsc_pipe_kind kind;
    int rc = fsc_pipe_kind_parse(l->pipe_schedule, &kind);
    if (rc) return fsc_error_context(rc, "--pipe-schedule: ");
    const int chunks =
        kind == FSC_PIPE_INTERLEAVED ? (l->virtual_stages ? l->virtual_stages : 2) : 1;
    const bool autobalance = l->balance && !strcmp(l->balance, "auto");
    static const char *const modes[] = {"never", "always", "except_last"};
    int mode = -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(l->pipe_checkpoint, modes[i])) mode = i;
    if (mode < 0)
        return fsc_error(FSC_ERR_INVALID,
                         "--pipe-checkpoint \"%s\": expected never, always or except_last",
                         l->pipe_checkpoint);
    if (l->checkpoint_activations && mode == FSC_PIPE_CKPT_NEVER) mode = FSC_PIPE_CKPT_ALWAYS;
    so->pipe.checkpoint = (fsc_pipe_checkpoint)mode;
    so->pipe.stages = l->pp;
    so->pipe.schedule = kind;
    so->pipe.chunks = chunks;
    /* TP stages cut inside an MLP pass the residual and a GELU shard: not
     * under SP (the residual is a sequence shard) nor with the GELU output
     * recomputed (tp_block_parts.c) */
    const char *no_mlp_cut = l->tp < 2                 ? NULL
                             : l->sequence_parallel    ? "--sequence-parallel"
                             : l->recompute_activation ? "--recompute-activation"
                                                       : NULL;
    if (!autobalance && (rc = gpt_layout_balance_parts(l->balance, &p->cfg, l->pp * chunks,
                                                       no_mlp_cut, &p->balance)))
        return rc;
    so->pipe.balance = p->balance;
    so->pipe.layers = fsc_gpt_num_parts(&p->cfg);
    so->pipe.make_stage = l->tp > 1 ? NULL : make_stage; /* else tp.make_stage */
    so->pipe.stage_user = l->tp > 1 ? (void *)p : &p->cfg;
    so->pipe.act_ndim = 3;
    /* under sequence parallelism a stage passes on its TP rank's shard of
     * the sequence, under context parallelism this rank's positions */
    so->pipe.act_shape[0] = l->batch;
    so->pipe.act_shape[1] = p->cfg.seq / (l->sequence_parallel ? l->tp : 1) / (p->cp ? l->cp : 1);
    so->pipe.act_shape[2] = p->cfg.d_model;
    so->pipe.act_shape_at = l->tp > 1 ? gpt_layout_tp_act_shape : gpt_layout_parts_act_shape;
    if (autobalance && (rc = gpt_layout_balance_auto(p, optim, so)))
        return fsc_error_context(rc, "--balance auto: ");
    if (l->schedule_out && fsc_dist_rank() == 0) {
        fsc_pipe_schedule *sched;
        fsc_pipe_stats st;
        FILE *f = l->schedule_out;
        if (!(rc = fsc_pipe_schedule_make(kind, l->pp, chunks, l->micro_batches, &sched))) {
            fsc_pipe_schedule_print(sched, f);
            if (!fsc_pipe_schedule_validate(sched, NULL, &st, NULL))
                fprintf(f,
                        "%s, %d ranks x %d chunk(s), %d micro-batches: bubble %.3f (theory "
                        "%.3f), at most %d activations held on a rank, %d messages\n",
                        fsc_pipe_kind_name(kind), l->pp, chunks, l->micro_batches, st.bubble,
                        st.theoretical_bubble, st.peak_inflight, st.messages);
            fsc_pipe_schedule_free(sched);
        }
        if (rc) return fsc_error_context(rc, "--pipe-schedule: ");
    }
    return FSC_OK;
}

int fsc_gpt_plan_options(fsc_gpt_plan *p, const fsc_optim_config *optim, fsc_strategy_options *so) {
    if (!p || !so) return fsc_error(FSC_ERR_INVALID, "fsc_gpt_plan_options: NULL argument");
    if (p->options_done)
        return fsc_error(FSC_ERR_INVALID, "fsc_gpt_plan_options: called twice on one plan");
    p->options_done = true;
    const fsc_gpt_layout *l = &p->layout;
    so->name = l->strategy;
    so->seed = l->seed;
    so->mesh = p->mesh;
    int rc;
    if (fsc_strategy_takes(l->strategy, "units") && so->min_params == 0 && p->model) {
        if ((rc = gpt_blocks(p->model, &p->units, &so->nunits))) return rc;
        so->units = p->units;
    }
    if (fsc_strategy_takes(l->strategy, "threads")) {
        so->threads = l->threads;
        so->make_replica = make_replica;
        so->replica_user = p;
    }
    if (l->tp > 1)
        so->tp = (fsc_tp_strategy_options){.size = l->tp,
                                           .sequence_parallel = l->sequence_parallel,
                                           .recompute_attention = l->recompute_attention,
                                           .recompute_activation = l->recompute_activation,
                                           .make_model = l->pp > 1 ? NULL : make_tp_model,
                                           .make_stage = l->pp > 1 ? make_tp_stage : NULL,
                                           .user = p};
    return l->pp > 1 ? pipe_options(p, optim, so) : FSC_OK;
}

fsc_module *fsc_gpt_plan_model(const fsc_gpt_plan *p) {
    return p ? p->model : NULL;
}

fsc_group *fsc_gpt_plan_tp_group(const fsc_gpt_plan *p) {
    return p ? p->tp_group : NULL;
}

void fsc_gpt_plan_free(fsc_gpt_plan *p) {
    if (!p) return;
    fsc_module_free(p->model);
    free(p->units);
    free(p->balance);
    free(p->x), free(p->y), free(p->px);
    fsc_cp_free(p->cp);
    free(p->cx), free(p->cy);
    free(p);
}
