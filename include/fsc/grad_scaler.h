/* fsc grad scaler: dynamic loss scaling for half-precision gradients, with
 * the semantics of PyTorch's torch.cuda.amp.GradScaler.
 *
 * Floor 4 of the house. Scaling the loss costs nothing in fsc: the loss is
 * already divided by a normaliser (fsc_cross_entropy's and
 * fsc_gpt_train_micro's norm, the count of targets in the global batch), so a
 * caller that passes norm / scale gets every gradient multiplied by scale.
 * Small gradients then survive rounding to fp16 (or bf16) for communication
 * or storage. Before the optimizer step the scaler unscales the gradients and
 * says whether any is inf or NaN; if so the step is skipped and the scale
 * backs off, otherwise it grows after growth_interval good steps in a row.
 * The reported loss comes back multiplied by the scale too (divide it before
 * logging), and gradient clipping belongs after the unscale, as in torch.
 *
 *     fsc_grad_scaler *gs = fsc_grad_scaler_new(NULL); // 65536, x2 / 2000 steps, x0.5
 *     double norm = global_targets / fsc_grad_scaler_get_scale(gs);  // scale the loss
 *     fsc_gpt_train_micro(model, &ctx, x, y, B, T, -1, norm, &loss); // grads x scale
 *     bool inf;
 *     fsc_grad_scaler_unscale(gs, r, nr, &inf);       // grads / scale, inf check
 *     if (!inf) fsc_optim_step(opt);                  // skip the step on overflow
 *     fsc_grad_scaler_update(gs, inf);                // back off or grow
 *
 * A sharded optimizer (OSS, ShardedDDP, FSDP) unscales only the shard it owns
 * and must agree with its peers on skipping: see fsc/sharded_grad_scaler.h.
 *
 * Numerics follow torch, whose scale is a float32 tensor: the scale is kept as
 * a float32 value (held in a double), multiplied by the factor in double and
 * rounded to float, and never grown past the largest float; the unscaling
 * factor is float(1 / scale) computed in double, as torch's
 * `scale.double().reciprocal().float()`, and each gradient becomes the float
 * product g * inv_scale, so unscaled values are bit-identical to torch's.
 */
#ifndef FSC_GRAD_SCALER_H
#define FSC_GRAD_SCALER_H

#include "fsc/core.h"
#include "fsc/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A zero field means the documented default (torch's defaults). */
typedef struct fsc_grad_scaler_config {
    double init_scale;       /* > 0, finite as a float; 0: 65536 (2^16) */
    double growth_factor;    /* > 1, finite; 0: 2 */
    double backoff_factor;   /* in (0, 1); 0: 0.5 */
    int64_t growth_interval; /* >= 1: good steps in a row before growing; 0: 2000 */
} fsc_grad_scaler_config;

typedef struct fsc_grad_scaler fsc_grad_scaler;

/* A scaler at cfg->init_scale (cfg NULL: all defaults). NULL (error set,
 * naming the field) when a factor, the interval or the initial scale is out
 * of range. The caller owns the scaler (fsc_grad_scaler_free); cfg is copied. */
FSC_API fsc_grad_scaler *fsc_grad_scaler_new(const fsc_grad_scaler_config *cfg);
FSC_API void fsc_grad_scaler_free(fsc_grad_scaler *s); /* accepts NULL */
/* The resolved configuration (defaults filled in); all zero for a NULL scaler. */
FSC_API fsc_grad_scaler_config fsc_grad_scaler_get_config(const fsc_grad_scaler *s);

/* The current scale (a float32 value). NaN for a NULL scaler. */
FSC_API double fsc_grad_scaler_get_scale(const fsc_grad_scaler *s);

/* Multiplies every gradient of the n ranges by float(1 / scale), in place, and
 * sets *found_inf to whether any unscaled gradient is inf or NaN (false
 * otherwise: it is overwritten, not or-ed). Every gradient is unscaled even
 * when one is not finite, as torch does. The check is on the unscaled values:
 * a non-finite input always gives a non-finite output, and a finite gradient
 * that overflows when unscaled (possible only with a scale below 1) is caught
 * too. Local: no communication. Call once per step for a set of gradients
 * (twice divides twice). FSC_ERR_INVALID for a NULL scaler or found_inf, or a
 * bad range (naming it); nothing is changed then. OpenMP-parallel over large
 * ranges. */
FSC_API int fsc_grad_scaler_unscale(fsc_grad_scaler *s, const fsc_optim_range *r, int n,
                                    bool *found_inf);

/* After the step (taken or skipped), as torch's _amp_update_scale_:
 * found_inf: scale *= backoff_factor, growth_tracker = 0, skipped_steps++;
 * otherwise growth_tracker++, and when it reaches growth_interval,
 * scale *= growth_factor (unless that overflows float) and growth_tracker = 0.
 * FSC_ERR_INVALID for a NULL scaler. */
FSC_API int fsc_grad_scaler_update(fsc_grad_scaler *s, bool found_inf);

/* What a checkpoint keeps (torch's state_dict keeps scale and _growth_tracker;
 * skipped_steps is fsc's count of steps skipped for overflow). */
typedef struct fsc_grad_scaler_state {
    double scale;           /* > 0 and finite as a float */
    int64_t growth_tracker; /* good steps since the last change: [0, growth_interval) */
    int64_t skipped_steps;  /* >= 0 */
} fsc_grad_scaler_state;

/* The state of s (all zero for a NULL scaler). */
FSC_API fsc_grad_scaler_state fsc_grad_scaler_get_state(const fsc_grad_scaler *s);
/* Restores a saved state; the scale is rounded to float as torch stores it.
 * FSC_ERR_INVALID naming the field when the scale is not a positive finite
 * float, growth_tracker is outside [0, growth_interval) or skipped_steps < 0;
 * s is unchanged then. */
FSC_API int fsc_grad_scaler_set_state(fsc_grad_scaler *s, const fsc_grad_scaler_state *st);

#ifdef __cplusplus
}
#endif
#endif
