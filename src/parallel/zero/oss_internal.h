/* The OSS object, shared by oss.c (stepping, sharing, clipping) and
 * oss_state.c (optimizer state by global name). Not a public header. */
#ifndef FSC_OSS_INTERNAL_H
#define FSC_OSS_INTERNAL_H

#include "fsc/zero.h"

struct fsc_oss {
    fsc_optim_config cfg; /* resolved */
    fsc_oss_options opt;  /* resolved: share_dtype F32, BF16 or F16 */
    fsc_params *ps;
    fsc_group *g;
    int rank, world;
    int K; /* state floats per element */
    fsc_partition *part;
    fsc_optim_range *ranges; /* this rank's part; range i is part->ranges[rank][i] */
    int nranges;
    fsc_optim *local;
    /* sharing after the step */
    int64_t *counts, *displs; /* EVEN: per rank, elements of ps->data each shard covers */
    int64_t *lo, *hi;         /* GREEDY: per rank, the flat span of its trainable tensors */
    int64_t *moved;           /* GREEDY: per rank, their elements (what it shares) */
    bool *contiguous;         /* GREEDY: span holds no other rank's tensor (F32: no packing) */
    void *comm;               /* FSC_MEM_COMM packing / half-precision buffer, or NULL */
};

#endif
