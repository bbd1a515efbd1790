/* fsc modules: the contract every layer, container and wrapper follows.
 *
 * DESIGN.md decisions 1-4, made concrete:
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
 * embedded fsc_module, declare parameters with fsc_module_add_param(). See
 * examples/custom_module.c.
 */
#ifndef FSC_NN_H
#define FSC_NN_H

#include "fsc/core.h"
#include "fsc/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What forward and backward of one step need to know beyond their tensors. */
typedef struct fsc_ctx {
    fsc_arena *arena; /* outputs and saved state live here until the step ends */
    bool training;    /* dropout on, saved state kept */
    uint64_t seed;    /* run seed (dropout keys) */
    int64_t step;     /* optimizer step, 0-based (dropout keys) */
    int64_t sample0;  /* global index of batch row 0 (dropout keys) */
    /* This forward re-runs one already done, inside backward (activation
     * checkpointing): wrappers must not count it as a new forward (FSDP does
     * not reshard after it). Results are identical: randomness is keyed by
     * (seed, step, sample), never by call order. */
    bool recompute;
} fsc_ctx;

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
    float *data;       /* view into the flat parameter buffer, bound by fsc_params_bind */
    float *grad;       /* view into the flat gradient buffer */
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
};

/* ---- the contract -------------------------------------------------------- */
FSC_API void fsc_module_init(fsc_module *m, const fsc_module_ops *ops, const char *name);
/* Declares a parameter; returns its index in m->params, or a negative status. */
FSC_API int fsc_module_add_param(fsc_module *m, const char *name, int ndim, const int64_t *shape,
                                 fsc_init_kind init, float init_std);
/* Adopts child (the parent frees it). Its name becomes child->name. */
FSC_API int fsc_module_add_child(fsc_module *m, fsc_module *child);
FSC_API int fsc_module_add_hook(fsc_module *m, fsc_hook_kind kind, fsc_hook_fn fn, void *user);
/* Removes every hook (fn, user) of that kind; wrappers call it when freed. */
FSC_API void fsc_module_remove_hook(fsc_module *m, fsc_hook_kind kind, fsc_hook_fn fn, void *user);
/* Runs hooks and ops->forward / ops->backward. Containers call children through these. */
FSC_API int fsc_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x,
                               fsc_tensor *y, void **saved);
FSC_API int fsc_module_backward(fsc_module *m, const fsc_ctx *ctx, void *saved,
                                const fsc_tensor *dy, fsc_tensor *dx);
/* Frees the module, its children, recursively. Accepts NULL. */
FSC_API void fsc_module_free(fsc_module *m);
/* Returns a parameter's view as a tensor. */
FSC_API fsc_tensor fsc_param_tensor(const fsc_param *p);
FSC_API fsc_tensor fsc_param_grad_tensor(const fsc_param *p);

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
 * with_grads), binds views, and initialises values from (seed, full name, element). */
FSC_API int fsc_params_bind(fsc_module *root, uint64_t seed, bool with_grads, fsc_params *out);
/* Lists parameters without allocating (entries with offsets); for wrappers that
 * allocate storage themselves. */
FSC_API int fsc_params_collect(fsc_module *root, fsc_params *out);
/* Re-points every view at external buffers laid out as `ps` describes (NULL keeps). */
FSC_API void fsc_params_rebind(fsc_params *ps, float *data, float *grad);
/* Re-runs initialisation of all values from (seed, name, element). */
FSC_API void fsc_params_init_values(fsc_params *ps, uint64_t seed);
FSC_API void fsc_params_zero_grad(fsc_params *ps);
FSC_API fsc_param_entry *fsc_params_find(fsc_params *ps, const char *name);
FSC_API void fsc_params_free(fsc_params *ps); /* frees storage it allocated; accepts NULL */

/* ---- built-in modules ------------------------------------------------------ */
/* Each returns NULL (error set) on bad configuration. */
/* x (N..., in) -> y (N..., out). layout picks torch (out,in) or GPT-2 Conv1D (in,out). */
FSC_API fsc_module *fsc_linear_new(const char *name, int in, int out, bool bias,
                                   fsc_weight_layout layout, float init_std);
/* x int32 (B,T) token ids -> y (B,T,dim). */
FSC_API fsc_module *fsc_embedding_new(const char *name, int num, int dim, float init_std);
FSC_API fsc_module *fsc_layernorm_new(const char *name, int dim, float eps);
FSC_API fsc_module *fsc_gelu_new(const char *name);
FSC_API fsc_module *fsc_relu_new(const char *name);
/* Dropout keyed by (seed, layer_id), (step, global sample index of the row, element).
 * x must have a leading batch dim; rows are numbered from ctx->sample0. */
FSC_API fsc_module *fsc_dropout_new(const char *name, float p, uint32_t layer_id);
/* Sequential: y = f_n(...f_1(x)). Takes ownership of the children given. */
FSC_API fsc_module *fsc_sequential_new(const char *name, int n, fsc_module **children);
/* Residual: y = x + f(x). */
FSC_API fsc_module *fsc_residual_new(const char *name, fsc_module *inner);
/* Causal self-attention with fused QKV, GPT-2 layout: children c_attn, c_proj (Conv1D).
 * x (B,T,C) -> (B,T,C). proj_std initialises c_proj. */
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
 * ranks add up to the gradient of one big batch. logits (..., V) f32 are
 * overwritten by d(loss)/d(logits); targets int32 with one id per row.
 * *loss_out receives sum(per-token loss) / norm. An out-of-range target (other
 * than ignore_index) is an error naming its position. */
FSC_API int fsc_cross_entropy(float *loss_out, fsc_tensor *logits, const fsc_tensor *targets,
                              int ignore_index, double norm, fsc_arena *arena);

#ifdef __cplusplus
}
#endif
#endif
