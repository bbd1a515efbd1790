/* The plan of a GPT on a layout (fsc/layout.h), shared by gpt_layout.c
 * (the makers and the strategy's options) and gpt_layout_balance.c (the
 * balance: parsed, or measured and printed). */
#ifndef FSC_TRAIN_GPT_LAYOUT_INTERNAL_H
#define FSC_TRAIN_GPT_LAYOUT_INTERNAL_H

#include "fsc/layout.h"

struct fsc_gpt_plan {
    fsc_gpt_config cfg;
    fsc_gpt_layout layout;
    fsc_mesh *mesh;      /* borrowed */
    fsc_module *model;   /* the whole GPT (no pp, no tp), or NULL */
    fsc_module **units;  /* the GPT's blocks when they are the row's units */
    int *balance;        /* parts per stage (pp x chunks), or NULL */
    fsc_group *tp_group; /* the last TP stage's group (its loss's) */
    bool options_done;
    /* fsc_gpt_plan_trainer_config: the caller's batches, this rank's
     * micro-batch and, under pp, the step's ids by micro-batch */
    fsc_gpt_batch_fn batch_fn;
    void *batch_user;
    int32_t *x, *y, *px;
    /* fsc_gpt_plan_eval_config: the validation batches, read into x and y
     * (the trainer's pipeline ends read them there as in training) */
    fsc_gpt_batch_fn eval_fn;
    void *eval_user;
    /* context parallelism: the ring over the mesh's cp group, and this
     * rank's positions of a micro-batch (batch x T/cp each) */
    struct fsc_cp *cp;
    int32_t *cx, *cy;
};

/* gpt_layout_cp.c. Under layout.cp > 1: checks the layout (the mesh's cp
 * size, what context parallelism runs with) and makes the ring over the
 * mesh's cp group; nothing without cp. */
int gpt_layout_cp_setup(fsc_gpt_plan *p);
/* This rank's positions of rows (rows, T) of x and y (either may be NULL)
 * into p->cx and p->cy (layout.batch x T/cp each, made at the first call). */
int gpt_layout_cp_take(fsc_gpt_plan *p, const int32_t *x, const int32_t *y, int rows);
/* Under cp with a pipeline: the trainer's pipe_seq and pipe_sample0 (the
 * stages run under the ring's split, dropout keyed by the replica's
 * samples); nothing otherwise. */
void gpt_layout_cp_pipe(fsc_gpt_plan *p, fsc_trainer_config *cfg);

/* gpt_layout_finetune.c. Freezes what layout.freeze names on m, a model
 * the plan made (whole: the one-process GPT, every pattern must match;
 * else a stage or TP slice, which holds part of the names). */
int gpt_layout_finetune(const fsc_gpt_plan *p, fsc_module *m, bool whole);
/* fsc_gpt_plan_new: every pattern of layout.freeze names a parameter of
 * the one-process model (built without storage to list its names). */
int gpt_layout_finetune_check(const fsc_gpt_plan *p);

/* The balance text (NULL: even) for S stages into *out (malloc'ed), in
 * parts per stage; no_mlp_cut (the flag that forbids them, or NULL)
 * refuses cuts inside an MLP (.75). Errors name the value and the rule. */
int gpt_layout_balance_parts(const char *text, const fsc_gpt_config *cfg, int S,
                             const char *no_mlp_cut, int **out);
/* fsc_pipe_options.act_shape_at for stages of parts (user: the config),
 * and under tp (user: the plan). */
void gpt_layout_parts_act_shape(void *cfg, int part, int64_t shape[FSC_MAX_DIMS]);
void gpt_layout_tp_act_shape(void *plan, int part, int64_t shape[FSC_MAX_DIMS]);
/* balance "auto": times every layer over the mesh and sets so->pipe.balance. */
int gpt_layout_balance_auto(fsc_gpt_plan *p, const fsc_optim_config *optim,
                            fsc_strategy_options *so);

#endif
