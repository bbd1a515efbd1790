/* The GPT written once (src/nn/gpt.c), and what a layout supplies to it.
 *
 * The model is a range of parts: part 0 the embedding (wte, wpe, dropout),
 * each block three parts (its attention half, its MLP's c_fc + GELU, its
 * c_proj; FSC_BLOCK_*), the last part ln_f and the LM head tied to wte.
 * The whole model is the range of every part; a pipeline stage is any
 * contiguous range. One forward and one backward run every range.
 *
 * A layout says how the parts are made and how the two ends compute: one
 * process (the plain layout, in gpt.c) or a tensor-parallel group (the
 * TP layout, src/parallel/tp/tp_gpt.c: vocabulary-parallel embedding and
 * head, TP blocks, sequence shards under SP). The blocks are modules either
 * way; only the ends call kernels on wte and wpe directly, since the tie
 * puts one table in two places. Children keep the whole model's names, in
 * Hugging Face's order (wte, wpe, drop, h.0 .. h.L-1, ln_f), so a range
 * reads and writes its part of the one-process weights and draws the same
 * initial values and dropout masks.
 */
#ifndef FSC_NN_GPT_INTERNAL_H
#define FSC_NN_GPT_INTERNAL_H

#include "fsc/gpt.h"
#include "layers_internal.h"

typedef struct gpt_model gpt_model;
typedef struct gpt_saved gpt_saved;

typedef struct gpt_layout_ops {
    const char *kind, *stage_kind; /* module kinds: the whole model, any other range */
    const char *label;             /* "GPT", "TP GPT": the start of error messages */
    const char *block_fmt;         /* the blocks' names, "h.%d" */
    bool decodes;                  /* runs under fsc_ctx.kv (one process, whole model) */
    /* The children, named and initialised as the one-process model's; wpe,
     * drop and lm_head may be NULL (no position table, no embedding
     * dropout, a head always tied to wte). lm_head sets *out to the head's
     * own weight, or NULL when the config ties it, and returns a status. */
    fsc_module *(*wte)(void *st, const fsc_gpt_config *c);
    fsc_module *(*wpe)(void *st, const fsc_gpt_config *c);
    fsc_module *(*drop)(void *st, const fsc_gpt_config *c);
    /* Block b's segments [from, to) (the whole block when 0 .. FSC_BLOCK_SEGMENTS). */
    fsc_module *(*block)(void *st, const fsc_gpt_config *c, const char *name, int b, int from,
                         int to);
    fsc_module *(*ln_f)(void *st, const fsc_gpt_config *c);
    int (*lm_head)(void *st, const fsc_gpt_config *c, fsc_module **out);
    /* Channels of the activation entering part p (C; inside an MLP the
     * residual and the GELU columns this layout keeps). */
    int (*width)(void *st, const fsc_gpt_config *c, int p);
    /* e (B,S,C): the embedded tokens before dropout, S = T / seq_split. */
    int (*embed_forward)(gpt_model *g, const fsc_ctx *ctx, const fsc_tensor *ids, fsc_tensor *e);
    /* wte's and wpe's gradients from de, the gradient at e. */
    int (*embed_backward)(gpt_model *g, const fsc_ctx *ctx, const gpt_saved *s,
                          const fsc_tensor *de);
    /* The head over s->final: logits (B,T,logit_width) into *y, or, when the
     * layout fuses the head with its loss (fsc_ctx.head_loss), the (1,) loss. */
    int (*head_forward)(gpt_model *g, const fsc_ctx *ctx, gpt_saved *s, fsc_tensor *y);
    /* wte's gradient (deferred under fsc_ctx.defer) and *dfin, the gradient
     * at ln_f's output, from dy (logits' gradient or the fused loss's 1). */
    int (*head_backward)(gpt_model *g, const fsc_ctx *ctx, gpt_saved *s, const fsc_tensor *dy,
                         fsc_tensor *dfin);
    void (*free_state)(void *st);
} gpt_layout_ops;

struct gpt_model {
    fsc_module base;
    fsc_module_ops mops; /* base.ops: the layout's kind over the one forward and backward */
    fsc_gpt_config cfg;
    const gpt_layout_ops *ops;
    void *st; /* the layout's: its group and vocabulary rows (NULL in one process) */
    bool embed, head;
    int in_w, out_w; /* channels of the activation in and out of a range without the ends */
    int seq_split;   /* ranks a sequence is split over between the ends (SP), else 1 */
    int logit_width; /* the head's output columns (this rank's vocabulary rows) */
    fsc_module *wte, *wpe, *drop, *ln_f, *lm_head; /* those in range and in the family */
    fsc_module **h; /* the whole blocks and blocks' parts in range, in order */
    int nh;
};

struct gpt_saved {
    fsc_tensor in; /* ids (a range with the embedding) or the input activation */
    int T;         /* the whole sequence (the activations may be shards of it) */
    void *drop, *ln_f;
    void **h;
    fsc_tensor final; /* ln_f's output: the head's input */
    bool logits_bf16; /* the head wrote its logits in bf16 (bf16 autocast) */
    /* a head fused with its loss: the targets kept (the caller's need not
     * outlive forward) and the (1,) output it fills */
    bool fused;
    fsc_head_loss hl;
    float *loss;
};

/* Parts [first, end) of cfg's model (a checked config) under a layout: the
 * whole model "gpt" of ops->kind, or with `stage` a range "gpt[a:b]" (cuts
 * in layers) of ops->stage_kind. st belongs to the model from then on
 * (freed by ops->free_state, also on failure). seq_split and logit_width as
 * in gpt_model. NULL (error set) on a bad range or a child that fails. */
fsc_module *gpt_model_new(const fsc_gpt_config *cfg, int first, int end, const gpt_layout_ops *ops,
                          void *st, bool stage, int seq_split, int logit_width);

/* The one-process ends, shared by the families of src/nn: the embedding
 * (wte rows, plus wpe's when the family has positions) and the head over
 * lm_head's weight, or wte's when tied (gpt.c). */
int gpt_plain_embed_forward(gpt_model *g, const fsc_ctx *ctx, const fsc_tensor *ids, fsc_tensor *e);
int gpt_plain_embed_backward(gpt_model *g, const fsc_ctx *ctx, const gpt_saved *s,
                             const fsc_tensor *de);
int gpt_plain_head_forward(gpt_model *g, const fsc_ctx *ctx, gpt_saved *s, fsc_tensor *y);
int gpt_plain_head_backward(gpt_model *g, const fsc_ctx *ctx, gpt_saved *s, const fsc_tensor *dy,
                            fsc_tensor *dfin);
/* The four entries a plain layout's table fills with them. */
#define GPT_PLAIN_ENDS                                                                             \
    .embed_forward = gpt_plain_embed_forward, .embed_backward = gpt_plain_embed_backward,          \
    .head_forward = gpt_plain_head_forward, .head_backward = gpt_plain_head_backward
/* The LLaMA family's plain layout (llama.c). */
extern const gpt_layout_ops gpt_llama_layout;

/* The whole model m if it is one a KV cache can decode through, else NULL. */
const gpt_model *gpt_model_decoding(const fsc_module *m);

/* The range model m is, or wraps (through wrappers' `wraps`), when its kind
 * is `kind`; NULL otherwise. */
gpt_model *gpt_model_find(fsc_module *m, const char *kind);

/* Whether block l's MLP is an MoE layer under c (gpt_config.c). */
bool fsc_gpt_moe_block(const fsc_gpt_config *c, int l);
/* Whole layers [first, end) as parts; FSC_ERR_INVALID naming `who` for a
 * range outside [0, L + 2) or empty (gpt_config.c). */
int fsc_gpt_parts_of_layers(const fsc_gpt_config *cfg, int first, int end, const char *who,
                            int *part_first, int *part_end);

/* Targets that are not ignore_index: the normaliser of a batch's mean loss. */
int64_t gpt_count_targets(const int32_t *y, int64_t n, int ignore_index);

#endif
