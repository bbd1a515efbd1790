/* A GPT on a layout: the library's recipe for spreading the one model
 * (fsc/gpt.h) over a strategy row, a pipeline and a tensor-parallel group,
 * so that a program gets a pipelined or tensor-parallel GPT trainer in the
 * same few lines as a DDP one:
 *
 *     fsc_mesh *mesh;   // dp x pp x tp over the world (fsc/dist.h)
 *     fsc_mesh_new_over(NULL, (fsc_mesh_shape){.pp = 2, .tp = 2}, &mesh);
 *     fsc_gpt_plan *plan;
 *     fsc_gpt_plan_new(&cfg, &(fsc_gpt_layout){.strategy = "ddp", .pp = 2, .tp = 2,
 *                                              .batch = B, .micro_batches = 4}, mesh, &plan);
 *     fsc_trainer_config tc = {.optim = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-3}};
 *     fsc_gpt_plan_trainer_config(plan, batch_fn, data, &tc);   // data and loss
 *     fsc_trainer *t = fsc_trainer_new(fsc_gpt_plan_model(plan), &tc);
 *
 * (examples/pipelined_tp.c). A program with loss functions of its own
 * fills only the strategy's options (fsc_gpt_plan_options), as fsc-train
 * does.
 *
 * The plan makes what each rank holds: the whole model (no pp, no tp), or
 * the makers the strategy calls for its TP model or its pipeline stages
 * (stages cut in parts, three per block, so a stage may end inside one);
 * it parses the balance (or measures it: "auto"), and answers the loss
 * functions' questions (fsc_gpt_plan_tp_group). The tools parse flags into
 * an fsc_gpt_layout and ask it; none of them knows a strategy by name. */
#ifndef FSC_LAYOUT_H
#define FSC_LAYOUT_H

#include <stdio.h>

#include "fsc/dist.h"
#include "fsc/export.h"
#include "fsc/gpt.h"
#include "fsc/optim.h"
#include "fsc/strategy.h"
#include "fsc/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One optimizer parameter group of a layout: parameters whose full names
 * match `pattern` take lr x lr_scale and, when weight_decay >= 0, that
 * decay (torch's param_groups; fsc_module_param_group). */
typedef struct fsc_gpt_param_group {
    const char *pattern;
    double lr_scale;
    double weight_decay;
} fsc_gpt_param_group;

/* Where and how the GPT runs. Zero fields are the documented defaults;
 * strings are borrowed for the plan's life. */
typedef struct fsc_gpt_layout {
    const char *strategy; /* a row of the strategy table (NULL: "single") */
    int pp;               /* pipeline stages (0 or 1: none) */
    /* layers per pipeline stage (pp x chunks of them) in whole layers or
     * quarters of a block ("1.5,0.5,..."; a block splits at .5 after its
     * attention half or .75 after its MLP's c_fc and GELU); NULL: an even
     * split of whole layers; "auto": every layer timed on every rank, cut
     * where the slowest stage is fastest within the memory budget */
    const char *balance;
    int tp; /* tensor-parallel ranks per replica (0 or 1: none) */
    /* context-parallel ranks per replica (0 or 1: none; fsc/cp.h): each holds
     * chunks c and 2cp-1-c of every sequence; the mesh's cp size */
    int cp;
    bool sequence_parallel;      /* with tp: LayerNorm/dropout regions on sequence shards */
    bool recompute_attention;    /* with tp: attention probabilities recomputed in backward */
    bool recompute_activation;   /* with tp: the MLP's GELU output recomputed in backward */
    const char *pipe_schedule;   /* gpipe | 1f1b (NULL) | interleaved | zb1 (fsc_pipe_kind_parse) */
    int virtual_stages;          /* interleaved: stages per rank (0: 2) */
    const char *pipe_checkpoint; /* never (NULL) | always | except_last */
    bool checkpoint_activations; /* recompute every block in backward */
    int batch;                   /* rows per micro-batch (the pipeline's activations) */
    int micro_batches;           /* per step (the trainer's grad_accum; 0: 1) */
    int threads;                 /* a row of threads: its workers (each a whole replica) */
    uint64_t seed;               /* initial weights (fsc_strategy_options.seed) */
    /* Fine-tuning: parameters frozen by full-name glob (fsc_module_freeze)
     * on every model the plan makes (the whole GPT, its DP replicas, its
     * pipeline stages and TP slices); each pattern must match a parameter
     * of the whole model (checked by fsc_gpt_plan_new). Borrowed. */
    const char *const *freeze;
    int nfreeze;
    /* LoRA adapters (fsc/lora.h) on every model the plan makes, before the
     * freeze patterns; NULL: none. Refused with tp > 1. Borrowed. */
    const struct fsc_lora_config *lora;
    /* Optimizer parameter groups (fsc_module_param_group), in order, the
     * first that matches a parameter winning; each must match a parameter
     * of the whole model. Borrowed. */
    const struct fsc_gpt_param_group *groups;
    int ngroups;
    /* Rank 0 prints the schedule's grid and its statistics here (NULL:
     * nothing), and --balance auto's choice in layers per stage with its
     * predicted time and memory (NULL: nothing). */
    FILE *schedule_out, *balance_out;
} fsc_gpt_layout;

typedef struct fsc_gpt_plan fsc_gpt_plan;

/* Plans config `cfg` (copied; its moe pointer is borrowed) on `layout` over
 * `mesh` (the layout's dp x pp x tp groups, fsc_mesh_new_over; NULL where
 * the row runs on this process alone; borrowed, outliving the plan). Makes
 * the whole model now when there is neither a pipeline nor a TP group
 * (blocks wrapped for recomputation under checkpoint_activations). 0 and
 * *out, or a negative status naming the field and the rule (an unknown
 * schedule, checkpoint mode or strategy, a balance that does not fill the
 * stages). */
FSC_API int fsc_gpt_plan_new(const fsc_gpt_config *cfg, const fsc_gpt_layout *layout,
                             fsc_mesh *mesh, fsc_gpt_plan **out);
/* Fills the layout's part of *so, leaving the rest as the caller set it:
 * name, seed, mesh; threads and make_replica for a row of threads; the
 * GPT's blocks as units for a row that takes units when so->min_params is
 * 0; tp (make_model or make_stage); pipe (stages, schedule, chunks, balance,
 * checkpoint, make_stage, the activation's shapes). With balance "auto" it
 * times the layers here (collective over the mesh's ranks), counting
 * `optim`'s state per parameter; it prints the schedule if asked. Call once,
 * before fsc_trainer_new or fsc_strategy_new; *so borrows the plan. */
FSC_API int fsc_gpt_plan_options(fsc_gpt_plan *p, const fsc_optim_config *optim,
                                 fsc_strategy_options *so);
/* The model to give fsc_trainer_new: the whole GPT, or NULL when the
 * strategy makes it (tp) or its stages (pp). Owned by the plan. */
FSC_API fsc_module *fsc_gpt_plan_model(const fsc_gpt_plan *p);
/* The TP group of this rank's last made TP stage (its loss's group under a
 * pipeline: fsc_tp_cross_entropy); NULL without tp or before a stage. */
FSC_API fsc_group *fsc_gpt_plan_tp_group(const fsc_gpt_plan *p);
/* The tokens of micro-batch mb (all its mb->batch rows) into x and y,
 * (batch, T) int32 each: the inputs and the next tokens (fsc_tokens_batch
 * fills them from a corpus). 0 or a negative status. */
typedef int (*fsc_gpt_batch_fn)(const fsc_micro_batch *mb, void *user, int32_t *x, int32_t *y);
/* Fills a trainer config for the plan: cfg->strategy (fsc_gpt_plan_options,
 * with cfg->optim, which the caller sets first), batch and grad_accum (the
 * layout's batch and micro_batches), targets_per_sample (T), load (calling
 * `batch` with batch_user) and the loss functions of whichever model the
 * plan makes (the whole GPT, the TP GPT, pipeline stages with or without
 * tp); cfg->user becomes the plan. Other fields are left as the caller set
 * them. Call once; the plan must outlive the trainer. */
FSC_API int fsc_gpt_plan_trainer_config(fsc_gpt_plan *p, fsc_gpt_batch_fn batch, void *batch_user,
                                        fsc_trainer_config *cfg);
/* Fills an evaluation config (fsc_trainer_eval) for the plan: load
 * (calling `batch`, with batch_user, for the validation batches) and the
 * forward-only loss of the whole or TP GPT, or, under a pipeline, the
 * trainer's pipeline ends (which read the batches from the same buffers);
 * cfg->user becomes the plan. Call after fsc_gpt_plan_trainer_config, before
 * each fsc_trainer_eval; batches is the caller's. FSC_ERR_UNSUPPORTED under
 * context parallelism. */
FSC_API int fsc_gpt_plan_eval_config(fsc_gpt_plan *p, fsc_gpt_batch_fn batch, void *batch_user,
                                     fsc_trainer_eval_config *cfg);
/* The batch_user given to fsc_gpt_plan_trainer_config (NULL before it):
 * the caller's own hooks in that config (after_backward) receive the plan
 * as their user and find the caller's data here. */
FSC_API void *fsc_gpt_plan_user(const fsc_gpt_plan *p);
/* Context parallelism (layout.cp > 1) for a program with its own data and
 * loss functions (fsc-train's): the strategy's ranks are then dp x cp,
 * ranked d * cp + c (fsc_mesh_dp_cp), and the cp ranks of replica d read
 * replica d's micro-batch. This gives the micro-batch to read for mb (mb
 * itself without cp). */
FSC_API fsc_micro_batch fsc_gpt_plan_data_batch(const fsc_gpt_plan *p, const fsc_micro_batch *mb);
/* Runs rows [mb->row0, +mb->rows) of x and y, (mb->batch, T) each, through
 * m (the plan's GPT or TP GPT), mb->norm normalising: under cp this rank's
 * positions of them, with fsc_ctx.seq set and the replica's dropout keys.
 * fsc_gpt_train_micro's status. */
FSC_API int fsc_gpt_plan_train_micro(fsc_gpt_plan *p, fsc_module *m, const fsc_ctx *ctx,
                                     const fsc_micro_batch *mb, const int32_t *x, const int32_t *y,
                                     float *loss);
/* T / cp: the trainer's targets_per_sample (the strategy's world counts
 * the cp ranks too, so the normaliser stays the global target count). */
FSC_API int fsc_gpt_plan_targets_per_sample(const fsc_gpt_plan *p);
/* The plan's ring (NULL without cp): its statistics (fsc_cp_get_stats). */
FSC_API struct fsc_cp *fsc_gpt_plan_cp(const fsc_gpt_plan *p);

/* Frees the plan and what it made (after the trainer or strategy that
 * borrows it); NULL is fine. */
FSC_API void fsc_gpt_plan_free(fsc_gpt_plan *p);

/* Questions a layout asks of the strategy table (fsc_strategy_info_get,
 * fsc_strategy_takes), so that no program compares names. */
/* Whether row `name` trains the whole model on this process alone, with no
 * ranks and no threads ("single"); false for unknown names. */
FSC_API bool fsc_strategy_is_single(const char *name);
/* Whether row `name` keeps a full replica on each of its ranks and
 * all-reduces the gradients every step ("ddp"): the row that runs a TP
 * model itself (the sharded rows run it as one pipeline stage) and over
 * whose ranks MoE experts are spread; false for unknown names. */
FSC_API bool fsc_strategy_all_reduces(const char *name);

#ifdef __cplusplus
}
#endif

#endif
