/* Fine-tuning on a layout: the plan's freeze patterns applied to every
 * model it makes. The patterns are checked once against the one-process
 * model's names, since a pipeline stage or a TP slice holds only part of
 * them (a pattern may rightly match nothing on one stage). */
#include "gpt_layout_internal.h"

int gpt_layout_finetune(const fsc_gpt_plan *p, fsc_module *m, bool whole) {
    const fsc_gpt_layout *l = &p->layout;
    if (!m || l->nfreeze == 0) return FSC_OK;
    int rc = fsc_module_freeze(m, l->freeze, l->nfreeze, whole, NULL);
    return rc ? fsc_error_context(rc, "--freeze: ") : FSC_OK;
}

int gpt_layout_finetune_check(const fsc_gpt_plan *p) {
    if (p->layout.nfreeze == 0) return FSC_OK;
    fsc_module *whole = fsc_gpt_new(&p->cfg); /* a tree of names, no storage */
    if (!whole) return FSC_ERR_INVALID;
    int rc = gpt_layout_finetune(p, whole, true);
    fsc_module_free(whole);
    return rc;
}
