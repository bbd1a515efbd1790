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
#include <string.h>

#include "../nn/layers_internal.h"
#include "tp_internal.h"

static const char TP_KIND_BLOCK_PART[] = "TensorParallelBlockPart";

typedef struct {
    tp_module tp;
    int from, to, C, F; /* segments [from, to); F = 4C/t, this rank's GELU columns */
} tp_block_part;

typedef struct {
    void *ln, *f;
} half_saved;

typedef struct {
    half_saved attn, mlp;
    fsc_tensor in;
} part_saved;

/* y = x + f(ln(x)) */
static int residual_forward(fsc_module *ln, fsc_module *f, const fsc_ctx *ctx, const fsc_tensor *x,
                            fsc_tensor *y, half_saved *s) {
    fsc_tensor h, a;
    int rc = fsc_module_forward(ln, ctx, x, &h, &s->ln);
    if (!rc) rc = fsc_module_forward(f, ctx, &h, &a, &s->f);
    if (!rc) rc = fsc_alloc_like(ctx->arena, x, x->shape[x->ndim - 1], y);
    if (rc) return rc;
    fsc_add(y->data, x->data, a.data, fsc_tensor_numel(x));
    return FSC_OK;
}

/* dx = dy + ln'(f'(dy)), over ln's input gradient */
static int residual_backward(fsc_module *ln, fsc_module *f, const fsc_ctx *ctx, const half_saved *s,
                             const fsc_tensor *dy, fsc_tensor *dx) {
    fsc_tensor dh, dln;
    int rc = fsc_module_backward(f, ctx, s->f, dy, &dh);
    if (!rc) rc = fsc_module_backward(ln, ctx, s->ln, &dh, &dln);
    if (rc || !dx) return rc;
    fsc_add_inplace(dln.data, dy->data, fsc_tensor_numel(dy));
    *dx = dln;
    return FSC_OK;
}

/* out rows [a | b]: a (rows, na), b (rows, nb) */
static void pack_rows(float *out, const float *a, int na, const float *b, int nb, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(out + r * (na + nb), a + r * na, sizeof(float) * (size_t)na);
        memcpy(out + r * (na + nb) + na, b + r * nb, sizeof(float) * (size_t)nb);
    }
}

/* The GELU shard of packed rows p (rows, C + F), contiguous (c_proj keeps it). */
static int unpack_hidden(fsc_arena *a, const fsc_tensor *p, int C, int F, fsc_tensor *h) {
    int rc = fsc_alloc_like(a, p, F, h);
    if (rc) return rc;
    const float *src = p->data;
    float *dst = h->data;
    for (int64_t r = 0, rows = fsc_rows(p); r < rows; r++)
        memcpy(dst + r * F, src + r * (C + F) + C, sizeof(float) * (size_t)F);
    return FSC_OK;
}

/* x (B,T,C) -> p (B,T,C+F): [x | gelu(c_fc(ln_2(x)))] */
static int fc_forward(const tp_block_part *b, fsc_module *ln, fsc_module *f, const fsc_ctx *ctx,
                      const fsc_tensor *x, fsc_tensor *p, half_saved *s) {
    fsc_tensor h, a;
    int rc = fsc_module_forward(ln, ctx, x, &h, &s->ln);
    if (!rc) rc = fsc_module_forward(f, ctx, &h, &a, &s->f);
    if (!rc) rc = fsc_alloc_like(ctx->arena, x, b->C + b->F, p);
    if (rc) return rc;
    pack_rows(p->data, x->data, b->C, a.data, b->F, fsc_rows(x));
    return FSC_OK;
}

/* dp (B,T,C+F) -> dx = dp[:, :C] + ln_2'(c_fc'(gelu'(dp[:, C:]))); c_fc's
 * backward sums its input gradient over the group */
static int fc_backward(const tp_block_part *b, fsc_module *ln, fsc_module *f, const fsc_ctx *ctx,
                       const half_saved *s, const fsc_tensor *dp, fsc_tensor *dx) {
    const int C = b->C, W = b->C + b->F;
    fsc_tensor da, dh, dln;
    int rc = unpack_hidden(ctx->arena, dp, C, b->F, &da);
    if (!rc) rc = fsc_module_backward(f, ctx, s->f, &da, &dh);
    if (!rc) rc = fsc_module_backward(ln, ctx, s->ln, &dh, &dln);
    if (rc || !dx) return rc;
    const float *g = dp->data;
    float *d = dln.data;
    for (int64_t r = 0, rows = fsc_rows(dp); r < rows; r++)
        for (int c = 0; c < C; c++) d[r * C + c] += g[r * W + c];
    *dx = dln;
    return FSC_OK;
}

/* p (B,T,C+F) -> y = p[:, :C] + dropout(c_proj(p[:, C:])), c_proj summed over the group */
static int proj_forward(const tp_block_part *b, fsc_module *f, const fsc_ctx *ctx,
                        const fsc_tensor *p, fsc_tensor *y, half_saved *s) {
    const int C = b->C, W = b->C + b->F;
    fsc_tensor h, a;
    int rc = unpack_hidden(ctx->arena, p, C, b->F, &h);
    if (!rc) rc = fsc_module_forward(f, ctx, &h, &a, &s->f);
    if (!rc) rc = fsc_alloc_like(ctx->arena, p, C, y);
    if (rc) return rc;
    const float *x = p->data, *o = a.data;
    float *out = y->data;
    for (int64_t r = 0, rows = fsc_rows(p); r < rows; r++)
        for (int c = 0; c < C; c++) out[r * C + c] = x[r * W + c] + o[r * C + c];
    return FSC_OK;
}

/* dy (B,T,C) -> dp (B,T,C+F): [dy | c_proj'(dropout'(dy))], this rank's columns */
static int proj_backward(const tp_block_part *b, fsc_module *f, const fsc_ctx *ctx,
                         const half_saved *s, const fsc_tensor *dy, fsc_tensor *dp) {
    fsc_tensor da;
    int rc = fsc_module_backward(f, ctx, s->f, dy, &da);
    if (rc || !dp) return rc;
    if ((rc = fsc_alloc_like(ctx->arena, dy, b->C + b->F, dp))) return rc;
    pack_rows(dp->data, dy->data, b->C, da.data, b->F, fsc_rows(dy));
    return FSC_OK;
}

/* The MLP's segments in range: [mf, to); none when mf >= to. */
static int mlp_from(const tp_block_part *b) {
    return b->from > FSC_BLOCK_FC ? b->from : FSC_BLOCK_FC;
}

static int part_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    const tp_block_part *b = (const tp_block_part *)m;
    const int mf = mlp_from(b);
    const int64_t in = b->from == FSC_BLOCK_PROJ ? b->C + b->F : b->C;
    if (x->ndim != 3 || x->dtype != FSC_DTYPE_F32 || x->shape[2] != in)
        return tp_shape_error(m,
                              b->from == FSC_BLOCK_PROJ
                                  ? "expected f32 (B, T, C + 4C/t): the residual, then this "
                                    "rank's GELU columns"
                                  : "expected f32 (B, T, C) input (T/t under sequence "
                                    "parallelism)",
                              x);
    part_saved *s = fsc_arena_calloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    s->in = *x;
    fsc_module *const *c = m->children;
    fsc_tensor cur = *x, next;
    int rc = FSC_OK;
    if (b->from == FSC_BLOCK_ATTN) {
        if ((rc = residual_forward(c[0], c[1], ctx, &cur, &next, &s->attn))) return rc;
        cur = next, c += 2;
    }
    if (mf < b->to)
        rc = mf == FSC_BLOCK_PROJ      ? proj_forward(b, c[0], ctx, &cur, &next, &s->mlp)
             : b->to == FSC_BLOCK_PROJ ? fc_forward(b, c[0], c[1], ctx, &cur, &next, &s->mlp)
                                       : residual_forward(c[0], c[1], ctx, &cur, &next, &s->mlp);
    if (rc) return rc;
    *y = mf < b->to ? next : cur;
    *saved = s;
    return FSC_OK;
}

static int part_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    const tp_block_part *b = (const tp_block_part *)m;
    const part_saved *s = saved;
    const int mf = mlp_from(b);
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, &s->in, b->to == FSC_BLOCK_PROJ ? b->C + b->F : b->C);
    if (rc) return rc;
    const bool attn = b->from == FSC_BLOCK_ATTN;
    fsc_module *const *c = m->children + (attn ? 2 : 0);
    fsc_tensor cur = *dy, next, *out = attn ? &next : dx;
    if (mf < b->to) {
        rc = mf == FSC_BLOCK_PROJ      ? proj_backward(b, c[0], ctx, &s->mlp, &cur, out)
             : b->to == FSC_BLOCK_PROJ ? fc_backward(b, c[0], c[1], ctx, &s->mlp, &cur, out)
                                       : residual_backward(c[0], c[1], ctx, &s->mlp, &cur, out);
        if (rc || !attn) return rc;
        cur = next;
    }
    return residual_backward(m->children[0], m->children[1], ctx, &s->attn, &cur, dx);
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
    b->from = from, b->to = to, b->C = C, b->F = 4 * C / b->tp.size;
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
