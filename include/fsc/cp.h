/* fsc context parallelism (ring attention): the sequence split over the
 * ranks of a context-parallel (cp) group, the mesh's fourth dimension
 * (fsc/dist.h, FSC_MESH_CP).
 *
 * The one idea: every layer but attention treats a position on its own, so
 * rank c of C holds only some positions of every sequence and runs them as
 * if they were the whole; attention alone needs the other ranks' keys and
 * values, which travel around the cp ring one block per step, with
 * non-blocking sends overlapped with the tile computation (ring attention,
 * Liu et al. 2023). Causality makes early positions cheap, so the sequence
 * is cut into 2C chunks and rank c holds chunks c and 2C-1-c (Megatron's
 * load balance): every rank then computes the same number of blocks, and a
 * block wholly in a query chunk's future is skipped. Backward recomputes
 * each tile from the forward's per-row log-sum-exps, and each key block's
 * dK/dV travels the ring with it back to its owner.
 *
 * Positions are global wherever they matter: GPT-2's position embeddings,
 * LLaMA's rotary angles and dropout masks are those of the global position
 * (fsc_ctx.seq, fsc/nn.h), and the loss is normalised by the global count
 * of targets, so cp ranks' losses and parameter gradients sum to one
 * process's (gradients are summed over dp x cp, fsc_mesh_dp_cp).
 */
#ifndef FSC_CP_H
#define FSC_CP_H

#include <stdint.h>

#include "fsc/dist.h"
#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_cp fsc_cp;

/* Context parallelism over g (borrowed; its ranks hold the same parameters
 * and the same sequences) for sequences of T positions: group rank c holds
 * chunks c and 2C-1-c of 2C chunks of T/(2C) positions. T must divide by
 * 2C (FSC_ERR_INVALID naming both otherwise); NULL on failure, with
 * fsc_last_error. A group of one holds the whole sequence as two runs. */
FSC_API fsc_cp *fsc_cp_new(fsc_group *g, int T);
/* Frees the ring's buffers. Accepts NULL. */
FSC_API void fsc_cp_free(fsc_cp *cp);
/* The split a training ctx carries (fsc_ctx.seq) for the layers to find
 * this rank's positions and the ring (owned by cp; NULL for a NULL cp).
 * Every rank of the group must run the same layers under it. */
FSC_API const fsc_seq_split *fsc_cp_seq(const fsc_cp *cp);
/* local (B, T/C) = this rank's positions of full (B, T), in run order. */
FSC_API void fsc_cp_take(const fsc_cp *cp, const int32_t *full, int B, int32_t *local);

/* What the ring did since creation or the last reset: wait_s is the time
 * this rank spent blocked on the ring's messages (after its own blocks were
 * done), compute_s the time in attention tiles, bytes what it sent, blocks
 * the (query run, key run) blocks it computed forward and backward. */
typedef struct fsc_cp_stats {
    double wait_s, compute_s;
    int64_t bytes, blocks;
} fsc_cp_stats;
FSC_API fsc_cp_stats fsc_cp_get_stats(const fsc_cp *cp); /* zeros for NULL */
FSC_API void fsc_cp_reset_stats(fsc_cp *cp);             /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
