/* Fine-tuning on a layout: the plan's LoRA adapters, freeze patterns and
 * optimizer parameter groups applied to every model it makes. Targets and patterns are checked once
 * against the one-process model, since a pipeline stage or a TP slice holds
 * only part of it (a pattern may rightly match nothing on one stage). */
#include "fsc/lora.h"
#include "fsc/tp.h"
#include "gpt_layout_internal.h"

int gpt_layout_finetune(const fsc_gpt_plan *p, fsc_module *m, bool whole) {
    const fsc_gpt_layout *l = &p->layout;
    if (!m) return FSC_OK;
    int rc = FSC_OK;
    if (l->lora) {
        fsc_lora_config c = *l->lora;
        c.partial = !whole; /* a stage holds some of the targets (the embedding's none) */
        /* plain and tensor-parallel Linears alike */
        if ((rc = fsc_tp_lora_apply(m, &c, NULL))) return fsc_error_context(rc, "LoRA: ");
    }
    rc = l->nfreeze ? fsc_module_freeze(m, l->freeze, l->nfreeze, whole, NULL) : FSC_OK;
    if (rc) return fsc_error_context(rc, "--freeze: ");
    for (int g = 0; g < l->ngroups && !rc; g++)
        rc = fsc_module_param_group(m, l->groups[g].pattern, l->groups[g].lr_scale,
                                    l->groups[g].weight_decay, whole, NULL);
    return rc ? fsc_error_context(rc, "--param-group: ") : FSC_OK;
}

int gpt_layout_finetune_check(const fsc_gpt_plan *p) {
    if (p->layout.nfreeze == 0 && !p->layout.lora && p->layout.ngroups == 0) return FSC_OK;
    fsc_module *whole = fsc_gpt_new(&p->cfg); /* a tree of names, no storage */
    if (!whole) return FSC_ERR_INVALID;
    int rc = gpt_layout_finetune(p, whole, true);
    fsc_module_free(whole);
    return rc;
}
