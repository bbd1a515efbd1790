/* MoE internals shared by the layer (moe.c), its top-2 router
 * (moe_route.c) and the KV cache (gpt_generate.c), which runs the layer's
 * weights on new tokens itself; not public. The rules are fsc/moe.h's. */
#ifndef FSC_NN_MOE_INTERNAL_H
#define FSC_NN_MOE_INTERNAL_H

#include "fsc/moe.h"

/* One call's routing of N = B*T tokens in B rows of T (t = b*T + i). */
typedef struct moe_route {
    int B, T, E, cap;
    float *gates;               /* (N,E) softmax of the logits, fp32 */
    int32_t *e1, *e2;           /* (N) first and second choice */
    int32_t *loc1, *loc2;       /* (N) slot in the expert's row buffer; -1: dropped */
    float *c1, *c2;             /* (N) combine weights (0 when dropped) */
    float *ce;                  /* (B,E) fraction of the row's first choices per expert */
    double aux_sum;             /* sum over rows of l_aux */
    int64_t dropped1, dropped2; /* choices past capacity */
} moe_route;

/* FSC_ERR_UNSUPPORTED naming `who` when o asks for experts (experts != 0),
 * else FSC_OK: for the model builders that make dense MLPs only (pipeline
 * stages, tensor parallelism), so cfg->moe is refused, not ignored. */
int moe_refuse(const fsc_moe_options *o, const char *who);

/* The options MoE layer m was made with, the capacity factor and hidden
 * width resolved (never 0); NULL when m is not an MoE layer. */
const fsc_moe_options *moe_options(const fsc_module *m);

/* The expert capacity of a row of T tokens: ceil(factor * T / E), >= 1. */
int moe_capacity(float factor, int T, int E);
/* Routes the tokens whose gate logits are logits (N,E); every array comes
 * from arena a. FSC_ERR_NOMEM when it is full. */
int moe_route_forward(moe_route *r, const float *logits, int B, int T, int E, int cap,
                      fsc_arena *a);
/* dlogits (N,E) written from the gradients of the combine weights dc1, dc2
 * (N) and, per row, aux_scale times the gradient of that row's l_aux. */
void moe_route_backward(float *dlogits, const moe_route *r, const float *dc1, const float *dc2,
                        float aux_scale);

#endif
