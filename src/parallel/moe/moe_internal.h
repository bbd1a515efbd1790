/* Expert parallelism inside src/parallel/ (not public): the global expert
 * index in a name (weights and optimizer state by global name). DDP's
 * buckets leave expert shards alone by bucket_plan_split_experts
 * (parallel/data/buckets.h), which reads only fsc_param.expert. */
#ifndef FSC_PARALLEL_MOE_INTERNAL_H
#define FSC_PARALLEL_MOE_INTERNAL_H

#include "fsc/moe_parallel.h"

/* The global expert index in a parameter name ("...experts.{e}.rest"), -1
 * without one; *at points at its digits, *after just past them. */
int moe_expert_index(const char *name, const char **at, const char **after);

#endif
