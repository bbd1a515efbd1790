/* LoRA adapters on Linear modules (fsc/lora.h).
 *
 * The one idea: a parent calls its Linear through its own pointer, so the
 * adapter cannot be a new module put in the Linear's place. It is the
 * Linear itself with other operations: its ops become lora_ops, whose
 * forward runs the Linear's own forward and adds scale * B(A(dropout(x))),
 * and it adopts three children: lora_A and lora_B (bias-free Linears, so
 * their GEMMs, bf16 autocast and deferred weight gradients are Linear's)
 * and lora_dropout, a parameter-free module that holds the adapter's
 * settings (scale, dropout) and applies the dropout. */
#include <math.h>
#include <string.h>

#include "fsc/lora.h"
#include "layers_internal.h"

enum { CHILD_A, CHILD_B, CHILD_DROP, NCHILD }; /* the adopted children, in this order */

typedef struct {
    fsc_module base;
    float p, scale;
    uint32_t layer_id;
    const fsc_module_ops *linear_ops; /* the adapted Linear's own operations */
    int in, out, rank;
    fsc_weight_layout layout; /* the base weight's, for merging */
} lora_settings;

typedef struct {
    void *base, *a, *b; /* the records of the Linear's, A's and B's forwards */
    bool dropped;       /* dropout drew a mask (training, p > 0) */
    int64_t rows, row_len;
} lora_saved;

static const fsc_module_ops settings_ops = {"LoRADropout", NULL, NULL, NULL};

static lora_settings *settings_of(const fsc_module *m) {
    return (lora_settings *)m->children[CHILD_DROP];
}

/* Dropout on the adapter's input, as Dropout draws it (keyed by sample row). */
static bool drops(const lora_settings *st, const fsc_ctx *ctx) {
    return ctx->training && st->p > 0.f;
}

static int lora_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    const lora_settings *st = settings_of(m);
    lora_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    memset(s, 0, sizeof *s);
    int rc = st->linear_ops->forward(m, ctx, x, y, &s->base);
    if (rc) return rc;
    fsc_tensor xd = *x, h, z;
    s->dropped = drops(st, ctx);
    if (s->dropped) {
        if (!ctx->keyed)
            return fsc_error(FSC_ERR_INVALID,
                             "LoRA dropout: a training forward needs a keyed ctx (seed, step, "
                             "sample0)");
        s->rows = x->shape[0], s->row_len = fsc_tensor_numel(x) / x->shape[0];
        if ((rc = fsc_alloc_like(ctx->arena, x, x->shape[x->ndim - 1], &xd))) return rc;
        fsc_dropout_forward(xd.data, x->data, st->p, fsc_dropout_key(ctx, st->layer_id),
                            ctx->sample0, s->rows, s->row_len);
    }
    rc = fsc_module_forward(m->children[CHILD_A], ctx, &xd, &h, &s->a);
    if (!rc) rc = fsc_module_forward(m->children[CHILD_B], ctx, &h, &z, &s->b);
    if (rc) return rc;
    float *yd = y->data;
    const float *zd = z.data;
    const int64_t n = fsc_tensor_numel(y);
    for (int64_t i = 0; i < n; i++) yd[i] += st->scale * zd[i];
    *saved = s;
    return FSC_OK;
}

static int lora_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    const lora_settings *st = settings_of(m);
    lora_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = st->linear_ops->backward(m, ctx, s->base, dy, dx); /* checks dy; W frozen */
    if (rc) return rc;
    fsc_tensor dz = *dy, dh, dxa;
    if (!(dz.data = fsc_arena_alloc(ctx->arena, fsc_tensor_nbytes(dy)))) return FSC_ERR_NOMEM;
    const float *dyd = dy->data;
    float *dzd = dz.data;
    const int64_t n = fsc_tensor_numel(dy);
    for (int64_t i = 0; i < n; i++) dzd[i] = st->scale * dyd[i];
    rc = fsc_module_backward(m->children[CHILD_B], ctx, s->b, &dz, &dh);
    if (!rc) rc = fsc_module_backward(m->children[CHILD_A], ctx, s->a, &dh, dx ? &dxa : NULL);
    if (rc || !dx) return rc;
    if (s->dropped)
        fsc_dropout_backward(dxa.data, dxa.data, st->p, fsc_dropout_key(ctx, st->layer_id),
                             ctx->sample0, s->rows, s->row_len);
    fsc_add_inplace(dx->data, dxa.data, fsc_tensor_numel(dx));
    return FSC_OK;
}

static const fsc_module_ops lora_ops = {"LoRALinear", lora_forward, lora_backward, NULL};

bool fsc_lora_is_adapted(const fsc_module *m) {
    return m && m->ops == &lora_ops;
}

/* Adapts one Linear m (in -> out, base layout); the A, B and settings
 * children are adopted in CHILD_* order. */
static int adapt(fsc_module *m, const fsc_lora_config *c, uint32_t layer_id) {
    const fsc_param *w = &m->params[0];
    const fsc_weight_layout layout = nn_linear_layout(m);
    const int in = (int)(layout == FSC_WEIGHT_IN_OUT ? w->shape[0] : w->shape[1]);
    const int out = (int)(layout == FSC_WEIGHT_IN_OUT ? w->shape[1] : w->shape[0]);
    fsc_module *a = fsc_linear_new("lora_A", in, c->rank, false, FSC_WEIGHT_OUT_IN, 0.f);
    fsc_module *b = fsc_linear_new("lora_B", c->rank, out, false, FSC_WEIGHT_OUT_IN, 0.f);
    lora_settings *st = fsc_module_alloc(sizeof *st, &settings_ops, "lora_dropout");
    if (!a || !b || !st) {
        fsc_module_free(a), fsc_module_free(b), fsc_module_free(st ? &st->base : NULL);
        return FSC_ERR_NOMEM;
    }
    a->params[0].init = FSC_INIT_UNIFORM; /* kaiming_uniform_(a=sqrt(5)): bound 1/sqrt(in) */
    a->params[0].init_std = 1.f / sqrtf((float)in);
    b->params[0].init = FSC_INIT_ZEROS;
    st->p = c->dropout;
    st->scale = (c->alpha > 0.f ? c->alpha : (float)c->rank) / (float)c->rank;
    st->layer_id = layer_id;
    st->linear_ops = m->ops;
    st->in = in, st->out = out, st->rank = c->rank, st->layout = layout;
    fsc_module *kids[NCHILD] = {a, b, &st->base};
    int rc = FSC_OK;
    for (int k = 0; k < NCHILD; k++) {
        if (!rc) rc = fsc_module_add_child(m, kids[k]);
        if (rc) fsc_module_free(kids[k]);
    }
    if (rc) return rc;
    m->ops = &lora_ops;
    for (int i = 0; i < m->nparams; i++) m->params[i].frozen = true;
    return FSC_OK;
}

static bool is_target(const fsc_module *m, const fsc_lora_config *c, int *which) {
    for (int k = 0; k < c->ntargets; k++)
        if (!strcmp(m->name, c->targets[k])) return (*which = k), true;
    return false;
}

/* Adapts the targets and freezes every other parameter, as PEFT does:
 * only the adapters train. */
static int walk(fsc_module *m, const fsc_lora_config *c, nn_lora_adapt_fn other, int *hits,
                int *adapted) {
    int k;
    for (int i = 0; i < m->nparams; i++) m->params[i].frozen = true;
    char path[FSC_NAME_MAX * 2];
    if (m->ops == &lora_ops)
        return fsc_error(FSC_ERR_INVALID, "LoRA: %s is adapted already",
                         fsc_module_path(m, path, sizeof path));
    if (is_target(m, c, &k)) {
        /* masks keyed by the module's path, so a pipeline stage draws as one process */
        fsc_module_path(m, path, sizeof path);
        const uint32_t id = c->layer_id ^ (uint32_t)fsc_rng_key(0, path);
        int rc = 0; /* 1: adapted */
        if (nn_linear_is(m) && !(rc = adapt(m, c, id)))
            rc = 1;
        else if (!nn_linear_is(m) && other)
            rc = other(m, c, id);
        if (rc < 0) return rc;
        if (rc == 1) { /* its children are the adapters */
            hits[k]++, (*adapted)++;
            return FSC_OK;
        }
    }
    for (int i = 0; i < m->nchildren; i++) {
        int rc = walk(m->children[i], c, other, hits, adapted);
        if (rc) return rc;
    }
    return FSC_OK;
}

int fsc_lora_apply(fsc_module *root, const fsc_lora_config *cfg, int *adapted) {
    return nn_lora_apply_with(root, cfg, NULL, adapted);
}

int nn_lora_apply_with(fsc_module *root, const fsc_lora_config *cfg, nn_lora_adapt_fn other,
                       int *adapted) {
    if (adapted) *adapted = 0;
    if (!root || !cfg) return fsc_error(FSC_ERR_INVALID, "LoRA: root and cfg must not be NULL");
    fsc_lora_config c = *cfg;
    if (c.rank <= 0) return fsc_error(FSC_ERR_INVALID, "LoRA: rank %d must be > 0", c.rank);
    if (!(c.alpha >= 0.f) || isinf(c.alpha))
        return fsc_error(FSC_ERR_INVALID, "LoRA: alpha %g must be finite and >= 0",
                         (double)c.alpha);
    if (!(c.dropout >= 0.f && c.dropout < 1.f))
        return fsc_error(FSC_ERR_INVALID, "LoRA: dropout %g must be in [0, 1)", (double)c.dropout);
    if (c.ntargets <= 0 || !c.targets) return fsc_error(FSC_ERR_INVALID, "LoRA: no target modules");
    if (!c.layer_id) c.layer_id = 0x10A0;
    int *hits = calloc((size_t)c.ntargets, sizeof *hits), n = 0;
    if (!hits) return fsc_error(FSC_ERR_NOMEM, "LoRA: out of memory");
    int rc = walk(root, &c, other, hits, &n);
    for (int k = 0; !rc && !c.partial && k < c.ntargets; k++)
        if (!hits[k])
            rc = fsc_error(FSC_ERR_INVALID, "LoRA: target module '%s' names no Linear of the model",
                           c.targets[k]);
    free(hits);
    if (adapted) *adapted = n;
    return rc;
}

static int merge(fsc_module *m) {
    int merged = 0;
    if (m->ops == &lora_ops) {
        const lora_settings *st = settings_of(m);
        const float *A = m->children[CHILD_A]->params[0].data; /* (r, in) */
        const float *B = m->children[CHILD_B]->params[0].data; /* (out, r) */
        float *W = m->params[0].data;
        if (!A || !B || !W)
            return fsc_error(FSC_ERR_INVALID, "LoRA merge: %s has unbound parameters", m->name);
        for (int o = 0; o < st->out; o++)
            for (int i = 0; i < st->in; i++) {
                double acc = 0;
                for (int k = 0; k < st->rank; k++)
                    acc += (double)B[(size_t)o * st->rank + k] * A[(size_t)k * st->in + i];
                size_t at = st->layout == FSC_WEIGHT_IN_OUT ? (size_t)i * st->out + o
                                                            : (size_t)o * st->in + i;
                W[at] += (float)(st->scale * acc);
            }
        return 1;
    }
    for (int i = 0; i < m->nchildren; i++) {
        int rc = merge(m->children[i]);
        if (rc < 0) return rc;
        merged += rc;
    }
    return merged;
}

int fsc_lora_merge(fsc_module *root) {
    if (!root) return fsc_error(FSC_ERR_INVALID, "LoRA merge: root must not be NULL");
    return merge(root);
}
