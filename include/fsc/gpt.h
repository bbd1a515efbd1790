/* fsc GPT: the GPT-2 architecture as an fsc module tree.
 *
 * Children and parameters carry the Hugging Face GPT-2 names and layouts
 * (wte.weight (V,C), wpe.weight (T,C), h.{i}.ln_1.*, h.{i}.attn.c_attn.* with
 * Conv1D (in,out) weights, ..., ln_f.*), so weights interoperate with
 * GPT2LMHeadModel. The LM head is tied to wte.
 */
#ifndef FSC_GPT_H
#define FSC_GPT_H

#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_gpt_config {
    int vocab;     /* V */
    int seq;       /* T: maximum sequence length (wpe rows) */
    int layers;    /* L */
    int d_model;   /* C */
    int heads;     /* NH: must divide C */
    float dropout; /* embedding and residual dropout (0 = off) */
} fsc_gpt_config;

/* Checks the configuration: FSC_ERR_INVALID, the message naming the offending
 * field (vocab < 2, heads not dividing d_model, dropout outside [0, 1), ...).
 * cfg must not be NULL. */
FSC_API int fsc_gpt_config_check(const fsc_gpt_config *cfg);
/* x int32 (B,T) ids with T <= cfg->seq -> logits (B,T,V). NULL (error set) on bad config.
 * The caller owns the tree (fsc_module_free); cfg is copied. */
FSC_API fsc_module *fsc_gpt_new(const fsc_gpt_config *cfg);
/* The GPT as a pipeline sees it: layer 0 the embedding (wte, wpe, dropout),
 * layers 1..L the blocks, layer L+1 the head (ln_f, LM head tied to wte):
 * L + 2 layers (no checks: a valid cfg). */
FSC_API int fsc_gpt_num_layers(const fsc_gpt_config *cfg);
/* Layers [first, end) as one module with the full model's parameter names
 * and dropout keys: input int32 (B,T) ids when first == 0, else F32 (B,T,C)
 * activations; output logits (B,T,V) when end == L + 2, else (B,T,C). A
 * stage with the head but not the embedding has its own wte (the tied
 * copy). NULL (error set) for a bad cfg or range. The caller owns it. */
FSC_API fsc_module *fsc_gpt_stage_new(const fsc_gpt_config *cfg, int first, int end);
/* Parameters, counting the tied head once (no checks: a valid cfg). */
FSC_API int64_t fsc_gpt_num_params(const fsc_gpt_config *cfg);
/* Model FLOPs per trained token (forward + backward), the nanoGPT/PaLM convention:
 * 6 * (params - position embeddings) + 12 * L * C * T. */
FSC_API double fsc_gpt_flops_per_token(const fsc_gpt_config *cfg, int T);

/* One micro-batch of language-model training: forward, cross-entropy against y
 * (ignore_index targets skipped), backward accumulating (+=) into the bound
 * gradients. The loss is the mean over `norm` targets (the count of
 * non-ignored targets in the GLOBAL batch), so micro-batches and ranks add up
 * to one big batch; *loss receives this micro-batch's share. The arena in ctx
 * is used, not reset. x and y hold B*T ids (borrowed). FSC_ERR_INVALID for
 * norm <= 0 or an id outside the vocabulary (naming its position),
 * FSC_ERR_SHAPE for T outside 1..cfg->seq. */
FSC_API int fsc_gpt_train_micro(fsc_module *gpt, const fsc_ctx *ctx, const int32_t *x,
                                const int32_t *y, int B, int T, int ignore_index, double norm,
                                float *loss);
/* Forward only (ctx->training is treated as false): mean loss over the
 * non-ignored targets of this batch; FSC_ERR_INVALID if every target is
 * ignored. Errors otherwise as fsc_gpt_train_micro. */
FSC_API int fsc_gpt_eval_loss(fsc_module *gpt, const fsc_ctx *ctx, const int32_t *x,
                              const int32_t *y, int B, int T, int ignore_index, float *loss);

#ifdef __cplusplus
}
#endif
#endif
