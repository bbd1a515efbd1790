/* fsc tensor parallelism (Megatron-LM / fairscale.nn.model_parallel): layers
 * whose weights are split over a tensor-parallel (TP) group, and a GPT built
 * from them.
 *
 * The one idea: a shard is a slice of the one-process tensor. Every sharded
 * parameter keeps its global Hugging Face name ("h.0.attn.c_attn.weight"),
 * is initialised from (seed, global name, GLOBAL element index) and saved
 * and loaded by global name, so a TP shard equals the slice of the
 * one-process weight bit for bit. Dropout masks are keyed by the global
 * (sample, element), never by TP rank, so TP = 1 and TP = t draw the same
 * masks and a TP run can be checked against one process.
 *
 * Communication lives in four conjugate operations (src/parallel/tp/tp_regions.c):
 *   copy      forward identity,    backward all-reduce  (Megatron's f)
 *   reduce    forward all-reduce,  backward identity    (Megatron's g)
 *   gather    forward all-gather,  backward reduce-scatter  (sequence)
 *   scatter   forward reduce-scatter, backward all-gather   (sequence)
 * A column-parallel linear enters a TP region (copy, or gather under sequence
 * parallelism); a row-parallel linear leaves it (reduce, or scatter).
 *
 * Sequence parallelism (Korthikanti et al. 2022): outside the TP regions
 * (LayerNorm, dropout, residual adds) activations are split along the
 * sequence: rank r holds tokens [r*T/t, (r+1)*T/t) of every sample, a
 * (B, T/t, C) tensor, so T must be divisible by t. Parameters used there are
 * replicated but see only a shard of the tokens; their gradients are summed
 * over the TP group inside backward, once per micro-batch, so gradients of
 * replicated parameters are equal on every TP rank (bitwise) whether or not
 * sequence parallelism is on.
 *
 * Vocabulary padding rule: rank r holds rows [r*Vp, (r+1)*Vp) of the
 * vocabulary, Vp = ceil(V/t). Rows at or past V (on the last rank or ranks)
 * are padding: zero, never drawn from the RNG, excluded from the softmax,
 * never saved or loaded; their gradients stay zero, so AdamW keeps them zero.
 *
 * TP modules follow the module contract of fsc/nn.h (saved-state records,
 * +=-accumulated gradients, hooks, activation checkpointing). Bind their
 * parameters with fsc_tp_params_bind, which initialises shards as slices.
 * Every rank of the TP group must make the same calls in the same order
 * (forward, backward, recompute): each layer issues collectives.
 */
#ifndef FSC_TP_H
#define FSC_TP_H

#include "fsc/dist.h"
#include "fsc/gpt.h"
#include "fsc/nn.h"
#include "fsc/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options shared by every TP layer; zero fields are the defaults. */
typedef struct fsc_tp_options {
    fsc_group *group;       /* the TP group (borrowed; must outlive the modules);
                               NULL: fsc_group_self(), i.e. t = 1 */
    bool sequence_parallel; /* activations outside TP regions are sequence shards */
    /* Selective recomputation (Korthikanti et al. 2022): attention keeps only
     * q, k, v, not its (B, NH/t, T, T) softmax probabilities, and backward
     * recomputes them (one more q k^T per layer); the gradients are the same
     * bit for bit. Independent of sequence_parallel. */
    bool recompute_attention;
    /* The MLP keeps GELU's input, not also its output (4C/t floats per token
     * per layer), and backward recomputes the output from it by the same
     * kernel; the gradients are the same bit for bit. Independent of the two
     * above. */
    bool recompute_activation;
} fsc_tp_options;

/* ---- the vocabulary padding rule --------------------------------------------- */
/* Rank `rank` of `t` holds vocabulary rows [*first, *first + *count) of V,
 * padded to *padded = ceil(V/t) rows locally (*count <= *padded; may be 0).
 * Any out pointer may be NULL. FSC_ERR_INVALID for V < 1, t < 1 or a rank
 * outside [0, t). */
FSC_API int fsc_tp_vocab_range(int V, int t, int rank, int *first, int *count, int *padded);

/* ---- layers --------------------------------------------------------------------- */
/* Each returns NULL (error set) on bad configuration (sizes not divisible by
 * the TP size, NULL tp); tp is copied. The caller owns the module, as for the
 * built-in modules of fsc/nn.h. Parameter names and layouts are the
 * one-process module's (fsc_linear_new), shapes are the local slices. */

/* Column-parallel linear: weight split on the output dimension (out % t == 0;
 * rank r computes outputs [r*out/t, (r+1)*out/t), bias likewise). Input
 * (..., in) replicated over the group, or, with sequence parallelism, a
 * (B, T/t, in) sequence shard that forward all-gathers. Output (..., out/t),
 * or all of (..., out) with gather_output (FairScale's option: forward
 * all-gathers the last dim, backward keeps this rank's part). */
FSC_API fsc_module *fsc_tp_column_linear_new(const char *name, int in, int out, bool bias,
                                             fsc_weight_layout layout, float init_std,
                                             bool gather_output, const fsc_tp_options *tp);
/* Row-parallel linear: weight split on the input dimension (in % t == 0).
 * Input (..., in/t), this rank's part, when input_is_parallel (FairScale's
 * option); else (..., in) replicated, which forward splits. Output (..., out)
 * summed over the group (all-reduce), or, with sequence parallelism, the
 * (B, T/t, out) sequence shard of the sum (reduce-scatter); the bias (whole
 * on every rank) is added after the sum. */
FSC_API fsc_module *fsc_tp_row_linear_new(const char *name, int in, int out, bool bias,
                                          fsc_weight_layout layout, float init_std,
                                          bool input_is_parallel, const fsc_tp_options *tp);
/* Vocab-parallel embedding: int32 (B,T) ids -> (B,T,dim) (all-reduced), or
 * the (B,T/t,dim) sequence shard (reduce-scattered). Table rows split by the
 * padding rule (local weight (ceil(num/t), dim)); ids outside this rank's rows
 * contribute zero. An id outside [0, num) is FSC_ERR_INVALID. */
FSC_API fsc_module *fsc_tp_embedding_new(const char *name, int num, int dim, float init_std,
                                         const fsc_tp_options *tp);
/* LayerNorm (fsc_layernorm_new) for activations outside TP regions: with
 * sequence parallelism it sees a shard of the tokens, and backward sums its
 * weight and bias gradients over the group before accumulating them. */
FSC_API fsc_module *fsc_tp_layernorm_new(const char *name, int dim, float eps,
                                         const fsc_tp_options *tp);
/* Dropout (fsc_dropout_new) on (B,T,C) activations, or on their (B,T/t,C)
 * sequence shard, drawing the masks of the whole tensor: element (b,t,c) is
 * dropped as the one-process layer drops it. */
FSC_API fsc_module *fsc_tp_dropout_new(const char *name, float p, uint32_t layer_id,
                                       const fsc_tp_options *tp);
/* Causal self-attention (fsc_attention_new's names and init) with heads
 * split over the group (NH % t == 0): c_attn column-parallel, holding the
 * q, k and v columns of this rank's heads; c_proj row-parallel; residual
 * dropout. Input and output (B,T,C), or (B,T/t,C) shards under sequence
 * parallelism. */
FSC_API fsc_module *fsc_tp_attention_new(const char *name, int C, int NH, float dropout,
                                         uint32_t layer_id, float init_std, float proj_std,
                                         const fsc_tp_options *tp);
/* MLP (fsc_mlp_new's names): c_fc column-parallel (4C/t outputs), GELU on
 * the local part, c_proj row-parallel, dropout. Shapes as attention's. */
FSC_API fsc_module *fsc_tp_mlp_new(const char *name, int C, float dropout, uint32_t layer_id,
                                   float init_std, float proj_std, const fsc_tp_options *tp);
/* Pre-LN block (fsc_block_new's names, init and dropout keys) of TP layers. */
FSC_API fsc_module *fsc_tp_block_new(const char *name, int C, int NH, float dropout,
                                     uint32_t layer_id, int n_layers, const fsc_tp_options *tp);

/* ---- loss --------------------------------------------------------------------- */
/* Vocab-parallel cross-entropy: logits (..., Vp) f32 hold this rank's rows of
 * the vocabulary by the padding rule for `vocab` over the group (Vp =
 * ceil(vocab/t)); the logits are never gathered: one all-reduce MAX of the row
 * maxima and one all-reduce SUM of the target logit and the sum of exps.
 * Otherwise as fsc_cross_entropy: mean over the GLOBAL non-ignored targets
 * (norm), logits overwritten by d(loss)/d(logits) (zero in pad columns),
 * *loss_out the same on every rank. Errors as fsc_cross_entropy's (checked
 * on every rank alike: targets are replicated), FSC_ERR_SHAPE also for a last
 * dim other than Vp. g NULL means fsc_group_self(). */
FSC_API int fsc_tp_cross_entropy(float *loss_out, fsc_tensor *logits, const fsc_tensor *targets,
                                 int vocab, int ignore_index, double norm, fsc_group *g,
                                 fsc_arena *arena);

/* ---- GPT ------------------------------------------------------------------------ */
/* The GPT of fsc_gpt_new (same config, same global parameter names, the same
 * initial weights slice for slice), built of TP layers over tp->group:
 * wte vocab-parallel (also the tied head), blocks of fsc_tp_block_new, ln_f.
 * cfg->heads, 4*d_model and d_model must be divisible by t. A LLaMA config
 * (cfg->arch FSC_ARCH_LLAMA) gets Megatron's LLaMA split instead: q_proj,
 * k_proj, v_proj column-parallel by heads (key/value heads split, never
 * replicated: t must divide kv_heads, heads and ffn_hidden), o_proj row-
 * parallel, gate_proj and up_proj column-parallel, down_proj row-parallel,
 * RMSNorm replicated, embed_tokens and an untied lm_head vocab-parallel;
 * recompute_attention and recompute_activation are refused there
 * (FSC_ERR_UNSUPPORTED). Forward takes int32 (B,T) ids and yields this
 * rank's logits (B,T,ceil(V/t)), input of fsc_tp_cross_entropy; under
 * sequence parallelism T must be divisible by t.
 * NULL (error set) on a bad config. The caller owns the tree. */
FSC_API fsc_module *fsc_tp_gpt_new(const fsc_gpt_config *cfg, const fsc_tp_options *tp);
/* A pipeline stage of that GPT (fsc/pipe.h): layers [first, end) as
 * fsc_gpt_stage_new cuts the model (0 the embedding, 1..L the blocks, L+1
 * ln_f and the head tied to wte), of TP layers over tp->group, with the
 * whole model's names. Input: int32 (B,T) ids on the embedding stage, else
 * the (B,T,C) activation, equal on every TP rank (under sequence
 * parallelism this rank's (B,T/t,C) shard); output the same activation, or
 * on the head's stage this rank's logits (B,T,ceil(V/t)) for
 * fsc_tp_cross_entropy. Given fsc_ctx.head_loss (the pipeline's
 * fsc_pipe_io.targets), the head's stage outputs its (1,) loss instead and
 * runs the head fused with it, as fsc_tp_gpt_train_micro does: at the start
 * of backward (which then takes dy = 1), or in forward when evaluating.
 * A stage with the head and not the embedding holds its own copy of this
 * rank's wte rows (the pipeline keeps the copies equal). NULL (error set)
 * on a bad config or range, as fsc_gpt_stage_new and fsc_tp_gpt_new. The
 * caller owns the module. */
FSC_API fsc_module *fsc_tp_gpt_stage_new(const fsc_gpt_config *cfg, int first, int end,
                                         const fsc_tp_options *tp);
/* The same stage in parts (fsc_gpt_stage_parts_new's 3L + 2: part 0 the
 * embedding, block b's attention half 3b+1, its MLP's ln_2, c_fc and GELU
 * 3b+2, its c_proj and dropout with the residual 3b+3, the head 3L+1), so
 * a stage may end inside a block; names, init and dropout keys are the
 * whole model's, so checkpoints resume at any cut. Between parts 3b+2 and
 * 3b+3 the activation is (B,T,C + 4C/t) on each TP rank: the residual
 * stream, then this rank's columns of the GELU output
 * (fsc_tp_gpt_part_width). A range starting or ending there is refused
 * (FSC_ERR_UNSUPPORTED, naming why) under sequence parallelism (the
 * residual is a sequence shard there, the GELU output is not) and with
 * recompute_activation; the cut after the attention half passes (B,T,C),
 * or (B,T/t,C) under sequence parallelism. NULL (error set) otherwise as
 * fsc_tp_gpt_stage_new. */
FSC_API fsc_module *fsc_tp_gpt_stage_parts_new(const fsc_gpt_config *cfg, int first, int end,
                                               const fsc_tp_options *tp);
/* Channels per token entering part `part` of a TP stage over t ranks:
 * C + F/t before a block's c_proj (LLaMA: down_proj) part, F = 4C (LLaMA:
 * the SwiGLU width), else C (no checks). */
FSC_API int fsc_tp_gpt_part_width(const fsc_gpt_config *cfg, int t, int part);
/* fsc_gpt_train_micro for a TP GPT, or a wrapper around one (DDP,
 * ShardedDDP: found through fsc_module.wraps): forward, vocab-parallel
 * cross-entropy, backward (+=). The head runs fused with the loss, at the
 * start of backward, over chunks of rows (each chunk's logits made,
 * differentiated and folded into the head's input and weight gradients at
 * once), so the (B,T,ceil(V/t)) logits never exist; per row the arithmetic
 * is the unfused one, the weight gradient sums rows chunk by chunk (under
 * ctx->defer the head runs unfused). *loss is the same on every rank. Errors as
 * fsc_gpt_train_micro's; FSC_ERR_INVALID for a module fsc_tp_gpt_new did not
 * make (nor wraps). */
FSC_API int fsc_tp_gpt_train_micro(fsc_module *gpt, const fsc_ctx *ctx, const int32_t *x,
                                   const int32_t *y, int B, int T, int ignore_index, double norm,
                                   float *loss);
/* fsc_gpt_eval_loss for a TP GPT (forward only, the head fused with the loss
 * as above). */
FSC_API int fsc_tp_gpt_eval_loss(fsc_module *gpt, const fsc_ctx *ctx, const int32_t *x,
                                 const int32_t *y, int B, int T, int ignore_index, float *loss);

/* ---- LoRA ------------------------------------------------------------------------ */
struct fsc_lora_config;
/* fsc_lora_apply (fsc/lora.h) for a tree that may hold TP Linears: a
 * column-parallel target gets lora_A (r, in) replicated and lora_B (out, r)
 * split by output rows as its weight is; a row-parallel one lora_A split by
 * input columns as its weight is and lora_B replicated; the low-rank
 * partial products are summed over the group with the base's (one more
 * collective of N x r floats per adapted Linear, in backward). Shards are
 * slices of the one-process tensors under the same names, so weights and
 * adapters save and load by global name as any TP parameter. Plain Linears
 * are adapted as fsc_lora_apply does. FSC_ERR_UNSUPPORTED for a target that
 * names a TP module other than a Linear (the vocabulary-parallel lm_head);
 * the rest as fsc_lora_apply. */
FSC_API int fsc_tp_lora_apply(fsc_module *root, const struct fsc_lora_config *cfg, int *adapted);

/* ---- parameters ------------------------------------------------------------------ */
/* fsc_params_bind for a tree of TP (and plain) modules: then every sharded
 * parameter is initialised as its slice of the global tensor, from (seed,
 * global name, global element index); padding rows are zero. Errors as
 * fsc_params_bind. */
FSC_API int fsc_tp_params_bind(fsc_module *root, uint64_t seed, bool with_grads, fsc_params *out);
/* fsc_params_init_values for such a tree (ps bound over root): slices again. */
FSC_API void fsc_tp_params_init_values(fsc_module *root, fsc_params *ps, uint64_t seed);
/* True when ps entry i (bound over root) is split over the TP group, false
 * when every TP rank holds all of it (a plain module's parameter counts as
 * replicated). */
FSC_API bool fsc_tp_param_is_sharded(fsc_module *root, const fsc_params *ps, int i);
/* The global gradient 2-norm of a TP model: squares of sharded gradients
 * summed over group g, replicated ones counted once (they are equal on every
 * TP rank after backward). The same value on every rank of g. FSC_ERR_INVALID
 * for NULL arguments or unbound gradients; dist errors from the collective. */
FSC_API int fsc_tp_grad_norm(fsc_module *root, const fsc_params *ps, fsc_group *g, float *norm);
/* fsc_clip_grad_norm with fsc_tp_grad_norm's norm: scales this rank's
 * gradients by max_norm / (norm + 1e-6) when that is < 1. *total_norm (may
 * be NULL) receives the norm. Errors as the two. */
FSC_API int fsc_tp_clip_grad_norm(fsc_module *root, const fsc_params *ps, fsc_group *g,
                                  float max_norm, float *total_norm);

/* ---- weights by global name ------------------------------------------------------- */
/* Writes the whole model as the one-process fsc_weights_save would (same
 * names, global shapes, order and metadata, so the same bytes): rank 0 of g
 * writes the header and replicated tensors, every rank writes its own slices
 * in place, and the file appears at `path` only once all are written
 * (atomic as fsc_weights_save). Collective over g; every rank returns the
 * same status. */
FSC_API int fsc_tp_save_weights(const char *path, fsc_module *root, const fsc_params *ps,
                                fsc_group *g, int n_meta, const char *const *keys,
                                const char *const *values);
/* Reads this rank's slice of every parameter (and replicated ones whole) from
 * a file of global tensors (F32, BF16 or F16), as fsc_weights_load does for
 * one process: checked first (present, global shape), nothing changed on
 * error. Padding rows are set to zero. Not collective. *n_unused as
 * fsc_weights_load's (may be NULL). */
FSC_API int fsc_tp_load_weights(const char *path, fsc_module *root, fsc_params *ps, int *n_unused);

/* ---- optimizer state by global name ------------------------------------------------ */
/* A TP rank's optimizer runs over contiguous runs of the GLOBAL layout, so
 * its state is a set of pieces (global parameter, first element, count) of
 * the one-process state, and saves and loads in the file format of
 * fsc_oss_save_optim (fsc/zero.h): "optim.exp_avg.<global name>" and so on
 * in global shapes. A TP run's state file then resumes under one process,
 * DDP, OSS or FSDP, and theirs under any TP size. Stepping over runs is
 * bitwise the same as stepping whole local tensors (the updates are
 * element-wise); padding rows have no run (they stay zero either way). An
 * optimizer over whole local tensors (fsc_optim_ranges_from_params) saves
 * and loads the same file too; its larger ranges let the update kernels use
 * threads, where a row-sized run is below their threshold. fsc_tp_grad_norm and
 * fsc_tp_clip_grad_norm read ps's gradients, never the optimizer's ranges, so clipping is the same
 * with either. */

/* Optimizer ranges for fsc_optim_new over the TP model root (ps bound over
 * it with gradients): each sharded parameter one range per run of elements
 * contiguous both locally and in the global tensor (a weight split along its
 * last dimension: one per row; QKV: three per row; padding rows: none), each
 * replicated parameter one range; sorted by entry, then global element. decay
 * and name as fsc_optim_ranges_from_params (names point into ps). Free with
 * fsc_optim_ranges_free. FSC_ERR_INVALID for a NULL argument or unbound data
 * or gradients (*out NULL, *n 0). */
FSC_API int fsc_tp_optim_ranges(fsc_module *root, const fsc_params *ps, fsc_optim_range **out,
                                int *n);

/* What saving and loading a TP optimizer's state by global name needs. */
typedef struct fsc_tp_optim_state fsc_tp_optim_state;

/* The global parameter list (names, global shapes) and every TP rank's pieces
 * of it, for optim, an optimizer over the runs of fsc_tp_optim_ranges(root,
 * ps) or over whole local tensors (fsc_optim_ranges_from_params(ps)), in any
 * order: each piece is found in the range holding its address. g is the TP
 * group of root's modules. Collective over g (one all-gather of the pieces);
 * every rank returns NULL (error set) if any rank failed: a NULL argument, a
 * g of another size or rank than the modules' group, optimizer ranges that
 * overlap, miss a piece or hold more than ps's parameters. root and ps are
 * read during the call only; optim and g are borrowed and must outlive the
 * state. */
FSC_API fsc_tp_optim_state *fsc_tp_optim_state_new(fsc_module *root, const fsc_params *ps,
                                                   fsc_optim *optim, fsc_group *g);
/* Frees what fsc_tp_optim_state_new made (not root, ps, optim or g). Accepts NULL. */
FSC_API void fsc_tp_optim_state_free(fsc_tp_optim_state *s);
/* Writes the optimizer's state as one process's fsc_oss_save_optim would
 * (same tensors and global shapes; metadata world = t, policy "tp"): the
 * group's rank `root` writes `path` (atomically, one tensor in memory at a
 * time), receiving every sharded element from its owner and replicated
 * state from TP rank 0 only. path is needed on root only. Collective over g;
 * every rank returns root's failure too. FSC_ERR_INVALID for a NULL s. */
FSC_API int fsc_tp_save_optim(fsc_tp_optim_state *s, const char *path, int root);
/* Reads this rank's pieces (replicated parameters' state whole) and the step
 * count from a state file of the same model written at any TP size or by any
 * strategy (fsc_oss_load_optim's checks: kind, state kinds, every tensor
 * present in its global shape, no tensor of another model). Collective over
 * g: staged, and committed only when every rank has read its pieces, so a
 * refused or unreadable file changes nothing on any rank. lr and the other
 * hyper-parameters stay as configured. */
FSC_API int fsc_tp_load_optim(fsc_tp_optim_state *s, const char *path);

#ifdef __cplusplus
}
#endif
#endif
