/* GPT-2 MLP: c_fc (C -> 4C), GELU, c_proj (4C -> C), dropout; a Sequential with
 * the Hugging Face child names. A pipeline cut between GELU and c_proj makes
 * each side from a range of the same children, so both keep the MLP's names. */
#include "layers_internal.h"

fsc_module *fsc_mlp_parts_new(const char *name, int C, float dropout, uint32_t layer_id,
                              float init_std, float proj_std, int from, int to) {
    if (C <= 0 || from < 0 || to > 4 || from >= to) {
        fsc_error(FSC_ERR_INVALID,
                  "MLP %s: d_model %d must be positive, children [%d, %d) in [0, 4)", name, C, from,
                  to);
        return NULL;
    }
    fsc_module *parts[4] = {NULL};
    for (int i = from; i < to; i++)
        parts[i] = i == 0   ? fsc_linear_new("c_fc", C, 4 * C, true, FSC_WEIGHT_IN_OUT, init_std)
                   : i == 1 ? fsc_gelu_new("act")
                   : i == 2 ? fsc_linear_new("c_proj", 4 * C, C, true, FSC_WEIGHT_IN_OUT, proj_std)
                            : fsc_dropout_new("dropout", dropout, layer_id);
    for (int i = from; i < to; i++)
        if (!parts[i]) {
            for (int j = from; j < to; j++) fsc_module_free(parts[j]);
            return NULL;
        }
    /* bf16 autocast: GELU's output in bf16 when c_proj is here to read it
     * (a pipeline cut after GELU packs fp32 rows) */
    if (from <= 1 && to >= 3) nn_gelu_set_feeds(parts[1], parts[2]);
    /* and c_fc's output, GELU's input, in bf16 when GELU is here to read it
     * (PyTorch's autocast keeps it so: the MLP's widest saved tensor) */
    if (from == 0 && to >= 2) nn_linear_set_out_bf16(parts[0], nn_gelu_reads_bf16, parts[1]);
    return fsc_sequential_new(name, to - from, parts + from);
}

fsc_module *fsc_mlp_new(const char *name, int C, float dropout, uint32_t layer_id, float init_std,
                        float proj_std) {
    return fsc_mlp_parts_new(name, C, dropout, layer_id, init_std, proj_std, 0, 4);
}
