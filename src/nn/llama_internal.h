/* What the LLaMA layers share (not public): rotary tables from the arena and
 * the check of a rotary configuration. */
#ifndef FSC_NN_LLAMA_INTERNAL_H
#define FSC_NN_LLAMA_INTERNAL_H

#include <math.h>

#include "fsc/gpt.h"
#include "fsc/nn.h"

/* Allocates (T, hd/2) cos and sin tables from a and fills them for
 * positions pos0.. (fsc_rope_table). FSC_ERR_NOMEM when the arena is full. */
int fsc_rope_tables_alloc(fsc_arena *a, const float *inv_freq, int T, int hd, int pos0,
                          float **cos_t, float **sin_t);
/* FSC_OK, or FSC_ERR_INVALID naming the module (kind, name) for an odd or
 * non-positive head_dim, theta <= 0 or not finite, or a rope_scaling with
 * factor > 0 whose other fields break fsc_rope_scaling's rules. */
int fsc_rope_check_config(const char *kind, const char *name, int hd, float theta,
                          const fsc_rope_scaling *sc);

/* LLaMA's RMSNorm epsilon of c: rms_norm_eps, 1e-5 when unset. */
static inline float llama_norm_eps(const fsc_gpt_config *c) {
    return c->norm_eps > 0.f ? c->norm_eps : 1e-5f;
}

/* The attention of c's decoder layers, with Hugging Face's initialisation
 * (every Linear N(0, initializer_range 0.02)). */
static inline fsc_llama_attention_config llama_attention_config(const fsc_gpt_config *c) {
    return (fsc_llama_attention_config){.d_model = c->d_model,
                                        .n_heads = c->heads,
                                        .n_kv_heads = c->kv_heads,
                                        .qkv_bias = c->qkv_bias,
                                        .rope_theta = c->rope_theta,
                                        .rope_scaling = c->rope_scaling,
                                        .init_std = 0.02f,
                                        .proj_std = 0.02f};
}

/* How a layout makes a decoder layer's projections and norms: one process
 * (llama_plain_maker) or a tensor-parallel group of t ranks. `column` makes
 * a Linear (nn.Linear's (out,in) weight) whose outputs are split over the t
 * ranks (this rank's out/t of them), `row` one whose inputs are (taking
 * this rank's in/t columns, summing the partial products), `norm` an
 * RMSNorm. sp: the layer runs on sequence shards between its regions. */
typedef struct llama_proj_maker {
    void *user;
    int t;
    bool sp;
    fsc_module *(*column)(void *user, const char *name, int in, int out, bool bias, float std);
    fsc_module *(*row)(void *user, const char *name, int in, int out, float std);
    fsc_module *(*norm)(void *user, const char *name, int dim, float eps);
} llama_proj_maker;
extern const llama_proj_maker llama_plain_maker;

/* fsc_llama_attention_new's attention over projections mk makes, with this
 * rank's n_heads/t query heads and n_kv_heads/t key/value heads (query head
 * h keeps key/value head h / (n_heads / n_kv_heads)). NULL (error set)
 * when t divides either head count not. */
fsc_module *llama_attention_split_new(const char *name, const fsc_llama_attention_config *cfg,
                                      int t, const llama_proj_maker *mk);

/* SwiGLU over given projections: silu(gate(x)) * up(x), then down when
 * given (the whole MLP "mlp"), else the F_local product columns (the side
 * of a pipeline cut before down_proj). Adopts gate, up and down (frees them
 * on failure). x (B,T,C), or a sequence shard the projections gather. */
fsc_module *llama_gated_mlp_new(const char *name, int C, int F_local, fsc_module *gate,
                                fsc_module *up, fsc_module *down);

/* Decoder layer b of c (name "model.layers.b") as segments [from, to) of
 * FSC_BLOCK_* (the attention half; post_attention_layernorm, gate_proj,
 * up_proj and the product; down_proj with the residual sum), the whole
 * layer when 0 .. FSC_BLOCK_SEGMENTS, made by mk under Hugging Face's names
 * and initialisation. Between the MLP's two segments the cut passes rows
 * [x (C) | product (F/t)]. NULL (error set) on a bad range or a refused one. */
fsc_module *llama_layer_new(const fsc_gpt_config *c, const char *name, int from, int to,
                            const llama_proj_maker *mk);

#endif
