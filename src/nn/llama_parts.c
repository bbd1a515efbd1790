/* A LLaMA decoder layer under any layout, whole or as a range of its three
 * segments (block.c's engine, fsc_block_span_*): the attention half
 * x + self_attn(input_layernorm(x)); post_attention_layernorm, gate_proj,
 * up_proj and the SwiGLU product; down_proj with the residual sum. So a
 * pipeline stage may end inside a layer, as GPT-2's may end inside a block.
 *
 * The one idea: a layout differs only in how projections and norms are
 * made (llama_proj_maker: nn.Linear and RMSNorm in one process, column- and
 * row-parallel Linears over a TP group), so the layer is written once. The
 * cut between the MLP's two segments passes each rank's residual and its
 * own F/t product columns, rows [x | product]. */
#include <string.h>

#include "layers_internal.h"
#include "llama_internal.h"

/* ---- one process ---------------------------------------------------------------------------- */

static fsc_module *plain_column(void *user, const char *name, int in, int out, bool bias,
                                float std) {
    (void)user;
    return fsc_linear_new(name, in, out, bias, FSC_WEIGHT_OUT_IN, std);
}

static fsc_module *plain_row(void *user, const char *name, int in, int out, float std) {
    (void)user;
    return fsc_linear_new(name, in, out, false, FSC_WEIGHT_OUT_IN, std);
}

static fsc_module *plain_norm(void *user, const char *name, int dim, float eps) {
    (void)user;
    return fsc_rmsnorm_new(name, dim, eps);
}

const llama_proj_maker llama_plain_maker = {
    .t = 1, .column = plain_column, .row = plain_row, .norm = plain_norm};

/* ---- a range of segments -------------------------------------------------------------------- */

typedef struct {
    fsc_module base;
    fsc_block_span span; /* F: this rank's product columns */
} layer_part;

static int part_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    const fsc_block_span *b = &((const layer_part *)m)->span;
    int rc = fsc_check_last(m, x, b->from == FSC_BLOCK_PROJ ? b->C + b->F : b->C);
    return rc ? rc : fsc_block_span_forward(b, m, ctx, x, y, saved);
}

static int part_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    return fsc_block_span_backward(&((const layer_part *)m)->span, m, ctx, saved, dy, dx);
}

static const fsc_module_ops part_ops = {"LlamaDecoderLayerPart", part_forward, part_backward, NULL};

static fsc_module *attention(const fsc_gpt_config *c, const llama_proj_maker *mk) {
    const fsc_llama_attention_config ac = llama_attention_config(c);
    return llama_attention_split_new("self_attn", &ac, mk->t, mk);
}

/* The MLP's segments [mf, to): the whole SwiGLU, its gated half, or down_proj alone. */
static fsc_module *mlp_range(const fsc_gpt_config *c, int mf, int to, const llama_proj_maker *mk) {
    const int C = c->d_model, F = fsc_gpt_ffn_hidden(c);
    if (mf == FSC_BLOCK_PROJ) {
        fsc_module *down = mk->row(mk->user, "down_proj", F, C, 0.02f);
        return down ? fsc_sequential_new("mlp", 1, &down) : NULL;
    }
    fsc_module *gate = mk->column(mk->user, "gate_proj", C, F, false, 0.02f);
    fsc_module *up = mk->column(mk->user, "up_proj", C, F, false, 0.02f);
    fsc_module *down =
        to == FSC_BLOCK_SEGMENTS ? mk->row(mk->user, "down_proj", F, C, 0.02f) : NULL;
    if (to == FSC_BLOCK_SEGMENTS && !down) {
        fsc_module_free(gate), fsc_module_free(up);
        return NULL;
    }
    return llama_gated_mlp_new("mlp", C, F / mk->t, gate, up, down);
}

fsc_module *llama_layer_new(const fsc_gpt_config *c, const char *name, int from, int to,
                            const llama_proj_maker *mk) {
    const int C = c->d_model, F = fsc_gpt_ffn_hidden(c), t = mk->t;
    if (from < FSC_BLOCK_ATTN || to > FSC_BLOCK_SEGMENTS || from >= to) {
        fsc_error(FSC_ERR_INVALID, "LLaMA %s: segments [%d, %d) outside [0, 3) or empty", name,
                  from, to);
        return NULL;
    }
    if (F % t) {
        fsc_error(FSC_ERR_INVALID,
                  "LLaMA %s: the SwiGLU width %d (--ffn-hidden) must be divisible by the "
                  "tensor-parallel size %d",
                  name, F, t);
        return NULL;
    }
    if (mk->sp && (from == FSC_BLOCK_PROJ || to == FSC_BLOCK_PROJ)) {
        fsc_error(FSC_ERR_UNSUPPORTED,
                  "LLaMA %s: a cut between the SwiGLU product and down_proj (a .75 cut) is not "
                  "there with sequence parallelism: the residual is a sequence shard, the "
                  "product is not (cut at .5 or between layers)",
                  name);
        return NULL;
    }
    fsc_module *parts[4] = {NULL};
    int n = 0;
    if (from == FSC_BLOCK_ATTN) {
        parts[n++] = mk->norm(mk->user, "input_layernorm", C, llama_norm_eps(c));
        parts[n++] = attention(c, mk);
    }
    const int mf = from > FSC_BLOCK_FC ? from : FSC_BLOCK_FC;
    if (mf < to) {
        if (mf == FSC_BLOCK_FC)
            parts[n++] = mk->norm(mk->user, "post_attention_layernorm", C, llama_norm_eps(c));
        parts[n++] = mlp_range(c, mf, to, mk);
    }
    if (from == FSC_BLOCK_ATTN && to == FSC_BLOCK_SEGMENTS) return fsc_block_of(name, parts);
    layer_part *b = fsc_module_alloc(sizeof *b, &part_ops, name);
    bool ok = b != NULL;
    for (int i = 0; i < n; i++) ok = ok && parts[i];
    int adopted = 0;
    for (; ok && adopted < n; adopted++)
        if (fsc_module_add_child(&b->base, parts[adopted])) {
            ok = false;
            break;
        }
    if (!ok) { /* the adopted ones go with b */
        for (int i = adopted; i < n; i++) fsc_module_free(parts[i]);
        if (b) fsc_module_free(&b->base);
        return NULL;
    }
    b->span = (fsc_block_span){.from = from, .to = to, .C = C, .F = F / t};
    return &b->base;
}
