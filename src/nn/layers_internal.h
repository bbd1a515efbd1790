/* Helpers shared by the built-in modules (not public). */
#ifndef FSC_NN_LAYERS_INTERNAL_H
#define FSC_NN_LAYERS_INTERNAL_H

#include <stdlib.h>

#include "fsc/nn.h"

/* Allocates a zeroed module struct of `size` bytes whose first member is an
 * fsc_module, and initialises that member. */
static inline void *fsc_module_alloc(size_t size, const fsc_module_ops *ops, const char *name) {
    fsc_module *m = calloc(1, size);
    if (!m) {
        fsc_error(FSC_ERR_NOMEM, "out of memory creating module %s", name ? name : "");
        return NULL;
    }
    fsc_module_init(m, ops, name);
    return m;
}

/* layernorm.c: a norm module of `size` bytes (as fsc_module_alloc) with a
 * weight of ones over dim, and a bias of zeros when bias; NULL (error set,
 * naming ops->kind) when dim is not positive or memory is short. */
fsc_module *nn_norm_alloc(size_t size, const fsc_module_ops *ops, const char *name, int dim,
                          bool bias);

/* embedding.c: every id of x (int32 ids) in [0, num), else FSC_ERR_INVALID
 * naming m's kind and name and the first id outside (the plain and the
 * vocabulary-parallel embedding). */
int nn_check_ids_below(const fsc_module *m, const fsc_tensor *x, int num);

/* linear.c: whether m is a plain Linear (fsc_linear_new), and its layout
 * (m must be one); for LoRA (lora.c), which adapts Linears in place. */
bool nn_linear_is(const fsc_module *m);
fsc_weight_layout nn_linear_layout(const fsc_module *m);

/* lora.c's fsc_lora_apply for trees whose Linears may be another floor's
 * (tensor parallelism's): `other` is asked about each target that is not a
 * plain Linear (its base parameters frozen already; layer_id keys its
 * dropout masks) and returns 1 when it adapted m, 0 when m is no Linear it
 * knows (the walk goes on into its children), or a negative status. */
struct fsc_lora_config;
typedef int (*nn_lora_adapt_fn)(fsc_module *m, const struct fsc_lora_config *c,
                                uint32_t layer_id);
int nn_lora_apply_with(fsc_module *root, const struct fsc_lora_config *cfg, nn_lora_adapt_fn other,
                       int *adapted);

/* Allocates an output shaped like x, last dim replaced, of dtype dt. */
static inline int fsc_alloc_like_dt(fsc_arena *a, const fsc_tensor *x, int64_t last, fsc_dtype dt,
                                    fsc_tensor *out) {
    fsc_tensor t = *x;
    t.dtype = dt;
    t.shape[t.ndim - 1] = last;
    t.data = fsc_arena_alloc(a, fsc_tensor_nbytes(&t));
    if (!t.data) return FSC_ERR_NOMEM;
    *out = t;
    return FSC_OK;
}

/* Allocates an fp32 output tensor shaped like x but with the last dim replaced. */
static inline int fsc_alloc_like(fsc_arena *a, const fsc_tensor *x, int64_t last, fsc_tensor *out) {
    return fsc_alloc_like_dt(a, x, last, FSC_DTYPE_F32, out);
}

/* For modules whose backward needs only their input: saves a view of x. */
static inline int fsc_save_input(fsc_arena *a, const fsc_tensor *x, void **saved) {
    fsc_tensor *keep = fsc_arena_alloc(a, sizeof *keep);
    if (!keep) return FSC_ERR_NOMEM;
    *keep = *x;
    *saved = keep;
    return FSC_OK;
}

static inline int64_t fsc_rows(const fsc_tensor *x) {
    return fsc_tensor_numel(x) / x->shape[x->ndim - 1];
}

/* For backward: the record its forward returned must be there. */
static inline int fsc_check_saved(const fsc_module *m, const void *saved) {
    if (saved) return FSC_OK;
    char path[FSC_NAME_MAX * 2];
    return fsc_error(FSC_ERR_INVALID,
                     "module '%s' (%s): backward without the record its forward returned "
                     "(saved is NULL)",
                     fsc_module_path(m, path, sizeof path), m->ops->kind);
}

/* For backward: dy has the shape of x (the input the forward saved) with the
 * last dim replaced by `last`, i.e. the output's shape. */
static inline int fsc_check_dy_like(const fsc_module *m, const fsc_tensor *dy, const fsc_tensor *x,
                                    int64_t last) {
    int64_t shape[FSC_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = last;
    return fsc_module_check_dy(m, dy, x->ndim, shape);
}

/* The GEMM precision ctx->autocast asks for (fsc_module_forward/backward
 * have refused any dtype but F32 and BF16). */
static inline fsc_gemm_prec fsc_ctx_prec(const fsc_ctx *ctx) {
    return ctx->autocast == FSC_DTYPE_BF16 ? FSC_GEMM_BF16 : FSC_GEMM_F32;
}

/* Whether this call stores activations that feed bf16 GEMMs in bf16
 * (issue 27's bf16 end to end): bf16 autocast with bf16 GEMMs running here.
 * Forced off (FSC_BF16_GEMM=off, or no native bf16 under auto), autocast
 * computes in fp32 bit for bit as before, so producers keep fp32 too. */
static inline bool fsc_ctx_bf16_act(const fsc_ctx *ctx) {
    return ctx->autocast == FSC_DTYPE_BF16 && fsc_bf16_gemm_wanted();
}

/* Under fsc_ctx_bf16_act a producer whose output goes straight into a
 * plain Linear (not one LoRA adapted, which reads fp32) writes it in bf16,
 * which the Linear's GEMM would round it to anyway: GELU into the MLP's
 * c_proj, LayerNorm into attention's c_attn or the MLP's c_fc (not under
 * ctx->kv or ctx->seq, whose paths read fp32). Set by the module that owns
 * both ends. */
void nn_gelu_set_feeds(fsc_module *gelu, const fsc_module *linear);
/* nn_bf16_out_fn of a GELU reading its Linear's output (the MLP's c_fc) in
 * bf16: true under fsc_ctx_bf16_act. */
bool nn_gelu_reads_bf16(const fsc_module *gelu, const fsc_ctx *ctx, const fsc_tensor *x);
/* A Linear's consumer that reads its output in bf16 (attention: q/k/v)
 * says so per call: want(consumer, ctx, x) true makes that call's y bf16,
 * the GEMM's fp32 result rounded once. Set by the module that owns both;
 * want NULL keeps y fp32. Never for a LoRA-adapted Linear. */
typedef bool (*nn_bf16_out_fn)(const fsc_module *consumer, const fsc_ctx *ctx, const fsc_tensor *x);
void nn_linear_set_out_bf16(fsc_module *linear, nn_bf16_out_fn want, const fsc_module *consumer);
void nn_layernorm_set_feeds(fsc_module *layernorm, const fsc_module *linear);

/* Checks x is an f32 tensor whose last dim is `last`. */
static inline int fsc_check_last(const fsc_module *m, const fsc_tensor *x, int64_t last) {
    if (x->dtype != FSC_DTYPE_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != last)
        return fsc_error(FSC_ERR_SHAPE,
                         "%s (%s): expected f32 input with last dim %lld, got %s "
                         "with last dim %lld",
                         m->name, m->ops->kind, (long long)last, fsc_dtype_name(x->dtype),
                         (long long)(x->ndim ? x->shape[x->ndim - 1] : 0));
    return FSC_OK;
}

/* LayerNorm's forward and backward for a module whose parameters 0 and 1 are
 * weight and bias over `dim`, the backward accumulating the parameter
 * gradients into dweight and dbias (the module's own, or a buffer a
 * tensor-parallel LayerNorm sums over its group first). */
int fsc_layernorm_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x,
                                 fsc_tensor *y, void **saved, int dim, float eps);
int fsc_layernorm_module_backward(fsc_module *m, const fsc_ctx *ctx, void *saved,
                                  const fsc_tensor *dy, fsc_tensor *dx, int dim, float *dweight,
                                  float *dbias);

/* Attention over its parts c_attn, c_proj and resid_dropout (in that order)
 * with C channels in NH heads after c_attn (the local ones under tensor
 * parallelism): saves qkv, the probabilities and the parts' records. The
 * caller checks x (forward) and dy (backward). */
typedef struct {
    void *c_attn, *c_proj, *drop;
    fsc_tensor qkv; /* (B, T, 3C): the whole sequence; f32, or bf16 (atth set) */
    float *att;     /* (B, NH, T, T): the naive kernel's, else NULL */
    uint16_t *atth; /* the same in bf16, when qkv is bf16 (autocast), else NULL */
    float *lse;     /* (B, NH, T): the flash kernel's, else NULL */
    float *out;     /* flash: the attention output (c_proj's input) */
} fsc_attn_saved;
/* The attention kernel on s->qkv, chosen by ctx->attention and T (see
 * fsc_attention_uses_flash): h (B, T, C) written, s->att or s->lse and
 * s->out set; backward follows the saved choice (dqkv written). */
int nn_attention_fused_forward(const fsc_ctx *ctx, fsc_attn_saved *s, float *h, int C, int NH);
int nn_attention_fused_backward(const fsc_ctx *ctx, const fsc_attn_saved *s, const float *dh,
                                float *dqkv, int C, int NH);
/* FSC_ERR_NOMEM with the probabilities' size under naive attention and
 * what flash (or --cp) would keep instead, as the error's context. */
int nn_attention_refused(int64_t B, int64_t T, int NH);
int fsc_attention_parts_forward(fsc_module *const parts[3], const fsc_ctx *ctx, const fsc_tensor *x,
                                fsc_tensor *y, void **saved, int C, int NH);

/* fsc_ctx.kv: every attention layer's keys and values of the positions
 * decoded so far, one sequence. A forward's attention layers take slots
 * 0, 1, ... in the order they run (`next`, reset by the caller), append
 * their new rows at positions len .. len + n - 1 and attend causally over
 * 0 .. len + n - 1; the caller advances len after the forward. */
typedef struct fsc_kv_cache {
    int slots, T, C; /* layers, positions and channels the buffers hold */
    int len, next;
    float *k, *v;   /* (slots, T, C) each */
    bool last_only; /* the head makes logits of the last new row only */
} fsc_kv_cache;
int fsc_attention_parts_backward(fsc_module *const parts[3], const fsc_ctx *ctx,
                                 const fsc_attn_saved *s, const fsc_tensor *dy, fsc_tensor *dx,
                                 int C, int NH);

/* A pre-LN block's forward and backward over its children ln_1, attn, ln_2,
 * mlp (in that order): x + attn(ln_1(x)), then + mlp(ln_2(.)). */
int fsc_block_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                      void **saved);
int fsc_block_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                       fsc_tensor *dx);
/* A pre-LN block of fsc_block_forward/backward over the four children
 * given (norm, attention, norm, MLP, adopted in that order): another
 * family's block. NULL (error set) when one is NULL or adoption fails; the
 * children are freed then. */
fsc_module *fsc_block_of(const char *name, fsc_module *const children[4]);
/* A block's segments, in order: its attention half x + attn(ln_1(x)); the
 * MLP's ln_2, c_fc and GELU; its c_proj and dropout with the residual sum. */
enum { FSC_BLOCK_ATTN, FSC_BLOCK_FC, FSC_BLOCK_PROJ, FSC_BLOCK_SEGMENTS };
/* Segments [from, to) of fsc_block_new's block, named like it (the full
 * model's names, init and dropout keys), with the children they run (ln_1,
 * attn; ln_2, mlp with c_fc, act and/or c_proj, dropout). (B,T,C) in and
 * out, but for the packed boundary between FC and PROJ: a range ending
 * with FC returns, and one beginning with PROJ takes, (B,T,5C) rows [x |
 * gelu(c_fc(ln_2(x)))]. NULL (error set) on bad sizes or range. */
fsc_module *fsc_block_part_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                               int n_layers, int from, int to);
/* The engine of a range of a block's segments, shared by fsc_block_part_new
 * (F = 4C) and the tensor-parallel block part (F = 4C/t, this rank's GELU
 * columns): over m's children as fsc_block_part_new makes them, (B,T,C) in
 * and out but across the cut between FC and PROJ, which passes rows
 * [x (C) | gelu output (F)]. Forward trusts x's shape (the module checks
 * it); backward checks saved and dy. */
typedef struct fsc_block_span {
    int from, to, C, F;
} fsc_block_span;
int fsc_block_span_forward(const fsc_block_span *b, fsc_module *m, const fsc_ctx *ctx,
                           const fsc_tensor *x, fsc_tensor *y, void **saved);
int fsc_block_span_backward(const fsc_block_span *b, fsc_module *m, const fsc_ctx *ctx, void *saved,
                            const fsc_tensor *dy, fsc_tensor *dx);
/* Children [from, to) of fsc_mlp_new's MLP (c_fc, act, c_proj, dropout) as
 * a Sequential of its name: the two sides of a cut inside the MLP. */
fsc_module *fsc_mlp_parts_new(const char *name, int C, float dropout, uint32_t layer_id,
                              float init_std, float proj_std, int from, int to);

/* Backward through blocks h[n-1] .. h[0] (saved records saved[l]) from *cur,
 * which ends as the input gradient of h[0]. Each block's input gradient
 * goes into one of the two (B,T,C) buffers of pingpong and the rest of its
 * backward memory is given back to the arena, so every block reuses the
 * same (cache-warm) region: a stack of blocks does not grow the workspace.
 * Shared by the GPT and its pipeline stages. */
int fsc_blocks_backward(fsc_module *const *h, void *const *saved, int n, const fsc_ctx *ctx,
                        fsc_tensor *cur, fsc_tensor pingpong[2]);

/* RMSNorm over x's rows with weight m->params[0] (dim, eps): the module's
 * forward, shared by fsc_rmsnorm_new's module and the tensor-parallel one;
 * *saved is the arena record fsc_rmsnorm_module_backward takes, which
 * allocates dx when given and adds the weight gradient into dw (dim floats:
 * the parameter's gradient, or a scratch the caller reduces). */
int fsc_rmsnorm_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, int dim,
                               float eps, fsc_tensor *y, void **saved);
int fsc_rmsnorm_module_backward(fsc_module *m, const fsc_ctx *ctx, void *saved,
                                const fsc_tensor *dy, int dim, float *dw, fsc_tensor *dx);

#endif
