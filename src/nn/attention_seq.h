/* Attention and rotary tables under context parallelism (fsc_ctx.seq): the
 * layers' paths when their keys also live on other ranks. */
#ifndef FSC_NN_ATTENTION_SEQ_H
#define FSC_NN_ATTENTION_SEQ_H

#include "layers_internal.h"

/* fsc_attention_parts_forward/backward under ctx->seq: the same parts, the
 * attention through ctx->seq->attend. The saved record starts with an
 * fsc_attn_saved whose att is NULL; backward must run under the same seq. */
int nn_attention_seq_forward(fsc_module *const parts[3], const fsc_ctx *ctx, const fsc_tensor *x,
                             fsc_tensor *y, void **saved, int C, int NH);
int nn_attention_seq_backward(fsc_module *const parts[3], const fsc_ctx *ctx, const void *saved,
                              const fsc_tensor *dy, fsc_tensor *dx, int C, int NH);

/* Rotary tables (runs*len, hd/2) at the global positions of ctx->seq's runs. */
int nn_rope_tables_seq(fsc_arena *a, const float *inv_freq, const fsc_seq_split *q, int hd,
                       float **cos_t, float **sin_t);

#endif
