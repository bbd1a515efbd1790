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
 *                 parameters; FSDP: the last rank's gathered shard);
 *   CKPT_KILL     "ckpt-kill:K": the process dies by SIGKILL at commit
 *                 point K of a checkpoint save (fsc_fault_ckpt_point), so a
 *                 test can crash a save at every step and resume after;
 *   IO_WRITE      "io-write": the last rank's part of a parallel (MPI-IO)
 *                 save fails as a write error would, while it keeps joining
 *                 the collective writes;
 *   CP_SKIP_BLOCK "cp-skip-block": in every forward of ring attention, the
 *                 last rank of the context-parallel group skips the first
 *                 key block that visits it from another rank. */
#ifndef FSC_CORE_FAULT_H
#define FSC_CORE_FAULT_H

#include <stdbool.h>

typedef enum {
    FSC_FAULT_NONE = 0,
    FSC_FAULT_DROP_GRAD,
    FSC_FAULT_REDUCE_TWICE,
    FSC_FAULT_SHARD_OFFSET,
    FSC_FAULT_CKPT_KILL,
    FSC_FAULT_IO_WRITE,
    FSC_FAULT_CP_SKIP_BLOCK,
} fsc_fault;

/* The commit points of a checkpoint save (src/io/checkpoint.c), in order.
 * Each is a place where a crash leaves the directory in a different state. */
enum {
    FSC_CKPT_POINT_COMMIT = 1,              /* members written in the temporary directory */
    FSC_CKPT_POINT_STATE_TORN,              /* state.json half written */
    FSC_CKPT_POINT_STATE_SYNCED,            /* state.json complete and fsynced */
    FSC_CKPT_POINT_TMP_SYNCED,              /* the temporary directory fsynced, not renamed */
    FSC_CKPT_POINT_RENAMED,                 /* step-N renamed into place, dir not yet fsynced */
    FSC_CKPT_POINT_DIR_SYNCED,              /* ... and the directory fsynced; latest still old */
    FSC_CKPT_POINT_LATEST_TMP,              /* the new latest written under a temporary name */
    FSC_CKPT_POINT_LATEST,                  /* latest renamed into place, dir not yet fsynced */
    FSC_CKPT_POINT_DURABLE,                 /* ... and the directory fsynced; nothing pruned */
    FSC_CKPT_POINT_PRUNE_ASIDE,             /* an old step-N renamed to a hidden name */
    FSC_CKPT_POINT_PRUNED,                  /* ... and removed */
    FSC_CKPT_POINTS = FSC_CKPT_POINT_PRUNED /* how many there are */
};

extern fsc_fault fsc_fault_active;

/* Sets the fault from its name ("drop-grad", "reduce-twice", "shard-offset",
 * "io-write", "cp-skip-block", "ckpt-kill:K" with 1 <= K <= FSC_CKPT_POINTS, "" or NULL for none);
 * returns false for an unknown name. */
bool fsc_fault_set(const char *name);

static inline bool fsc_fault_is(fsc_fault f) {
    return fsc_fault_active == f;
}

/* For REDUCE_TWICE: true on every other call while it is on (each rank makes
 * the same calls, so ranks agree). */
bool fsc_fault_fires(fsc_fault f);

/* Called by the checkpoint writer at commit point k: under "ckpt-kill:k" the
 * process dies there (SIGKILL: no handler, no flush, no atexit). */
void fsc_fault_ckpt_point(int k);

#endif
