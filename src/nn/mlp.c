/* GPT-2 MLP: c_fc (C -> 4C), GELU, c_proj (4C -> C), dropout; a Sequential with
 * the Hugging Face child names. */
#include "layers_internal.h"

fsc_module *fsc_mlp_new(const char *name, int C, float dropout, uint32_t layer_id, float init_std,
                        float proj_std) {
    if (C <= 0) {
        fsc_error(FSC_ERR_INVALID, "MLP %s: d_model %d must be positive", name, C);
        return NULL;
    }
    fsc_module *parts[4] = {
        fsc_linear_new("c_fc", C, 4 * C, true, FSC_WEIGHT_IN_OUT, init_std),
        fsc_gelu_new("act"),
        fsc_linear_new("c_proj", 4 * C, C, true, FSC_WEIGHT_IN_OUT, proj_std),
        fsc_dropout_new("dropout", dropout, layer_id),
    };
    for (int i = 0; i < 4; i++)
        if (!parts[i]) {
            for (int j = 0; j < 4; j++) fsc_module_free(parts[j]);
            return NULL;
        }
    return fsc_sequential_new(name, 4, parts);
}
