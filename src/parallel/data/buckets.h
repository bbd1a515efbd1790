/* Shared by DDP and ShardedDDP (internal): gradient buckets over the flat
 * gradient buffer in reverse forward order, and the backward hooks on each
 * module that owns parameters directly (the entries they mark ready). */
#ifndef FSC_PARALLEL_BUCKETS_H
#define FSC_PARALLEL_BUCKETS_H

#include "fsc/nn.h"

/* Bucket k covers flat elements [begin[k], end[k]); bucket 0 ends at the end of
 * the buffer. A bucket closes once it holds at least bucket_bytes; a
 * parameter never straddles two. bucket_of[e] is entry e's bucket. */
typedef struct bucket_plan {
    int n;
    int64_t *begin, *end;
    int *bucket_of;
    int64_t max_bytes;
} bucket_plan;

int bucket_plan_make(const fsc_params *ps, size_t bucket_bytes, bucket_plan *out);
/* ShardedDDP's plan: buckets of AT MOST cap_bytes (an entry larger than that
 * alone), counting each entry with the padding after it, over the entries
 * with skip[e] false (skip NULL: all); skipped entries get bucket_of -1.
 * Entries are taken from the end of the buffer, so begin/end (the span of a
 * bucket's entries) may enclose skipped ones. */
int bucket_plan_capped(const fsc_params *ps, size_t cap_bytes, const bool *skip, bucket_plan *out);
void bucket_plan_free(bucket_plan *p);

/* The user data of one module's backward hooks: the wrapper that installed
 * them and the parameters (indices into ps->entries) the module declares. */
typedef struct owner_hook {
    void *wrapper;
    fsc_module *module;
    int n;
    int *entries;
} owner_hook;

/* A wrapper's hooks: fns[k] of kind kinds[k] on every module under the
 * child that declares parameters, each module with its own owner_hook. */
typedef struct owner_hooks {
    owner_hook *hooks;
    int n, nkinds;
    fsc_hook_kind kinds[2];
    fsc_hook_fn fns[2];
} owner_hooks;

/* Installs the hooks (nkinds of 1 or 2, added in that order on each module,
 * parents before children). On failure those added so far stay listed, for
 * owner_hooks_free. */
int owner_hooks_add(owner_hooks *hs, const fsc_params *ps, fsc_module *child, void *wrapper,
                    int nkinds, const fsc_hook_kind *kinds, const fsc_hook_fn *fns);
/* Removes every hook owner_hooks_add installed and frees the lists. */
void owner_hooks_free(owner_hooks *hs);

/* Cuts every bucket of plan where its entries change between expert shards
 * (fsc_param.expert: each rank holds its own experts) and the rest, so no
 * bucket mixes them, and sets *local (one flag per new bucket, malloc'ed,
 * the caller frees) true for the buckets of experts:
 * they are never reduced over the data-parallel group. Without expert
 * entries the plan is untouched and *local is NULL. */
int bucket_plan_split_experts(const fsc_params *ps, bucket_plan *plan, bool **local);

#endif
