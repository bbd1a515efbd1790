/* The optimizer object: a configuration, a list of flat ranges, and the state
 * for exactly those elements.
 *
 * State lives in one FSC_MEM_OPTIM allocation per state kind (momentum, or
 * exp_avg and exp_avg_sq), range i at the same offset in each, so the bytes
 * charged are K x elements with no padding: the figure ZeRO's tests check.
 * Bookkeeping (the range copies, names) is small and uses malloc. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adam_internal.h"
#include "fsc/core.h"
#include "fsc/kernels.h"
#include "fsc/optim.h"

#define MAX_STATES 2

struct fsc_optim {
    fsc_optim_config cfg; /* resolved; cfg.lr is the current lr */
    int nstates;          /* K */
    int nranges;
    fsc_optim_range *ranges; /* copies; names owned here */
    int64_t *offsets;        /* element offset of range i in each state buffer */
    int64_t numel;           /* sum of range lengths */
    float *state[MAX_STATES];
    int64_t step; /* steps taken */
    /* Adam/AdamW: the multi-tensor pass's per-step tables, one slot per range */
    fsc_adam_tensor *tensors;
    fsc_adam_consts *consts;
    int64_t *block_start; /* nranges + 1 */
};

static const char *kind_name(fsc_optim_kind k) {
    switch (k) {
    case FSC_OPTIM_SGD:
        return "SGD";
    case FSC_OPTIM_ADAM:
        return "Adam";
    case FSC_OPTIM_ADAMW:
        return "AdamW";
    default:
        return "?";
    }
}

/* ---- configuration ---------------------------------------------------------- */
int fsc_optim_config_resolve(const fsc_optim_config *in, fsc_optim_config *out) {
    if (!in || !out)
        return fsc_error(FSC_ERR_INVALID, "optim config: cfg and out must not be NULL");
    fsc_optim_config c = *in;
    if ((int)c.kind < 0 || c.kind >= FSC_OPTIM_KIND_COUNT)
        return fsc_error(FSC_ERR_INVALID, "optim config: kind %d is not SGD, Adam or AdamW",
                         (int)c.kind);
    const char *k = kind_name(c.kind);
    if (!(c.lr >= 0.0) || isinf(c.lr))
        return fsc_error(FSC_ERR_INVALID, "%s: lr %g must be finite and >= 0", k, c.lr);
    if (!(c.weight_decay >= 0.0) || isinf(c.weight_decay))
        return fsc_error(FSC_ERR_INVALID, "%s: weight_decay %g must be finite and >= 0", k,
                         c.weight_decay);
    if (c.kind == FSC_OPTIM_SGD) {
        if (!(c.momentum >= 0.0) || isinf(c.momentum))
            return fsc_error(FSC_ERR_INVALID, "SGD: momentum %g must be finite and >= 0",
                             c.momentum);
        if (!isfinite(c.dampening))
            return fsc_error(FSC_ERR_INVALID, "SGD: dampening %g must be finite", c.dampening);
        if (c.nesterov && (c.momentum <= 0.0 || c.dampening != 0.0))
            return fsc_error(FSC_ERR_INVALID,
                             "SGD: nesterov needs momentum > 0 and dampening == 0 (got momentum "
                             "%g, dampening %g)",
                             c.momentum, c.dampening);
        c.beta1 = c.beta2 = c.eps = 0.0;
    } else {
        if (c.beta1 == 0.0) c.beta1 = 0.9;
        if (c.beta2 == 0.0) c.beta2 = 0.999;
        if (c.eps == 0.0) c.eps = 1e-8;
        if (!(c.beta1 >= 0.0 && c.beta1 < 1.0))
            return fsc_error(FSC_ERR_INVALID, "%s: beta1 %g must be in [0, 1)", k, c.beta1);
        if (!(c.beta2 >= 0.0 && c.beta2 < 1.0))
            return fsc_error(FSC_ERR_INVALID, "%s: beta2 %g must be in [0, 1)", k, c.beta2);
        if (!(c.eps > 0.0) || isinf(c.eps))
            return fsc_error(FSC_ERR_INVALID, "%s: eps %g must be finite and > 0", k, c.eps);
        c.momentum = c.dampening = 0.0;
        c.nesterov = false;
    }
    *out = c;
    return FSC_OK;
}

int fsc_optim_state_count(const fsc_optim_config *cfg) {
    if (!cfg) return fsc_error(FSC_ERR_INVALID, "optim state count: cfg must not be NULL");
    switch (cfg->kind) {
    case FSC_OPTIM_SGD:
        return cfg->momentum != 0.0 ? 1 : 0;
    case FSC_OPTIM_ADAM:
    case FSC_OPTIM_ADAMW:
        return 2;
    default:
        return fsc_error(FSC_ERR_INVALID, "optim state count: kind %d is not SGD, Adam or AdamW",
                         (int)cfg->kind);
    }
}

/* ---- ranges ---------------------------------------------------------------- */
int fsc_optim_ranges_from_params(const fsc_params *ps, fsc_optim_range **out, int *n) {
    if (!ps || !out || !n)
        return fsc_error(FSC_ERR_INVALID, "optim ranges: ps, out and n must not be NULL");
    *out = NULL;
    *n = 0;
    if (ps->count < 0)
        return fsc_error(FSC_ERR_INVALID, "optim ranges: ps->count %d < 0", ps->count);
    fsc_optim_range *r = calloc(ps->count > 0 ? (size_t)ps->count : 1, sizeof *r);
    if (!r) return fsc_error(FSC_ERR_NOMEM, "optim ranges: out of memory for %d ranges", ps->count);
    for (int i = 0; i < ps->count; i++) {
        const fsc_param_entry *e = &ps->entries[i];
        const fsc_param *p = e->param;
        if (!p || !p->data || (!p->grad && p->numel > 0)) {
            free(r);
            return fsc_error(FSC_ERR_INVALID,
                             "optim ranges: parameter '%s' has no %s bound (bind with grads)",
                             e->name, (!p || !p->data) ? "data" : "gradient");
        }
        r[i] = (fsc_optim_range){.param = p->data,
                                 .grad = p->grad,
                                 .n = p->frozen ? 0 : p->numel, /* no state, no update */
                                 .decay = p->weight_decay,
                                 .name = e->name,
                                 .lr_scale = p->lr_scale,
                                 .wd_set = p->wd_set,
                                 .wd = p->wd};
    }
    *out = r;
    *n = ps->count;
    return FSC_OK;
}

void fsc_optim_ranges_free(fsc_optim_range *r) {
    free(r);
}

/* ---- lifetime ---------------------------------------------------------------- */
void fsc_optim_free(fsc_optim *o) {
    if (!o) return;
    for (int s = 0; s < MAX_STATES; s++) fsc_mem_free(o->state[s]);
    if (o->ranges)
        for (int i = 0; i < o->nranges; i++) free((char *)o->ranges[i].name);
    free(o->ranges);
    free(o->offsets);
    free(o->tensors);
    free(o->consts);
    free(o->block_start);
    free(o);
}

static char *copy_name(const char *s) {
    size_t len = strlen(s) + 1;
    char *c = malloc(len);
    if (c) memcpy(c, s, len);
    return c;
}

fsc_optim *fsc_optim_new(const fsc_optim_config *cfg, const fsc_optim_range *ranges, int n) {
    fsc_optim_config c;
    if (fsc_optim_config_resolve(cfg, &c) != FSC_OK) return NULL;
    if (n < 0 || (n > 0 && !ranges)) {
        fsc_error(FSC_ERR_INVALID, "optim: %d ranges at %p (expected n >= 0 and ranges non-NULL)",
                  n, (const void *)ranges);
        return NULL;
    }
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const fsc_optim_range *r = &ranges[i];
        const char *nm = r->name ? r->name : "(unnamed)";
        if (r->n < 0) {
            fsc_error(FSC_ERR_INVALID, "optim: range %d '%s' has n %lld < 0", i, nm,
                      (long long)r->n);
            return NULL;
        }
        if (r->n > 0 && (!r->param || !r->grad)) {
            fsc_error(FSC_ERR_INVALID, "optim: range %d '%s' has a NULL %s", i, nm,
                      r->param ? "grad" : "param");
            return NULL;
        }
        total += r->n;
    }
    fsc_optim *o = calloc(1, sizeof *o);
    if (!o) {
        fsc_error(FSC_ERR_NOMEM, "optim: out of memory");
        return NULL;
    }
    o->cfg = c;
    o->nstates = fsc_optim_state_count(&c);
    o->nranges = n;
    o->numel = total;
    size_t cnt = n > 0 ? (size_t)n : 1;
    o->ranges = calloc(cnt, sizeof *o->ranges);
    o->offsets = calloc(cnt, sizeof *o->offsets);
    if (!o->ranges || !o->offsets) goto nomem;
    if (c.kind == FSC_OPTIM_ADAM || c.kind == FSC_OPTIM_ADAMW) {
        o->tensors = calloc(cnt, sizeof *o->tensors);
        o->consts = calloc(cnt, sizeof *o->consts);
        o->block_start = calloc(cnt + 1, sizeof *o->block_start);
        if (!o->tensors || !o->consts || !o->block_start) goto nomem;
    }
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        o->ranges[i] = ranges[i];
        o->ranges[i].name = NULL;
        if (ranges[i].name && !(o->ranges[i].name = copy_name(ranges[i].name))) goto nomem;
        o->offsets[i] = off;
        off += ranges[i].n;
    }
    if (total > 0) {
        for (int s = 0; s < o->nstates; s++) {
            o->state[s] = fsc_mem_alloc(FSC_MEM_OPTIM, (size_t)total * sizeof(float));
            if (!o->state[s]) {
                fsc_optim_free(o);
                return NULL; /* fsc_mem_alloc set the error */
            }
        }
    }
    return o;
nomem:
    fsc_optim_free(o);
    fsc_error(FSC_ERR_NOMEM, "optim: out of memory for %d ranges", n);
    return NULL;
}

/* ---- stepping ---------------------------------------------------------------- */
/* A parameter group's own decay and lr (torch's param_groups). */
static double range_wd(const fsc_optim_config *c, const fsc_optim_range *r) {
    return r->wd_set ? r->wd : (r->decay || c->decay_all) ? c->weight_decay : 0.0;
}

static double range_lr(const fsc_optim_config *c, const fsc_optim_range *r) {
    return r->lr_scale > 0 ? c->lr * r->lr_scale : c->lr;
}

/* Adam/AdamW: every non-empty range in one multi-tensor pass. */
static void adam_step(fsc_optim *o, int64_t step) {
    const fsc_optim_config *c = &o->cfg;
    int count = 0;
    for (int i = 0; i < o->nranges; i++) {
        const fsc_optim_range *r = &o->ranges[i];
        if (r->n == 0) continue;
        o->tensors[count++] = (fsc_adam_tensor){.p = r->param,
                                                .g = r->grad,
                                                .m = o->state[0] + o->offsets[i],
                                                .v = o->state[1] + o->offsets[i],
                                                .n = r->n,
                                                .lr = range_lr(c, r),
                                                .wd = range_wd(c, r)};
    }
    fsc_adam_multi_update(o->tensors, count, o->consts, o->block_start, c->beta1, c->beta2, c->eps,
                          c->kind == FSC_OPTIM_ADAMW, step);
}

int fsc_optim_step(fsc_optim *o) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "optim step: o must not be NULL");
    const fsc_optim_config *c = &o->cfg;
    const bool first = o->step == 0;
    const int64_t step = ++o->step;
    switch (c->kind) {
    case FSC_OPTIM_SGD:
        for (int i = 0; i < o->nranges; i++) {
            const fsc_optim_range *r = &o->ranges[i];
            if (r->n == 0) continue;
            float *s0 = o->nstates > 0 ? o->state[0] + o->offsets[i] : NULL;
            fsc_sgd_update(r->param, r->grad, s0, r->n, range_lr(c, r), c->momentum, c->dampening,
                           c->nesterov, range_wd(c, r), first);
        }
        break;
    case FSC_OPTIM_ADAM:
    case FSC_OPTIM_ADAMW:
        adam_step(o, step);
        break;
    default:
        return fsc_error(FSC_ERR_INTERNAL, "optim step: kind %d", (int)c->kind);
    }
    fsc_weights_changed(); /* bf16 copies of the old weights are stale now */
    return FSC_OK;
}

void fsc_optim_zero_grad(fsc_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->nranges; i++)
        if (o->ranges[i].n > 0)
            memset(o->ranges[i].grad, 0, (size_t)o->ranges[i].n * sizeof(float));
}

/* ---- accessors ---------------------------------------------------------------- */
int fsc_optim_set_lr(fsc_optim *o, double lr) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "optim set_lr: o must not be NULL");
    if (!(lr >= 0.0) || isinf(lr))
        return fsc_error(FSC_ERR_INVALID, "optim set_lr: lr %g must be finite and >= 0", lr);
    o->cfg.lr = lr;
    return FSC_OK;
}

double fsc_optim_get_lr(const fsc_optim *o) {
    return o ? o->cfg.lr : 0.0;
}

int64_t fsc_optim_get_step(const fsc_optim *o) {
    return o ? o->step : 0;
}

int fsc_optim_set_step(fsc_optim *o, int64_t step) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "optim set_step: o must not be NULL");
    if (step < 0)
        return fsc_error(FSC_ERR_INVALID, "optim set_step: step %lld must be >= 0",
                         (long long)step);
    o->step = step;
    return FSC_OK;
}

fsc_optim_config fsc_optim_get_config(const fsc_optim *o) {
    fsc_optim_config c = {0};
    return o ? o->cfg : c;
}

int fsc_optim_num_ranges(const fsc_optim *o) {
    return o ? o->nranges : 0;
}

const fsc_optim_range *fsc_optim_get_range(const fsc_optim *o, int i) {
    if (!o || i < 0 || i >= o->nranges) return NULL;
    return &o->ranges[i];
}

int fsc_optim_state(fsc_optim *o, int range_index, int which, float **data) {
    if (!o || !data) return fsc_error(FSC_ERR_INVALID, "optim state: o and data must not be NULL");
    *data = NULL;
    if (range_index < 0 || range_index >= o->nranges)
        return fsc_error(FSC_ERR_INVALID, "optim state: range_index %d not in [0, %d)", range_index,
                         o->nranges);
    if (which < 0 || which >= o->nstates)
        return fsc_error(FSC_ERR_INVALID, "optim state: which %d not in [0, %d) for %s%s", which,
                         o->nstates, kind_name(o->cfg.kind),
                         o->nstates == 0 ? " without momentum" : "");
    if (o->ranges[range_index].n > 0) *data = o->state[which] + o->offsets[range_index];
    return FSC_OK;
}

size_t fsc_optim_state_bytes(const fsc_optim *o) {
    return o ? (size_t)o->nstates * (size_t)o->numel * sizeof(float) : 0;
}
