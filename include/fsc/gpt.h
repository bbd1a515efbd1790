/* fsc GPT: decoder-only transformers as an fsc module tree, in two
 * families: GPT-2 and LLaMA (fsc_gpt_config.arch).
 *
 * Children and parameters carry Hugging Face's names and layouts, so weights
 * interoperate with GPT2LMHeadModel (wte.weight (V,C), wpe.weight (T,C),
 * h.{i}.ln_1.*, h.{i}.attn.c_attn.* with Conv1D (in,out) weights, ...,
 * ln_f.*; the LM head tied to wte) and LlamaForCausalLM
 * (model.embed_tokens.weight (V,C), model.layers.{i}.input_layernorm.weight,
 * model.layers.{i}.self_attn.{q,k,v,o}_proj.weight as nn.Linear (out,in),
 * model.layers.{i}.post_attention_layernorm.weight,
 * model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight,
 * lm_head.weight unless tied).
 */
#ifndef FSC_GPT_H
#define FSC_GPT_H

#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The model families one config describes. */
typedef enum {
    FSC_ARCH_GPT2 = 0, /* learned positions, LayerNorm, GELU MLP, biases, head tied to wte */
    FSC_ARCH_LLAMA,    /* rotary positions, RMSNorm, SwiGLU, grouped-query attention */
} fsc_arch;

typedef struct fsc_gpt_config {
    int vocab;     /* V */
    int seq;       /* T: maximum sequence length (wpe rows) */
    int layers;    /* L */
    int d_model;   /* C */
    int heads;     /* NH: must divide C */
    float dropout; /* embedding and residual dropout (0 = off; the LLaMA family has none) */
    fsc_arch arch; /* 0: GPT-2 */
    /* The LLaMA family's fields (zero: the default stated; GPT-2 ignores them). */
    int kv_heads;                  /* key/value heads, dividing heads; 0: heads */
    int ffn_hidden;                /* SwiGLU width F; 0: fsc_gpt_ffn_hidden's rule */
    float rope_theta;              /* 0: 10000 */
    float norm_eps;                /* RMSNorm's eps; 0: 1e-5 */
    bool tie_embeddings;           /* lm_head is embed_tokens (false: its own weight) */
    bool qkv_bias;                 /* biases on q_proj, k_proj, v_proj (Qwen 2) */
    fsc_rope_scaling rope_scaling; /* factor 0: none (LLaMA-3.1: 8, 1, 4, 8192) */
    /* Mixture of Experts (fsc/moe.h): NULL or experts 0 keeps dense MLPs;
     * else blocks l with (l + 1) % every == 0 get an MoE MLP named "mlp".
     * Borrowed: must outlive the model (its exchange too). */
    const struct fsc_moe_options *moe;
} fsc_gpt_config;

/* The LLaMA family's SwiGLU width: ffn_hidden, or when 0 LLaMA's rule, 2/3
 * of 4 C rounded up to a multiple of 256 (C = 512: 1536; C = 4096: 11008). */
FSC_API int fsc_gpt_ffn_hidden(const fsc_gpt_config *cfg);
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
/* The same model in 3L + 2 parts, so a pipeline stage may end inside a
 * block: part 0 the embedding; block b's parts 3b+1, the attention half x +
 * attn(ln_1(x)), 3b+2, its MLP's ln_2, c_fc and GELU, and 3b+3, the MLP's
 * c_proj and dropout with the residual sum; part 3L+1 the head. Parts
 * [first, end) as one module, as fsc_gpt_stage_new (names, dropout keys,
 * input and output); a block cut by the range is a child "h.b" with the
 * children of its parts in range only (checkpoints by global name work at
 * any cut). Between parts 3b+2 and 3b+3 the activation is (B,T,5C), per
 * token the residual stream then the GELU output (fsc_gpt_part_width).
 * NULL (error set) for a bad cfg or range. */
FSC_API fsc_module *fsc_gpt_stage_parts_new(const fsc_gpt_config *cfg, int first, int end);
FSC_API int fsc_gpt_num_parts(const fsc_gpt_config *cfg); /* 3L + 2 (no checks) */
/* The blocks (whole decoder layers, and the parts of cut ones) of a model
 * made by fsc_gpt_new, fsc_tp_gpt_new or a stage constructor, in order:
 * up to max into blocks, and their count returned (FSC_ERR_INVALID, < 0,
 * for another module). What FSDP's units and activation checkpointing
 * wrap, in any family. */
FSC_API int fsc_gpt_blocks(fsc_module *model, fsc_module **blocks, int max);
/* Cuts counted in quarter layers (layers as fsc_gpt_stage_new counts them;
 * a block is four quarters: its attention half two, its MLP's c_fc + GELU
 * one, its c_proj one): a cut after k layers is 4k, after k layers and the
 * next block's attention half (k.5) 4k + 2, after that block's c_fc and
 * GELU too (k.75) 4k + 3. *part gets the part the cut falls before (parts
 * [0, *part) precede it). FSC_ERR_INVALID, naming the cut in layers, for
 * one outside [0, L + 2], inside the embedding or head, or at k.25 (inside
 * attention). */
FSC_API int fsc_gpt_part_of_cut(const fsc_gpt_config *cfg, int quarters, int *part);
/* The reverse: quarter layers before part `part` (0 .. 3L + 2). */
FSC_API int fsc_gpt_cut_of_part(const fsc_gpt_config *cfg, int part);
/* Channels per token of the activation entering part `part` (1 .. 3L + 1):
 * 5C before a block's c_proj part, else C (no checks). */
FSC_API int fsc_gpt_part_width(const fsc_gpt_config *cfg, int part);
/* Parameters, counting the tied head once and every expert of an MoE
 * model (on all ranks together; no checks: a valid cfg). */
FSC_API int64_t fsc_gpt_num_params(const fsc_gpt_config *cfg);
/* Model FLOPs per trained token (forward + backward), the nanoGPT/PaLM convention:
 * 6 * (params - position embeddings) + 12 * L * C * T, counting in an MoE
 * layer the parameters a token is computed with (the gate and two experts). */
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

/* ---- generation ------------------------------------------------------------
 * Incremental decoding with a key/value cache: each new token runs the
 * blocks on its own row and attends over the keys and values the earlier
 * tokens left in the cache, so a token costs O(params + t*C) instead of a
 * whole forward over the context. Logits equal the full forward's at the
 * same positions (to float rounding; tests/nn/test_generate.c checks it). An
 * MoE block's MLP (fsc/moe.h) runs on the new tokens only, through the
 * layer's own gate, router and experts, and never drops a token: a step of
 * n tokens routes with capacity n.
 *
 *     fsc_gpt_kv *kv = fsc_gpt_kv_new(gpt, &cfg);
 *     fsc_gpt_kv_append(kv, prompt, n, logits, false);       // prefill
 *     for (...) { id = fsc_gpt_sample(logits, V, 0.8f, 40, seed, i, work);
 *                 fsc_gpt_kv_append(kv, &id, 1, logits, false); }
 */
typedef struct fsc_gpt_kv fsc_gpt_kv;

/* A cache of cfg->seq positions for `gpt` (made by fsc_gpt_new with cfg;
 * parameters bound and loaded; borrowed: it must outlive the cache and its
 * weights must not move). Holds 2 * L * seq * C floats plus the scratch of
 * a seq-token prefill (FSC_MEM_ACTIV). NULL (error set) when gpt is not a
 * GPT of that config, is unbound, has an MoE layer that could drop tokens
 * (capacity_factor < experts: its forward would then differ from the
 * cache's, which drops none; build the model with capacity_factor >=
 * experts to sample) or holds only some of its experts (expert parallel),
 * or memory runs out. */
FSC_API fsc_gpt_kv *fsc_gpt_kv_new(fsc_module *gpt, const fsc_gpt_config *cfg);
/* Frees the cache (not the model). Accepts NULL. */
FSC_API void fsc_gpt_kv_free(fsc_gpt_kv *kv);
/* Forgets every cached position (the next append starts at position 0). */
FSC_API void fsc_gpt_kv_reset(fsc_gpt_kv *kv);
/* Positions cached so far. */
FSC_API int fsc_gpt_kv_len(const fsc_gpt_kv *kv);
/* Runs n tokens (ids[0..n), in vocab) at the next n positions, caching their
 * keys and values, and writes logits: (n,V) for every new position when
 * `all`, else (V) for the last one. FSC_ERR_INVALID for n < 1, a bad id
 * (naming it) or more than cfg->seq positions in all (reset, or re-run a
 * shorter context, to go on). */
FSC_API int fsc_gpt_kv_append(fsc_gpt_kv *kv, const int32_t *ids, int n, float *logits, bool all);

/* Draws the next token from logits (V): greedy (argmax) for temperature <= 0,
 * otherwise softmax(logits / temperature) over the top_k largest (top_k <= 0
 * or >= V: all), with the uniform draw keyed by (seed, index), so a run is
 * reproducible token by token. work holds V floats of scratch. */
FSC_API int32_t fsc_gpt_sample(const float *logits, int V, float temperature, int top_k,
                               uint64_t seed, int64_t index, float *work);

#ifdef __cplusplus
}
#endif
#endif
