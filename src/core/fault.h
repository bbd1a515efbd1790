/* Test-only fault switches: deliberate defects in the parallel strategies,
 * so that a test can prove its equivalence check would catch them. Only test
 * programs turn one on (fsc_fault_set); the library's own code merely asks.
 * Each strategy applies the faults that have a meaning for it:
 *   DROP_GRAD     the last rank's share of one reduction is lost (DDP and
 *                 ShardedDDP: the first bucket; FSDP: the last unit, the
 *                 first to reduce; DP: the last thread's gradients; the
 *                 pipeline: the sum of a shared parameter's copies);
 *   REDUCE_TWICE  one reduced gradient is counted twice, every other
 *                 backward (the first half of the places above: a constant
 *                 factor on all of a model's gradients would be invisible
 *                 to Adam and to a biting clip, so the fault is not one);
 *   SHARD_OFFSET  a shard is placed one element off (OSS: the shared
 *                 parameters; FSDP: the last rank's gathered shard). */
#ifndef FSC_CORE_FAULT_H
#define FSC_CORE_FAULT_H

#include <stdbool.h>

typedef enum {
    FSC_FAULT_NONE = 0,
    FSC_FAULT_DROP_GRAD,
    FSC_FAULT_REDUCE_TWICE,
    FSC_FAULT_SHARD_OFFSET,
} fsc_fault;

extern fsc_fault fsc_fault_active;

/* Sets the fault from its name ("drop-grad", "reduce-twice", "shard-offset",
 * "" or NULL for none); returns false for an unknown name. */
bool fsc_fault_set(const char *name);

static inline bool fsc_fault_is(fsc_fault f) {
    return fsc_fault_active == f;
}

/* For REDUCE_TWICE: true on every other call while it is on (each rank makes
 * the same calls, so ranks agree). */
bool fsc_fault_fires(fsc_fault f);

#endif
