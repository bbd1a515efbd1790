/* The LLaMA family (LLaMA 2/3, Mistral, Qwen 2, SmolLM, TinyLlama): the
 * parts src/nn/gpt.c's one model is made of when fsc_gpt_config.arch is
 * FSC_ARCH_LLAMA, under Hugging Face's LlamaForCausalLM names.
 *
 * Only the layers differ from GPT-2: token embeddings without a position
 * table (rotary embeddings inside attention carry the positions), pre-norm
 * blocks of RMSNorm, grouped-query attention and a SwiGLU MLP, a final
 * RMSNorm, and an LM head with its own weight unless the config ties it.
 * With cfg->moe, Mixtral: the MoE layers' MLP is block_sparse_moe, top-2
 * over SwiGLU experts (fsc/moe.h).
 * The block is block.c's (x + attn(norm(x)), then + mlp(norm(.))) over
 * these children, and the two ends are the one-process GPT's (gpt.c):
 * wte's rows without positions, and the head's GEMM over lm_head's weight. */
#include <math.h>
#include <stdio.h>

#include "fsc/moe.h"
#include "gpt_internal.h"
#include "llama_internal.h"

static fsc_module *llama_wte(void *st, const fsc_gpt_config *c) {
    (void)st;
    return fsc_embedding_new("model.embed_tokens", c->vocab, c->d_model, 0.02f);
}

/* Layer b's MLP: the dense SwiGLU "mlp", or where cfg->moe says so
 * Mixtral's "block_sparse_moe" (fsc/moe.h with SwiGLU experts w1, w3, w2,
 * as wide as the dense MLP unless moe->hidden says otherwise; the gate and
 * every expert initialised N(0, 0.02) as MixtralForCausalLM does). */
static fsc_module *llama_mlp(const fsc_gpt_config *c, int b) {
    if (!fsc_gpt_moe_block(c, b))
        return fsc_swiglu_mlp_new("mlp", c->d_model, fsc_gpt_ffn_hidden(c), 0.02f, 0.02f);
    fsc_moe_options o = *c->moe;
    o.expert = FSC_MOE_EXPERT_SWIGLU;
    if (!o.hidden) o.hidden = fsc_gpt_ffn_hidden(c);
    return fsc_moe_new("block_sparse_moe", c->d_model, &o, 0.f, (uint32_t)(2 * b + 2), 0.02f,
                       0.02f);
}

/* A decoder layer, or a range of its segments when a pipeline cut falls
 * inside it (llama_parts.c; pipelines refuse MoE models). */
static fsc_module *llama_block(void *st, const fsc_gpt_config *c, const char *name, int b, int from,
                               int to) {
    (void)st;
    if (from != FSC_BLOCK_ATTN || to != FSC_BLOCK_SEGMENTS)
        return llama_layer_new(c, name, from, to, &llama_plain_maker);
    const fsc_llama_attention_config ac = llama_attention_config(c);
    fsc_module *children[4] = {
        fsc_rmsnorm_new("input_layernorm", c->d_model, llama_norm_eps(c)),
        fsc_llama_attention_new("self_attn", &ac),
        fsc_rmsnorm_new("post_attention_layernorm", c->d_model, llama_norm_eps(c)),
        llama_mlp(c, b),
    };
    return fsc_block_of(name, children);
}

static fsc_module *llama_norm(void *st, const fsc_gpt_config *c) {
    (void)st;
    return fsc_rmsnorm_new("model.norm", c->d_model, llama_norm_eps(c));
}

static int llama_lm_head(void *st, const fsc_gpt_config *c, fsc_module **out) {
    (void)st;
    *out = NULL;
    if (c->tie_embeddings) return FSC_OK;
    *out = fsc_linear_new("lm_head", c->d_model, c->vocab, false, FSC_WEIGHT_OUT_IN, 0.02f);
    return *out ? FSC_OK : FSC_ERR_INVALID;
}

static int llama_width(void *st, const fsc_gpt_config *c, int p) {
    (void)st;
    return fsc_gpt_part_width(c, p);
}

const gpt_layout_ops gpt_llama_layout = {
    .kind = "LLaMA",
    .stage_kind = "LLaMAStage",
    .label = "LLaMA",
    .block_fmt = "model.layers.%d",
    .decodes = true,
    .wte = llama_wte,
    .block = llama_block,
    .ln_f = llama_norm,
    .lm_head = llama_lm_head,
    .width = llama_width,
    GPT_PLAIN_ENDS,
};
