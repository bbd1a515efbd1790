/* A tensor-parallel block as a range of its three segments (block.c's
 * fsc_block_part_new over TP layers), so a pipeline stage of the TP GPT may
 * end inside a block: the attention half x + attn(ln_1(x)); the MLP's ln_2,
 * column-parallel c_fc and GELU; its row-parallel c_proj and dropout, plus
 * the residual. Children keep the whole block's names (ln_1, attn, ln_2,
 * mlp.c_fc, mlp.act | mlp.c_proj, mlp.dropout), initialisation and
 * dropout keys.
 *
 * The one idea: between c_fc + GELU and c_proj each TP rank holds the
 * residual stream (equal on every rank) and its own 4C/t columns of the
 * GELU output, so the cut there passes (B,T,C + 4C/t) per rank, rows
 * [x | gelu shard], and c_proj (input_is_parallel) takes the shard as it
 * would inside the MLP. Under sequence parallelism the residual is a
 * sequence shard (B,T/t,C) while the GELU output is not, so that cut is
 * refused; the cut after the attention half passes the residual alone and
 * works either way. */
#include <math.h>

#include "nn/layers_internal.h"
#include "tp_internal.h"

static const char TP_KIND_BLOCK_PART[] = "TensorParallelBlockPart";

typedef struct {
    tp_module tp;
    fsc_block_span span; /* segments [from, to); F = 4C/t, this rank's GELU columns */
} tp_block_part;

/* Checks the input's width (a .75 cut's rows differ from a block's), then
 * runs block.c's engine over the TP children: c_fc's backward sums its
 * input gradient over the group, c_proj (input_is_parallel) sums its output. */
static int part_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    const fsc_block_span *b = &((const tp_block_part *)m)->span;
    const int64_t in = b->from == FSC_BLOCK_PROJ ? b->C + b->F : b->C;
    if (x->ndim != 3 || x->dtype != FSC_DTYPE_F32 || x->shape[2] != in)
        return tp_shape_error(m,
                              b->from == FSC_BLOCK_PROJ
                                  ? "expected f32 (B, T, C + 4C/t): the residual, then this "
                                    "rank's GELU columns"
                                  : "expected f32 (B, T, C) input (T/t under sequence "
                                    "parallelism)",
                              x);
    return fsc_block_span_forward(b, m, ctx, x, y, saved);
}

static int part_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    return fsc_block_span_backward(&((const tp_block_part *)m)->span, m, ctx, saved, dy, dx);
}

static const fsc_module_ops part_ops = {TP_KIND_BLOCK_PART, part_forward, part_backward, NULL};

/* The MLP's children [from, to) of {c_fc, act, c_proj, dropout} as the
 * container "mlp" (fsc_tp_mlp_new's names and init); the whole MLP when all. */
static fsc_module *mlp_part(int C, float dropout, uint32_t key, float std, float proj_std, int from,
                            int to, const fsc_tp_options *tp) {
    if (from == 0 && to == 4) return fsc_tp_mlp_new("mlp", C, dropout, key, std, proj_std, tp);
    fsc_module *parts[4] = {NULL};
    for (int i = from; i < to; i++) {
        parts[i] = i == 0 ? fsc_tp_column_linear_new("c_fc", C, 4 * C, true, FSC_WEIGHT_IN_OUT, std,
                                                     false, tp)
                   : i == 1 ? fsc_gelu_new("act")
                   : i == 2 ? fsc_tp_row_linear_new("c_proj", 4 * C, C, true, FSC_WEIGHT_IN_OUT,
                                                    proj_std, true, tp)
                            : fsc_tp_dropout_new("dropout", dropout, key, tp);
        if (!parts[i]) {
            for (int j = from; j < i; j++) fsc_module_free(parts[j]);
            return NULL;
        }
    }
    return fsc_sequential_new("mlp", to - from, parts + from);
}

fsc_module *tp_block_part_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                              int n_layers, int from, int to, const fsc_tp_options *tp) {
    if (n_layers <= 0 || from < FSC_BLOCK_ATTN || to > FSC_BLOCK_SEGMENTS || from >= to ||
        (from == FSC_BLOCK_ATTN && to == FSC_BLOCK_SEGMENTS)) {
        fsc_error(FSC_ERR_INVALID,
                  "%s %s: n_layers %d must be positive, segments [%d, %d) a part of [0, 3)",
                  TP_KIND_BLOCK_PART, name, n_layers, from, to);
        return NULL;
    }
    tp_block_part *b = tp_module_alloc(sizeof *b, &part_ops, name, tp);
    if (!b) return NULL;
    b->span = (fsc_block_span){.from = from, .to = to, .C = C, .F = 4 * C / b->tp.size};
    if (b->tp.sp && (from == FSC_BLOCK_PROJ || to == FSC_BLOCK_PROJ)) {
        fsc_error(FSC_ERR_UNSUPPORTED,
                  "%s %s: a cut between the MLP's c_fc + GELU and its c_proj (a .75 cut) is not "
                  "there with sequence parallelism: the residual is a sequence shard, the GELU "
                  "output is not (cut at .5 or between blocks)",
                  TP_KIND_BLOCK_PART, name);
        fsc_module_free(&b->tp.base);
        return NULL;
    }
    if (tp && tp->recompute_activation && (from == FSC_BLOCK_PROJ || to == FSC_BLOCK_PROJ)) {
        fsc_error(FSC_ERR_UNSUPPORTED,
                  "%s %s: a cut between the MLP's c_fc + GELU and its c_proj (a .75 cut) passes "
                  "the GELU output on, so recompute_activation has nothing to recompute there "
                  "(cut at .5 or between blocks)",
                  TP_KIND_BLOCK_PART, name);
        fsc_module_free(&b->tp.base);
        return NULL;
    }
    /* fsc_tp_block_new's init and dropout keys */
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)n_layers);
    fsc_module *parts[4] = {NULL};
    int n = 0;
    if (from == FSC_BLOCK_ATTN) {
        parts[n++] = fsc_tp_layernorm_new("ln_1", C, 1e-5f, tp);
        parts[n++] =
            fsc_tp_attention_new("attn", C, NH, dropout, 2 * layer_id + 1, std, proj_std, tp);
    }
    const int mf = from > FSC_BLOCK_FC ? from : FSC_BLOCK_FC;
    if (mf < to) { /* MLP children [0, 2) are c_fc, act; [2, 4) c_proj, dropout */
        if (mf == FSC_BLOCK_FC) parts[n++] = fsc_tp_layernorm_new("ln_2", C, 1e-5f, tp);
        parts[n++] = mlp_part(C, dropout, 2 * layer_id + 2, std, proj_std,
                              mf == FSC_BLOCK_FC ? 0 : 2, to == FSC_BLOCK_PROJ ? 2 : 4, tp);
    }
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && parts[i];
    int adopted = 0;
    for (; ok && adopted < n; adopted++)
        ok = fsc_module_add_child(&b->tp.base, parts[adopted]) == FSC_OK;
    if (!ok) { /* the adopted ones go with b */
        for (int i = adopted; i < n; i++) fsc_module_free(parts[i]);
        fsc_module_free(&b->tp.base);
        return NULL;
    }
    return &b->tp.base;
}
