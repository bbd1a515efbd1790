/* LoRA (Hu et al., 2021), as Hugging Face PEFT applies it to a model's
 * Linear layers: y = W x + b + scale * B A dropout(x), with A (r, in) drawn
 * as torch's kaiming_uniform_(a=sqrt(5)) (U(-1/sqrt(in), 1/sqrt(in))), B
 * (out, r) zeros, scale = alpha / r; the base W and b frozen (fsc_param.
 * frozen), A and B trained.
 *
 * The adapters attach to the Linear module itself, so parents that call it
 * through their own pointers (attention's q_proj, the MLP's gate_proj) run
 * it unchanged: its parameters stay "...q_proj.weight" and the adapters add
 * "...q_proj.lora_A.weight" and "...q_proj.lora_B.weight" (PEFT's names
 * under its "base_model.model." prefix). Apply before the parameters are
 * bound or a strategy is built; every layout (DDP, ZeRO, FSDP units, a
 * pipeline's stages) then sees A and B as ordinary parameters. */
#ifndef FSC_LORA_H
#define FSC_LORA_H

#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Zero fields mean the documented default. */
typedef struct fsc_lora_config {
    int rank;      /* r > 0 (no default) */
    float alpha;   /* scale = alpha / r; 0: alpha = r (scale 1) */
    float dropout; /* on the adapter's input, in [0, 1) */
    /* local module names to adapt ("q_proj", "c_attn"), PEFT's
     * target_modules; every Linear of the tree so named is adapted */
    const char *const *targets;
    int ntargets;
    /* dropout masks are keyed by (layer_id xor a hash of the Linear's path,
     * step, sample): 0 means 0x10A0 */
    uint32_t layer_id;
    /* root is part of a model (a pipeline stage): a target may name none
     * of its modules (check the whole model's names once instead) */
    bool partial;
} fsc_lora_config;

/* Attaches adapters to every Linear under root named in cfg->targets and,
 * as PEFT does, freezes every other parameter of the tree (only the
 * adapters train; fsc_module_freeze's effects). FSC_ERR_INVALID for a bad config (rank <= 0,
 * alpha < 0, dropout outside [0, 1), no targets), for a target that names
 * no Linear (naming it), or for a Linear already adapted. *adapted (may be
 * NULL) receives the number of Linears adapted. */
FSC_API int fsc_lora_apply(fsc_module *root, const fsc_lora_config *cfg, int *adapted);

/* Whether m is a Linear with LoRA adapters (fsc_lora_apply). */
FSC_API bool fsc_lora_is_adapted(const fsc_module *m);

/* Merges every adapter under root into its base weight, W += scale * B A
 * (in the base's layout), for export (--lora-merge); the adapters stay and
 * keep their values, so call it on a model that only writes files next.
 * Parameters must be bound (whole tensors: one process). Returns the
 * number of Linears merged, or a negative status. */
FSC_API int fsc_lora_merge(fsc_module *root);

#ifdef __cplusplus
}
#endif
#endif
