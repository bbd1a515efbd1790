/* The GPT's shape: its configuration check, parameter and FLOP counts, and
 * the parts a pipeline cuts it into (part 0 the embedding, each block three
 * parts, the last the head; cuts counted in quarter layers). The model
 * itself is src/nn/gpt.c. */
#include <stdbool.h>

#include "fsc/gpt.h"
#include "fsc/moe.h"
#include "layers_internal.h"

/* The LLaMA family's own fields; heads already divide d_model. */
static int llama_check(const fsc_gpt_config *c) {
    if (c->dropout > 0.f)
        return fsc_error(FSC_ERR_INVALID,
                         "dropout %g: the LLaMA family has no dropout layers (use 0)",
                         (double)c->dropout);
    const int kv = c->kv_heads ? c->kv_heads : c->heads;
    if (kv < 1 || c->heads % kv)
        return fsc_error(FSC_ERR_INVALID, "kv_heads %d must divide heads %d", c->kv_heads,
                         c->heads);
    if ((c->d_model / c->heads) % 2)
        return fsc_error(FSC_ERR_INVALID,
                         "head dimension %d (d_model %d / heads %d) must be even for rotary "
                         "embeddings",
                         c->d_model / c->heads, c->d_model, c->heads);
    if (c->ffn_hidden < 0)
        return fsc_error(FSC_ERR_INVALID, "ffn_hidden %d must be positive (0: the default)",
                         c->ffn_hidden);
    if (!(c->rope_theta >= 0.f) || !(c->norm_eps >= 0.f))
        return fsc_error(FSC_ERR_INVALID, "rope_theta %g and norm_eps %g must be >= 0 (0: default)",
                         (double)c->rope_theta, (double)c->norm_eps);
    return FSC_OK;
}

int fsc_gpt_config_check(const fsc_gpt_config *c) {
    if (c->vocab < 2) return fsc_error(FSC_ERR_INVALID, "vocab %d must be at least 2", c->vocab);
    if (c->seq < 1) return fsc_error(FSC_ERR_INVALID, "seq %d must be positive", c->seq);
    if (c->layers < 1) return fsc_error(FSC_ERR_INVALID, "layers %d must be positive", c->layers);
    if (c->d_model < 1)
        return fsc_error(FSC_ERR_INVALID, "d_model %d must be positive", c->d_model);
    if (c->heads < 1 || c->d_model % c->heads)
        return fsc_error(FSC_ERR_INVALID, "heads %d must divide d_model %d", c->heads, c->d_model);
    if (!(c->dropout >= 0.f && c->dropout < 1.f))
        return fsc_error(FSC_ERR_INVALID, "dropout %g must be in [0, 1)", (double)c->dropout);
    if (c->arch == FSC_ARCH_LLAMA) return llama_check(c);
    if (c->arch != FSC_ARCH_GPT2)
        return fsc_error(FSC_ERR_INVALID, "arch %d is neither GPT-2 (0) nor LLaMA (1)",
                         (int)c->arch);
    if (c->moe && c->moe->experts) return fsc_moe_check(c->moe);
    return FSC_OK;
}

int fsc_gpt_ffn_hidden(const fsc_gpt_config *c) {
    if (c->ffn_hidden > 0) return c->ffn_hidden;
    const int64_t two_thirds = 2 * (4 * (int64_t)c->d_model) / 3;
    return (int)((two_thirds + 255) / 256 * 256);
}

/* Head dimension of the LLaMA family: C / heads (heads divides C). */
static int head_dim(const fsc_gpt_config *c) {
    return c->d_model / c->heads;
}

/* ---- counts ---------------------------------------------------------------------------------- */

/* Whether block l's MLP is an MoE layer under cfg (also used by gpt.c). */
bool fsc_gpt_moe_block(const fsc_gpt_config *c, int l) {
    const fsc_moe_options *o = c->moe;
    return o && o->experts && (l + 1) % (o->every > 0 ? o->every : 1) == 0;
}

/* Parameters of the MoE blocks beyond a dense MLP's, counting `experts`
 * experts per layer (all of them, or the two a token meets): the gate (E,C)
 * and GPT-2's experts (2CH + H + C each; the dense MLP 8C^2 + 5C) or the
 * LLaMA family's SwiGLU experts (3CH each, no biases; the dense one 3CF). */
static int64_t moe_extra_params(const fsc_gpt_config *c, int64_t experts) {
    const bool llama = c->arch == FSC_ARCH_LLAMA;
    const int64_t C = c->d_model, F = llama ? fsc_gpt_ffn_hidden(c) : 4 * C;
    const int64_t H = c->moe && c->moe->hidden ? c->moe->hidden : F;
    const int64_t expert = llama ? 3 * C * H : 2 * C * H + H + C;
    const int64_t dense = llama ? 3 * C * F : 8 * C * C + 5 * C;
    int64_t n = 0;
    for (int l = 0; l < c->layers; l++)
        if (fsc_gpt_moe_block(c, l)) n += c->moe->experts * C + experts * expert - dense;
    return n;
}

/* The LLaMA family's parameters: embedding, per layer two norms, q/k/v/o
 * (q/k/v biases when set) and the SwiGLU's three (or an MoE layer's gate
 * and experts), the final norm, and lm_head unless tied. */
static int64_t llama_params(const fsc_gpt_config *c) {
    const int64_t C = c->d_model, F = fsc_gpt_ffn_hidden(c), hd = head_dim(c);
    const int64_t q = c->heads * hd, kv = (c->kv_heads ? c->kv_heads : c->heads) * hd;
    const int64_t per_layer =
        2 * C + C * q + 2 * C * kv + q * C + 3 * C * F + (c->qkv_bias ? q + 2 * kv : 0);
    return (int64_t)c->vocab * C * (c->tie_embeddings ? 1 : 2) + c->layers * per_layer + C +
           moe_extra_params(c, c->moe ? c->moe->experts : 0);
}

int64_t fsc_gpt_num_params(const fsc_gpt_config *c) {
    if (c->arch == FSC_ARCH_LLAMA) return llama_params(c);
    int64_t C = c->d_model;
    int64_t per_block = 12 * C * C + 13 * C;
    return (int64_t)c->vocab * C + (int64_t)c->seq * C + c->layers * per_block + 2 * C +
           moe_extra_params(c, c->moe ? c->moe->experts : 0);
}

double fsc_gpt_flops_per_token(const fsc_gpt_config *c, int T) {
    /* a token meets two experts of an MoE layer, not all of them */
    const double unused =
        (double)(moe_extra_params(c, c->moe ? c->moe->experts : 0) - moe_extra_params(c, 2));
    if (c->arch == FSC_ARCH_LLAMA) { /* the head's GEMM counts, the embedding's lookup not */
        const double lookup = c->tie_embeddings ? 0.0 : (double)c->vocab * c->d_model;
        return 6.0 * ((double)llama_params(c) - lookup - unused) +
               12.0 * c->layers * (double)c->d_model * T;
    }
    const double n = (double)fsc_gpt_num_params(c) - (double)c->seq * c->d_model - unused;
    return 6.0 * n + 12.0 * c->layers * (double)c->d_model * T;
}

/* ---- parts and cuts -------------------------------------------------------------------------- */

int fsc_gpt_num_layers(const fsc_gpt_config *cfg) {
    return cfg->layers + 2;
}

int fsc_gpt_num_parts(const fsc_gpt_config *cfg) {
    return 3 * cfg->layers + 2;
}

/* Where each of a block's three parts starts, in quarters of the block. */
static const int seg_quarter[3] = {0, 2, 3};

/* Part p (embedding 0, block b's parts 3b+1..3b+3, head 3L+1) starts at
 * the quarter its block starts (4 (b + 1)) plus its segment's offset. */
int fsc_gpt_cut_of_part(const fsc_gpt_config *cfg, int part) {
    const int L = cfg->layers;
    if (part <= 0) return 0;
    if (part > 3 * L) return part == 3 * L + 1 ? 4 * (L + 1) : 4 * (L + 2);
    return 4 * ((part - 1) / 3 + 1) + seg_quarter[(part - 1) % 3];
}

int fsc_gpt_part_of_cut(const fsc_gpt_config *cfg, int quarters, int *part) {
    const int L = cfg->layers, n = fsc_gpt_num_parts(cfg);
    if (quarters < 0 || quarters > 4 * (L + 2))
        return fsc_error(FSC_ERR_INVALID, "GPT: a cut after %g layers is outside [0, %d]",
                         quarters / 4.0, L + 2);
    const int layer = quarters / 4, q = quarters % 4;
    if (q && (layer == 0 || layer == L + 1))
        return fsc_error(FSC_ERR_INVALID,
                         "GPT: a cut after %g layers falls inside the %s, which cannot be split "
                         "(only blocks 1..%d split: after attention, .5, or after the MLP's "
                         "c_fc and GELU, .75)",
                         quarters / 4.0,
                         layer == 0 ? "embedding (layer 0)" : "head (the last layer)", L);
    if (q == 1)
        return fsc_error(FSC_ERR_INVALID,
                         "GPT: a cut after %g layers falls inside block %d's attention (a block "
                         "splits after its attention, .5, or after its MLP's c_fc and GELU, .75)",
                         quarters / 4.0, layer - 1);
    const int seg = q ? q - 1 : 0; /* in block layer - 1: k -> 0, k.5 -> 1, k.75 -> 2 */
    *part = quarters == 0    ? 0
            : layer == L + 2 ? n
            : layer == L + 1 ? 3 * L + 1
                             : 3 * layer - 2 + seg;
    return FSC_OK;
}

int fsc_gpt_part_width(const fsc_gpt_config *cfg, int part) {
    const bool proj = part >= 1 && part <= 3 * cfg->layers && (part - 1) % 3 == FSC_BLOCK_PROJ;
    if (!proj) return cfg->d_model;
    return cfg->arch == FSC_ARCH_LLAMA ? cfg->d_model + fsc_gpt_ffn_hidden(cfg) : 5 * cfg->d_model;
}

int fsc_gpt_parts_of_layers(const fsc_gpt_config *cfg, int first, int end, const char *who,
                            int *part_first, int *part_end) {
    const int n = cfg->layers + 2;
    if (first < 0 || end > n || first >= end)
        return fsc_error(FSC_ERR_INVALID, "%s: layers [%d, %d) outside [0, %d) or empty", who,
                         first, end, n);
    /* whole layers: cuts at whole quarters, never inside a layer */
    int rc = fsc_gpt_part_of_cut(cfg, 4 * first, part_first);
    return rc ? rc : fsc_gpt_part_of_cut(cfg, 4 * end, part_end);
}
