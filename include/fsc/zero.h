/* fsc zero: ZeRO stages 1 and 2 — optimizer-state sharding (OSS, like
 * FairScale's fairscale.optim.OSS) and gradient sharding (ShardedDDP, like
 * fairscale.nn.ShardedDataParallel) — and optimizer state dicts by global
 * parameter name that load at any world size.
 *
 * Both work on a partition of the flat parameter buffer (fsc_params) among
 * the ranks of a group. Two policies:
 *  - GREEDY: FairScale's: whole tensors, each to the rank with the smallest
 *    running size (largest tensors first). One huge tensor can unbalance it.
 *  - EVEN: the flat buffer cut into `world` equal contiguous shards (padded to
 *    a multiple of world * align); a tensor may be split between ranks.
 */
#ifndef FSC_ZERO_H
#define FSC_ZERO_H

#include "fsc/dist.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- partition -------------------------------------------------------------- */
typedef enum { FSC_PARTITION_GREEDY = 0, FSC_PARTITION_EVEN } fsc_partition_policy;

/* Elements [begin, begin + count) of parameter entry `entry` (index into
 * fsc_params.entries), i.e. flat elements entries[entry].offset + begin ... */
typedef struct fsc_shard_range {
    int entry;
    int64_t begin, count;
} fsc_shard_range;

typedef struct fsc_partition {
    int world;
    fsc_partition_policy policy;
    int *nranges;             /* per rank */
    fsc_shard_range **ranges; /* per rank, in flat-buffer order */
    int64_t *elems;           /* per rank: parameter elements owned (no padding) */
    /* EVEN only: rank r owns flat elements [r * shard, (r + 1) * shard) of a
     * buffer padded to padded_numel = world * shard (>= fsc_params.numel). */
    int64_t shard, padded_numel;
} fsc_partition;

/* align: EVEN shards are multiples of this many elements (0: 16). Returns
 * FSC_ERR_INVALID for world < 1, an unknown policy or align < 0. GREEDY ties
 * (equal sizes: entry order; equal running totals: the lowest rank) make the
 * partition a deterministic function of its arguments, so every rank computes
 * the same one without communicating. Every parameter element is owned by
 * exactly one rank; the alignment padding between tensors by none. EVEN's
 * shard = ceil(ps->numel / world) rounded up to align; a rank may own nothing.
 * ps needs entries only (fsc_params_collect is enough). The caller owns *out
 * (fsc_partition_free); FSC_ERR_INVALID also for a NULL ps or out. */
FSC_API int fsc_partition_new(const fsc_params *ps, int world, fsc_partition_policy policy,
                              int64_t align, fsc_partition **out);
/* Frees the partition and its arrays. Accepts NULL. */
FSC_API void fsc_partition_free(fsc_partition *p);
/* The owner of flat element i of the parameter buffer (-1 for padding between
 * parameters under GREEDY, and for i outside [0, ps->numel) or NULL p, ps). */
FSC_API int fsc_partition_owner(const fsc_partition *p, const fsc_params *ps, int64_t flat);
/* Optimizer ranges for rank r's part: views into ps->data / ps->grad (which
 * must be bound) with the entry's name and decay flag, one per fsc_shard_range
 * in the same order. Free with fsc_optim_ranges_free. FSC_ERR_INVALID for a
 * NULL argument, rank outside [0, world), unbound buffers, or a partition of
 * another parameter list; *out NULL and *n 0 then. */
FSC_API int fsc_partition_ranges(const fsc_partition *p, const fsc_params *ps, int rank,
                                 fsc_optim_range **out, int *n);

/* ---- OSS (ZeRO-1) ------------------------------------------------------------- */
typedef struct fsc_oss fsc_oss;

typedef struct fsc_oss_options {
    fsc_partition_policy policy;
    /* dtype in which updated parameters are shared after the step: F32 (default,
     * exact), BF16 or F16 (half the traffic; FairScale's broadcast_fp16).
     * Half precision rounds the updated parameters on every rank, the owner
     * included, so the replicas stay bit-identical (FairScale leaves the
     * owner's copy unrounded); the optimizer state stays fp32. */
    fsc_dtype share_dtype;
} fsc_oss_options;

/* An optimizer (cfg) over this rank's part of ps, for group g (opt NULL: the
 * defaults, GREEDY and F32). Gradients must be complete (all-reduced, e.g. by
 * DDP) on every rank before a step. State: exactly K * 4 * (owned elements)
 * bytes of FSC_MEM_OPTIM; GREEDY with non-contiguous owners or a half
 * share_dtype also keeps one FSC_MEM_COMM buffer (the largest share, or EVEN:
 * ps->numel halves). Not collective. NULL (error set) on bad arguments (NULL
 * ps or g, buffers unbound, a bad config or share_dtype). ps and g are
 * borrowed and must outlive the optimizer. */
FSC_API fsc_oss *fsc_oss_new(const fsc_optim_config *cfg, fsc_params *ps, fsc_group *g,
                             const fsc_oss_options *opt);
/* Frees the local optimizer, partition and buffers (not ps or g). Accepts NULL. */
FSC_API void fsc_oss_free(fsc_oss *o);
/* Updates the owned part, then every owner shares its updated parameters so
 * every rank holds the full, identical parameters: GREEDY one broadcast per
 * rank that owns something, EVEN one allgather. Collective over g.
 * FSC_ERR_INVALID for NULL (as for every fsc_oss_* call returning int). */
FSC_API int fsc_oss_step(fsc_oss *o);
FSC_API int fsc_oss_set_lr(fsc_oss *o, double lr); /* reaches every shard */
/* Global gradient-norm clipping over all shards: the local norm of the owned
 * part, one collective (an allgather of each rank's figure, combined in rank
 * order in double), the same result as unsharded clipping (inf_norm: the max
 * norm). *total (may be NULL) receives the pre-clip norm, identical on every
 * rank. Only the OWNED gradients are scaled: the others are not read by the
 * step. Collective over g. */
FSC_API int fsc_oss_clip_grad_norm(fsc_oss *o, float max_norm, bool inf_norm, float *total);
FSC_API size_t fsc_oss_state_bytes(const fsc_oss *o); /* this rank's optimizer state */
/* Who owns what. This and the optimizer below are owned by o (do not free
 * them); NULL for a NULL o. */
FSC_API const fsc_partition *fsc_oss_partition(const fsc_oss *o);
FSC_API fsc_optim *fsc_oss_local(fsc_oss *o); /* the optimizer over the owned ranges */
/* The group given to fsc_oss_new; o must not be NULL. */
FSC_API fsc_group *fsc_oss_group(const fsc_oss *o);

/* ---- optimizer state by global name ------------------------------------------ */
/* Streams the full optimizer state to `root`, which writes it to a safetensors
 * file at path (atomically) tensor by tensor: "optim.exp_avg.<param name>",
 * "optim.exp_avg_sq.<param name>" (Adam/AdamW) or "optim.momentum.<name>"
 * (SGD with momentum; plain SGD writes metadata only), F32 in the parameter's
 * shape, with the step count and hyper-parameters in the metadata (format,
 * kind, state, step, lr, weight_decay, decay_all, beta1/beta2/eps or
 * momentum/dampening/nesterov, world, policy; all strings). The root never
 * holds more than one tensor's state at a time (one FSC_MEM_COMM buffer of
 * the largest tensor). path is needed on the root only. Collective over g:
 * every rank returns the root's failure too. With more than one rank and
 * FSC_PARALLEL_IO not 0, every rank instead writes its own pieces into the
 * one file through MPI-IO (the same bytes; FSC_IO_TIMEOUT_S bounds it). */
FSC_API int fsc_oss_save_optim(fsc_oss *o, const char *path, int root);
/* fsc_oss_save_optim of an OSS over one process whose state every rank of g
 * holds alike (DDP's replicas): collective over g, the same file. Each rank
 * writes an even share through MPI-IO (unless FSC_PARALLEL_IO=0: then rank
 * root of g writes alone); every rank returns the same status.
 * FSC_ERR_INVALID for a NULL o or g, root outside g, or an OSS sharded over
 * more than one rank. */
FSC_API int fsc_oss_save_optim_replicated(fsc_oss *o, fsc_group *g, const char *path, int root);
/* Every rank reads the parts it owns from a file written at any world size
 * (and under either policy), and sets the step count; lr and the other
 * hyper-parameters stay as configured. Refuses files of another optimizer
 * kind (or SGD with momentum on one side only) or of another model (missing
 * tensor, shape mismatch, a tensor naming no parameter), naming them.
 * Collective over g: the slices are staged (FSC_MEM_WORK, K * 4 * owned
 * bytes) and committed only when every rank has read its part, so a refused
 * or unreadable file changes nothing on any rank. */
FSC_API int fsc_oss_load_optim(fsc_oss *o, const char *path);

/* ---- ShardedDDP (ZeRO-2) ---------------------------------------------------- */
typedef struct fsc_sdp_options {
    /* The other ranks' gradient memory a rank may hold at once (0: 25 MB).
     * Buckets hold at most half of it (a parameter larger than that alone),
     * so one can reduce while the next fills. */
    size_t bucket_bytes;
    bool no_broadcast; /* skip broadcasting rank 0's parameters at wrap time */
    /* dtype of the reduction: F32 (default, exact sums of the F32 gradients),
     * BF16 or F16 (half the traffic: each launched bucket is rounded into a
     * FSC_MEM_COMM staging buffer, reduced in that dtype, as fsc_group_reduce
     * sums halves, and the owner's result widened back into its F32
     * gradient). Costs two staging buffers, each the largest bucket's
     * elements in the half dtype: together the largest bucket's F32 bytes,
     * at most bucket_bytes / 2 unless one parameter (or the root-written
     * ones, see below) is larger. Anything else is FSC_ERR_INVALID. */
    fsc_dtype reduce_dtype;
    /* NULL: none; sees each segment of a bucket (its F32 values) before it
     * is rounded or reduced (fsc_grad_probe_fn, fsc/parallel.h). */
    fsc_grad_probe_fn probe;
    void *probe_user;
} fsc_sdp_options;

typedef struct fsc_sdp_stats {
    int64_t buckets;          /* buckets per synchronised backward */
    int64_t max_bucket_bytes; /* the largest, in F32 bytes (a parameter never straddles two) */
    int64_t reduces;          /* reduce collectives issued so far */
    int64_t reduced_bytes;    /* bytes they carried (reduce dtype); frozen parameters: none */
    double wait_s;            /* blocked on reductions after backward */
    double last_wait_s;       /* ... in the last synchronised backward */
} fsc_sdp_stats;

/* Wraps child (parameters and gradients bound in `params`) for ZeRO-2 with the
 * OSS optimizer `oss`, whose partition decides who owns what. During backward
 * each gradient bucket (whole parameters, taken from the end of the flat
 * buffer) is reduced to the rank(s) owning it as soon as it is complete,
 * overlapped with the rest of backward; the other ranks then give that memory
 * back (fsc_mem_discard). Between backwards a rank holds only what it owns.
 *
 * Memory (FSC_MEM_GRADS, by the allocator's figures): during a synchronised
 * backward a rank holds its share plus at most bucket_bytes of other ranks'
 * gradients: a module's pre-backward hook commits the memory it is about to
 * write, first waiting for the oldest reductions in flight if the budget
 * would be overrun. Two exceptions: a parameter larger than bucket_bytes / 2
 * fills a bucket alone, so up to two adjacent buckets (one being computed,
 * one in flight) may exceed the budget (by at most the largest parameter if
 * only one is that large); and gradients the root writes outside any hooked
 * module (GPT's tied wte and wpe) are live for the whole backward, on top of
 * the budget. Those are learnt by the first synchronised backward, which
 * holds every gradient. Accumulating under no_sync holds every gradient too.
 * After a synchronised backward the owned gradients are complete: call
 * fsc_oss_step. Frees only the wrapper. NULL (error set) on bad arguments
 * (NULL child, params or oss, params without gradients, bad options). child,
 * params and oss are borrowed: free the wrapper first. Training goes through
 * the wrapper: a backward run on the child itself (which would reduce
 * nothing and write into given-back memory) fails with FSC_ERR_INVALID
 * before its first module that owns parameters computes, under no_sync too.
 * Forward alone (evaluation) may call the child directly. */
FSC_API fsc_module *fsc_sdp_wrap(fsc_module *child, fsc_params *params, fsc_oss *oss,
                                 const fsc_sdp_options *opt);
/* While on, gradients accumulate in full locally (FairScale's no_sync: full
 * gradient memory, no communication); the next synchronised backward reduces
 * the sum. sdp must be a module from fsc_sdp_wrap (not checked), as for the
 * two calls below. */
FSC_API void fsc_sdp_set_no_sync(fsc_module *sdp, bool no_sync);
/* Zeroes the gradients this rank holds (the rest is already zero). */
FSC_API void fsc_sdp_zero_grad(fsc_module *sdp);
FSC_API fsc_sdp_stats fsc_sdp_get_stats(const fsc_module *sdp); /* counters so far */

#ifdef __cplusplus
}
#endif
#endif
