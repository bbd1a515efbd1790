/* The pipeline executor's state, shared by pipe.c (set-up and the action
 * loop), pipe_params.c (shared parameters), pipe_step.c (norm, update,
 * weights files) and the executor's other pipe_*.c files.
 * Only src/parallel/ sees this. */
#ifndef FSC_PIPE_EXEC_INTERNAL_H
#define FSC_PIPE_EXEC_INTERNAL_H

#include "fsc/pipe.h"
#include "fsc/zero.h"

enum { PIPE_HEADER = 8 }; /* floats in front of every message: its shape and status */

/* A parameter that other ranks hold too (by name), and the group of the
 * ranks that do. */
typedef struct {
    float *data, *grad;
    int64_t n;
    fsc_group *g; /* the ranks holding it; rank 0 of it (the lowest) owns and updates it */
} pipe_shared;

/* This rank's slice of one chunk's flat buffers among the replicas: flat
 * elements [lo, hi) of `numel`, out of equal slices of `shard` elements. */
typedef struct {
    int64_t numel, shard, lo, hi;
} pipe_slice;

/* The optimizer state's view by global name (pipe_state.c): the whole
 * model's parameter list in global shapes (no storage), and every rank of
 * the norm group's pieces of it (global entry, first element, count), with
 * this rank's piece k in optimizer range map[k] from element off[k]. Saving
 * lists a parameter every TP rank holds on TP rank 0 only; loading on all. */
typedef struct {
    fsc_params whole;
    fsc_param *gparams;
    fsc_partition save, load;
    int *save_map, *load_map;
    int64_t *save_off, *load_off;
} pipe_pieces;

/* The activation crossing one cut between stages, per micro-batch. */
typedef struct {
    int64_t shape[FSC_MAX_DIMS], numel;
} pipe_cut;

struct fsc_pipe {
    fsc_group *g; /* borrowed */
    const fsc_pipe_schedule *sched;
    fsc_pipe_config cfg;
    fsc_pipe_options opt;
    int rank, stages;
    int *first; /* per stage: first layer (stages + 1 entries: end of the last) */
    int nchunks;
    fsc_module **chunk; /* this rank's stage modules, by chunk */
    fsc_params *params; /* by chunk */
    fsc_optim_range *ranges;
    int nranges;
    fsc_optim *optim;
    pipe_shared *shared;
    int nshared;
    fsc_group **groups; /* distinct groups of shared parameters (owned) */
    int ngroups;
    /* The whole model's parameter list (no storage) and who owns each
     * entry (the lowest rank holding it): the optimizer-state file's view. */
    fsc_module *whole;
    fsc_params whole_ps;
    fsc_partition part;
    /* Replicas (pipe_dp.c): groups borrowed from the options; per chunk,
     * this rank's slice; whether the sharded parameters are gathered now
     * (SHARD_PARAMS). replica: the ranks of this replica (every stage and
     * TP rank), the layout's (fsc_mesh_replica). */
    int dp_rank, dp_size, tp_rank, tp_size;
    pipe_slice *slice;
    bool gathered;
    fsc_group *replica;
    /* The layout's groups: opt.layout, or own_mesh built from the options
     * (pipe_mesh_setup). */
    const fsc_mesh *layout;
    fsc_mesh *own_mesh;
    /* pipe_state.c: the optimizer's ranges that count in the gradient norm
     * on this rank (a parameter every TP rank holds: TP rank 0's only), and
     * the optimizer state's pieces by global name. */
    fsc_optim_range *counted;
    int ncounted;
    pipe_pieces pieces;
    pipe_cut *cut;            /* stages + 1: cut[s] enters stage s (0 and stages unused) */
    struct pipe_probe *probe; /* pipe_probe.c: opt.probe's state, or NULL */
    bool *lazy;               /* per micro-batch: its arena back once its sends are seen taken */
    fsc_arena **arena;        /* per micro-batch of the step */
    int narena;
    fsc_pipe_run_stats stats;
    /* the last run's actions on this rank: start and end, seconds since its start */
    double *trace_t0, *trace_t1;
    int ntrace;
};

/* pipe_stages.c: p->first (the balance, or an even one), p->cut, and this
 * rank's chunks: modules (checkpointed as the options say) and parameters. */
int pipe_make_stages(fsc_pipe *p);

/* pipe_release.c: p->lazy, for the training schedule: the micro-batches
 * whose sends this rank must not wait for at their last action here (the
 * wait could hang on a hand-written order; generated ones wait for all). */
int pipe_plan_release(fsc_pipe *p);

/* pipe_params.c: finds parameters held by several ranks, makes their groups,
 * and the whole model's listing with every entry's owner. */
int pipe_find_shared(fsc_pipe *p);
/* This rank's owned ranges, in whole-model order (what its optimizer steps). */
int pipe_owned_ranges(fsc_pipe *p, fsc_optim_range **out, int *n);
/* After the update: the owner's values of each shared parameter to its copies. */
int pipe_share_updates(fsc_pipe *p);
void pipe_free_shared(fsc_pipe *p);
/* Sums the shared parameters' gradients over the ranks that hold them. */
int pipe_sum_shared(fsc_pipe *p);

/* pipe_dp.c: the layout's groups (opt.layout, or a mesh laid out once from
 * the options), checked against this rank's place in the options' groups;
 * collective over the mesh when it builds one. */
int pipe_mesh_setup(fsc_pipe *p);
void pipe_mesh_free(fsc_pipe *p);
/* pipe_dp.c: the replicas. Setup cuts each chunk into slices and (sharded
 * modes) makes the optimizer's ranges and the mesh's pieces; collective
 * over the mesh. */
int pipe_dp_setup(fsc_pipe *p);
void pipe_dp_free(fsc_pipe *p);
/* SHARD_PARAMS: the whole of every chunk's buffers counted and writable
 * again, values outside this rank's slices undefined (not collective). */
int pipe_dp_commit(fsc_pipe *p);
/* SHARD_PARAMS: every chunk whole again (all-gather over dp, then the
 * shared parameters' owners' values to their copies); others: nothing. */
int pipe_dp_gather(fsc_pipe *p);
/* SHARD_PARAMS: everything but this rank's slices given back. */
int pipe_dp_release(fsc_pipe *p);
/* After the schedule: gradients reduced over dp as the mode says. */
int pipe_dp_reduce(fsc_pipe *p);
/* After the update: the replicas' slices to every replica (sharded modes). */
int pipe_dp_share_update(fsc_pipe *p);
/* Zeroes the gradients this rank keeps between steps. */
void pipe_dp_zero_grad(fsc_pipe *p);
/* The group over which the optimizer's ranges are disjoint (clip, state):
 * the mesh when replicas shard, else this replica. */
fsc_group *pipe_dp_norm_group(fsc_pipe *p);

/* pipe_probe.c: opt.probe on each micro-batch's gradient (hooks on the
 * chunks' backward). Setup after pipe_find_shared and p->tp_rank; flush
 * after pipe_sum_shared, before the replicas reduce: the shared
 * parameters' micro-batches summed over their holders (collective over
 * their groups). */
int pipe_probe_setup(fsc_pipe *p);
void pipe_probe_free(fsc_pipe *p);
void pipe_probe_zero(fsc_pipe *p); /* with the gradients */
int pipe_probe_flush(fsc_pipe *p);

/* The first replica's outcome rc on every replica (an error there is named
 * on the others as `what`). Collective over dp. */
int pipe_replicas_agree(fsc_pipe *p, int rc, const char *what);
/* pipe_state.c: after the ranges are final, the ranges that count in the
 * norm and the state's pieces (collective over the norm group). */
int pipe_state_setup(fsc_pipe *p);
void pipe_state_free(fsc_pipe *p);

#endif
