/* The LLaMA family's tensor-parallel layout (Megatron's split): the one
 * model of src/nn/gpt.c with LLaMA's layers made over a TP group, and the
 * GPT's TP ends (tp_gpt.c: vocabulary-parallel embedding and head, the
 * head fused with its loss, sequence shards under SP).
 *
 * A decoder layer is llama_parts.c's, written once; this file only says how
 * its projections and norms are made (a llama_proj_maker): q_proj, k_proj
 * and v_proj column-parallel by heads, so each rank holds heads/t query
 * heads and kv_heads/t key/value heads and every query head keeps its own
 * key/value head (t must divide kv_heads: key/value heads are split, not
 * replicated); o_proj row-parallel on those heads; gate_proj and up_proj
 * column-parallel and down_proj row-parallel (the SwiGLU product is
 * elementwise per column, so it stays local); RMSNorm replicated, on
 * sequence shards under SP with its weight's gradient summed over the
 * group. An untied lm_head is split by vocabulary rows as wte is. */
#include "nn/gpt_internal.h"
#include "nn/layers_internal.h"
#include "nn/llama_internal.h"
#include "tp_internal.h"

/* ---- RMSNorm outside TP regions ----------------------------------------------------------- */

static const char TP_KIND_RMSNORM[] = "TensorParallelRMSNorm";

typedef struct {
    tp_module tp;
    int dim;
    float eps;
} tp_rms;

static int rms_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    const tp_rms *l = (const tp_rms *)m;
    return fsc_rmsnorm_module_forward(m, ctx, x, l->dim, l->eps, y, saved);
}

/* Under SP this shard's weight gradient is summed over the group first. */
static int rms_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    tp_rms *l = (tp_rms *)m;
    float *dw = m->params[0].grad;
    if (l->tp.sp && !(dw = fsc_arena_calloc(ctx->arena, (size_t)l->dim * sizeof(float))))
        return FSC_ERR_NOMEM;
    int rc = fsc_rmsnorm_module_backward(m, ctx, saved, dy, l->dim, dw, dx);
    if (rc) return rc;
    return l->tp.sp ? tp_accumulate_replicated(&l->tp, m->params[0].grad, dw, l->dim) : FSC_OK;
}

static const fsc_module_ops rms_ops = {TP_KIND_RMSNORM, rms_forward, rms_backward, NULL};

static fsc_module *tp_rmsnorm_new(const char *name, int dim, float eps, const fsc_tp_options *tp) {
    tp_rms *l = tp_module_alloc(sizeof *l, &rms_ops, name, tp);
    if (!l) return NULL;
    l->dim = dim, l->eps = eps;
    if (fsc_module_add_param(&l->tp.base, "weight", 1, (int64_t[]){dim}, FSC_INIT_ONES, 0) < 0) {
        fsc_module_free(&l->tp.base);
        return NULL;
    }
    return &l->tp.base;
}

/* ---- the layer's projections and norms ---------------------------------------------------- */

static fsc_module *tp_column(void *user, const char *name, int in, int out, bool bias, float std) {
    return fsc_tp_column_linear_new(name, in, out, bias, FSC_WEIGHT_OUT_IN, std, false, user);
}

static fsc_module *tp_row(void *user, const char *name, int in, int out, float std) {
    return fsc_tp_row_linear_new(name, in, out, false, FSC_WEIGHT_OUT_IN, std, true, user);
}

static fsc_module *tp_norm(void *user, const char *name, int dim, float eps) {
    return tp_rmsnorm_new(name, dim, eps, user);
}

/* ---- the layout --------------------------------------------------------------------------- */

static fsc_module *tp_llama_wte(void *st, const fsc_gpt_config *c) {
    return fsc_tp_embedding_new("model.embed_tokens", c->vocab, c->d_model, 0.02f,
                                &((tp_ends *)st)->opt);
}

static fsc_module *tp_llama_block(void *st, const fsc_gpt_config *c, const char *name, int b,
                                  int from, int to) {
    (void)b;
    tp_ends *t = st;
    const llama_proj_maker mk = {.user = &t->opt,
                                 .t = t->tp.size,
                                 .sp = t->tp.sp,
                                 .column = tp_column,
                                 .row = tp_row,
                                 .norm = tp_norm};
    return llama_layer_new(c, name, from, to, &mk);
}

static fsc_module *tp_llama_norm(void *st, const fsc_gpt_config *c) {
    return tp_rmsnorm_new("model.norm", c->d_model, llama_norm_eps(c), &((tp_ends *)st)->opt);
}

/* An untied head: its (V, C) weight split by vocabulary rows as wte's is,
 * with nn.Linear's name and initialisation (N(0, 0.02) by global element,
 * as the one-process Linear draws it); the ends compute with it. */
static int tp_llama_lm_head(void *st, const fsc_gpt_config *c, fsc_module **out) {
    *out = NULL;
    if (c->tie_embeddings) return FSC_OK;
    *out = fsc_tp_embedding_new("lm_head", c->vocab, c->d_model, 0.02f, &((tp_ends *)st)->opt);
    return *out ? FSC_OK : FSC_ERR_INVALID;
}

static int tp_llama_width(void *st, const fsc_gpt_config *c, int p) {
    return fsc_tp_gpt_part_width(c, ((tp_ends *)st)->tp.size, p);
}

const gpt_layout_ops tp_llama_layout = {
    .label = "TP LLaMA",
    .block_fmt = "model.layers.%d",
    .wte = tp_llama_wte,
    .block = tp_llama_block,
    .ln_f = tp_llama_norm,
    .lm_head = tp_llama_lm_head,
    .width = tp_llama_width,
    TP_GPT_ENDS,
    .free_state = free,
};
