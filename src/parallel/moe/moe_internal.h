/* Expert parallelism inside src/parallel/ (not public): how DDP's gradient
 * buckets leave expert shards (fsc_param.expert) alone, and the global
 * expert index in a name (weights and optimizer state by global name). */
#ifndef FSC_PARALLEL_MOE_INTERNAL_H
#define FSC_PARALLEL_MOE_INTERNAL_H

#include "buckets.h"
#include "fsc/moe.h"

/* Cuts every bucket of plan where its entries change between expert shards
 * and the rest, so no bucket mixes them, and sets *local (one flag per new
 * bucket, malloc'ed, the caller frees) true for the buckets of experts:
 * they are never reduced over the data-parallel group. Without expert
 * entries the plan is untouched and *local is NULL. */
int moe_split_buckets(const fsc_params *ps, bucket_plan *plan, bool **local);

/* The global expert index in a parameter name ("...experts.{e}.rest"), -1
 * without one; *at points at its digits, *after just past them. */
int moe_expert_index(const char *name, const char **at, const char **after);

#endif
