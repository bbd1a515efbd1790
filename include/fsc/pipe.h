/* fsc pipe: pipeline parallelism, one stage (or v interleaved chunks) per
 * rank of a group, driven by a validated schedule (fsc/pipe_schedule.h).
 *
 * The model is a sequence of layers that a user-supplied function cuts into
 * stage modules with the whole model's parameter names (fsc_gpt_stage_new
 * for the GPT). Each rank builds and binds only its own stages, initialised
 * by (seed, name, element) exactly as the whole model would be. One executor
 * interprets the schedule: forwards, full backwards, and non-blocking sends
 * and receives of activations and their gradients, each message checked
 * against the planned shape (a mismatch is an error on both ranks naming
 * the rank, stage, micro-batch and action). Parameters that several stages
 * share by name (the GPT's wte: embedding and tied head) are kept equal:
 * their gradients are summed over the ranks that hold them before the
 * update, and counted once in the gradient norm. Replicas of the pipeline
 * (options dp, mesh) are data-parallel, with or without ZeRO sharding of
 * each stage over them (fsc_pipe_sharding).
 *
 *     fsc_pipe *p = fsc_pipe_new(group, schedule, &adamw, &opt);
 *     fsc_pipe_zero_grad(p);
 *     fsc_pipe_run(p, &ctx, &io, &loss);       // every micro-batch of the step
 *     fsc_pipe_clip_grad_norm(p, 1.0f, &norm);
 *     fsc_pipe_step(p);
 */
#ifndef FSC_PIPE_H
#define FSC_PIPE_H

#include "fsc/checkpoint_wrapper.h"
#include "fsc/dist.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/parallel.h" /* fsc_grad_probe_fn */
#include "fsc/pipe_schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_pipe fsc_pipe;

/* Makes the module for layers [first, end) of the model, with the whole
 * model's parameter names (the caller of fsc_pipe_new keeps user alive). */
typedef fsc_module *(*fsc_pipe_stage_fn)(void *user, int first, int end);

/* Activation checkpointing of the stages' parts (torchgpipe's and
 * FairScale's `checkpoint` argument): never; every micro-batch; every one
 * but the last of the step (whose backward follows its forward soonest). */
typedef enum {
    FSC_PIPE_CKPT_NEVER = 0,
    FSC_PIPE_CKPT_ALWAYS,
    FSC_PIPE_CKPT_EXCEPT_LAST
} fsc_pipe_checkpoint;

/* How data-parallel replicas of a pipeline share their work (the ZeRO
 * stages of the named strategies, applied to each stage's parameters over
 * the ranks that run that stage): */
typedef enum {
    FSC_PIPE_REPLICATED = 0, /* ddp: gradients all-reduced, every replica steps everything */
    FSC_PIPE_SHARD_OPTIM,    /* oss (ZeRO-1): all-reduce, each replica steps 1/dp, all-gather */
    FSC_PIPE_SHARD_GRADS,    /* sdp (ZeRO-2): reduce-scatter, step 1/dp, all-gather */
    /* fsdp (ZeRO-3): between steps a rank keeps 1/dp of its stages'
     * parameters and gradients (the rest given back to the system); the
     * step gathers them once before its first micro-batch and reduce-scatters
     * after its last (PyTorch's pipelining unshards and reshards alike). */
    FSC_PIPE_SHARD_PARAMS
} fsc_pipe_sharding;

typedef struct fsc_pipe_options {
    int layers; /* of the whole model (> 0) */
    fsc_pipe_stage_fn make_stage;
    void *stage_user;
    /* Layers per stage: ranks x chunks entries, each >= 1, summing to
     * `layers` (borrowed; copied). NULL: as even as possible, earlier
     * stages taking the remainder. */
    const int *balance;
    /* The activation between two stages for one micro-batch (e.g. B, T, C):
     * every message is checked against it. */
    int act_ndim;
    int64_t act_shape[FSC_MAX_DIMS];
    /* Where a cut passes another shape (the GPT's cut between a block's
     * c_fc + GELU and its c_proj passes (B, T, 5C)): the activation entering
     * layer `layer` (0 < layer < layers), written over shape, which holds
     * act_shape on entry (act_ndim dimensions). Called with stage_user.
     * NULL: act_shape at every cut. */
    void (*act_shape_at)(void *user, int layer, int64_t shape[FSC_MAX_DIMS]);
    /* Tokens per sample of the model's input, for fsc_pipe_balance_auto's
     * ids (act_shape[0], seq_len) and a fused head's targets; 0: act_shape[1]
     * (under sequence parallelism act_shape[1] is a TP rank's shard of it). */
    int64_t seq_len;
    /* Context parallelism (fsc/cp.h): fsc_pipe_balance_auto times each
     * layer under this split (fsc_ctx.seq; act_shape and seq_len are then
     * this rank's positions), its attention round the ring with the cp
     * group's other ranks, which must time the same layers. Borrowed; NULL:
     * none. A run's split is its ctx's (fsc_pipe_run). */
    const fsc_seq_split *seq;
    uint64_t seed; /* initial weights by (seed, name, element) */
    /* Recompute in backward: each stage's children that hold parameters of
     * their own (not used by the stage directly) are checkpointed in place.
     * Same gradients bit for bit; less activation memory. */
    fsc_pipe_checkpoint checkpoint;
    /* Data-parallel replicas of this pipeline (NULL: one). dp holds the
     * ranks that run the same stages in the other replicas; mesh holds every
     * rank of every replica, ranked replica * ranks + pipeline rank (both
     * borrowed, outliving the pipe). fsc_pipe_run then reduces gradients
     * over dp after the schedule, as `sharding` says; clipping and the
     * optimizer-state file span the mesh. */
    fsc_group *dp, *mesh;
    fsc_pipe_sharding sharding;
    /* Tensor-parallel stages (NULL: none): the TP group of this rank's
     * stage modules, which make_stage builds of fsc/tp.h's layers over it
     * (fsc_tp_gpt_stage_new); g then holds the ranks of the same TP rank,
     * one per stage. Parameters are bound as slices of the one-process
     * tensors (fsc_tp_params_bind), the gradient norm counts a parameter
     * every TP rank holds once, and the weights and optimizer-state files
     * hold the global tensors by global name. Needs mesh (dp optional), its
     * ranks laid out (replica * ranks + pipeline rank) * tp size + tp rank.
     * Borrowed, outliving the pipe. */
    fsc_group *tp;
    /* The layout's mesh (fsc/dist.h; borrowed, outliving the pipe): g, dp,
     * mesh and tp are then its pp, dp x cp (fsc_mesh_dp_cp: under context
     * parallelism a stage's cp ranks are replicas that see other positions,
     * and its gradients are summed over them), parent and tp groups, and
     * the pipe takes its other groups from it (a replica's ranks, the
     * stages that share a parameter). NULL: the pipe lays out its own mesh once, over
     * mesh (else g) as replicas x g's ranks x tp. */
    const fsc_mesh *layout;
    /* NULL: none. Sees each micro-batch's own gradient after its backward
     * on this rank (AdaScale's samples), only what this rank counts in the
     * norm: a parameter every TP rank holds on TP rank 0, a shared one on
     * its owner after the schedule, summed over its holders (offset -1);
     * else offset is into the stage's flat gradient (fsc_grad_probe_fn).
     * Not with a schedule that splits backward (FSC_ERR_UNSUPPORTED). */
    fsc_grad_probe_fn probe;
    void *probe_user;
} fsc_pipe_options;

/* This rank's stages of opt's model over group g, run by `schedule`
 * (borrowed, must outlive the pipe; its ranks must equal g's size, its
 * backward not split), with an optimizer of config `optim` over this rank's
 * parameters. Collective over g (names of shared parameters are exchanged).
 * NULL (error set, naming the problem) for a schedule of another size, a
 * balance that does not add up, a stage the model cannot make, a parameter
 * name repeated on one rank, or fewer than 2 ranks without a mesh (one rank
 * with opt->mesh is one stage that the mesh's replicas or TP ranks share). */
FSC_API fsc_pipe *fsc_pipe_new(fsc_group *g, const fsc_pipe_schedule *schedule,
                               const fsc_optim_config *optim, const fsc_pipe_options *opt);
/* Frees stages, parameters, optimizer and buffers. Accepts NULL. */
FSC_API void fsc_pipe_free(fsc_pipe *p);

/* What one step needs from the caller, by micro-batch index. */
typedef struct fsc_pipe_io {
    /* The first stage's input of micro-batch `micro` (borrowed until the
     * step ends). Called on the rank of stage 0 only. */
    int (*input)(void *user, int micro, fsc_tensor *x);
    /* The last stage's output y of micro-batch `micro`: *loss gets its share
     * of the global mean loss, and dloss/dy is written into y (in place, as
     * fsc_cross_entropy does). Called on the rank of the last stage only. */
    int (*loss)(void *user, int micro, fsc_tensor *y, fsc_arena *arena, float *loss);
    /* Optional: micro-batch `micro`'s targets, ignore_index and norm (as
     * loss's share divides by it) for a last stage that runs its head fused
     * with the loss (fsc_tp_gpt_stage_new), so its logits never exist whole.
     * Called on the last stage's rank before that stage's forward, which
     * gets them in fsc_ctx.head_loss (hl->targets need live only during the
     * call) and then outputs its (1,) loss share, computed at the start of
     * its backward (in forward when evaluating); loss above is not called
     * then. A stage that outputs anything else is given to loss as before,
     * and so is every stage under a split backward (zero-bubble schedules:
     * the head's weight gradient waits for W there). NULL: loss always. */
    int (*targets)(void *user, int micro, fsc_head_loss *hl);
    /* The global index of micro-batch `micro`'s first sample (dropout keys). */
    int64_t (*sample0)(void *user, int micro);
    void *user;
} fsc_pipe_io;

/* Zeroes this rank's gradients. */
FSC_API void fsc_pipe_zero_grad(fsc_pipe *p);
/* Runs every action of the schedule for this step: forwards and backwards
 * of every micro-batch, gradients accumulated (+=), shared parameters'
 * gradients summed. ctx supplies training, seed and step (arena and sample0
 * are the pipe's and io's). *loss gets the step's loss (the sum of the last
 * stage's shares), identical on every rank. Collective over the group. A
 * peer that never sends ends under the watchdog, the message naming this
 * rank's action. */
FSC_API int fsc_pipe_run(fsc_pipe *p, const fsc_ctx *ctx, const fsc_pipe_io *io, float *loss);
/* An evaluation pass: every micro-batch forward through the stages by the
 * forward-only schedule of the pipe's shape (fsc_pipe_schedule_make_forward),
 * each micro-batch's activations given back as soon as its forward here is
 * sent. io as for fsc_pipe_run (loss may write dloss/dy into y; nothing
 * reads it); ctx->training must be false. *loss gets the sum of the last
 * stage's shares, identical on every rank. Gradients, the optimizer and
 * fsc_pipe_get_stats / the trace of the last fsc_pipe_run are left alone;
 * sharded parameters (FSC_PIPE_SHARD_PARAMS) are gathered for the pass and
 * given back after it. Collective over the group. FSC_ERR_INVALID for bad
 * arguments or ctx->training true. */
FSC_API int fsc_pipe_eval(fsc_pipe *p, const fsc_ctx *ctx, const fsc_pipe_io *io, float *loss);
/* A pipe of one stage (one rank in g) whose module the caller runs itself,
 * outside any schedule (fsdp over tensor-parallel replicas without a
 * pipeline): fsc_pipe_unshard makes the stage whole before its forward
 * (FSC_PIPE_SHARD_PARAMS: gathered over dp; collective over dp; nothing if
 * whole already), fsc_pipe_reshard keeps only this rank's slices again (not
 * collective), and after the step's last backward fsc_pipe_reduce_grads
 * does what fsc_pipe_run does after its schedule (gradients reduced over dp
 * as the sharding says, then resharded). Other modes: unshard and reshard
 * do nothing. */
FSC_API int fsc_pipe_unshard(fsc_pipe *p);
FSC_API int fsc_pipe_reshard(fsc_pipe *p);      /* see fsc_pipe_unshard */
FSC_API int fsc_pipe_reduce_grads(fsc_pipe *p); /* see fsc_pipe_unshard; collective over dp */
/* Global gradient-norm clipping over every stage, shared parameters counted
 * once (max_norm <= 0: norm only); *total (may be NULL) gets the pre-clip
 * norm. Collective. FSC_ERR_NUMERIC when the norm is not finite. */
FSC_API int fsc_pipe_clip_grad_norm(fsc_pipe *p, float max_norm, float *total);
FSC_API int fsc_pipe_set_lr(fsc_pipe *p, double lr); /* lr >= 0 */
FSC_API int fsc_pipe_step(fsc_pipe *p);              /* this rank's update (local) */
FSC_API fsc_optim *fsc_pipe_optim(fsc_pipe *p);      /* owned by p */
/* The unsharded weights file of the whole model, written by rank root of
 * the group (which holds the whole model while it writes; path needed
 * there only) with the metadata pairs; with replicas, root of the first
 * replica writes and every rank of the mesh calls this (sharded parameters
 * are gathered for the while). Collective over the mesh. */
FSC_API int fsc_pipe_save_weights(fsc_pipe *p, const char *path, int root, int n_meta,
                                  const char *const *keys, const char *const *values);
/* Every rank reads its stages' tensors by name from a weights file of the
 * whole model (any layout wrote it). Not collective. */
FSC_API int fsc_pipe_load_weights(fsc_pipe *p, const char *path);
/* Optimizer state by global name, the file format of fsc_oss_save_optim
 * (loadable by any strategy at any world size), streamed to rank root of
 * the group tensor by tensor; with replicas, every rank of the mesh calls
 * this and root of the first replica writes. Collective over the mesh. */
FSC_API int fsc_pipe_save_optim(fsc_pipe *p, const char *path, int root);
/* Reads this rank's parameters' state from such a file (any strategy or
 * layout wrote it); validated on every rank, nothing changes unless every
 * rank could. Collective over the mesh. */
FSC_API int fsc_pipe_load_optim(fsc_pipe *p, const char *path);

/* How many stages (chunks) this rank runs: the schedule's chunks; 0 for NULL. */
FSC_API int fsc_pipe_chunks(const fsc_pipe *p);
/* The stage chunk c runs (c * ranks + this rank); -1 for a bad c. */
FSC_API int fsc_pipe_chunk_stage(const fsc_pipe *p, int c);
/* Chunk c's stage module (owned by p), or NULL for a bad c. */
FSC_API fsc_module *fsc_pipe_chunk_module(fsc_pipe *p, int c);
/* Chunk c's bound parameters (owned by p), or NULL for a bad c. */
FSC_API fsc_params *fsc_pipe_chunk_params(fsc_pipe *p, int c);

/* What fsc_pipe_balance_auto predicts per stage. */
#define FSC_PIPE_MAX_STAGES 64
typedef struct fsc_pipe_balance_report {
    int stages;
    double stage_seconds[FSC_PIPE_MAX_STAGES]; /* forward + backward of one micro-batch */
    double stage_bytes[FSC_PIPE_MAX_STAGES];   /* state + activations held in flight */
} fsc_pipe_balance_report;
/* Chooses layers per stage for schedule s (ranks x chunks stages) into
 * balance[]: each of opt's layers is built alone and timed through forward
 * and backward on one micro-batch of opt->act_shape (act_shape_at's where
 * it says; ids in [0, vocab) for layer 0; the last layer's logits over
 * vocab, if that is its output, through a cross-entropy; a last layer that
 * takes fsc_ctx.head_loss, with its fused loss), the times averaged over
 * group g (NULL: this process) so every rank chooses alike. With opt->tp
 * the layers are TP stages: every rank of g times every layer, the ranks of
 * each TP group together (their collectives inside the timing). The
 * contiguous cut that minimises the slowest stage wins among those whose
 * parameters, gradients, optim_floats optimizer floats per parameter and
 * activations held by the schedule fit the allocator's budget
 * (fsc_mem_get_limit), if one is set. *rep (may be NULL)
 * gets the prediction. Collective over g. FSC_ERR_NOMEM (error names the
 * budget) when no cut fits; FSC_ERR_INVALID for bad arguments. */
FSC_API int fsc_pipe_balance_auto(fsc_group *g, const fsc_pipe_options *opt,
                                  const fsc_pipe_schedule *s, int vocab, int optim_floats,
                                  int *balance, fsc_pipe_balance_report *rep);

typedef struct fsc_pipe_run_stats {
    double compute_s;       /* forwards and backwards */
    /* blocked on receives, on sends at the end, and on the step's loss
     * reduction (the drain: this rank done, another still computing) */
    double wait_s;
    /* from this rank's first action until every rank's schedule is done (the
     * loss reduced): wait_s / span_s is this rank's measured bubble */
    double span_s;
    double replica_s;       /* reducing gradients and gathering parameters over the replicas */
    int peak_inflight;      /* most (stage, micro-batch) activations held at once: the
                             * validator's peak_inflight for this rank */
    int64_t messages;       /* sent by this rank */
    size_t peak_held_bytes; /* most bytes in use in the micro-batches' arenas at once */
} fsc_pipe_run_stats;
/* The last fsc_pipe_run as a Chrome trace (opens in Perfetto or
 * chrome://tracing): one row per rank, one box per action with its start
 * and duration in microseconds since that rank's run began. Written by rank
 * 0 of the group; collective; every rank returns rank 0's outcome. */
FSC_API int fsc_pipe_write_trace(fsc_pipe *p, const char *path);
/* Figures of the last fsc_pipe_run on this rank. */
FSC_API fsc_pipe_run_stats fsc_pipe_get_stats(const fsc_pipe *p);

#ifdef __cplusplus
}
#endif
#endif
