/* Tensor parallelism, shared by src/parallel/tp_*.c (not public).
 *
 * Every TP module starts with a tp_module: its group, and for each of its
 * parameters how the local tensor sits in the global one (tp_shard). The
 * parameter functions (init, norm, save, load) find TP modules in a tree by
 * their ops' kind string (pointer identity with the TP_KIND_* below), which
 * survives activation checkpointing (it copies the ops table, kind included).
 */
#ifndef FSC_PARALLEL_TP_INTERNAL_H
#define FSC_PARALLEL_TP_INTERNAL_H

#include "fsc/tp.h"

#define TP_MAX_PARAMS 2

/* How a local parameter maps to the global tensor. dim < 0: replicated
 * (local == global). Else dimension `dim` of the global tensor (size
 * global_dim) is `blocks` equal blocks (QKV: 3), each split over the group
 * in runs of `local_block` = ceil(global_dim / blocks / t) indices; local
 * index j is global blk * (global_dim / blocks) + rank * local_block + w
 * (blk = j / local_block, w = j % local_block), padding where rank *
 * local_block + w reaches global_dim / blocks. */
typedef struct tp_shard {
    int dim;
    int blocks;
    int64_t global_dim;
    int64_t local_block;
} tp_shard;

typedef struct tp_module {
    fsc_module base;
    fsc_group *g;
    int rank, size;
    bool sp;
    tp_shard shard[TP_MAX_PARAMS]; /* by parameter index; zeroed + dim -1 = replicated */
} tp_module;

extern const char TP_KIND_COLUMN[], TP_KIND_ROW[], TP_KIND_EMBEDDING[], TP_KIND_LAYERNORM[],
    TP_KIND_DROPOUT[], TP_KIND_ATTENTION[], TP_KIND_BLOCK[], TP_KIND_GPT[], TP_KIND_MLP[];

/* The tp_module of m, or NULL when m is not a TP module. */
tp_module *tp_module_of(const fsc_module *m);

/* Allocates a zeroed TP module of `size` bytes (first member a tp_module) and
 * fills its group fields from opt (NULL group: self); every shard replicated. */
void *tp_module_alloc(size_t size, const fsc_module_ops *ops, const char *name,
                      const fsc_tp_options *opt);

/* The shard record of parameter p of the tree under root (its TP module in
 * *owner), or NULL when p is replicated (a plain module's, or unsplit). */
const tp_shard *tp_param_shard(fsc_module *root, const fsc_param *p, tp_module **owner);
/* Global index along the sharded dim of local index j, or -1 for padding. */
int64_t tp_global_index(const tp_module *m, const tp_shard *s, int64_t j);

/* ---- a local parameter's place in the global tensor (tp_weights.c) ------------ */
typedef struct tp_placement {
    const tp_module *t; /* NULL: replicated */
    const tp_shard *s;  /* NULL: replicated */
    int64_t gshape[FSC_MAX_DIMS];
    int64_t gnumel;
} tp_placement;

/* Parameter p (of the tree under root): its shard record and global shape. */
tp_placement tp_place(fsc_module *root, const fsc_param *p);
/* fn(user, local element offset, global flat element offset, count) for every
 * run of a sharded p: local indices along the split dimension whose global
 * indices are consecutive, times the contiguous inner dimensions; one outer
 * index at a time, so runs come in increasing local and global order.
 * Padding runs come with global -1. pl must be sharded (pl->s non-NULL).
 * Stops at, and returns, fn's first nonzero status. */
typedef int (*tp_run_fn)(void *user, int64_t local, int64_t global, int64_t n);
int tp_for_each_run(const tp_placement *pl, const fsc_param *p, tp_run_fn fn, void *user);

/* ---- LoRA adapters on the TP Linears (tp_lora.c) ------------------------------ */
/* A column- or row-parallel Linear's global in and out sizes (tp_layers.c). */
void tp_linear_dims(const fsc_module *m, int *in, int *out);
/* Whether TP Linear m carries adapters (fsc_tp_lora_apply). */
bool tp_lora_has(const fsc_module *m);
/* Column: y_local += scale B_local A dropout(xin), xin the region's input
 * (gathered under SP); backward adds this rank's part of the input gradient
 * to dxin (NULL: none wanted) before the region's sum, and the adapters'
 * weight gradients (now, or deferred with ctx->defer). */
int tp_lora_column_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xin,
                           fsc_tensor *yl);
int tp_lora_column_backward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xin,
                            const fsc_tensor *dyl, fsc_tensor *dxin);
/* Row: part += scale B A_r dropout(x_r) before the region's sum; backward
 * from dyf, the whole output gradient (gathered under SP), into dxl. */
int tp_lora_row_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xl, fsc_tensor *part);
int tp_lora_row_backward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *xl,
                         const fsc_tensor *dyf, fsc_tensor *dxl);

/* ---- the conjugate communication operations (tp_regions.c) ------------------- */
/* Sum over the group, in place (n floats). `grad` marks a gradient reduction
 * that the test-only fault DROP_GRAD may corrupt (the last rank's share lost). */
int tp_allreduce(const tp_module *m, float *buf, int64_t n, bool grad);
/* Sequence gather: x (B, T/t, C) shard -> y (B, T, C) (arena); forward of
 * entering a region under SP, backward of leaving it. */
int tp_seq_gather(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y);
/* Sequence reduce-scatter: x (B, T, C) partial -> y (B, T/t, C) shard of the
 * sum over the group (arena). */
int tp_seq_reduce_scatter(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y);
/* Last-dim gather: x (..., c) -> y (..., c*t) (arena), rank r's part at [r*c, (r+1)*c). */
int tp_last_gather(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y);
/* Last-dim split: x (..., c*t) -> y (..., c), this rank's part (arena copy). */
int tp_last_split(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y);

/* Entering a TP region (before a column-parallel layer): forward copy (x
 * itself) or, under SP, sequence gather; backward: all-reduce of dx in place,
 * or sequence reduce-scatter into a new dx. */
int tp_enter_forward(const tp_module *m, fsc_arena *a, const fsc_tensor *x, fsc_tensor *y);
int tp_enter_backward(const tp_module *m, fsc_arena *a, fsc_tensor *dx);
/* Leaving a TP region (after a row-parallel layer): forward all-reduce in
 * place (y = x) or, under SP, reduce-scatter into a new y; backward: dy
 * itself, or under SP its sequence gather. */
int tp_leave_forward(const tp_module *m, fsc_arena *a, fsc_tensor *x, fsc_tensor *y);
int tp_leave_backward(const tp_module *m, fsc_arena *a, const fsc_tensor *dy, fsc_tensor *dx);

/* For a replicated parameter whose gradient this rank computed from a shard
 * of the tokens (SP): `part` holds this micro-batch's n gradient floats;
 * sums it over the group and adds it to grad. Without SP: grad += part. */
int tp_accumulate_replicated(const tp_module *m, float *grad, float *part, int64_t n);

/* ---- the vocabulary-parallel pieces shared by the embedding and the GPT ------ */
/* y (N, C) = local rows of table (padded rows Vp, first row `first`, count
 * real) for ids, zero for ids outside; then the region exit. */
void tp_vocab_lookup(float *y, const int32_t *ids, int64_t N, const float *table, int first,
                     int count, int C);
/* dtable rows += dy rows of the ids that fall in this rank's range. */
void tp_vocab_lookup_backward(float *dtable, const float *dy, const int32_t *ids, int64_t N,
                              int first, int count, int C);

/* FSC_ERR_INVALID naming the first target outside [0, vocab) that is not
 * ignore_index (targets are replicated, so every rank fails alike). */
int tp_check_targets(const int32_t *y, int64_t N, int vocab, int ignore_index);
/* fsc_tp_cross_entropy's arithmetic on N rows of logits x (N, vp), targets
 * checked: *sum += each row's loss (unnormalised); with grad, x becomes
 * d(loss)/d(x) at 1/norm per target. Per row, the result does not depend on
 * which rows share the call, so the head may run over chunks of rows. */
int tp_cross_entropy_rows(double *sum, float *x, const int32_t *y, int64_t N, int vp, int first,
                          int count, int ignore_index, double norm, bool grad, fsc_group *g,
                          fsc_arena *arena);

/* ---- the LM head fused with its loss (tp_head.c) ------------------------------ */
/* fsc_ctx.head_loss comes from fsc_tp_gpt_train_micro / eval_loss into the
 * TP GPT's forward, or from the pipeline into its last TP stage's. */

/* Forward's half of a fused head over n = B*T rows: checks hl (targets in
 * [0, vocab) or ignored, norm > 0; FSC_ERR_INVALID naming m otherwise),
 * copies it into *kept with its targets in the arena (backward reads them
 * after the caller's are gone), and makes y, the (1,) loss, NAN until the
 * head runs into *loss. */
int tp_head_loss_keep(const tp_module *m, const fsc_ctx *ctx, int64_t n, int vocab,
                      fsc_head_loss *kept, fsc_tensor *y, float **loss);
/* Backward's check of a fused head's dy: (1,) and 1 (the loss was
 * differentiated at 1/norm already); FSC_ERR_SHAPE or FSC_ERR_INVALID. */
int tp_head_loss_check_dy(const tp_module *m, const fsc_tensor *dy);

/* The tied head (logits = fin W^T over this rank's vp vocabulary rows) and
 * the vocab-parallel cross-entropy, over chunks of rows so that the logits
 * of only one chunk exist at a time. in: the head's input, (B, T, C) or
 * under SP this rank's (B, T/t, C) shard. *loss_sum gets the summed
 * (unnormalised) loss. When ctx->training: dW += each chunk's weight
 * gradient and *dfinal (arena, allocated before anything else here, shaped
 * as in) the gradient at in after the region's backward (all-reduce,
 * or under SP reduce-scatter), as the unfused head's backward gives them. */
int tp_head_loss(const tp_module *m, const fsc_ctx *ctx, const fsc_tensor *in, fsc_param *wte,
                 int first, int count, int vp, const struct fsc_head_loss *hl, double *loss_sum,
                 fsc_tensor *dfinal);

/* ---- a block's segments, for stages cut inside it (tp_block_parts.c) ---------- */
/* Segments [from, to) of fsc_tp_block_new's block (FSC_BLOCK_ATTN, _FC,
 * _PROJ; not all three), with its names, init and dropout keys. A range
 * ending at _PROJ outputs (B,T,C + 4C/t), the residual then this rank's
 * GELU columns, and one starting there takes it. NULL (error set) for a bad
 * range, or for a cut at _PROJ with sequence parallelism or
 * recompute_activation (FSC_ERR_UNSUPPORTED, naming why). */
fsc_module *tp_block_part_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                              int n_layers, int from, int to, const fsc_tp_options *tp);

/* ---- the GPT's tensor-parallel ends, shared by its families (tp_gpt.c) -------- */
/* The layout's state: the group (as a tp_module, for the region operations),
 * the options the layers are made with and this rank's vocabulary rows. */
typedef struct tp_ends {
    tp_module tp;
    fsc_tp_options opt;
    int first, count, vp;
} tp_ends;
struct gpt_model;
struct gpt_saved;
/* The vocabulary-parallel embedding (plus wpe's rows when the family has a
 * position table) and the head over this rank's rows of lm_head, or of wte
 * when tied: gpt_layout_ops' four ends. */
int tp_gpt_embed_forward(struct gpt_model *g, const fsc_ctx *ctx, const fsc_tensor *ids,
                         fsc_tensor *e);
int tp_gpt_embed_backward(struct gpt_model *g, const fsc_ctx *ctx, const struct gpt_saved *s,
                          const fsc_tensor *de);
int tp_gpt_head_forward(struct gpt_model *g, const fsc_ctx *ctx, struct gpt_saved *s,
                        fsc_tensor *y);
int tp_gpt_head_backward(struct gpt_model *g, const fsc_ctx *ctx, struct gpt_saved *s,
                         const fsc_tensor *dy, fsc_tensor *dfin);
extern const char TP_KIND_STAGE[];
/* What every family's TP layout table fills alike: the kinds and the ends. */
#define TP_GPT_ENDS                                                                                \
    .kind = TP_KIND_GPT, .stage_kind = TP_KIND_STAGE, .embed_forward = tp_gpt_embed_forward,       \
    .embed_backward = tp_gpt_embed_backward, .head_forward = tp_gpt_head_forward,                  \
    .head_backward = tp_gpt_head_backward
/* The LLaMA family's TP layout (tp_llama.c): the same ends and kinds. */
extern const struct gpt_layout_ops tp_llama_layout;

/* Sizes of a TP module for messages ("ColumnParallelLinear h.0.attn.c_attn"). */
int tp_shape_error(const fsc_module *m, const char *what, const fsc_tensor *x);

#endif
