/* What the sharded strategies (OSS, FSDP) share (internal): clipping over
 * shards, and optimizer state by global parameter name. */
#ifndef FSC_SHARDED_INTERNAL_H
#define FSC_SHARDED_INTERNAL_H

#include "fsc/zero.h"

/* Global gradient-norm clipping of ranges sharded over g: each rank's local
 * figure, one collective, the same total everywhere (see fsc_oss_clip_grad_norm).
 * who prefixes error messages. */
int sharded_clip_grad_norm(fsc_group *g, const fsc_optim_range *r, int n, float max_norm,
                           bool inf_norm, float *total, const char *who);

/* Optimizer state of ranges sharded over g, by global parameter name (the
 * file format of fsc_oss_save_optim). part lists every rank's pieces by
 * entry of ps, in entry order; piece k of this rank is elements
 * [offset_of_piece[k], + its count) of its local optimizer's range
 * local_of_piece[k] (both NULL: all of range k, the ranges matching the
 * pieces one for one). Save streams to root, which writes (or, with io
 * set, every rank writes its part through MPI-IO: the same bytes); load reads each
 * rank's pieces, validated and staged, and commits only if every rank could.
 * Both collective over g. */
typedef struct optim_shards {
    fsc_params *ps;
    const fsc_partition *part;
    fsc_optim *local;
    fsc_group *g;
    const char *policy; /* written to the metadata: "even", "greedy", "fsdp" */
    const char *who;    /* prefixes error messages */
    /* optional, for a rank whose pieces are not its ranges one for one (TP:
     * replicated state saved from one rank only; ranges over whole local
     * tensors that hold several pieces): this rank's piece index -> local
     * optimizer range index (NULL: identity), and the piece's first element
     * within that range (NULL: 0) */
    const int *local_of_piece;
    const int64_t *offset_of_piece;
    /* optional: the group whose ranks save the file together through MPI-IO
     * (io/st_parallel.h) unless FSC_PARALLEL_IO=0; g itself (each rank
     * writes its pieces), or any group when g is this process alone (state
     * replicated on io's ranks: each writes an even share). NULL: the root
     * writes alone. */
    fsc_group *io;
    /* filled in by the calls */
    int rank, world, K, nranges;
    fsc_optim_config cfg;
} optim_shards;

int optim_shards_save(optim_shards *o, const char *path, int root);
int optim_shards_load(optim_shards *o, const char *path);

#endif
