/* fsc modules: the contract every layer, container and wrapper follows.
 *
 * docs/architecture.md, decisions 1-4, made concrete:
 *  1. A module keeps no per-call state. forward() allocates its output and a
 *     saved-state record from the step's arena (ctx->arena) and hands the
 *     record back; backward() receives it. Several micro-batches, threads or a
 *     recomputation can be in flight on one module at once.
 *  2. A module declares parameters (name, shape, init rule); it does not own
 *     their storage. fsc_params_bind() lays every parameter of a tree out in
 *     one flat buffer (and gradients in another) and binds views into them.
 *  3. backward() accumulates parameter gradients (+=) and writes dx.
 *  4. Wrappers are modules; hooks run before/after forward and backward.
 *
 * Writing a module: fill an fsc_module_ops with forward/backward (and free, if
 * the module allocated its own struct), call fsc_module_init() on your struct's
 * embedded fsc_module, declare parameters with fsc_module_add_param(), and
 * open backward with fsc_module_check_dy() against what the forward saved.
 * See examples/custom_module.c.
 */
#ifndef FSC_NN_H
#define FSC_NN_H

#include "fsc/core.h"
#include "fsc/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fsc_ctx.seq: where this rank's rows sit in the whole sequence under
 * context parallelism (fsc/cp.h makes it). Every (B, runs*len, ...)
 * activation holds, per batch row, `runs` runs of `len` consecutive
 * positions, run r starting at global position pos0[r] of a T-long
 * sequence. Layers keyed by position read it: position embeddings and
 * rotary angles are taken at the global positions, dropout masks are those
 * of the global elements. Attention's keys also live on other ranks, so an
 * attention layer hands its local q, k, v (d: Tq = Tk = runs*len, the
 * positions fields ignored) to attend, which writes out and lse
 * (B*NH*runs*len floats, laid out as the implementation likes), and in
 * backward hands them back with dout to attend_backward, which writes dq,
 * dk and dv (the local rows' gradients, from every rank's queries). Both
 * are collective over the ranks that share the sequence. */
#define FSC_SEQ_RUNS_MAX 2
typedef struct fsc_seq_split {
    int T, runs, len;
    int64_t pos0[FSC_SEQ_RUNS_MAX];
    void *impl;
    int (*attend)(void *impl, const fsc_attn_dims *d, const float *q, const float *k,
                  const float *v, float *out, float *lse, fsc_gemm_prec prec);
    int (*attend_backward)(void *impl, const fsc_attn_dims *d, const float *q, const float *k,
                           const float *v, const float *out, const float *dout, const float *lse,
                           float *dq, float *dk, float *dv, fsc_gemm_prec prec);
} fsc_seq_split;

/* The attention kernel of fsc_ctx.attention. Both are causal softmax
 * attention; they differ in what forward keeps for backward: naive the
 * (B,NH,T,T) probabilities, flash (fsc_flash_attention_forward) the
 * attention output and a (B,NH,T) log-sum-exp, recomputing each tile. */
typedef enum {
    FSC_ATTENTION_AUTO = 0, /* flash from FSC_ATTENTION_FLASH_MIN_T positions, else naive */
    FSC_ATTENTION_NAIVE,
    FSC_ATTENTION_FLASH,
} fsc_attention_kind;
/* AUTO's threshold: the shortest sequence at which flash measured at least
 * as fast as naive in training (docs/benchmarks.md). */
#define FSC_ATTENTION_FLASH_MIN_T 512
/* Whether kind runs flash for sequences of T positions. */
FSC_API bool fsc_attention_uses_flash(fsc_attention_kind kind, int64_t T);
/* "auto", "naive" or "flash" -> *kind; FSC_ERR_INVALID naming s otherwise. */
FSC_API int fsc_attention_kind_parse(const char *s, fsc_attention_kind *kind);
FSC_API const char *fsc_attention_kind_name(fsc_attention_kind kind); /* "auto", "naive", "flash" */
/* Bytes attention's kernel keeps for backward per layer beyond q, k, v and
 * its output (which both keep, the output as the next projection's input):
 * naive B*NH*T*T probability floats, flash B*NH*T log-sum-exps. */
FSC_API int64_t fsc_attention_saved_bytes(fsc_attention_kind kind, int64_t B, int64_t T, int NH);

/* What forward and backward of one step need to know beyond their tensors. */
typedef struct fsc_ctx {
    fsc_arena *arena; /* outputs and saved state live here until the step ends */
    bool training;    /* dropout on, saved state kept */
    uint64_t seed;    /* run seed (dropout keys) */
    int64_t step;     /* optimizer step, 0-based (dropout keys) */
    int64_t sample0;  /* global index of batch row 0 (dropout keys) */
    /* The caller vouches that seed, step and sample0 name THIS micro-batch.
     * Set it where you set step and sample0, once per micro-batch (the
     * trainer does). A training forward through active dropout (p > 0)
     * refuses a ctx without it (FSC_ERR_INVALID): a zero-initialised ctx
     * would otherwise draw the same masks at every step, silently. step 0,
     * sample0 0 stay valid keys for the first micro-batch, hence a flag and
     * not a test of the values. */
    bool keyed;
    /* This forward re-runs one already done, inside backward (activation
     * checkpointing): wrappers must not count it as a new forward (FSDP does
     * not reshard after it). Results are identical: randomness is keyed by
     * (seed, step, sample), never by call order. */
    bool recompute;
    /* Checkpointed modules run as plain ones for this call (they keep their
     * activations): a pipeline's last micro-batch under "except_last". */
    bool no_checkpoint;
    /* Non-NULL: backward computes input gradients only, and the modules
     * whose weight gradients are GEMMs (Linear, the GPT's tied head) record
     * them here for fsc_deferred_run: a zero-bubble pipeline's B and W. The
     * records point into the arena, which must keep them until the run. */
    struct fsc_deferred *defer;
    /* Autocast, as torch.autocast("cpu", dtype=torch.bfloat16): BF16 takes
     * the GEMMs of Linear, attention (q k^T, att v) and the GPT's tied LM
     * head, forward and backward (dx and dW), at bf16-rounded inputs with
     * fp32 accumulation (fsc_gemm, FSC_GEMM_BF16: oneDNN where measured
     * faster, else sgemm). With bf16 GEMMs running, activations that feed
     * only a bf16 GEMM are stored in bf16, and the GPT's output logits are
     * bf16 (not when decoding, nor the tensor-parallel head's), as
     * fsc_cross_entropy takes them.
     * The arithmetic of LayerNorm, softmax and the loss, parameters,
     * gradients and optimizer state stay fp32. F32 (0, the
     * default): fp32 throughout, bit for bit as without this field. Other
     * dtypes: fsc_module_forward/backward return FSC_ERR_UNSUPPORTED. */
    fsc_dtype autocast;
    /* The loss of a model whose last layer runs its head fused with it (the
     * full logits never exist): set by fsc_tp_gpt_train_micro and
     * fsc_tp_gpt_eval_loss (fsc/tp.h) for the TP GPT, and by the pipeline for
     * a last TP stage (fsc_pipe_io.targets); such a module then outputs its
     * (1,) loss. Modules without a fused head ignore it; NULL elsewhere. */
    const struct fsc_head_loss *head_loss;
    /* Incremental decoding (fsc_gpt_kv_append, fsc/gpt.h): attention appends
     * its input rows' keys and values to this cache and attends over every
     * cached position, and the GPT's position embeddings start at the
     * cache's length. Forward only, batch 1; NULL elsewhere. */
    struct fsc_kv_cache *kv;
    /* Context parallelism: this rank's positions of each sequence and the
     * ring attention runs over (see fsc_seq_split); NULL elsewhere. */
    const fsc_seq_split *seq;
    /* The attention kernel (AUTO, 0: by sequence length); both kernels
     * give the same results within rounding. */
    fsc_attention_kind attention;
} fsc_ctx;

/* fsc_ctx.head_loss: what a fused head needs besides its input. The module
 * copies targets at forward, so they need to live only during that call. */
typedef struct fsc_head_loss {
    const int32_t *targets; /* (B, T), the output rows' targets (replicated over a TP group) */
    int ignore_index;       /* targets equal to it count nothing */
    double norm;            /* per-target losses are summed, then divided by this (> 0) */
} fsc_head_loss;

typedef struct fsc_module fsc_module;

typedef struct fsc_module_ops {
    const char *kind; /* "Linear", "Sequential", ... */
    /* y is allocated by the module (from ctx->arena). *saved receives the record
     * backward needs (NULL allowed when it needs nothing). */
    int (*forward)(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                   void **saved);
    /* dx is allocated by the module from ctx->arena and written; when dx is NULL
     * the caller does not want the input gradient (e.g. token ids). */
    int (*backward)(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                    fsc_tensor *dx);
    /* Frees what the module allocated itself (not children, not parameters). */
    void (*free)(fsc_module *m);
} fsc_module_ops;

typedef enum {
    FSC_INIT_ZEROS = 0,
    FSC_INIT_ONES,
    FSC_INIT_NORMAL, /* N(0, init_std), keyed by (seed, full parameter name, element) */
    /* U(-init_std, init_std), keyed as NORMAL: LoRA's A, torch's
     * kaiming_uniform_(a=sqrt(5)) at bound 1/sqrt(fan_in) (fsc/lora.h) */
    FSC_INIT_UNIFORM,
} fsc_init_kind;

#define FSC_NAME_MAX 128

typedef struct fsc_param {
    char name[FSC_NAME_MAX]; /* local name ("weight"); full names come from the tree */
    int ndim;
    int64_t shape[FSC_MAX_DIMS];
    int64_t numel;
    fsc_init_kind init;
    float init_std;
    bool weight_decay; /* AdamW decays it (default: ndim >= 2) */
    /* An expert's parameter held by one rank of an expert-parallel group
     * (fsc/moe.h): its gradient already sums the group's tokens, so DDP
     * neither reduces nor broadcasts it (the strategies run such a model
     * under ddp only). */
    bool expert;
    /* Frozen for fine-tuning (fsc_module_freeze): the optimizer holds no
     * state for it and never updates it (every range builder gives it an
     * empty range, so weight decay and clipping skip it too), layers do not
     * compute its gradient, DDP does not reduce it, and fsc_params_bind
     * gives its gradient stretch back to the allocator (it reads as zero). */
    bool frozen;
    /* Its optimizer parameter group (fsc_module_param_group; torch's
     * param_groups): lr is the optimizer's times lr_scale (0: 1), and with
     * wd_set its weight decay is wd whatever its shape. grouped: a group
     * claimed it (the first that matches wins). */
    bool grouped, wd_set;
    double lr_scale, wd;
    float *data; /* view into the flat parameter buffer, bound by fsc_params_bind */
    float *grad; /* view into the flat gradient buffer */
} fsc_param;

typedef enum {
    FSC_HOOK_PRE_FORWARD = 0,
    FSC_HOOK_POST_FORWARD,
    FSC_HOOK_PRE_BACKWARD,
    FSC_HOOK_POST_BACKWARD,
    FSC_HOOK_KIND_COUNT
} fsc_hook_kind;

/* A hook sees the module, the step's context (training, recompute, step) and
 * the tensor crossing it (x before forward, y after, dy before backward, dx
 * after; dx may be NULL). A non-zero return aborts the call. */
typedef int (*fsc_hook_fn)(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                           const fsc_tensor *t, void *user);

#define FSC_MAX_HOOKS 4

struct fsc_module {
    const fsc_module_ops *ops;
    char name[FSC_NAME_MAX]; /* name within the parent ("attn", "h.0") */
    fsc_module **children;
    int nchildren, cap_children;
    fsc_param *params;
    int nparams, cap_params;
    struct {
        fsc_hook_fn fn;
        void *user;
    } hooks[FSC_HOOK_KIND_COUNT][FSC_MAX_HOOKS];
    int nhooks[FSC_HOOK_KIND_COUNT];
    /* The parent uses this module's parameters itself, outside the module's
     * forward (GPT's wte serves as the tied LM head, wpe is read by the
     * fused encoder): they must stay with the parent, so a wrapper must not
     * make this module a unit of its own (FSDP refuses it, auto-wrap skips it). */
    bool params_used_by_parent;
    /* The module that adopted this one (fsc_module_add_child), NULL for a
     * root and for a child a wrapper holds without adopting (DDP, ShardedDDP).
     * Only names modules in messages (fsc_module_path). */
    fsc_module *parent;
    /* A wrapper that holds a model without adopting it (DDP, ShardedDDP):
     * that model, so a caller given the wrapper can reach it; else NULL. */
    fsc_module *wraps;
};

/* ---- the contract -------------------------------------------------------- */
/* Zeroes *m and sets its ops (borrowed: they must outlive m, typically a
 * static table) and name (copied; NULL means "", longer names are cut to
 * FSC_NAME_MAX - 1 characters). */
FSC_API void fsc_module_init(fsc_module *m, const fsc_module_ops *ops, const char *name);
/* Declares a parameter (name copied, shape[0..ndim) read); returns its index
 * in m->params, or a negative status: FSC_ERR_INVALID for ndim outside
 * 1..FSC_MAX_DIMS or a dim <= 0, FSC_ERR_NOMEM. Storage comes later, from
 * fsc_params_bind or a wrapper. */
FSC_API int fsc_module_add_param(fsc_module *m, const char *name, int ndim, const int64_t *shape,
                                 fsc_init_kind init, float init_std);
/* Adopts child (the parent frees it). Its name becomes child->name.
 * FSC_ERR_INVALID for a NULL child; on any failure the caller keeps child. */
FSC_API int fsc_module_add_child(fsc_module *m, fsc_module *child);
/* Appends a hook (user is borrowed, passed back to fn). FSC_ERR_INVALID for a
 * bad kind, a NULL fn, or more than FSC_MAX_HOOKS hooks of one kind. */
FSC_API int fsc_module_add_hook(fsc_module *m, fsc_hook_kind kind, fsc_hook_fn fn, void *user);
/* Removes every hook (fn, user) of that kind; wrappers call it when freed. */
FSC_API void fsc_module_remove_hook(fsc_module *m, fsc_hook_kind kind, fsc_hook_fn fn, void *user);
/* Runs hooks and ops->forward / ops->backward. Containers call children through these.
 * saved may be NULL (the record is then dropped). The first non-zero status of
 * a hook or the op is returned and stops the call. Checked first, naming the
 * module by its path: FSC_ERR_INVALID for a NULL module, ctx, ctx->arena, x
 * or y, and (after the pre-forward hooks, which is where FSDP binds) for a
 * parameter of the module, or of a child whose parameters it reads itself
 * (params_used_by_parent), that is not bound: call fsc_params_bind first.
 * Each call tests only its own module's views, so a whole forward costs one
 * pointer test per parameter. */
FSC_API int fsc_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x,
                               fsc_tensor *y, void **saved);
/* saved is what this module's forward gave back; FSC_ERR_UNSUPPORTED for a
 * module without backward. Checks as forward (dy for x; gradients must be
 * bound too, after the pre-backward hooks). The built-in modules also
 * refuse a dy that is not F32 in the shape of the output their forward
 * produced, and a NULL saved (FSC_ERR_SHAPE / FSC_ERR_INVALID, see
 * fsc_module_check_dy). Both refuse a ctx->autocast other than F32 or BF16
 * (FSC_ERR_UNSUPPORTED). */
FSC_API int fsc_module_backward(fsc_module *m, const fsc_ctx *ctx, void *saved,
                                const fsc_tensor *dy, fsc_tensor *dx);
/* ---- deferred weight gradients (zero-bubble pipelines) ---------------------- */
typedef struct fsc_deferred fsc_deferred;
/* An empty list in arena a (valid until a is reset); NULL (error set) if out
 * of memory. */
FSC_API fsc_deferred *fsc_deferred_new(fsc_arena *a);
/* Records dweight += and dbias += of a matmul (fsc_matmul_backward's
 * arguments; all borrowed, and must stay valid until fsc_deferred_run).
 * FSC_ERR_NOMEM when the arena is full. */
FSC_API int fsc_deferred_matmul(fsc_deferred *d, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, int N, int C, int OC,
                                int layout);
/* fsc_deferred_matmul whose GEMM runs at precision prec when run (the
 * autocast of the backward that recorded it). */
FSC_API int fsc_deferred_matmul_prec(fsc_deferred *d, float *dweight, float *dbias,
                                     const float *dout, const float *inp, const float *weight,
                                     int N, int C, int OC, int layout, fsc_gemm_prec prec);
/* Computes every recorded weight gradient, in the order recorded, and
 * empties the list. d may be NULL (nothing to do). */
FSC_API void fsc_deferred_run(fsc_deferred *d);

/* For a module's backward: FSC_OK when dy is an F32 tensor of exactly
 * shape[0..ndim) (the output its forward produced, as the module's saved
 * record tells), else FSC_ERR_SHAPE naming the module by its path with the
 * expected and the given shape. FSC_ERR_INVALID for a NULL m or dy. Custom
 * modules call it at the top of their backward, as the built-in ones do:
 * a wrongly shaped dy is otherwise read out of bounds. */
FSC_API int fsc_module_check_dy(const fsc_module *m, const fsc_tensor *dy, int ndim,
                                const int64_t *shape);
/* Writes m's dotted path ("h.0.attn.c_attn": names from the root down, the
 * root's own name left out as in parameter names, unless m is the root) into
 * buf (size bytes, cut to fit, always terminated when size > 0) and returns
 * buf. Follows fsc_module.parent. m NULL writes "(null)". */
FSC_API const char *fsc_module_path(const fsc_module *m, char *buf, size_t size);
/* Frees the module, its children, recursively. Accepts NULL. Parameter
 * storage is not touched (it belongs to fsc_params or a wrapper). A module
 * without ops->free is released with free(m), so it must be a malloc'ed
 * block that starts with its fsc_module. */
FSC_API void fsc_module_free(fsc_module *m);
/* Returns a parameter's view as an F32 tensor (data NULL while unbound). */
FSC_API fsc_tensor fsc_param_tensor(const fsc_param *p);
FSC_API fsc_tensor fsc_param_grad_tensor(const fsc_param *p); /* the same for its gradient */

/* ---- flat parameter storage -------------------------------------------- */
/* One entry per parameter of a module tree, in forward (declaration) order, with
 * its full dotted name ("h.0.attn.c_attn.weight") and its range in the flat buffers. */
typedef struct fsc_param_entry {
    char name[FSC_NAME_MAX * 2];
    fsc_param *param;
    int64_t offset; /* elements from the start of the flat buffer */
} fsc_param_entry;

typedef struct fsc_params {
    fsc_param_entry *entries;
    int count;
    int64_t numel; /* total elements, with alignment padding */
    float *data;   /* flat parameters (FSC_MEM_PARAMS), owned here */
    float *grad;   /* flat gradients (FSC_MEM_GRADS), owned here; NULL if not requested */
} fsc_params;

/* Collects every parameter under root, allocates flat storage (and gradients if
 * with_grads), binds views, and initialises values from (seed, full name, element).
 * *out owns the storage (free with fsc_params_free, before or after the tree)
 * and points into the tree's fsc_param records, so the tree must outlive any
 * use of it. FSC_ERR_INVALID for duplicate or over-long names, FSC_ERR_NOMEM;
 * on failure *out is zeroed. */
FSC_API int fsc_params_bind(fsc_module *root, uint64_t seed, bool with_grads, fsc_params *out);
/* Lists parameters without allocating (entries with offsets; data and grad
 * NULL); for wrappers that allocate storage themselves. Errors as
 * fsc_params_bind; free the list with fsc_params_free. */
FSC_API int fsc_params_collect(fsc_module *root, fsc_params *out);
/* Re-points every view at external buffers laid out as `ps` describes (NULL keeps).
 * The buffers stay the caller's; ps->data and ps->grad are not changed. */
FSC_API void fsc_params_rebind(fsc_params *ps, float *data, float *grad);
/* Re-runs initialisation of all values from (seed, name, element); the views
 * must be bound. */
FSC_API void fsc_params_init_values(fsc_params *ps, uint64_t seed);
FSC_API void fsc_params_zero_grad(fsc_params *ps); /* zeroes ps->grad; no-op if NULL */
/* Freezes every parameter under root whose full dotted name (as
 * fsc_params_collect names it) matches one of the n shell globs (fnmatch
 * without flags: '*' also crosses dots, "model.layers.*.mlp.*"). Call it
 * before the parameters are bound or a strategy is built. require_match:
 * a pattern that matches no parameter is FSC_ERR_INVALID naming it (a
 * pipeline stage or TP shard, which holds part of the model, passes false
 * once the whole model's names were checked). FSC_ERR_INVALID for a NULL
 * root or pattern, n < 0. *frozen_out (may be NULL) receives the number of
 * parameters now frozen under root. */
FSC_API int fsc_module_freeze(fsc_module *root, const char *const *patterns, int n,
                              bool require_match, int *frozen_out);
/* out[i] ~ U(-bound, bound) for global element indices [first, first+n) of
 * the tensor keyed `key` (fsc_rng_key(seed, full name)): element j draws
 * 32 bits of Philox at counter j / 4, so any slice draws what the whole
 * tensor would. FSC_INIT_UNIFORM's fill. */
FSC_API void fsc_params_uniform_fill(float *out, int64_t n, int64_t first, uint64_t key,
                                     float bound);
/* An optimizer parameter group, as one of torch's param_groups: every
 * parameter under root whose full name matches the glob `pattern` and that
 * no earlier group claimed takes lr = the optimizer's lr x lr_scale (so a
 * schedule scales every group alike; lr_scale > 0) and, when weight_decay
 * >= 0, that decay (else the default rule: decay_all or ndim >= 2). Call it
 * in the order the groups are given, before binding or building a
 * strategy. require_match as fsc_module_freeze (FSC_ERR_INVALID naming a
 * pattern that matches nothing; a parameter an earlier group took counts
 * as matched). *matched (may be NULL) receives the parameters it took. */
FSC_API int fsc_module_param_group(fsc_module *root, const char *pattern, double lr_scale,
                                   double weight_decay, bool require_match, int *matched);
/* Elements of ps's parameters that are not frozen (no padding). */
FSC_API int64_t fsc_params_trainable_numel(const fsc_params *ps);
/* The entry with full dotted name `name` (owned by ps), or NULL. */
FSC_API fsc_param_entry *fsc_params_find(fsc_params *ps, const char *name);
/* Frees the entries and fsc_mem_frees ps->data and ps->grad, then zeroes *ps;
 * not the module tree. Accepts NULL. */
FSC_API void fsc_params_free(fsc_params *ps);

/* ---- built-in modules ------------------------------------------------------ */
/* Each returns NULL (error set) on bad configuration. The caller owns the
 * module: free it with fsc_module_free, or hand it to a parent (containers,
 * fsc_module_add_child), which then frees it. name is copied. */
/* x (N..., in) -> y (N..., out). layout picks torch (out,in) or GPT-2 Conv1D (in,out). */
FSC_API fsc_module *fsc_linear_new(const char *name, int in, int out, bool bias,
                                   fsc_weight_layout layout, float init_std);
/* x int32 (B,T) token ids -> y (B,T,dim). */
FSC_API fsc_module *fsc_embedding_new(const char *name, int num, int dim, float init_std);
/* LayerNorm over the last dim (dim): weight 1, bias 0; eps <= 0 means 1e-5. */
FSC_API fsc_module *fsc_layernorm_new(const char *name, int dim, float eps);
FSC_API fsc_module *fsc_gelu_new(const char *name); /* GELU (tanh approximation) */
FSC_API fsc_module *fsc_relu_new(const char *name); /* ReLU */
/* Dropout keyed by (seed, layer_id), (step, global sample index of the row, element).
 * x must have a leading batch dim; rows are numbered from ctx->sample0. p in [0, 1).
 * A training forward with p > 0 needs ctx->keyed (FSC_ERR_INVALID otherwise). */
FSC_API fsc_module *fsc_dropout_new(const char *name, float p, uint32_t layer_id);
/* The Philox key a Dropout with this layer_id draws its masks from at ctx's
 * seed and step (element e of sample row g: fsc_dropout_forward's counter
 * (g, e / 4)), for layers that apply the same masks to shards of the tensor
 * (tensor/sequence parallelism). ctx must not be NULL. */
FSC_API uint64_t fsc_dropout_key(const fsc_ctx *ctx, uint32_t layer_id);
/* Dropout of x (B, runs*len, W) under fsc_ctx.seq (non-NULL): each run gets
 * the mask of its global elements, as in the whole (B, T, W) tensor; out
 * may equal in, and backward is the same call on the gradient. Refuses
 * another shape (FSC_ERR_SHAPE). For layers outside nn that drop by key. */
FSC_API int fsc_dropout_seq(const fsc_ctx *ctx, float *out, const float *in, float p, uint64_t key,
                            const fsc_tensor *x);
/* Sequential: y = f_n(...f_1(x)). Takes ownership of the children given, even
 * on failure (they are freed then). */
FSC_API fsc_module *fsc_sequential_new(const char *name, int n, fsc_module **children);
/* Residual: y = x + f(x). Takes ownership of inner, even on failure. */
FSC_API fsc_module *fsc_residual_new(const char *name, fsc_module *inner);
/* Causal self-attention with fused QKV, GPT-2 layout: children c_attn, c_proj (Conv1D).
 * x (B,T,C) -> (B,T,C). proj_std initialises c_proj. NH must divide C. */
FSC_API fsc_module *fsc_attention_new(const char *name, int C, int NH, float dropout,
                                      uint32_t layer_id, float init_std, float proj_std);
/* MLP: c_fc (C->4C), GELU, c_proj (4C->C), dropout. */
FSC_API fsc_module *fsc_mlp_new(const char *name, int C, float dropout, uint32_t layer_id,
                                float init_std, float proj_std);
/* Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(.)). */
FSC_API fsc_module *fsc_block_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                                  int n_layers);

/* ---- loss ------------------------------------------------------------------ */
/* Cross-entropy, mean over every non-ignored target of the GLOBAL batch: the
 * caller passes the global count of such targets (norm), so micro-batches and
 * ranks add up to the gradient of one big batch. logits (..., V) f32 or
 * bf16 (the GPT's under bf16 autocast: softmax in fp32, the gradient
 * rounded once) are overwritten by d(loss)/d(logits) in their own dtype;
 * targets int32 with one id per row.
 * *loss_out receives sum(per-token loss) / norm. An out-of-range target (other
 * than ignore_index) is FSC_ERR_INVALID naming its position; FSC_ERR_SHAPE for
 * logits that are not f32 or bf16 or a target count other than the rows of logits;
 * FSC_ERR_INVALID for norm <= 0. Takes N floats of scratch from arena. */
FSC_API int fsc_cross_entropy(float *loss_out, fsc_tensor *logits, const fsc_tensor *targets,
                              int ignore_index, double norm, fsc_arena *arena);

/* ---- LLaMA layers ------------------------------------------------------------ */
/* Each returns NULL (error set) on bad configuration; ownership as the
 * built-in modules above. Parameters take Hugging Face's LLaMA names. */
/* RMSNorm over the last dim (dim): y = x / sqrt(mean(x^2) + eps) * weight,
 * weight initialised to 1, no bias; eps <= 0 means 1e-5. */
FSC_API fsc_module *fsc_rmsnorm_new(const char *name, int dim, float eps);
/* Rotary embeddings as a layer (no parameters): x (B,T,n_heads*head_dim) ->
 * y of that shape, every head rotated by fsc_rope_forward at positions pos0
 * .. pos0+T-1. theta <= 0 means 10000; scaling NULL or with factor <= 0
 * means none (else fsc_rope_scaling's rules). FSC_ERR_INVALID for an odd or
 * non-positive head_dim, n_heads <= 0, pos0 < 0 or a bad scaling. */
FSC_API fsc_module *fsc_rope_new(const char *name, int n_heads, int head_dim, float theta,
                                 const fsc_rope_scaling *scaling, int pos0);
/* SwiGLU MLP: down_proj(silu(gate_proj(x)) * up_proj(x)); children
 * gate_proj, up_proj (C -> F) and down_proj (F -> C), nn.Linear (out,in)
 * layout, no biases. x (..., C) -> (..., C). gate_proj and up_proj start
 * N(0, init_std), down_proj N(0, proj_std). */
FSC_API fsc_module *fsc_swiglu_mlp_new(const char *name, int C, int F, float init_std,
                                       float proj_std);
/* LLaMA's attention; zero fields take the stated defaults. */
typedef struct fsc_llama_attention_config {
    int d_model;                   /* C: the input's and output's last dim */
    int n_heads;                   /* query heads */
    int n_kv_heads;                /* key/value heads, dividing n_heads; 0: n_heads */
    int head_dim;                  /* 0: d_model / n_heads (which must divide); even */
    bool qkv_bias;                 /* biases on q_proj, k_proj, v_proj (Qwen 2); o_proj has none */
    float rope_theta;              /* 0: 10000 */
    fsc_rope_scaling rope_scaling; /* factor 0: none (LLaMA-3.1: 8, 1, 4, 8192) */
    float init_std;                /* q_proj, k_proj, v_proj: N(0, init_std) */
    float proj_std;                /* o_proj: N(0, proj_std) */
} fsc_llama_attention_config;
/* Causal self-attention, LLaMA layout: children q_proj (C -> n_heads *
 * head_dim), k_proj and v_proj (C -> n_kv_heads * head_dim), o_proj back to
 * C, all nn.Linear (out,in); rotary embeddings (rotate-half, rope_theta,
 * rope_scaling) on q and k at positions 0..T-1; query head h attends with
 * key/value head h / (n_heads / n_kv_heads) (grouped-query; multi-query at
 * n_kv_heads = 1); scores scaled by 1/sqrt(head_dim); no dropout.
 * x (B,T,C) -> (B,T,C). cfg is read, not kept. Under fsc_ctx.kv
 * (generation, batch 1, forward only) the new rows are rotated at
 * positions len .. len+n-1 and attend over the cache, whose layer slot
 * holds n_kv_heads * head_dim channels per position (the KV heads only);
 * a cache of another width, or without room, is FSC_ERR_INVALID. */
FSC_API fsc_module *fsc_llama_attention_new(const char *name,
                                            const fsc_llama_attention_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
