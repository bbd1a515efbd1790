/* fsc checkpoint wrapper: activation checkpointing (FairScale's
 * checkpoint_wrapper), trading compute for memory.
 *
 * A checkpointed module keeps nothing from its forward but a view of its input
 * and its output; backward runs the forward again (ctx->recompute = true) and
 * then the real backward. Randomness is keyed by (seed, step, sample), so the
 * recomputation draws the same dropout masks and gradients are bit-identical
 * to the plain module's.
 *
 * Wrapping is in place: parents call their children through their own
 * pointers (the GPT keeps its blocks in an array), so a wrapper module put
 * above a block would never be called. fsc_checkpoint_wrap swaps the module's
 * ops table for one that adds checkpointing; its name, parameters, children and
 * hooks stay as they were.
 */
#ifndef FSC_CHECKPOINT_WRAPPER_H
#define FSC_CHECKPOINT_WRAPPER_H

#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checkpoints m in place. The extra state is freed by fsc_module_free(m).
 *
 * Contract of the wrapped module, for a step whose ctx->training is true:
 *  - forward runs m's forward and gives back to ctx->arena everything it
 *    allocated except y (and a small record). The input x is kept by
 *    reference: it must stay valid and unchanged until backward (true of
 *    anything in the step's arena).
 *  - backward re-runs m's forward with a copy of ctx whose `recompute` is true,
 *    then m's backward, and gives back everything but dx (which stays valid in
 *    ctx->arena). Parameter gradients accumulate (+=) as before.
 *  - m's own hooks fire once per forward and once per backward, as before.
 *    Its descendants' forward hooks fire a second time, during the recompute,
 *    and they and the descendants' forward ops see ctx->recompute == true;
 *    the backward that follows (ops and hooks) sees the caller's ctx.
 * With ctx->training false, forward and backward are m's own, unchanged (no
 * extra memory, nothing recomputed); forward and backward of one call must
 * agree on ctx->training.
 *
 * Nested checkpointing works (a block and its MLP both wrapped): the inner
 * one recomputes again inside the outer recompute, so peak memory inside the
 * outer's backward drops further at the cost of one more inner forward.
 *
 * FSC_ERR_INVALID if m is NULL, has no forward, or is already checkpointed;
 * FSC_ERR_NOMEM if the small record cannot be allocated. */
FSC_API int fsc_checkpoint_wrap(fsc_module *m);
/* True when m was checkpointed by fsc_checkpoint_wrap. Accepts NULL (false). */
FSC_API bool fsc_is_checkpointed(const fsc_module *m);

#ifdef __cplusplus
}
#endif
#endif
