/* The module contract: declaration of parameters and children, hook dispatch,
 * and the forward/backward entry points every container calls its children
 * through (so hooks fire at every level: DESIGN.md decision 4). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/nn.h"

void fsc_module_init(fsc_module *m, const fsc_module_ops *ops, const char *name) {
    memset(m, 0, sizeof *m);
    m->ops = ops;
    snprintf(m->name, sizeof m->name, "%s", name ? name : "");
}

static int grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return FSC_OK;
    int ncap = *cap ? *cap * 2 : 4;
    while (ncap < need) ncap *= 2;
    void *p = realloc(*arr, (size_t)ncap * elem);
    if (!p) return fsc_error(FSC_ERR_NOMEM, "out of memory growing a module");
    *arr = p;
    *cap = ncap;
    return FSC_OK;
}

int fsc_module_add_param(fsc_module *m, const char *name, int ndim, const int64_t *shape,
                         fsc_init_kind init, float init_std) {
    if (ndim < 1 || ndim > FSC_MAX_DIMS)
        return fsc_error(FSC_ERR_INVALID, "parameter %s.%s: %d dims (1..%d allowed)", m->name, name,
                         ndim, FSC_MAX_DIMS);
    int rc = grow((void **)&m->params, &m->cap_params, m->nparams + 1, sizeof *m->params);
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
    int rc = grow((void **)&m->children, &m->cap_children, m->nchildren + 1, sizeof *m->children);
    if (rc) return rc;
    m->children[m->nchildren++] = child;
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

int fsc_module_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                       void **saved) {
    void *dummy = NULL;
    if (!saved) saved = &dummy;
    *saved = NULL;
    int rc = run_hooks(m, FSC_HOOK_PRE_FORWARD, ctx, x);
    if (!rc) rc = m->ops->forward(m, ctx, x, y, saved);
    if (!rc) rc = run_hooks(m, FSC_HOOK_POST_FORWARD, ctx, y);
    return rc;
}

int fsc_module_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                        fsc_tensor *dx) {
    if (!m->ops->backward)
        return fsc_error(FSC_ERR_UNSUPPORTED, "module %s (%s) has no backward", m->name,
                         m->ops->kind);
    int rc = run_hooks(m, FSC_HOOK_PRE_BACKWARD, ctx, dy);
    if (!rc) rc = m->ops->backward(m, ctx, saved, dy, dx);
    if (!rc) rc = run_hooks(m, FSC_HOOK_POST_BACKWARD, ctx, dx);
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
