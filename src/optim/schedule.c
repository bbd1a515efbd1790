/* Learning-rate schedules: constant, linear warm-up then cosine or constant.
 *
 * A schedule is a pure function of the 0-based step, so every rank, every
 * resumed run and every test computes the same lr with no state to save. */
#include <math.h>

#include "fsc/core.h"
#include "fsc/optim.h"

static const double PI = 3.14159265358979323846;

static double floor_lr(const fsc_lr_schedule_config *c) {
    return c->min_lr != 0.0f ? (double)c->min_lr : (double)c->min_lr_ratio * c->max_lr;
}

/* Validates c; records a message only when report is set, so the pure
 * fsc_lr_schedule never disturbs the caller's last error. */
static int check(const fsc_lr_schedule_config *c, bool report) {
#define FAIL(...) (report ? fsc_error(FSC_ERR_INVALID, __VA_ARGS__) : FSC_ERR_INVALID)
    if (!c) return FAIL("lr schedule: config must not be NULL");
    if ((int)c->kind < 0 || c->kind >= FSC_LR_KIND_COUNT)
        return FAIL("lr schedule: kind %d is not constant, warmup_cosine or "
                    "warmup_constant",
                    (int)c->kind);
    if (!(c->max_lr >= 0.0f) || isinf(c->max_lr))
        return FAIL("lr schedule: max_lr %g must be finite and >= 0", (double)c->max_lr);
    if (c->warmup_steps < 0)
        return FAIL("lr schedule: warmup_steps %lld must be >= 0", (long long)c->warmup_steps);
    if (c->kind == FSC_LR_WARMUP_COSINE) {
        if (c->total_steps < c->warmup_steps)
            return FAIL("lr schedule: total_steps %lld must be >= warmup_steps %lld",
                        (long long)c->total_steps, (long long)c->warmup_steps);
        if (!(c->min_lr_ratio >= 0.0f && c->min_lr_ratio <= 1.0f))
            return FAIL("lr schedule: min_lr_ratio %g must be in [0, 1]", (double)c->min_lr_ratio);
        if (!(c->min_lr >= 0.0f && c->min_lr <= c->max_lr))
            return FAIL("lr schedule: min_lr %g must be in [0, max_lr %g]", (double)c->min_lr,
                        (double)c->max_lr);
    }
    return FSC_OK;
#undef FAIL
}

int fsc_lr_schedule_check(const fsc_lr_schedule_config *c) {
    return check(c, true);
}

float fsc_lr_schedule(const fsc_lr_schedule_config *c, int64_t step) {
    if (!c) return 0.0f;
    if (check(c, false) != FSC_OK) return c->max_lr;
    const double max_lr = c->max_lr;
    const int64_t s = step < 0 ? 0 : step, w = c->warmup_steps;
    if (c->kind == FSC_LR_CONSTANT) return c->max_lr;
    if (s < w) return (float)(max_lr * (double)(s + 1) / (double)w);
    if (c->kind == FSC_LR_WARMUP_CONSTANT) return c->max_lr;
    const double min_lr = floor_lr(c);
    if (s >= c->total_steps) return (float)min_lr;
    const double progress = (double)(s - w) / (double)(c->total_steps - w);
    return (float)(min_lr + (max_lr - min_lr) * 0.5 * (1.0 + cos(PI * progress)));
}
