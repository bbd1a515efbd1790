/* AdaScale's gain estimator: the variance of S gradient samples against the
 * squared norm of their mean, smoothed over steps.
 *
 * The one idea: everything AdaScale needs from a step is two numbers, the sum
 * of the samples' squared norms (taken before any reduction) and the squared
 * norm of the averaged gradient, so the estimator is a few doubles and the
 * hard part (getting each rank's figure before its gradient is reduced)
 * lives with the reduction, not here. */
#include <math.h>

#include "fsc/adascale.h"

static double default_smoothing(int samples) {
    double s = 1.0 - samples / 1000.0;
    return s > 0 ? s : 0;
}

int fsc_adascale_init(fsc_adascale *a, const fsc_adascale_config *cfg) {
    if (!a || !cfg) return fsc_error(FSC_ERR_INVALID, "adascale: NULL state or config");
    if (!isfinite(cfg->scale) || (cfg->scale != 0 && cfg->scale < 1))
        return fsc_error(FSC_ERR_INVALID,
                         "adascale: scale %g must be >= 1 (or 0: the sample count)", cfg->scale);
    if (!isfinite(cfg->smoothing) || cfg->smoothing >= 1)
        return fsc_error(FSC_ERR_INVALID, "adascale: smoothing %g must be < 1", cfg->smoothing);
    *a = (fsc_adascale){.scale = cfg->scale,
                        .auto_smoothing = cfg->smoothing == 0,
                        .smoothing = cfg->smoothing > 0 ? cfg->smoothing : 0,
                        .paper_average = cfg->paper_average,
                        .sqr_avg = 1.0,
                        .var_avg = 0.0};
    return FSC_OK;
}

int fsc_adascale_set_scale(fsc_adascale *a, double scale) {
    if (!a || !isfinite(scale) || scale < 1)
        return fsc_error(FSC_ERR_INVALID, "adascale: scale %g must be finite and >= 1", scale);
    if (a->scale >= 1 && a->scale != scale) { /* FairScale's set_scale(update_estimate=True) */
        const double f = a->scale / scale;
        a->var_avg *= f, a->var_biased *= f, a->var_total *= f;
    }
    a->scale = scale;
    return FSC_OK;
}

/* One average's update: debiased EWMA, or the paper's mean-then-EWMA. */
static void average(const fsc_adascale *a, double value, double *avg, double *biased,
                    double *total) {
    const double f = a->smoothing;
    if (!a->paper_average) {
        *biased = f * *biased + (1 - f) * value;
        *avg = *biased / a->unbias;
    } else if ((double)a->updates < 1.0 / (1.0 - f)) {
        *total += value;
        *avg = *total / (double)a->updates;
    } else {
        *avg = f * *avg + (1 - f) * value;
    }
}

int fsc_adascale_update(fsc_adascale *a, double sum_sq, int samples, double mean_sq) {
    if (!a || samples < 2 || !(a->scale >= 1))
        return fsc_error(FSC_ERR_INVALID,
                         "adascale: update needs >= 2 samples (%d) and a scale >= 1 (%g)", samples,
                         a ? a->scale : 0.0);
    if (!(sum_sq >= 0) || !(mean_sq >= 0) || isinf(sum_sq) || isinf(mean_sq))
        return fsc_error(FSC_ERR_INVALID,
                         "adascale: squared norms must be finite and >= 0 (sum %g, mean %g)",
                         sum_sq, mean_sq);
    /* FairScale's default follows the samples (world x accumulation), which
     * set how noisy each step's estimate is, not the scale */
    if (a->auto_smoothing) a->smoothing = default_smoothing(samples);
    const double S = a->scale, n = samples;
    double var = sum_sq * (S / n) / (n - 1) - mean_sq * S / (n - 1);
    double sqr = mean_sq - var / S;
    if (var < 1e-6) var = 1e-6;
    if (sqr < 0) sqr = 0;
    a->updates++;
    a->unbias = a->smoothing * a->unbias + (1 - a->smoothing);
    average(a, sqr, &a->sqr_avg, &a->sqr_biased, &a->sqr_total);
    average(a, var, &a->var_avg, &a->var_biased, &a->var_total);
    return FSC_OK;
}

double fsc_adascale_gain(const fsc_adascale *a) {
    if (!a || !(a->scale > 1)) return 1.0;
    const double var = a->var_avg, sqr = a->sqr_avg;
    return (var + sqr) / (var / a->scale + sqr);
}
