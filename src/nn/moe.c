/* The MoE MLP (fsc/moe.h): gate, top-2 routing, dispatch to the experts,
 * combine. Tokens move through one buffer layout, (E, B, cap, C): expert e's
 * slots for each row, so the experts of rank p are one contiguous chunk and
 * an all-to-all of that buffer is the dispatch. After it, rank r holds
 * (P sources, El experts, B*cap, C); each local expert runs once over its
 * P*B*cap slots (empty slots are zero rows: they cost compute, as GShard's
 * padding does, and add exactly zero to every gradient). Combine is the
 * same exchange backwards, and backward sends the output gradients and
 * receives the input gradients through the same two exchanges. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "layers_internal.h"
#include "llama_internal.h"
#include "moe_internal.h"

typedef struct {
    fsc_module base;
    int C, E, P, rank, El; /* El = E / P experts on this rank */
    fsc_moe_options opt;
    fsc_module *gate, *drop;
    fsc_module **experts; /* El of them, children of "experts" */
    double loss_norm;     /* 0: the tokens of each call */
    fsc_moe_stats stats;
} moe;

typedef struct {
    fsc_tensor x;
    moe_route route;
    void *gate, *drop, **experts;
    float *out; /* (E, B, cap, C): every expert's output for this rank's slots */
} moe_saved;

static const fsc_module_ops moe_ops;

/* Sends the (E, B*cap, C) buffer `in` to the experts' ranks; `out` gets
 * (El, P*B*cap, C), expert-major (back == false); or the reverse. */
static int exchange(moe *m, const float *in, float *out, int64_t slots, fsc_arena *a, bool back) {
    const int64_t C = m->C, chunk = (int64_t)m->El * slots * C; /* floats to each rank */
    if (m->P <= 1) {
        memcpy(out, in, sizeof(float) * (size_t)chunk);
        return FSC_OK;
    }
    float *tmp = fsc_arena_alloc(a, sizeof(float) * (size_t)(chunk * m->P));
    if (!tmp) return FSC_ERR_NOMEM;
    const float *src = in;
    if (back) { /* (El, P, slots, C) -> (P, El, slots, C) */
        for (int p = 0; p < m->P; p++)
            for (int e = 0; e < m->El; e++)
                memcpy(tmp + ((int64_t)p * m->El + e) * slots * C,
                       in + ((int64_t)e * m->P + p) * slots * C,
                       sizeof(float) * (size_t)(slots * C));
        src = tmp;
    }
    float *dst = back ? out : tmp;
    double t0 = fsc_now();
    int rc = m->opt.ep.alltoall(m->opt.ep.user, src, dst, chunk);
    m->stats.exchange_s += fsc_now() - t0;
    m->stats.exchanges++;
    m->stats.exchange_bytes += chunk * m->P * (int64_t)sizeof(float);
    if (rc || back) return rc;
    for (int p = 0; p < m->P; p++) /* (P, El, slots, C) -> (El, P, slots, C) */
        for (int e = 0; e < m->El; e++)
            memcpy(out + ((int64_t)e * m->P + p) * slots * C,
                   tmp + ((int64_t)p * m->El + e) * slots * C, sizeof(float) * (size_t)(slots * C));
    return FSC_OK;
}

/* Slot of choice (e, loc) of token t in the (E, B, cap, C) layout. */
static inline int64_t slot(const moe_route *r, int64_t t, int32_t e, int32_t loc) {
    return ((int64_t)e * r->B + t / r->T) * r->cap + loc;
}

static int moe_forward(fsc_module *mod, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    moe *m = (moe *)mod;
    if (x->dtype != FSC_DTYPE_F32 || x->ndim != 3 || x->shape[2] != m->C)
        return fsc_error(FSC_ERR_SHAPE, "%s (MoE): expected f32 (B,T,%d) input", mod->name, m->C);
    const int B = (int)x->shape[0], T = (int)x->shape[1], C = m->C, E = m->E;
    const int64_t N = (int64_t)B * T;
    moe_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    s->x = *x;
    s->experts = fsc_arena_alloc(ctx->arena, sizeof(void *) * (size_t)m->El);
    fsc_ctx fp32 = *ctx;
    fp32.autocast = FSC_DTYPE_F32; /* gating is fp32 whatever the GEMMs run in */
    fsc_tensor logits;
    int rc = s->experts ? fsc_module_forward(m->gate, &fp32, x, &logits, &s->gate) : FSC_ERR_NOMEM;
    const int cap = moe_capacity(m->opt.capacity_factor, T, E);
    if (!rc) rc = moe_route_forward(&s->route, logits.data, B, T, E, cap, ctx->arena);
    if (rc) return rc;
    const moe_route *r = &s->route;
    const int64_t slots = (int64_t)B * cap, all = (int64_t)E * slots * C;
    /* xin (the experts' saved input) and out live until backward; the
     * send-side buffers are given back as soon as their exchange is done */
    float *xin = fsc_arena_alloc(ctx->arena, sizeof(float) * (size_t)all);
    s->out = fsc_arena_alloc(ctx->arena, sizeof(float) * (size_t)all);
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    float *disp = fsc_arena_calloc(ctx->arena, sizeof(float) * (size_t)all);
    if (!xin || !s->out || !disp) return FSC_ERR_NOMEM;
    const float *xd = x->data;
    for (int64_t t = 0; t < N; t++) {
        if (r->loc1[t] >= 0)
            memcpy(disp + slot(r, t, r->e1[t], r->loc1[t]) * C, xd + t * C, sizeof(float) * C);
        if (r->loc2[t] >= 0)
            memcpy(disp + slot(r, t, r->e2[t], r->loc2[t]) * C, xd + t * C, sizeof(float) * C);
    }
    if ((rc = exchange(m, disp, xin, slots, ctx->arena, false))) return rc;
    fsc_arena_release(ctx->arena, mark);
    const int64_t rows = (int64_t)m->P * slots; /* per local expert */
    fsc_tensor *outs = fsc_arena_alloc(ctx->arena, sizeof(fsc_tensor) * (size_t)m->El);
    if (!outs) return FSC_ERR_NOMEM;
    for (int e = 0; e < m->El; e++) {
        fsc_tensor in = fsc_tensor_2d(xin + e * rows * C, FSC_DTYPE_F32, rows, C);
        if ((rc = fsc_module_forward(m->experts[e], ctx, &in, &outs[e], &s->experts[e]))) return rc;
    }
    mark = fsc_arena_mark(ctx->arena);
    float *yout = fsc_arena_alloc(ctx->arena, sizeof(float) * (size_t)all);
    if (!yout) return FSC_ERR_NOMEM;
    for (int e = 0; e < m->El; e++)
        memcpy(yout + e * rows * C, outs[e].data, sizeof(float) * (size_t)(rows * C));
    if ((rc = exchange(m, yout, s->out, slots, ctx->arena, true))) return rc;
    fsc_arena_release(ctx->arena, mark);
    fsc_tensor comb;
    if ((rc = fsc_alloc_like(ctx->arena, x, C, &comb))) return rc;
    float *yc = comb.data;
    for (int64_t t = 0; t < N; t++) {
        float *yt = yc + t * C;
        memset(yt, 0, sizeof(float) * C);
        if (r->loc1[t] >= 0) {
            const float *o = s->out + slot(r, t, r->e1[t], r->loc1[t]) * C;
            for (int c = 0; c < C; c++) yt[c] += r->c1[t] * o[c];
        }
        if (r->loc2[t] >= 0) {
            const float *o = s->out + slot(r, t, r->e2[t], r->loc2[t]) * C;
            for (int c = 0; c < C; c++) yt[c] += r->c2[t] * o[c];
        }
    }
    if ((rc = fsc_module_forward(m->drop, ctx, &comb, y, &s->drop))) return rc;
    if (ctx->training && !ctx->recompute) {
        m->stats.tokens += N, m->stats.rows += B;
        m->stats.dropped1 += r->dropped1, m->stats.dropped2 += r->dropped2;
        m->stats.aux_sum += r->aux_sum;
    }
    *saved = s;
    return FSC_OK;
}

/* Gives back the backward's buffers from mark m on, unless weight gradients
 * are deferred (a zero-bubble W pass): their records, and the dY and
 * activations they point at, stay in the arena until W runs. */
static void give_back(const fsc_ctx *ctx, fsc_arena_mark_t m) {
    if (!ctx->defer) fsc_arena_release(ctx->arena, m);
}

static int moe_backward(fsc_module *mod, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    moe *m = (moe *)mod;
    moe_saved *s = saved;
    int rc = fsc_check_saved(mod, saved);
    if (!rc) rc = fsc_check_dy_like(mod, dy, &s->x, m->C);
    if (rc) return rc;
    const moe_route *r = &s->route;
    const int C = m->C, E = m->E;
    const int64_t N = (int64_t)r->B * r->T, slots = (int64_t)r->B * r->cap;
    const int64_t all = (int64_t)E * slots * C, rows = (int64_t)m->P * slots;
    /* Buffers live only as long as backward reads them (arena marks): ddisp,
     * dc and dlogits until the gate's backward; dyin and dxout through the
     * experts'; the combine's gradient and the send-side buffers until
     * their exchange is done; each expert's temporaries until its input
     * gradient is copied out. */
    float *ddisp = fsc_arena_alloc(ctx->arena, sizeof(float) * (size_t)all);
    float *dc = fsc_arena_alloc(ctx->arena, sizeof(float) * (size_t)(2 * N));
    float *dlogits = fsc_arena_alloc(ctx->arena, sizeof(float) * (size_t)(N * E));
    if (!ddisp || !dc || !dlogits) return FSC_ERR_NOMEM;
    const fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    float *dyin = fsc_arena_alloc(ctx->arena, sizeof(float) * (size_t)all);
    float *dxout = fsc_arena_alloc(ctx->arena, sizeof(float) * (size_t)all);
    if (!dyin || !dxout) return FSC_ERR_NOMEM;
    const fsc_arena_mark_t inner = fsc_arena_mark(ctx->arena);
    fsc_tensor dcomb;
    if ((rc = fsc_module_backward(m->drop, ctx, s->drop, dy, &dcomb))) return rc;
    float *dout = fsc_arena_calloc(ctx->arena, sizeof(float) * (size_t)all);
    if (!dout) return FSC_ERR_NOMEM;
    const float *dz = dcomb.data;
    for (int64_t t = 0; t < N; t++) { /* y_t = c1 o1 + c2 o2 */
        const float *dzt = dz + t * C;
        const int32_t e[2] = {r->e1[t], r->e2[t]}, loc[2] = {r->loc1[t], r->loc2[t]};
        const float cw[2] = {r->c1[t], r->c2[t]};
        for (int k = 0; k < 2; k++) {
            double dot = 0;
            if (loc[k] >= 0) {
                const int64_t at = slot(r, t, e[k], loc[k]) * C;
                for (int c = 0; c < C; c++) {
                    dot += (double)dzt[c] * s->out[at + c];
                    dout[at + c] = cw[k] * dzt[c];
                }
            }
            dc[k * N + t] = (float)dot;
        }
    }
    if ((rc = exchange(m, dout, dyin, slots, ctx->arena, false))) return rc;
    give_back(ctx, inner);
    for (int e = 0; e < m->El; e++) {
        fsc_tensor d = fsc_tensor_2d(dyin + e * rows * C, FSC_DTYPE_F32, rows, C), di;
        if ((rc = fsc_module_backward(m->experts[e], ctx, s->experts[e], &d, &di))) return rc;
        memcpy(dxout + e * rows * C, di.data, sizeof(float) * (size_t)(rows * C));
        give_back(ctx, inner);
    }
    if ((rc = exchange(m, dxout, ddisp, slots, ctx->arena, true))) return rc;
    give_back(ctx, mark);
    /* the gate: routing gradients, then its Linear (fp32) */
    const double norm = m->loss_norm > 0 ? m->loss_norm : (double)N;
    const float aux_scale = ctx->training ? (float)(m->opt.aux_coef * r->T / norm) : 0.f;
    moe_route_backward(dlogits, r, dc, dc + N, aux_scale);
    fsc_ctx fp32 = *ctx;
    fp32.autocast = FSC_DTYPE_F32;
    fsc_tensor dl = fsc_tensor_make(dlogits, FSC_DTYPE_F32, 3, (int64_t[]){r->B, r->T, E}), dg;
    if ((rc = fsc_module_backward(m->gate, &fp32, s->gate, &dl, dx ? &dg : NULL))) return rc;
    if (!dx) return FSC_OK;
    *dx = dg; /* the gate's input gradient, plus each kept choice's slot */
    float *dxd = dx->data;
    for (int64_t t = 0; t < N; t++) {
        if (r->loc1[t] >= 0)
            fsc_add_inplace(dxd + t * C, ddisp + slot(r, t, r->e1[t], r->loc1[t]) * C, C);
        if (r->loc2[t] >= 0)
            fsc_add_inplace(dxd + t * C, ddisp + slot(r, t, r->e2[t], r->loc2[t]) * C, C);
    }
    return FSC_OK;
}

static void moe_free(fsc_module *mod) {
    moe *m = (moe *)mod;
    free(m->experts);
    free(m);
}

static const fsc_module_ops moe_ops = {"MoE", moe_forward, moe_backward, moe_free};
static const fsc_module_ops experts_ops = {"Experts", NULL, NULL, NULL};

int fsc_moe_check(const fsc_moe_options *o) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "MoE: options are NULL");
    const int P = o->ep.ranks > 1 ? o->ep.ranks : 1;
    if (o->experts < 2)
        return fsc_error(FSC_ERR_INVALID, "MoE: experts %d must be >= 2", o->experts);
    if (o->every < 0)
        return fsc_error(FSC_ERR_INVALID, "MoE: every %d must be >= 1 (0: 1)", o->every);
    if (!(o->capacity_factor >= 0) || !isfinite(o->capacity_factor))
        return fsc_error(FSC_ERR_INVALID, "MoE: capacity factor %g must be a finite number > 0",
                         (double)o->capacity_factor);
    if (!(o->aux_coef >= 0) || !isfinite(o->aux_coef))
        return fsc_error(FSC_ERR_INVALID, "MoE: aux_coef %g must be finite and >= 0",
                         (double)o->aux_coef);
    if (o->hidden < 0) return fsc_error(FSC_ERR_INVALID, "MoE: hidden %d must be >= 0", o->hidden);
    if (o->expert != FSC_MOE_EXPERT_GPT2 && o->expert != FSC_MOE_EXPERT_SWIGLU)
        return fsc_error(FSC_ERR_INVALID, "MoE: expert kind %d is neither GPT-2 (0) nor SwiGLU (1)",
                         (int)o->expert);
    if (o->experts % P)
        return fsc_error(FSC_ERR_INVALID,
                         "MoE: %d experts do not divide evenly over %d expert-parallel ranks",
                         o->experts, P);
    if (P > 1 && (o->ep.rank < 0 || o->ep.rank >= P || !o->ep.alltoall))
        return fsc_error(FSC_ERR_INVALID,
                         "MoE: expert-parallel rank %d outside [0, %d) or no alltoall", o->ep.rank,
                         P);
    return FSC_OK;
}

/* Expert e of kind `kind`: GPT-2's c_fc (C->H), GELU, c_proj (H->C) in the
 * Conv1D layout; or Mixtral's SwiGLU, the LLaMA MLP's own module over
 * nn.Linears w1 (gate) and w3 (up), C->H, and w2 (down), H->C. */
static fsc_module *expert_new(fsc_moe_expert kind, int e, int C, int H, float init_std,
                              float proj_std) {
    char name[16];
    snprintf(name, sizeof name, "%d", e);
    if (kind == FSC_MOE_EXPERT_SWIGLU)
        return llama_gated_mlp_new(name, C, H,
                                   fsc_linear_new("w1", C, H, false, FSC_WEIGHT_OUT_IN, init_std),
                                   fsc_linear_new("w3", C, H, false, FSC_WEIGHT_OUT_IN, init_std),
                                   fsc_linear_new("w2", H, C, false, FSC_WEIGHT_OUT_IN, proj_std));
    fsc_module *parts[3] = {fsc_linear_new("c_fc", C, H, true, FSC_WEIGHT_IN_OUT, init_std),
                            fsc_gelu_new("act"),
                            fsc_linear_new("c_proj", H, C, true, FSC_WEIGHT_IN_OUT, proj_std)};
    if (!parts[0] || !parts[1] || !parts[2]) {
        for (int i = 0; i < 3; i++) fsc_module_free(parts[i]);
        return NULL;
    }
    return fsc_sequential_new(name, 3, parts);
}

static void mark_expert(fsc_module *m) {
    for (int i = 0; i < m->nparams; i++) m->params[i].expert = true;
    for (int c = 0; c < m->nchildren; c++) mark_expert(m->children[c]);
}

fsc_module *fsc_moe_new(const char *name, int C, const fsc_moe_options *opt, float dropout,
                        uint32_t layer_id, float init_std, float proj_std) {
    if (fsc_moe_check(opt)) return NULL;
    if (C <= 0) {
        fsc_error(FSC_ERR_INVALID, "MoE %s: d_model %d must be positive", name, C);
        return NULL;
    }
    moe *m = fsc_module_alloc(sizeof *m, &moe_ops, name);
    if (!m) return NULL;
    m->opt = *opt;
    if (!(m->opt.capacity_factor > 0)) m->opt.capacity_factor = 2.0f;
    m->C = C, m->E = opt->experts, m->P = opt->ep.ranks > 1 ? opt->ep.ranks : 1;
    m->rank = m->P > 1 ? opt->ep.rank : 0, m->El = m->E / m->P;
    const int H = opt->hidden ? opt->hidden : 4 * C;
    m->opt.hidden = H;
    m->experts = calloc((size_t)m->El, sizeof *m->experts);
    fsc_module *experts = fsc_module_alloc(sizeof(fsc_module), &experts_ops, "experts");
    m->gate = fsc_linear_new("gate", C, m->E, false, FSC_WEIGHT_OUT_IN, init_std);
    m->drop = fsc_dropout_new("dropout", dropout, layer_id);
    int rc = m->experts && experts ? FSC_OK : FSC_ERR_NOMEM;
    for (int e = 0; !rc && e < m->El; e++) {
        m->experts[e] = expert_new(opt->expert, m->rank * m->El + e, C, H, init_std, proj_std);
        rc = m->experts[e] ? fsc_module_add_child(experts, m->experts[e]) : FSC_ERR_INVALID;
        if (rc && m->experts[e]) fsc_module_free(m->experts[e]);
    }
    /* children in forward order: gate, experts, dropout */
    fsc_module *kids[3] = {m->gate, experts, m->drop};
    for (int i = 0; i < 3; i++) {
        if (!rc) rc = kids[i] ? fsc_module_add_child(&m->base, kids[i]) : FSC_ERR_INVALID;
        if (rc) fsc_module_free(kids[i]);
    }
    if (rc) {
        m->gate = m->drop = NULL;
        fsc_module_free(&m->base);
        return NULL;
    }
    if (m->P > 1) mark_expert(experts);
    return &m->base;
}

int moe_refuse(const fsc_moe_options *o, const char *who) {
    if (!o || !o->experts) return FSC_OK;
    return fsc_error(FSC_ERR_UNSUPPORTED,
                     "%s builds dense MLPs only, but cfg->moe asks for %d experts (Mixture of "
                     "Experts runs in the whole model, fsc_gpt_new, under ddp or single)",
                     who, o->experts);
}

bool fsc_moe_is(const fsc_module *m) {
    return m && m->ops == &moe_ops;
}

const fsc_moe_options *moe_options(const fsc_module *m) {
    return fsc_moe_is(m) ? &((const moe *)m)->opt : NULL;
}

int fsc_moe_ep_size(const fsc_module *root) {
    if (!root) return 0;
    if (root->wraps) return fsc_moe_ep_size(root->wraps);
    if (fsc_moe_is(root)) return ((const moe *)root)->P;
    int n = 0;
    for (int c = 0; !n && c < root->nchildren; c++) n = fsc_moe_ep_size(root->children[c]);
    return n;
}

void fsc_moe_set_loss_norm(fsc_module *root, double norm) {
    if (!root) return;
    if (root->wraps) fsc_moe_set_loss_norm(root->wraps, norm);
    if (fsc_moe_is(root)) ((moe *)root)->loss_norm = norm > 0 ? norm : 0;
    for (int c = 0; c < root->nchildren; c++) fsc_moe_set_loss_norm(root->children[c], norm);
}

static void add_stats(const fsc_module *root, fsc_moe_stats *st) {
    if (fsc_moe_is(root)) {
        const fsc_moe_stats *s = &((const moe *)root)->stats;
        st->tokens += s->tokens, st->dropped1 += s->dropped1, st->dropped2 += s->dropped2;
        st->rows += s->rows, st->aux_sum += s->aux_sum, st->exchange_s += s->exchange_s;
        st->exchanges += s->exchanges, st->exchange_bytes += s->exchange_bytes;
    }
    for (int c = 0; c < root->nchildren; c++) add_stats(root->children[c], st);
}

fsc_moe_stats fsc_moe_get_stats(const fsc_module *root) {
    fsc_moe_stats st = {0};
    if (root) add_stats(root->wraps ? root->wraps : root, &st);
    return st;
}

void fsc_moe_reset_stats(fsc_module *root) {
    if (!root) return;
    if (root->wraps) fsc_moe_reset_stats(root->wraps);
    if (fsc_moe_is(root)) ((moe *)root)->stats = (fsc_moe_stats){0};
    for (int c = 0; c < root->nchildren; c++) fsc_moe_reset_stats(root->children[c]);
}
