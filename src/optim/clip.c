/* Global gradient-norm clipping over flat ranges, as torch.nn.utils.clip_grad_norm_.
 *
 * Split into a local reduction (sum of squares in double, or max |g|) and a
 * scaling step, so a sharded run reduces the local figures with one
 * all-reduce and then scales its own shard by the same global coefficient. */
#include <math.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "fsc/optim.h"

#define PAR_MIN (1 << 15)

static int check_ranges(const char *what, const fsc_optim_range *r, int n) {
    if (n < 0 || (n > 0 && !r))
        return fsc_error(FSC_ERR_INVALID, "%s: %d ranges at %p (expected n >= 0, ranges non-NULL)",
                         what, n, (const void *)r);
    for (int i = 0; i < n; i++)
        if (r[i].n < 0 || (r[i].n > 0 && !r[i].grad))
            return fsc_error(FSC_ERR_INVALID, "%s: range %d '%s' has n %lld and grad %p", what, i,
                             r[i].name ? r[i].name : "(unnamed)", (long long)r[i].n,
                             (const void *)r[i].grad);
    return FSC_OK;
}

double fsc_grad_norm_sq(const fsc_optim_range *r, int n) {
    double total = 0.0;
    if (!r) return 0.0;
    for (int i = 0; i < n; i++)
        if (r[i].n > 0 && r[i].grad) total += fsc_sumsq(r[i].grad, r[i].n);
    return total;
}

static float max_abs(const float *restrict g, int64_t n) {
    float m = 0.0f;
    int nan = 0;
    const int nt = fsc_get_num_threads();
#pragma omp parallel for simd if (n >= PAR_MIN) num_threads(nt) schedule(static) reduction(max     \
                                                                                           : m)    \
    reduction(|                                                                                    \
              : nan)
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(g[i]);
        m = a > m ? a : m;
        nan |= a != a;
    }
    return nan ? NAN : m;
}

float fsc_grad_max_abs(const fsc_optim_range *r, int n) {
    float m = 0.0f;
    if (!r) return 0.0f;
    for (int i = 0; i < n; i++) {
        if (r[i].n <= 0 || !r[i].grad) continue;
        float a = max_abs(r[i].grad, r[i].n);
        if (isnan(a)) return NAN;
        m = a > m ? a : m;
    }
    return m;
}

int fsc_clip_grads_scale(const fsc_optim_range *r, int n, float max_norm, float total_norm) {
    int rc = check_ranges("clip grads", r, n);
    if (rc) return rc;
    if (!(max_norm >= 0.0f))
        return fsc_error(FSC_ERR_INVALID, "clip grads: max_norm %g must be >= 0", (double)max_norm);
    if (!isfinite(total_norm))
        return fsc_error(FSC_ERR_NUMERIC, "clip grads: total norm is %g; gradients left unscaled",
                         (double)total_norm);
    /* torch: clip_coef = max_norm / (total + 1e-6), evaluated as
     * reciprocal(total + 1e-6) * max_norm in float, then clamped to 1. */
    const float coef = (1.0f / (total_norm + 1e-6f)) * max_norm;
    if (!(coef < 1.0f)) return FSC_OK;
    for (int i = 0; i < n; i++)
        if (r[i].n > 0) fsc_scale(r[i].grad, coef, r[i].n);
    return FSC_OK;
}

int fsc_clip_grad_norm(const fsc_optim_range *r, int n, float max_norm, float *total_norm_out) {
    int rc = check_ranges("clip grad norm", r, n);
    if (rc) return rc;
    const float total = (float)sqrt(fsc_grad_norm_sq(r, n));
    if (total_norm_out) *total_norm_out = total;
    return fsc_clip_grads_scale(r, n, max_norm, total);
}

int fsc_clip_grad_norm_inf(const fsc_optim_range *r, int n, float max_norm, float *total_norm_out) {
    int rc = check_ranges("clip grad norm (inf)", r, n);
    if (rc) return rc;
    const float total = fsc_grad_max_abs(r, n);
    if (total_norm_out) *total_norm_out = total;
    return fsc_clip_grads_scale(r, n, max_norm, total);
}
