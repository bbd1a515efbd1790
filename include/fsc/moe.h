/* fsc MoE: a Mixture-of-Experts MLP with top-2 gating (GShard; FairScale's
 * MOELayer + Top2Gate). Floor 3: the layer sees its experts' ranks only as
 * an fsc_moe_exchange; fsc/moe_parallel.h (floor 7) makes one from a process
 * group and saves, loads and clips expert-sharded parameters.
 *
 * The layer (floor 3) replaces a GPT-2 MLP: x (B,T,C) -> y (B,T,C).
 *
 *  gating, in fp32 whatever ctx->autocast says: logits = x Wg^T (gate.weight,
 *  (E,C)), gates = softmax(logits); the first choice e1 = argmax, the second
 *  e2 = argmax over the others (ties: the lower expert; no noise, so routing
 *  is deterministic).
 *
 *  groups: tokens are routed in groups of one sequence (one row of B): the
 *  capacity, the positions and l_aux are per row, so any split of a batch
 *  over ranks and micro-batches routes every token as one process does.
 *
 *  capacity and drops: each expert takes cap = ceil(capacity_factor * T / E)
 *  tokens of a row (at least 1). Positions follow token order: a first
 *  choice's position is the number of earlier tokens of the row with the
 *  same first choice; a second choice's is the row's count of first choices
 *  of that expert (dropped ones included) plus the earlier second choices of
 *  it. A choice at position >= cap is dropped and counted. Combine weights
 *  are the kept choices' gates normalised over the two (w_i = g_ei * kept_i,
 *  c_i = w_i / max(w1 + w2, FLT_EPSILON)); a token with both choices dropped
 *  gets y = 0 (the block's residual carries it). capacity_factor >= E
 *  gives cap >= T: nothing is dropped (how a GPT is sampled, fsc/gpt.h).
 *
 *  load balancing: per row, l_aux = E * mean_e(ce_e * me_e) with ce_e the
 *  fraction of the row's tokens whose first choice is e (before drops) and
 *  me_e their mean gate probability for e (1/E at perfect balance). The
 *  objective gains aux_coef * l_aux per row, weighted like the loss: each
 *  row counts T / norm (norm: fsc_moe_set_loss_norm, the global target
 *  count fsc_gpt_train_micro passes; unset, the tokens of the call), so a
 *  step adds aux_coef * (mean of l_aux over the global batch's rows). Only
 *  the gradient is added (backward); the value is in fsc_moe_stats.
 *
 *  experts: E MLPs of one kind, named experts.{e}.... by their global index
 *  e: GPT-2's (c_fc C->H, GELU, c_proj H->C, Conv1D layout with biases;
 *  H = hidden or 4C) or Mixtral's SwiGLU (w1 the gate and w3 the up
 *  projection C->H, w2 the down projection H->C, nn.Linear layout, no
 *  biases; y = w2(silu(w1 x) * w3 x)). Mixtral's router is this one with
 *  capacity_factor >= E (nothing dropped); its load-balancing loss is not
 *  l_aux above (GShard's, per row, first choices) but one over the whole
 *  batch, every layer and both choices (docs/moe.md). With an
 *  expert-parallel exchange of P > 1 ranks, rank r holds experts
 *  [r*E/P, (r+1)*E/P) only and every token reaches its experts through two
 *  all-to-all exchanges each way (dispatch and combine forward; the same
 *  two carry the gradients back). Those parameters carry fsc_param.expert:
 *  a data-parallel wrapper does not reduce them (their gradients are
 *  already the sum over the group's tokens) and they are sharded by expert.
 */
#ifndef FSC_MOE_H
#define FSC_MOE_H

#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How experts spread over ranks, as the layer sees it (floor 3 knows no
 * groups): ranks == 0 or 1 keeps every expert here. alltoall sends chunk p
 * (n floats at in + p*n) to rank p and receives rank p's chunk for this
 * rank at out + p*n; every rank calls it alike. fsc_moe_ep_exchange fills
 * one from a process group. */
typedef struct fsc_moe_exchange {
    int ranks, rank;
    int (*alltoall)(void *user, const float *in, float *out, int64_t n);
    void *user;
} fsc_moe_exchange;

/* The MLP each expert is: GPT-2's (c_fc, GELU, c_proj; biases) or the
 * LLaMA family's SwiGLU under Mixtral's names (w1, w3, w2; no biases). */
typedef enum fsc_moe_expert { FSC_MOE_EXPERT_GPT2 = 0, FSC_MOE_EXPERT_SWIGLU = 1 } fsc_moe_expert;

/* Zero fields mean the documented default. */
typedef struct fsc_moe_options {
    int experts;           /* E >= 2 (GPT: 0 means no MoE) */
    int every;             /* GPT: blocks l with (l + 1) % every == 0 are MoE (0: 1, all) */
    float capacity_factor; /* > 0 (0: 2.0, FairScale's 2S/E) */
    float aux_coef;        /* >= 0: weight of l_aux in the objective (0: none) */
    int hidden;            /* expert MLP width H (0: 4 * C; a LLaMA GPT: its ffn width) */
    fsc_moe_expert expert; /* the experts' kind (a GPT sets its family's: SwiGLU for LLaMA) */
    fsc_moe_exchange ep;   /* experts over ranks; borrowed, must outlive the layer */
} fsc_moe_options;

/* Checks opt against width C: FSC_ERR_INVALID naming the field (experts < 2,
 * a capacity factor not > 0 or not finite, aux_coef < 0, hidden < 0, ranks
 * not dividing experts, rank outside [0, ranks), ranks > 1 without
 * alltoall). */
FSC_API int fsc_moe_check(const fsc_moe_options *opt);
/* The MoE MLP for width C: children gate (Linear C->E, no bias, (E,C)),
 * experts (this rank's experts, named by global index) and dropout (p,
 * layer_id as the dense MLP's). init_std initialises gate and the experts'
 * input projections (c_fc; w1, w3), proj_std their output one (c_proj;
 * w2), as fsc_mlp_new. NULL (error set) on bad options. */
FSC_API fsc_module *fsc_moe_new(const char *name, int C, const fsc_moe_options *opt, float dropout,
                                uint32_t layer_id, float init_std, float proj_std);
/* Whether m is a layer from fsc_moe_new. */
FSC_API bool fsc_moe_is(const fsc_module *m);
/* Sets the loss normaliser (the global batch's target count, > 0; 0: the
 * tokens of each call) on every MoE layer under root: l_aux's rows then
 * weigh T / norm, as the cross-entropy's tokens weigh 1 / norm. */
FSC_API void fsc_moe_set_loss_norm(fsc_module *root, double norm);

/* Routing counters, summed over the MoE layers of a tree since creation or
 * the last reset (training forwards only; recomputations not counted). */
typedef struct fsc_moe_stats {
    int64_t tokens;         /* tokens routed (each has two choices) */
    int64_t dropped1;       /* first choices past capacity */
    int64_t dropped2;       /* second choices past capacity */
    int64_t rows;           /* rows (routing groups) */
    double aux_sum;         /* sum of l_aux over those rows */
    double exchange_s;      /* seconds inside all-to-all exchanges, forward and backward */
    int64_t exchanges;      /* all-to-all calls */
    int64_t exchange_bytes; /* floats sent by this rank (incl. its own chunk) x 4 */
} fsc_moe_stats;
/* Sums the counters of every MoE layer under root (zeros if none). */
FSC_API fsc_moe_stats fsc_moe_get_stats(const fsc_module *root);
FSC_API void fsc_moe_reset_stats(fsc_module *root); /* zeroes them */

/* The expert-parallel size of the MoE layers under root (through a
 * wrapper's `wraps`): their ep.ranks (1 when they keep every expert), or 0
 * without MoE layers. */
FSC_API int fsc_moe_ep_size(const fsc_module *root);

#ifdef __cplusplus
}
#endif
#endif
