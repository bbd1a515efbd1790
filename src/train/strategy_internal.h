/* The strategy table's row type and the state every strategy shares. A row
 * fills the operations it needs; NULL entries take the shared behaviour of
 * strategy.c (documented per entry). Only src/train/ sees this. */
#ifndef FSC_TRAIN_STRATEGY_INTERNAL_H
#define FSC_TRAIN_STRATEGY_INTERNAL_H

#include "fsc/fsdp.h"
#include "fsc/strategy.h"

/* Options a row accepts beyond name, group and seed; any other non-zero
 * option is refused, naming the rows that take it. */
enum {
    OPT_BUCKET = 1 << 0,    /* bucket_bytes */
    OPT_PARTITION = 1 << 1, /* partition, share_dtype */
    OPT_REDUCE = 1 << 2,    /* reduce_dtype, fp32_reduce_scatter */
    OPT_FSDP = 1 << 3,    /* compute_dtype, units, min_params, keep_after_forward, accum_no_sync */
    OPT_THREADS = 1 << 4, /* threads, make_replica, replica_user */
    OPT_PROBE = 1 << 5,   /* grad_probe, grad_probe_user */
    OPT_SLOWMO = 1 << 6,  /* localsgd_frequency, slowmo_frequency, slowmo_momentum, slowmo_lr */
    OPT_HSDP = 1 << 7,    /* shard_group */
};

typedef struct strategy_ops {
    const char *name, *summary;
    bool spans_ranks; /* runs over the data-parallel group (false: this process alone) */
    bool pipeline;    /* the model comes as layers; steps through run_pipeline */
    /* With pipe.stages > 1 the pipeline row runs instead, this row's
     * behaviour between the replicas (ddp: an all-reduce of the gradients). */
    bool composes_with_pipe;
    bool local_steps; /* ranks step on their own gradients (fsc_strategy_info.local_steps) */
    int zero_stage;   /* 0..3: what is sharded over the group (see fsc_strategy_memory) */
    unsigned accepts; /* OPT_* */
    int (*setup)(fsc_strategy *s, const fsc_optim_config *optim);
    void (*teardown)(fsc_strategy *s);
    void (*zero_grad)(fsc_strategy *s);                 /* NULL: zero the bound gradients */
    void (*set_no_sync)(fsc_strategy *s, bool no_sync); /* NULL: nothing to defer */
    /* NULL: fn once on fsc_strategy_module with ctx (arena reset). */
    int (*run)(fsc_strategy *s, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
               float *loss);
    int (*clip)(fsc_strategy *s, float max_norm, float *total);
    int (*step)(fsc_strategy *s);
    int (*save_weights)(fsc_strategy *s, const char *path, int root, int n_meta,
                        const char *const *keys, const char *const *values);
    int (*load_weights)(fsc_strategy *s, const char *path, int *n_unused);
    int (*save_optim)(fsc_strategy *s, const char *path, int root);
    int (*load_optim)(fsc_strategy *s, const char *path);
    /* The row's own state beyond weights and optimizer (a checkpoint's
     * strategy.safetensors); load gets NULL for a checkpoint without one.
     * NULL: none. */
    int (*save_state)(fsc_strategy *s, const char *path, int root);
    int (*load_state)(fsc_strategy *s, const char *path);
    int (*save_sharded)(fsc_strategy *s, const char *path, int n_meta, const char *const *keys,
                        const char *const *values);                /* NULL: none */
    int (*load_sharded)(fsc_strategy *s, const char *path);       /* NULL: none */
    void (*stats)(const fsc_strategy *s, fsc_strategy_stats *out); /* NULL: none */
    int (*run_pipeline)(fsc_strategy *s, const fsc_ctx *ctx, const fsc_pipe_io *io, float *loss);
    int (*write_trace)(fsc_strategy *s, const char *path); /* NULL: nothing to trace */
} strategy_ops;

struct fsc_strategy {
    const strategy_ops *ops;
    fsc_strategy_options opt;
    fsc_module *model;  /* borrowed */
    fsc_module *module; /* what forward/backward run on: a wrapper or the model */
    fsc_group *group;   /* data-parallel group (self for single, dp) */
    fsc_group *all; /* every rank of the strategy (group, or the pipeline's replicas x stages) */
    int rank, world;
    int shard_ranks; /* hsdp: the ranks its ZeRO stage shards over (0: world) */
    fsc_optim *optim;        /* this rank's optimizer (owned by oss or fsdp below) */
    fsc_optim_range *ranges; /* the optimizer's ranges as one array */
    int nranges;
    /* replicated rows (single, dp, ddp, oss, sdp) */
    fsc_params params;
    bool bound;
    fsc_oss *oss;        /* always an OSS: over the group for oss/sdp, self otherwise */
    fsc_module *wrapper; /* ddp or sdp wrapper, or NULL */
    fsc_dp *dp;
    /* fsdp */
    fsc_fsdp *fsdp;
    /* pipeline: the stages' group (ranks of one replica) and the schedule;
     * `group` is then the data-parallel group (one rank per replica) */
    fsc_pipe *pipe;
    fsc_pipe_schedule *sched;
    /* the layout's groups, all the mesh's (strategy_mesh): pp the stages of
     * one replica, dp the ranks at the same place in every replica, tp (NULL
     * when tp.size is 1) the ranks of one TP group */
    fsc_mesh *own_mesh; /* the one built here when opt.mesh is NULL */
    fsc_group *pp_group, *dp_group;
    int pipe_zero;     /* the named row's ZeRO stage, applied between the replicas */
    bool pipe_no_sync; /* fsdp over TP replicas: not the step's last micro-batch */
    /* tensor parallelism (strategy_tp.c): the TP group (one replica; the
     * data-parallel group across replicas is dp_group), the row's operations
     * with TP's overrides, the options the model was made with (it keeps a
     * pointer), which optimizer ranges count in the norm on this rank */
    fsc_group *tp_group;
    strategy_ops tp_ops;
    fsc_tp_options tp_options;
    bool *tp_counted;
    fsc_tp_optim_state *tp_state; /* optimizer pieces by global name, made at first use */
    void (*tp_row_stats)(const fsc_strategy *s, fsc_strategy_stats *out);
    double pipe_wait_s;
    int64_t pipe_messages, dp_allreduces;
    struct slowmo_state *slowmo; /* strategy_slowmo.c */
    struct hsdp_state *hsdp;     /* strategy_hsdp.c: its groups, the fsdp row's state above */
};

/* strategy.c. The layout's groups from the mesh (opt.mesh, or one built
 * over s->group of size / (stages x tp) replicas, s->own_mesh): pp_group,
 * dp_group and, with tp.size > 1, tp_group. The caller has checked that the
 * group's size is a multiple of stages x tp. */
int strategy_mesh(fsc_strategy *s);

/* strategy_tp.c. Before the row's setup: the TP and data-parallel groups,
 * the model, and s->ops switched to the row's with TP's overrides. */
int strategy_tp_begin(fsc_strategy *s, const strategy_ops *row);
/* After the row's teardown: the model and groups. */
void strategy_tp_end(fsc_strategy *s);
/* Binds s->model's parameters with gradients into *out (TP shards as
 * slices of the one-process tensors). */
int strategy_bind(fsc_strategy *s, fsc_params *out);

/* The rows, defined beside their code. */
extern const strategy_ops fsc_strategy_single, fsc_strategy_dp, fsc_strategy_ddp, fsc_strategy_oss,
    fsc_strategy_sdp, fsc_strategy_fsdp, fsc_strategy_slowmo, fsc_strategy_hsdp;
/* Not in the table: what a row that composes with a pipeline becomes, and
 * what fsdp becomes with tp.size > 1 and no pipeline (strategy_pipe.c: a
 * pipeline of one stage, the whole TP model, run micro-step by micro-step). */
extern const strategy_ops fsc_strategy_pipe, fsc_strategy_pipe_whole;

/* strategy_fsdp.c: the fsdp row's calls that hsdp takes as they are, over
 * its shard group (each group holds the whole model once). */
void strategy_fsdp_zero_grad(fsc_strategy *s);
int strategy_fsdp_clip(fsc_strategy *s, float max_norm, float *total);
int strategy_fsdp_step(fsc_strategy *s);
int strategy_fsdp_load_weights(fsc_strategy *s, const char *path, int *n_unused);
int strategy_fsdp_load_optim(fsc_strategy *s, const char *path);
/* The entries both rows' tables fill with them. */
#define STRATEGY_FSDP_SHARED_OPS                                                                   \
    .zero_grad = strategy_fsdp_zero_grad, .clip = strategy_fsdp_clip, .step = strategy_fsdp_step,  \
    .load_weights = strategy_fsdp_load_weights, .load_optim = strategy_fsdp_load_optim

/* strategy_hsdp.c: the group across shard groups (this rank's peers that
 * own the same shard), or NULL when s is not hsdp; for tests' statistics. */
fsc_group *strategy_hsdp_replica(const fsc_strategy *s);

/* Copies the optimizer's ranges into s->ranges (after setup). */
int strategy_collect_ranges(fsc_strategy *s);

#endif
