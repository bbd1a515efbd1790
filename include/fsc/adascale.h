/* AdaScale (Johnson et al., ICML 2020; FairScale's fairscale.optim.AdaScale):
 * scale data parallelism up without retuning the learning-rate schedule.
 *
 * A step that averages S gradient samples (ranks x micro-batches) makes the
 * progress of r steps of one sample, r = (sigma^2 + mu^2) / (sigma^2 / S +
 * mu^2) in [1, S], where mu^2 = ||true gradient||^2 and sigma^2 the trace of
 * one sample's covariance. Both come from the samples' squared norms
 * against the averaged gradient's, smoothed over steps. The learning rate is
 * multiplied by r and the schedule is read at the scale-invariant step, the
 * sum of the gains so far, so a schedule written for one worker runs
 * unchanged at S workers.
 *
 *     fsc_adascale a;
 *     fsc_adascale_init(&a, &(fsc_adascale_config){.scale = world * accum});
 *     each step: sum_sq = sum over the S samples of ||g_i||^2 (before any
 *                reduction), mean_sq = ||(1/S) sum g_i||^2;
 *                fsc_adascale_update(&a, sum_sq, S, mean_sq);
 *                lr = fsc_adascale_gain(&a) * schedule(floor(progress));
 *                progress += fsc_adascale_gain(&a);
 *
 * The estimator is FairScale's (Appendix B.3 of the paper, with its
 * correction for a scale other than the sample count), on one parameter
 * group. fsc_trainer does all of the above with `adascale` set. */
#ifndef FSC_ADASCALE_H
#define FSC_ADASCALE_H

#include "fsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Zero fields mean the documented default. */
typedef struct fsc_adascale_config {
    /* S: the step's batch over the batch the schedule was written for
     * (>= 1; 0: the caller's sample count, which fsc_trainer sets to
     * world x grad_accum). */
    double scale;
    /* EWMA factor in [0, 1) for both estimates: 0 means FairScale's default
     * max(1 - n / 1000, 0), n the samples an update averages (world x
     * accumulation, whatever the scale); a negative value means none (each
     * step's own estimate). */
    double smoothing;
    /* false (FairScale's default, debias_ewma=True): a debiased EWMA. true:
     * the paper's Appendix B.3 average, a plain mean of the first
     * 1 / (1 - smoothing) steps and an EWMA after. */
    bool paper_average;
} fsc_adascale_config;

/* The estimator's whole state: a plain struct, copied to save it. */
typedef struct fsc_adascale {
    double scale, smoothing; /* S (0: not set yet) and the EWMA factor in use */
    bool auto_smoothing;     /* smoothing follows the sample count (the config's 0) */
    bool paper_average;
    double sqr_avg, var_avg;       /* mu^2 and sigma^2 estimates (start 1 and 0: gain 1) */
    double sqr_biased, var_biased; /* debiased EWMA: the biased averages */
    double unbias;                 /* ... and the weight they carry (1 - smoothing^n) */
    double sqr_total, var_total;   /* paper average: running sums */
    int64_t updates;               /* fsc_adascale_update calls so far */
} fsc_adascale;

/* Resolves the defaults (scale 0 stays 0 until fsc_adascale_set_scale; a
 * smoothing of 0 follows each update's sample count) and zeroes the
 * estimates. FSC_ERR_INVALID naming the field for a NULL
 * argument, scale in (0, 1) or not finite, smoothing >= 1 or not finite. */
FSC_API int fsc_adascale_init(fsc_adascale *a, const fsc_adascale_config *cfg);
/* Sets S (>= 1, finite) when the config left it 0; a later change rescales
 * the variance estimate by old / new as FairScale's set_scale does.
 * FSC_ERR_INVALID otherwise. */
FSC_API int fsc_adascale_set_scale(fsc_adascale *a, double scale);
/* One step's figures: sum_sq, the sum over `samples` (>= 2) gradient
 * samples of their squared 2-norms; mean_sq, the squared 2-norm of their
 * mean. sigma^2 = (sum_sq (S/n) - mean_sq S) / (n - 1) (at least 1e-6) and
 * mu^2 = mean_sq - sigma^2 / S (at least 0) enter the averages.
 * FSC_ERR_INVALID for samples < 2, a scale still unset, or a negative or
 * non-finite figure (nothing changes then). */
FSC_API int fsc_adascale_update(fsc_adascale *a, double sum_sq, int samples, double mean_sq);
/* r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2), in [1, S]; 1 before the
 * first update and for S = 1. */
FSC_API double fsc_adascale_gain(const fsc_adascale *a);

#ifdef __cplusplus
}
#endif
#endif
