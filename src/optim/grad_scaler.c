/* Dynamic loss scaling (torch.cuda.amp.GradScaler): unscale + inf check over
 * flat gradient ranges, and the scale's update rule.
 *
 * The scale is a float32 value, as torch's scale tensor is, so a trajectory
 * of backoffs and growths lands on exactly torch's numbers; the unscale is
 * one pass that multiplies and checks together, so each gradient is read once. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "fsc/core.h"
#include "fsc/grad_scaler.h"

#define PAR_MIN (1 << 15)

struct fsc_grad_scaler {
    fsc_grad_scaler_config cfg; /* resolved */
    fsc_grad_scaler_state st;
};

/* x is a float32 value that is > 0 and finite. */
static bool positive_float(double x) {
    return x > 0.0 && x <= FLT_MAX && (float)x > 0.0f;
}

fsc_grad_scaler *fsc_grad_scaler_new(const fsc_grad_scaler_config *cfg) {
    fsc_grad_scaler_config c = cfg ? *cfg : (fsc_grad_scaler_config){0};
    if (c.init_scale == 0.0) c.init_scale = 65536.0;
    if (c.growth_factor == 0.0) c.growth_factor = 2.0;
    if (c.backoff_factor == 0.0) c.backoff_factor = 0.5;
    if (c.growth_interval == 0) c.growth_interval = 2000;
    /* the scale is a float: an init that is not a positive finite float would
     * round to 0 or inf and every step would be skipped */
    if (!positive_float(c.init_scale)) {
        fsc_error(FSC_ERR_INVALID, "grad scaler: init_scale %g must be > 0 and finite as a float",
                  c.init_scale);
        return NULL;
    }
    if (!(c.growth_factor > 1.0) || isinf(c.growth_factor)) {
        fsc_error(FSC_ERR_INVALID, "grad scaler: growth_factor %g must be finite and > 1",
                  c.growth_factor);
        return NULL;
    }
    if (!(c.backoff_factor > 0.0 && c.backoff_factor < 1.0)) {
        fsc_error(FSC_ERR_INVALID, "grad scaler: backoff_factor %g must be in (0, 1)",
                  c.backoff_factor);
        return NULL;
    }
    if (c.growth_interval < 1) {
        fsc_error(FSC_ERR_INVALID, "grad scaler: growth_interval %lld must be >= 1",
                  (long long)c.growth_interval);
        return NULL;
    }
    fsc_grad_scaler *s = calloc(1, sizeof *s);
    if (!s) {
        fsc_error(FSC_ERR_NOMEM, "grad scaler: out of memory");
        return NULL;
    }
    s->cfg = c;
    s->st.scale = (float)c.init_scale; /* torch.full((1,), init_scale, dtype=float32) */
    return s;
}

void fsc_grad_scaler_free(fsc_grad_scaler *s) {
    free(s);
}

fsc_grad_scaler_config fsc_grad_scaler_get_config(const fsc_grad_scaler *s) {
    return s ? s->cfg : (fsc_grad_scaler_config){0};
}

double fsc_grad_scaler_get_scale(const fsc_grad_scaler *s) {
    return s ? s->st.scale : NAN;
}

/* g *= inv in place; returns whether any product is inf or NaN. */
static bool unscale_range(float *restrict g, int64_t n, float inv) {
    int bad = 0;
    const int nt = fsc_get_num_threads();
    /* !(|v| <= FLT_MAX) is true for inf and NaN alike and vectorises as one
     * compare, where isfinite may become a library call. */
#pragma omp parallel for simd if (n >= PAR_MIN) num_threads(nt) schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < n; i++) {
        const float v = g[i] * inv;
        g[i] = v;
        bad |= !(fabsf(v) <= FLT_MAX);
    }
    return bad != 0;
}

int fsc_grad_scaler_unscale(fsc_grad_scaler *s, const fsc_optim_range *r, int n, bool *found_inf) {
    if (!s || !found_inf)
        return fsc_error(FSC_ERR_INVALID,
                         "grad scaler unscale: scaler %p and found_inf %p must "
                         "not be NULL",
                         (void *)s, (void *)found_inf);
    if (n < 0 || (n > 0 && !r))
        return fsc_error(FSC_ERR_INVALID,
                         "grad scaler unscale: %d ranges at %p (expected n >= 0, ranges non-NULL)",
                         n, (const void *)r);
    /* every range is checked before any is touched: a refusal changes nothing */
    for (int i = 0; i < n; i++)
        if (r[i].n < 0 || (r[i].n > 0 && !r[i].grad))
            return fsc_error(
                FSC_ERR_INVALID, "grad scaler unscale: range %d '%s' has n %lld and grad %p", i,
                r[i].name ? r[i].name : "(unnamed)", (long long)r[i].n, (const void *)r[i].grad);
    /* torch: inv_scale = scale.double().reciprocal().float() */
    const float inv = (float)(1.0 / s->st.scale);
    bool bad = false;
    for (int i = 0; i < n; i++)
        if (r[i].n > 0) bad |= unscale_range(r[i].grad, r[i].n, inv);
    *found_inf = bad;
    return FSC_OK;
}

int fsc_grad_scaler_update(fsc_grad_scaler *s, bool found_inf) {
    if (!s) return fsc_error(FSC_ERR_INVALID, "grad scaler update: scaler must not be NULL");
    /* torch's _amp_update_scale_: the float scale times a double factor,
     * stored back as float */
    if (found_inf) {
        s->st.scale = (float)(s->st.scale * s->cfg.backoff_factor);
        s->st.growth_tracker = 0;
        s->st.skipped_steps++;
        return FSC_OK;
    }
    if (s->st.growth_tracker + 1 < s->cfg.growth_interval) {
        s->st.growth_tracker++;
        return FSC_OK;
    }
    const float grown = (float)(s->st.scale * s->cfg.growth_factor);
    if (isfinite(grown)) s->st.scale = grown; /* torch never grows the scale to inf */
    s->st.growth_tracker = 0;
    return FSC_OK;
}

fsc_grad_scaler_state fsc_grad_scaler_get_state(const fsc_grad_scaler *s) {
    return s ? s->st : (fsc_grad_scaler_state){0};
}

int fsc_grad_scaler_set_state(fsc_grad_scaler *s, const fsc_grad_scaler_state *st) {
    if (!s || !st)
        return fsc_error(FSC_ERR_INVALID, "grad scaler set state: scaler and state must not be "
                                          "NULL");
    if (!positive_float(st->scale))
        return fsc_error(FSC_ERR_INVALID,
                         "grad scaler set state: scale %g must be > 0 and finite as a float",
                         st->scale);
    /* a tracker at or past the interval would never equal it again: the scale
     * could then never grow */
    if (st->growth_tracker < 0 || st->growth_tracker >= s->cfg.growth_interval)
        return fsc_error(FSC_ERR_INVALID,
                         "grad scaler set state: growth_tracker %lld must be in [0, "
                         "growth_interval %lld)",
                         (long long)st->growth_tracker, (long long)s->cfg.growth_interval);
    if (st->skipped_steps < 0)
        return fsc_error(FSC_ERR_INVALID, "grad scaler set state: skipped_steps %lld must be >= 0",
                         (long long)st->skipped_steps);
    s->st = *st;
    s->st.scale = (float)st->scale;
    return FSC_OK;
}
