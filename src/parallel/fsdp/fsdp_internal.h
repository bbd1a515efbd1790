/* The FSDP object, shared by fsdp.c (units, hooks, gathering and reducing),
 * fsdp_layout.c (the flat layout and shards, built once) and fsdp_state.c
 * (full parameters between steps, state dicts). Not a public header. */
#ifndef FSC_FSDP_INTERNAL_H
#define FSC_FSDP_INTERNAL_H

#include "fsc/fsdp.h"
#include "fsc/zero.h"
#include "parallel/shard/sharded_internal.h"

/* Released full-size buffers kept for reuse: the root's parameters and
 * gradients, two more units' of each, and room to spare. */
#define FSDP_CACHE 8
/* Released half-precision staging, matched exactly: six kinds (send, gather,
 * reduce-in and reduce-out at two unit sizes), a few of each released close
 * together at a step's end. Eight slots overflowed there, and the next step
 * mapped (and page-faulted) one or two fresh 6-9 MB buffers. */
#define FSDP_HALF_CACHE 16

typedef struct fsdp_unit {
    struct fsc_fsdp *f;
    int index; /* 0: the root */
    fsc_module *m;
    char name[FSC_NAME_MAX * 2];    /* module path, "" for the root */
    int n;                          /* member parameters, in entry order */
    int *entries;                   /* indices into f->ps.entries */
    int64_t *offset;                /* each member's offset in the unit's flat buffer */
    /* The flat buffer is two regions, each sharded alone: the trainable
     * members ([0, gpadded): gathered, reduce-scattered, with gradients and
     * optimizer state) and the frozen ones ([gpadded, padded): gathered,
     * never reduced, no gradient). A rank's shard is its slice of the first
     * (gshard floats) then its slice of the second (shard - gshard). */
    int64_t gnumel, gshard, gpadded; /* trainable region: elements used; per rank; world * gshard */
    int64_t fnumel;                  /* frozen region: elements used */
    int64_t shard, padded;           /* both regions: per rank; world * shard */
    float *shard_data, *shard_grad;  /* this rank's shard (shard floats; gshard of gradient) */
    bool grad_zero;                 /* the gradient shard is known to be all zero */
    int fwd_pos;                    /* position in the recorded forward order, -1: none */
    /* gathered state (FSC_MEM_GATHERED unless noted) */
    float *full;                /* full parameters, bound to the model's views once complete */
    int64_t full_cap, grad_cap; /* floats in full and full_grad (cached ones may be larger) */
    void *recv_half;            /* compute-dtype gather buffer while in flight */
    void *send_half;            /* this rank's shard in the compute dtype (FSC_MEM_COMM) */
    fsc_request *gather_req;    /* a gather in flight into full / recv_half */
    fsc_request *fgather_req;   /* ... and the frozen region's, when it has one */
    float *full_grad;           /* full gradients while backward computes them */
    float *own_grad;            /* with a probe under no_sync: this backward's alone */
    int64_t own_cap;            /* floats in own_grad */
    void *rs_in;                /* reduce-dtype copy of full_grad (FSC_MEM_COMM) */
    void *rs_out;               /* the reduced shard before it is added (FSC_MEM_COMM) */
    fsc_request *rs_req;        /* a reduce-scatter in flight */
    bool rs_pending;            /* launched, not yet added into the gradient shard */
} fsdp_unit;

struct fsc_fsdp {
    fsc_module *root;
    fsc_group *g;
    int rank, world;
    fsc_fsdp_options opt;
    fsc_params ps; /* every parameter of the model, listed (no storage) */
    int *unit_of;  /* per entry */
    fsdp_unit *units;
    int nunits;
    float *data, *grad; /* all shards, FSC_MEM_PARAMS / FSC_MEM_GRADS */
    int64_t shard_total, grad_total; /* floats in data and in grad (trainable regions only) */
    fsc_optim_range *ranges; /* this rank's shards by parameter, entry order */
    int nranges;
    fsc_optim *optim;
    fsc_partition *part; /* every rank's pieces by entry: optimizer state I/O */
    int *order;          /* units in the order the first forward ran them */
    int norder;
    bool order_known, no_sync, summoned;
    bool in_backward;         /* the root's backward is running (its unit hooks bracket it) */
    fsdp_unit *newest_rs;     /* the unit whose reduce-scatter launched last */
    float *cache[FSDP_CACHE]; /* released full-size buffers, ready for reuse */
    int64_t cache_n[FSDP_CACHE];
    void *half[FSDP_HALF_CACHE]; /* released half-precision staging, ready for reuse */
    fsc_mem_tag half_tag[FSDP_HALF_CACHE];
    size_t half_bytes[FSDP_HALF_CACHE];
    fsc_module **hooked; /* modules carrying progress hooks */
    int nhooked;
    fsc_fsdp_stats stats;
};

static inline fsc_param *fsdp_member(const fsc_fsdp *f, const fsdp_unit *u, int i) {
    return f->ps.entries[u->entries[i]].param;
}

/* fsdp_layout.c, called once by fsc_fsdp_new. Walks the tree in
 * fsc_params_collect's order, giving each entry (*entry counts them) the
 * unit of the innermost unit module around it and each unit its module path
 * and module; seen[k] counts the visits of unit k. */
int fsdp_assign(fsc_fsdp *f, fsc_module *m, const char *path, int cur, fsc_module *const *units,
                int n, int *entry, int *seen);
/* Each unit's members, their offsets in its flat buffer, its shard and padded
 * sizes, and f->shard_total. */
int fsdp_lay_out_units(fsc_fsdp *f);
/* Initial values of this rank's shard of u, drawn as the full tensors would be. */
void fsdp_init_shard(fsc_fsdp *f, fsdp_unit *u, uint64_t seed);
/* f->ranges (the optimizer's) and f->part (every rank's pieces). */
int fsdp_plan_ranges(fsc_fsdp *f);

/* Rank r's slice of member i's region: its first flat element (*lo), its
 * length (*len) and where it starts in the rank's shard (*at). */
void fsdp_region(const fsc_fsdp *f, const fsdp_unit *u, int i, int r, int64_t *lo, int64_t *len,
                 int64_t *at);
/* Copies this rank's slices of u's full (gathered) buffer into its shard. */
void fsdp_take_shard(const fsc_fsdp *f, fsdp_unit *u);

/* fsdp_buffers.c. dst[i] (+)= src[i] widened from dt (F32, BF16 or F16). */
void fsdp_widen(float *dst, const void *src, int64_t n, fsc_dtype dt, bool add);
/* dst[i] = src[i] rounded to dt (BF16 or F16) as fsc_tensor_convert rounds. */
void fsdp_narrow(void *dst, const float *src, int64_t n, fsc_dtype dt);
/* A full-size buffer of at least n floats (FSC_MEM_GATHERED), from the cache
 * of released ones when one fits (zeroed if zero); *cap gets its size. NULL
 * when out of memory. */
float *fsdp_buf_get(fsc_fsdp *f, int64_t n, bool zero, int64_t *cap);
/* Gives back a buffer of cap floats to the cache (or frees it if full); NULL: no-op. */
void fsdp_buf_put(fsc_fsdp *f, float *p, int64_t cap);
/* A staging buffer of exactly bytes under tag, from the cache when one
 * matches; NULL when out of memory. Contents undefined. */
void *fsdp_half_get(fsc_fsdp *f, fsc_mem_tag tag, size_t bytes);
/* Gives back a staging buffer got with the same tag and bytes; NULL: no-op. */
void fsdp_half_put(fsc_fsdp *f, void *p, fsc_mem_tag tag, size_t bytes);
/* Frees both caches (fsc_fsdp_free). */
void fsdp_buffers_free(fsc_fsdp *f);

/* Gathering, shared with the state-dict code: start (non-blocking) and
 * finish (wait, widen, bind the views) a unit's full parameters, in fp32 when
 * exact (summon, save) or in the compute dtype; and free them again. */
int fsdp_gather(fsc_fsdp *f, fsdp_unit *u, bool exact);
void fsdp_release(fsdp_unit *u);

#endif
