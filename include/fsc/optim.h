/* fsc optimizers: SGD, Adam, AdamW, learning-rate schedules, gradient clipping.
 *
 * Floor 4 of the house. Everything here works on flat (param, grad, state)
 * ranges rather than on modules (docs/architecture.md, decision 2): an optimizer is built
 * over an array of ranges and owns exactly K floats of state per element of
 * those ranges, so a sharded optimizer (OSS, FSDP) runs the very same kernels
 * on the shard a rank owns, and its memory is K x (elements owned), exactly.
 *
 * Numerics follow PyTorch 1.13 (torch.optim.SGD, Adam, AdamW with
 * foreach=False, torch.nn.utils.clip_grad_norm_): scalars are combined in
 * double as Python does, then applied element-wise in float in torch's order,
 * with fused multiply-adds where torch fuses them; on a CPU with FMA the
 * parameters match torch's bit for bit.
 *
 *     fsc_optim_range *r; int nr;
 *     fsc_optim_ranges_from_params(&params, &r, &nr);
 *     fsc_optim_config cfg = {.kind = FSC_OPTIM_ADAMW, .lr = 6e-4, .weight_decay = 0.1};
 *     fsc_optim *opt = fsc_optim_new(&cfg, r, nr);
 *     for (int64_t s = 0; s < steps; s++) {
 *         ... forward, backward ...
 *         float norm;
 *         fsc_clip_grad_norm(r, nr, 1.0f, &norm);
 *         fsc_optim_set_lr(opt, fsc_lr_schedule(&sched, s));
 *         fsc_optim_step(opt);
 *     }
 *     fsc_optim_free(opt);
 *     fsc_optim_ranges_free(r);
 */
#ifndef FSC_OPTIM_H
#define FSC_OPTIM_H

#include "fsc/core.h"
#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ranges ---------------------------------------------------------------- */
/* n elements of parameters and their gradients. decay says whether weight decay
 * applies (by default: parameters with >= 2 dims). The caller owns param and
 * grad; the optimizer copies the range (and its name) when it is created. */
typedef struct fsc_optim_range {
    float *param;
    float *grad;
    int64_t n;
    bool decay;
    const char *name; /* optional: the parameter's global name, for state I/O */
    /* Its parameter group (fsc_module_param_group): lr x lr_scale (0: 1),
     * and with wd_set the weight decay wd instead of the config's rule. */
    double lr_scale;
    bool wd_set;
    double wd;
} fsc_optim_range;

/* One range per entry of ps, in entry order: param->data, param->grad, numel,
 * decay = param->weight_decay, name = the entry's full name (pointing into ps,
 * so ps must outlive *out). ps must have gradients bound. Free with
 * fsc_optim_ranges_free. FSC_ERR_INVALID for a NULL argument or an unbound
 * parameter or gradient (naming it); *out is NULL and *n 0 on failure. */
FSC_API int fsc_optim_ranges_from_params(const fsc_params *ps, fsc_optim_range **out, int *n);
/* Frees the array (not the buffers or names it points to). Accepts NULL. */
FSC_API void fsc_optim_ranges_free(fsc_optim_range *r);

/* ---- configuration ---------------------------------------------------------- */
typedef enum {
    FSC_OPTIM_SGD = 0,
    FSC_OPTIM_ADAM,
    FSC_OPTIM_ADAMW,
    FSC_OPTIM_KIND_COUNT
} fsc_optim_kind;

/* A plain struct; a zero field means the documented default. Fields that do not
 * apply to the kind (momentum for Adam, betas for SGD) are ignored. */
typedef struct fsc_optim_config {
    fsc_optim_kind kind;
    double lr;           /* >= 0; no default (0 means a zero learning rate) */
    double momentum;     /* SGD: >= 0; 0 means plain SGD with no state */
    double dampening;    /* SGD: buf = momentum * buf + (1 - dampening) * g */
    bool nesterov;       /* SGD: needs momentum > 0 and dampening == 0 */
    double weight_decay; /* >= 0; 0 means none (note: torch's AdamW defaults to 0.01) */
    double beta1;        /* Adam/AdamW: in [0, 1); 0 means 0.9 */
    double beta2;        /* Adam/AdamW: in [0, 1); 0 means 0.999 */
    double eps;          /* Adam/AdamW: > 0; 0 means 1e-8 */
    /* false: weight decay (SGD's and Adam's L2 term, AdamW's decoupled decay)
     * applies only to ranges with decay = true; true: to every range. */
    bool decay_all;
} fsc_optim_config;

/* Fills defaults into *out and validates: FSC_ERR_INVALID with a message naming
 * the field (lr < 0, beta outside [0,1), eps < 0, nesterov without momentum or
 * with dampening, an unknown kind, a NULL in or out, ...). out may equal in. */
FSC_API int fsc_optim_config_resolve(const fsc_optim_config *in, fsc_optim_config *out);

/* K: state floats per element for cfg: 0 for SGD without momentum, 1 for SGD
 * with momentum (the momentum buffer), 2 for Adam/AdamW (exp_avg, exp_avg_sq).
 * Negative status for an invalid kind. */
FSC_API int fsc_optim_state_count(const fsc_optim_config *cfg);

/* ---- the optimizer ---------------------------------------------------------- */
typedef struct fsc_optim fsc_optim;

/* An optimizer over n ranges (n may be 0: a rank that owns nothing). State is
 * zero-initialised from the tagged allocator (FSC_MEM_OPTIM): exactly
 * K * 4 * (sum of range lengths) bytes, one allocation per state kind; nothing
 * else is charged to FSC_MEM_OPTIM. Returns NULL (error set) on a bad config
 * or range (n < 0, a negative length, a NULL param or grad with n > 0). The
 * ranges are copied (names too); their buffers stay the caller's and must
 * outlive the optimizer. */
FSC_API fsc_optim *fsc_optim_new(const fsc_optim_config *cfg, const fsc_optim_range *ranges, int n);
/* Frees the state and the copied ranges (not the buffers). Accepts NULL. */
FSC_API void fsc_optim_free(fsc_optim *o);

/* One update of every range from its gradient, at the current lr. The step
 * count goes up by one first (the first step is step 1, as in torch). SGD's
 * momentum buffer is set to the gradient when the count before the step is 0,
 * so to resume, load the buffers and set the saved step. FSC_ERR_INVALID for NULL. */
FSC_API int fsc_optim_step(fsc_optim *o);
/* Zeroes the gradients of every range. Accepts NULL. */
FSC_API void fsc_optim_zero_grad(fsc_optim *o);

/* Setters return FSC_ERR_INVALID for a NULL optimizer or an out-of-range value;
 * getters return 0 (an all-zero config) for NULL. */
FSC_API int fsc_optim_set_lr(fsc_optim *o, double lr);      /* lr finite and >= 0 */
FSC_API double fsc_optim_get_lr(const fsc_optim *o);        /* the current lr */
FSC_API int64_t fsc_optim_get_step(const fsc_optim *o);     /* steps taken (0 before the first) */
FSC_API int fsc_optim_set_step(fsc_optim *o, int64_t step); /* step >= 0 */
/* The resolved configuration (defaults filled in; lr is the current lr). */
FSC_API fsc_optim_config fsc_optim_get_config(const fsc_optim *o);

FSC_API int fsc_optim_num_ranges(const fsc_optim *o); /* 0 for NULL */
/* The optimizer's copy of range i (its name is owned by the optimizer; NULL
 * if none was given). NULL if i is out of bounds. */
FSC_API const fsc_optim_range *fsc_optim_get_range(const fsc_optim *o, int i);
/* State `which` of range i, range->n floats: which 0 is SGD's momentum buffer
 * or Adam's exp_avg, 1 is Adam's exp_avg_sq. FSC_ERR_INVALID when i or which
 * is out of bounds for this optimizer (or o, data is NULL). Writable: load
 * state through it. Owned by o; *data is NULL for an empty range. */
FSC_API int fsc_optim_state(fsc_optim *o, int range_index, int which, float **data);
/* Bytes of optimizer state held: K * 4 * elements (0 for NULL). */
FSC_API size_t fsc_optim_state_bytes(const fsc_optim *o);

/* ---- update kernels on one flat range ----------------------------------- */
/* Plain element-wise functions, usable on any range or shard; scalars are
 * double, as torch's Python floats. p, g, state are n floats; they may not
 * overlap. OpenMP-parallel above a size threshold. */

/* torch.optim.SGD on one range. d = g + weight_decay * p; with momentum,
 * buf = first ? d : momentum * buf + (1 - dampening) * d, and d = nesterov ?
 * d + momentum * buf : buf; then p -= lr * d. buf may be NULL if momentum is 0. */
FSC_API void fsc_sgd_update(float *p, const float *g, float *buf, int64_t n, double lr,
                            double momentum, double dampening, bool nesterov, double weight_decay,
                            bool first);
/* torch.optim.Adam on one range at step (>= 1): L2 decay g += weight_decay * p,
 * then m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
 * p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps). */
FSC_API void fsc_adam_update(float *p, const float *g, float *m, float *v, int64_t n, double lr,
                             double beta1, double beta2, double eps, double weight_decay,
                             int64_t step);
/* torch.optim.AdamW: p *= 1 - lr * weight_decay first, then Adam without L2. */
FSC_API void fsc_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, double lr,
                              double beta1, double beta2, double eps, double weight_decay,
                              int64_t step);

/* ---- learning-rate schedules ------------------------------------------------ */
typedef enum {
    FSC_LR_CONSTANT = 0,    /* max_lr at every step */
    FSC_LR_WARMUP_COSINE,   /* linear warm-up, then cosine down to min_lr at total_steps */
    FSC_LR_WARMUP_CONSTANT, /* linear warm-up, then max_lr */
    FSC_LR_KIND_COUNT
} fsc_lr_schedule_kind;

typedef struct fsc_lr_schedule_config {
    fsc_lr_schedule_kind kind;
    float max_lr;         /* the peak lr */
    int64_t warmup_steps; /* 0: no warm-up */
    int64_t total_steps;  /* cosine: the step at which min_lr is reached */
    float min_lr;         /* cosine floor; if 0, min_lr_ratio * max_lr */
    float min_lr_ratio;   /* in [0, 1]; used only when min_lr is 0 */
} fsc_lr_schedule_config;

/* The lr for 0-based step s (negative s counts as 0), with W = warmup_steps,
 * T = total_steps, min = min_lr (or min_lr_ratio * max_lr):
 *   s < W:            max_lr * (s + 1) / W
 *   constant kinds:   max_lr after warm-up
 *   cosine, W <= s < T: min + (max_lr - min) * (1 + cos(pi * (s - W) / (T - W))) / 2
 *   cosine, s >= T:   min
 * Call fsc_lr_schedule_check once first; an invalid config gives max_lr. */
FSC_API float fsc_lr_schedule(const fsc_lr_schedule_config *c, int64_t step);
/* FSC_ERR_INVALID naming the field: max_lr < 0, warmup_steps < 0, cosine with
 * total_steps < warmup_steps, min_lr outside [0, max_lr], ratio outside [0,1]. */
FSC_API int fsc_lr_schedule_check(const fsc_lr_schedule_config *c);

/* ---- gradient-norm clipping --------------------------------------------------- */
/* As torch.nn.utils.clip_grad_norm_ over all ranges' gradients viewed as one
 * vector: total = ||g|| (2-norm or max |g|); coef = max_norm / (total + 1e-6);
 * if coef < 1 every gradient is multiplied by coef. *total_norm_out receives
 * the pre-clip norm (total_norm_out may be NULL). A non-finite norm leaves
 * the gradients untouched and returns FSC_ERR_NUMERIC (the norm is still
 * written). max_norm must be >= 0 and the ranges valid (n >= 0, a grad for
 * every non-empty range): FSC_ERR_INVALID otherwise, nothing changed. */
FSC_API int fsc_clip_grad_norm(const fsc_optim_range *r, int n, float max_norm,
                               float *total_norm_out);
/* The same with the max norm: total = max |g|; a NaN gradient makes it NaN. */
FSC_API int fsc_clip_grad_norm_inf(const fsc_optim_range *r, int n, float max_norm,
                                   float *total_norm_out);

/* The split form for sharded gradients: each rank computes its local figure,
 * combines them (sum of norm_sq, then sqrt; max of max_abs) in one all-reduce,
 * and applies the scale with the global norm. */
FSC_API double fsc_grad_norm_sq(const fsc_optim_range *r, int n); /* sum of g^2 (fsc_sumsq) */
FSC_API float fsc_grad_max_abs(const fsc_optim_range *r, int n);  /* max |g|; NaN if any is NaN */
/* Scales every gradient by max_norm / (total_norm + 1e-6) when that is < 1.
 * FSC_ERR_NUMERIC (nothing scaled) for a non-finite total_norm, FSC_ERR_INVALID
 * for max_norm < 0 or bad ranges. */
FSC_API int fsc_clip_grads_scale(const fsc_optim_range *r, int n, float max_norm, float total_norm);

#ifdef __cplusplus
}
#endif
#endif
