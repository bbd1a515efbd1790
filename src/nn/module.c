/* The module contract: declaration of parameters and children, hook dispatch,
 * and the forward/backward entry points every container calls its children
 * through (so hooks fire at every level: docs/architecture.md, decision 4).
 *
 * The entry points also turn a new user's crashes into messages: a NULL ctx
 * or arena, and parameter views that were never bound. The view test is per
 * module (its own parameters, and those of children it reads directly), not
 * one walk of the tree at the outermost call, because FSDP binds a unit's
 * views in that unit's pre-forward hook: only there, just before the module
 * computes, is "unbound" a mistake. Every parameter is still tested once per
 * pass, a pointer compare against a kernel call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "fsc/nn.h"
#include "fsc/profile.h"

void fsc_module_init(fsc_module *m, const fsc_module_ops *ops, const char *name) {
    memset(m, 0, sizeof *m);
    m->ops = ops;
    snprintf(m->name, sizeof m->name, "%s", name ? name : "");
}

/* A module's lists (params, children) start at 4 entries. */
#define GROW(p, cap, need) FSC_GROW_ARRAY(p, cap, need, 4, "out of memory growing a module")

int fsc_module_add_param(fsc_module *m, const char *name, int ndim, const int64_t *shape,
                         fsc_init_kind init, float init_std) {
    if (ndim < 1 || ndim > FSC_MAX_DIMS)
        return fsc_error(FSC_ERR_INVALID, "parameter %s.%s: %d dims (1..%d allowed)", m->name, name,
                         ndim, FSC_MAX_DIMS);
    int rc = GROW(m->params, &m->cap_params, m->nparams + 1);
    if (rc) return rc;
    fsc_param *p = &m->params[m->nparams];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return fsc_error(FSC_ERR_INVALID, "parameter %s.%s: dim %d is %lld", m->name, name, i,
                             (long long)shape[i]);
        p->shape[i] = shape[i];
        p->numel *= shape[i];
    }
    p->init = init;
    p->init_std = init_std;
    p->weight_decay = ndim >= 2;
    return m->nparams++;
}

int fsc_module_add_child(fsc_module *m, fsc_module *child) {
    if (!child) return fsc_error(FSC_ERR_INVALID, "module %s: NULL child", m->name);
    int rc = GROW(m->children, &m->cap_children, m->nchildren + 1);
    if (rc) return rc;
    m->children[m->nchildren++] = child;
    child->parent = m;
    return FSC_OK;
}

int fsc_module_add_hook(fsc_module *m, fsc_hook_kind kind, fsc_hook_fn fn, void *user) {
    if ((unsigned)kind >= FSC_HOOK_KIND_COUNT || !fn)
        return fsc_error(FSC_ERR_INVALID, "module %s: bad hook", m->name);
    if (m->nhooks[kind] == FSC_MAX_HOOKS)
        return fsc_error(FSC_ERR_INVALID, "module %s: more than %d hooks of one kind", m->name,
                         FSC_MAX_HOOKS);
    m->hooks[kind][m->nhooks[kind]].fn = fn;
    m->hooks[kind][m->nhooks[kind]++].user = user;
    return FSC_OK;
}

void fsc_module_remove_hook(fsc_module *m, fsc_hook_kind kind, fsc_hook_fn fn, void *user) {
    if ((unsigned)kind >= FSC_HOOK_KIND_COUNT) return;
    int k = 0;
    for (int i = 0; i < m->nhooks[kind]; i++)
        if (m->hooks[kind][i].fn != fn || m->hooks[kind][i].user != user)
            m->hooks[kind][k++] = m->hooks[kind][i];
    m->nhooks[kind] = k;
}

static int run_hooks(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx, const fsc_tensor *t) {
    for (int i = 0; i < m->nhooks[kind]; i++) {
        int rc = m->hooks[kind][i].fn(m, kind, ctx, t, m->hooks[kind][i].user);
        if (rc) return rc;
    }
    return FSC_OK;
}

const char *fsc_module_path(const fsc_module *m, char *buf, size_t size) {
    if (!buf || !size) return buf;
    if (!m) {
        snprintf(buf, size, "(null)");
        return buf;
    }
    enum { DEPTH = 64 }; /* deeper trees keep their innermost 64 names */
    const fsc_module *chain[DEPTH];
    int n = 0;
    for (const fsc_module *a = m; a && n < DEPTH; a = a->parent) chain[n++] = a;
    if (n > 1 && !chain[n - 1]->parent) n--; /* the root's name is not part of paths */
    size_t at = 0;
    buf[0] = '\0';
    for (int i = n - 1; i >= 0 && at + 1 < size; i--) {
        if (!chain[i]->name[0]) continue;
        int w = snprintf(buf + at, size - at, "%s%s", at ? "." : "", chain[i]->name);
        if (w < 0) break;
        at += (size_t)w < size - at ? (size_t)w : size - at - 1;
    }
    return buf;
}

static const char *kind_of(const fsc_module *m) {
    return m->ops && m->ops->kind ? m->ops->kind : "?";
}

/* "(2,8,32)" */
static const char *shape_str(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (at < size) snprintf(buf + at, size - at, ")");
    return buf;
}

int fsc_module_check_dy(const fsc_module *m, const fsc_tensor *dy, int ndim, const int64_t *shape) {
    if (!m || !dy)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_module_check_dy: the module and dy must not be NULL");
    bool ok = dy->dtype == FSC_DTYPE_F32 && dy->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = dy->shape[i] == shape[i];
    if (ok) return FSC_OK;
    char path[FSC_NAME_MAX * 2], want[96], got[96];
    int gd = dy->ndim < 0 ? 0 : dy->ndim > FSC_MAX_DIMS ? FSC_MAX_DIMS : dy->ndim;
    return fsc_error(FSC_ERR_SHAPE,
                     "module '%s' (%s): output gradient dy is %s %s, expected F32 %s (the "
                     "output its forward produced)",
                     fsc_module_path(m, path, sizeof path), kind_of(m), fsc_dtype_name(dy->dtype),
                     shape_str(got, sizeof got, gd, dy->shape),
                     shape_str(want, sizeof want, ndim, shape));
}

/* The arguments every call needs, so a missing one is a message, not a crash. */
static int check_call(const fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *in,
                      const void *out, bool fwd) {
    const char *call = fwd ? "forward" : "backward";
    if (!m || !m->ops || !m->ops->forward)
        return fsc_error(FSC_ERR_INVALID, "fsc_module_%s: %s", call,
                         m ? "the module has no ops (fsc_module_init not called?)"
                           : "the module is NULL");
    char path[FSC_NAME_MAX * 2];
    const char *what = !ctx          ? "ctx is NULL"
                       : !ctx->arena ? "ctx->arena is NULL; outputs and saved state are "
                                       "allocated from it (create one with fsc_arena_new)"
                       : !in         ? (fwd ? "x is NULL" : "dy is NULL")
                       : !out && fwd ? "y is NULL"
                                     : NULL;
    if (!what && ctx->autocast != FSC_DTYPE_F32 && ctx->autocast != FSC_DTYPE_BF16)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "module '%s' (%s): %s: ctx->autocast %s: fsc computes GEMMs in F32 or "
                         "BF16 only (oneDNN has fp16 matmul kernels only on CPUs with "
                         "avx512_fp16; fp16 mixed precision rounds parameters, not GEMM inputs)",
                         fsc_module_path(m, path, sizeof path), kind_of(m), call,
                         fsc_dtype_name(ctx->autocast));
    if (!what) return FSC_OK;
    return fsc_error(FSC_ERR_INVALID, "module '%s' (%s): %s: %s",
                     fsc_module_path(m, path, sizeof path), kind_of(m), call, what);
}

static int params_bound(const fsc_module *owner, bool grads) {
    for (int i = 0; i < owner->nparams; i++) {
        const fsc_param *p = &owner->params[i];
        if (p->data && (!grads || p->grad || p->frozen)) continue; /* frozen: no gradient */
        char path[FSC_NAME_MAX * 2];
        fsc_module_path(owner, path, sizeof path);
        if (!p->data)
            return fsc_error(FSC_ERR_INVALID,
                             "module '%s' (%s): parameter '%s' is not bound; call "
                             "fsc_params_bind first (under FSDP: run the model from its root)",
                             path, kind_of(owner), p->name);
        return fsc_error(FSC_ERR_INVALID,
                         "module '%s' (%s): the gradient of parameter '%s' is not bound; bind "
                         "parameters with gradients (fsc_params_bind with with_grads) before "
                         "backward",
                         path, kind_of(owner), p->name);
    }
    return FSC_OK;
}

/* What m's op reads: its own parameters, and those of children it uses
 * itself (GPT's wte and wpe), whose own forward never runs. */
static int check_bound(const fsc_module *m, bool grads) {
    int rc = params_bound(m, grads);
    for (int c = 0; !rc && c < m->nchildren; c++)
        if (m->children[c]->params_used_by_parent) rc = params_bound(m->children[c], grads);
    return rc;
}

/* The profiler's span of one module call: the op is the kind and direction,
 * the detail the module's path (the memory rows' key), and the arena's
 * bytes in use before and after are what the call kept. */
static void prof_begin(const fsc_module *m, const fsc_ctx *ctx, bool forward) {
    const char *kind = m->ops->kind;
    fsc_prof_cat cat = strstr(kind, "Attention") ? FSC_PROF_ATTENTION : FSC_PROF_OTHER;
    static const char *const elementwise[] = {"Norm", "GELU", "ReLU", "Dropout", "Embedding"};
    for (size_t i = 0; i < sizeof elementwise / sizeof *elementwise; i++)
        if (strstr(kind, elementwise[i])) cat = FSC_PROF_ELEMENTWISE;
    char path[FSC_NAME_MAX * 2], name[FSC_NAME_MAX + 32];
    fsc_module_path(m, path, sizeof path);
    snprintf(name, sizeof name, "%s %s", kind,
             !forward         ? "backward"
             : ctx->recompute ? "recompute"
                              : "forward");
    fsc_prof_begin_mem(cat, name, path, (int64_t)fsc_arena_used(ctx->arena));
}

static double tensor_bytes(const fsc_tensor *t) {
    return t && t->data ? (double)fsc_tensor_numel(t) * (double)fsc_dtype_size(t->dtype) : 0;
}

static void prof_end(const fsc_ctx *ctx, const fsc_tensor *in, const fsc_tensor *out,
                     bool forward) {
    fsc_prof_end_mem((int64_t)fsc_arena_used(ctx->arena), forward ? 0 : 1,
                     tensor_bytes(in) + tensor_bytes(out));
}

int fsc_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    void *dummy = NULL;
    if (!saved) saved = &dummy;
    *saved = NULL;
    int rc = check_call(m, ctx, x, y, true);
    const bool prof = !rc && fsc_prof_enabled;
    if (prof) prof_begin(m, ctx, true);
    if (!rc) rc = run_hooks(m, FSC_HOOK_PRE_FORWARD, ctx, x);
    if (!rc) rc = check_bound(m, false); /* after the hooks: FSDP binds there */
    if (!rc) rc = m->ops->forward(m, ctx, x, y, saved);
    if (!rc) rc = run_hooks(m, FSC_HOOK_POST_FORWARD, ctx, y);
    if (prof) prof_end(ctx, x, y, true);
    return rc;
}

int fsc_module_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    int rc = check_call(m, ctx, dy, dx, false);
    if (rc) return rc;
    if (!m->ops->backward)
        return fsc_error(FSC_ERR_UNSUPPORTED, "module %s (%s) has no backward", m->name,
                         m->ops->kind);
    const bool prof = fsc_prof_enabled;
    if (prof) prof_begin(m, ctx, false);
    rc = run_hooks(m, FSC_HOOK_PRE_BACKWARD, ctx, dy);
    if (!rc) rc = check_bound(m, true);
    if (!rc) rc = m->ops->backward(m, ctx, saved, dy, dx);
    if (!rc) rc = run_hooks(m, FSC_HOOK_POST_BACKWARD, ctx, dx);
    if (prof) prof_end(ctx, dy, dx, false);
    return rc;
}

void fsc_module_free(fsc_module *m) {
    if (!m) return;
    for (int i = 0; i < m->nchildren; i++) fsc_module_free(m->children[i]);
    free(m->children);
    free(m->params);
    if (m->ops && m->ops->free)
        m->ops->free(m);
    else
        free(m);
}

fsc_tensor fsc_param_tensor(const fsc_param *p) {
    return fsc_tensor_make(p->data, FSC_DTYPE_F32, p->ndim, p->shape);
}

fsc_tensor fsc_param_grad_tensor(const fsc_param *p) {
    return fsc_tensor_make(p->grad, FSC_DTYPE_F32, p->ndim, p->shape);
}
