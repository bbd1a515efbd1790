/* Choosing FSDP units for the caller. By size: FairScale's
 * default_auto_wrap_policy (size_based_auto_wrap_policy in PyTorch), where a
 * module becomes a unit once the parameters below it that no unit claimed
 * reach min_num_params. By kind: FairScale's config_auto_wrap_policy with a
 * module class (transformer_auto_wrap_policy in PyTorch), where a kind is
 * the name in fsc_module_ops.kind; a LLaMA or a GPT-2 is then wrapped one
 * unit per decoder layer ("TransformerBlock") without listing the units. */
#include <stdlib.h>
#include <string.h>

#include "fsc/fsdp.h"

typedef struct {
    fsc_module **m;
    int n, cap;
} unit_list;

static int push(unit_list *l, fsc_module *m, const char *who) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        void *p = realloc(l->m, (size_t)cap * sizeof *l->m);
        if (!p) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", who);
        l->m = p, l->cap = cap;
    }
    l->m[l->n++] = m;
    return FSC_OK;
}

/* ---- by size ---- */

/* Parameters under m that no unit below claimed; m itself becomes a unit
 * (and claims them) when they reach min. */
static int64_t wrap_visit(fsc_module *m, bool is_root, int64_t min, unit_list *l, int *rc) {
    int64_t unclaimed = 0;
    for (int i = 0; i < m->nparams; i++) unclaimed += m->params[i].numel;
    for (int c = 0; c < m->nchildren && !*rc; c++)
        unclaimed += wrap_visit(m->children[c], false, min, l, rc);
    if (*rc || is_root || unclaimed < min || m->params_used_by_parent) return unclaimed;
    *rc = push(l, m, "FSDP auto-wrap");
    return 0;
}

int fsc_fsdp_auto_wrap(fsc_module *root, int64_t min_num_params, fsc_module ***units, int *n) {
    if (!root || !units || !n)
        return fsc_error(FSC_ERR_INVALID, "FSDP auto-wrap: root, units and n must not be NULL");
    if (min_num_params < 1)
        return fsc_error(FSC_ERR_INVALID, "FSDP auto-wrap: min_num_params %lld must be >= 1",
                         (long long)min_num_params);
    unit_list l = {0};
    int rc = FSC_OK;
    wrap_visit(root, true, min_num_params, &l, &rc);
    if (rc) {
        free(l.m);
        return rc;
    }
    *units = l.m, *n = l.n;
    return FSC_OK;
}

/* ---- by kind ---- */

/* Outermost matches only: a unit's submodules belong to it. */
static int visit(fsc_module *m, bool is_root, const char *kind, unit_list *l) {
    if (!is_root && !m->params_used_by_parent && m->ops && m->ops->kind &&
        !strcmp(m->ops->kind, kind))
        return push(l, m, "FSDP wrap by kind");
    for (int c = 0; c < m->nchildren; c++) {
        int rc = visit(m->children[c], false, kind, l);
        if (rc) return rc;
    }
    return FSC_OK;
}

int fsc_fsdp_wrap_kind(fsc_module *root, const char *kind, fsc_module ***units, int *n) {
    if (!root || !kind || !units || !n)
        return fsc_error(FSC_ERR_INVALID, "FSDP wrap by kind: root, kind, units and n must not "
                                          "be NULL");
    *units = NULL, *n = 0;
    unit_list l = {0};
    int rc = visit(root, true, kind, &l);
    if (!rc && l.n == 0)
        rc = fsc_error(FSC_ERR_INVALID,
                       "FSDP wrap by kind: no submodule of '%s' (%s) is a %s (kinds are "
                       "fsc_module_ops.kind: TransformerBlock for a GPT-2 or LLaMA layer)",
                       root->name, root->ops ? root->ops->kind : "?", kind);
    if (rc) {
        free(l.m);
        return rc;
    }
    *units = l.m, *n = l.n;
    return FSC_OK;
}
