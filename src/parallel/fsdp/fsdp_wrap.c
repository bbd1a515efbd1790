/* FSDP units by module kind: FairScale's config_auto_wrap_policy with a
 * module class (transformer_auto_wrap_policy in PyTorch), where a kind is
 * the name in fsc_module_ops.kind. A LLaMA or a GPT-2 is then wrapped one
 * unit per decoder layer ("TransformerBlock") without listing the units. */
#include <stdlib.h>
#include <string.h>

#include "fsc/fsdp.h"

typedef struct {
    fsc_module **m;
    int n, cap;
} kind_list;

/* Outermost matches only: a unit's submodules belong to it. */
static int visit(fsc_module *m, bool is_root, const char *kind, kind_list *l) {
    if (!is_root && !m->params_used_by_parent && m->ops && m->ops->kind &&
        !strcmp(m->ops->kind, kind)) {
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 16;
            void *p = realloc(l->m, (size_t)cap * sizeof *l->m);
            if (!p) return fsc_error(FSC_ERR_NOMEM, "FSDP wrap by kind: out of memory");
            l->m = p, l->cap = cap;
        }
        l->m[l->n++] = m;
        return FSC_OK;
    }
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
    kind_list l = {0};
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
