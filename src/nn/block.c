/* Pre-LN transformer block (GPT-2): x + attn(ln_1(x)), then + mlp(ln_2(.)).
 * Children are named as in Hugging Face GPT-2: ln_1, attn, ln_2, mlp. So a
 * pipeline stage may end inside a block, the block is also offered as a
 * range of its three segments, each range a module with the block's name
 * and only the children it runs: the attention half x + attn(ln_1(x)); the
 * MLP's c_fc and GELU after ln_2; its c_proj and dropout, plus the residual.
 * A cut between the MLP's two segments must pass on both the residual
 * stream and the GELU output, so that boundary is packed per token, (B,T,5C)
 * with rows [x | gelu(c_fc(ln_2(x)))]. */
#include <math.h>
#include <string.h>

#include "layers_internal.h"

typedef struct {
    void *ln, *f;
} half_saved;

/* y = x + f(ln(x)); x, y (B,T,C). The sum is written over f's output,
 * which is the block's own and dead after it (attention's and the MLP's
 * saved records keep their inputs, never their outputs), so the residual
 * stream costs no buffer of its own; a + x is x + a, the same float. */
static int residual_forward(fsc_module *ln, fsc_module *f, const fsc_ctx *ctx, const fsc_tensor *x,
                            fsc_tensor *y, half_saved *s) {
    fsc_tensor h;
    int rc = fsc_module_forward(ln, ctx, x, &h, &s->ln);
    if (!rc) rc = fsc_module_forward(f, ctx, &h, y, &s->f);
    if (rc) return rc;
    fsc_add_inplace(y->data, x->data, fsc_tensor_numel(x));
    return FSC_OK;
}

/* dx = dy + ln'(f'(dy)), written over ln's input gradient (ours to reuse:
 * dy may still be read by f's deferred weight gradients). f checks dy. */
static int residual_backward(fsc_module *ln, fsc_module *f, const fsc_ctx *ctx, const half_saved *s,
                             const fsc_tensor *dy, fsc_tensor *dx) {
    fsc_tensor dh, dln;
    int rc = fsc_module_backward(f, ctx, s->f, dy, &dh);
    if (!rc) rc = fsc_module_backward(ln, ctx, s->ln, &dh, &dln);
    if (rc) return rc;
    if (dx) {
        fsc_add_inplace(dln.data, dy->data, fsc_tensor_numel(dy));
        *dx = dln;
    }
    return FSC_OK;
}

/* ---- the packed boundary between the MLP's c_fc + GELU and its c_proj -------------------- */

/* out rows [a | b]: a (rows, na), b (rows, nb), out (rows, na + nb) */
static void pack_rows(float *out, const float *a, int na, const float *b, int nb, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(out + r * (na + nb), a + r * na, sizeof(float) * (size_t)na);
        memcpy(out + r * (na + nb) + na, b + r * nb, sizeof(float) * (size_t)nb);
    }
}

/* The GELU output of packed rows p (rows, C + F), contiguous (c_proj keeps
 * it for its weight gradient). */
static int unpack_hidden(fsc_arena *a, const fsc_tensor *p, int C, int F, fsc_tensor *h) {
    int rc = fsc_alloc_like(a, p, F, h);
    if (rc) return rc;
    const float *src = p->data;
    float *dst = h->data;
    for (int64_t r = 0, rows = fsc_rows(p); r < rows; r++)
        memcpy(dst + r * F, src + r * (C + F) + C, sizeof(float) * (size_t)F);
    return FSC_OK;
}

/* x (B,T,C) -> p (B,T,C+F): [x | f(ln(x))] */
static int fc_forward(const fsc_block_span *b, fsc_module *ln, fsc_module *f, const fsc_ctx *ctx,
                      const fsc_tensor *x, fsc_tensor *p, half_saved *s) {
    fsc_tensor h, a;
    int rc = fsc_module_forward(ln, ctx, x, &h, &s->ln);
    if (!rc) rc = fsc_module_forward(f, ctx, &h, &a, &s->f);
    if (!rc) rc = fsc_alloc_like(ctx->arena, x, b->C + b->F, p);
    if (rc) return rc;
    pack_rows(p->data, x->data, b->C, a.data, b->F, fsc_rows(x));
    return FSC_OK;
}

/* dp (B,T,C+F) -> dx = dp[:, :C] + ln'(f'(dp[:, C:])) */
static int fc_backward(const fsc_block_span *b, fsc_module *ln, fsc_module *f, const fsc_ctx *ctx,
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

/* p (B,T,C+F) -> y = p[:, :C] + f(p[:, C:]), (B,T,C) */
static int proj_forward(const fsc_block_span *b, fsc_module *f, const fsc_ctx *ctx,
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

/* dy (B,T,C) -> dp (B,T,C+F): [dy | f'(dy)]. f checks dy. */
static int proj_backward(const fsc_block_span *b, fsc_module *f, const fsc_ctx *ctx,
                         const half_saved *s, const fsc_tensor *dy, fsc_tensor *dp) {
    fsc_tensor da;
    int rc = fsc_module_backward(f, ctx, s->f, dy, &da);
    if (rc || !dp) return rc;
    if ((rc = fsc_alloc_like(ctx->arena, dy, b->C + b->F, dp))) return rc;
    pack_rows(dp->data, dy->data, b->C, da.data, b->F, fsc_rows(dy));
    return FSC_OK;
}

/* ---- the whole block ----------------------------------------------------------------------- */

enum { LN_1, ATTN, LN_2, MLP };

int fsc_block_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                      void **saved) {
    half_saved *s = fsc_arena_alloc(ctx->arena, 2 * sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    fsc_tensor r;
    fsc_module *const *c = m->children;
    int rc = residual_forward(c[LN_1], c[ATTN], ctx, x, &r, &s[0]);
    if (!rc) rc = residual_forward(c[LN_2], c[MLP], ctx, &r, y, &s[1]);
    if (!rc) *saved = s;
    return rc;
}

int fsc_block_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                       fsc_tensor *dx) {
    const half_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    fsc_tensor dr;
    fsc_module *const *c = m->children;
    rc = residual_backward(c[LN_2], c[MLP], ctx, &s[1], dy, &dr);
    if (!rc) rc = residual_backward(c[LN_1], c[ATTN], ctx, &s[0], &dr, dx);
    return rc;
}

static const fsc_module_ops block_ops = {"TransformerBlock", fsc_block_forward, fsc_block_backward,
                                         NULL};

/* ---- a range of segments ------------------------------------------------------------------- */

typedef struct {
    half_saved attn, mlp;
    fsc_tensor in;
} part_saved;

/* The MLP's segments in range: [mf, to); none when mf >= to. */
static int mlp_from(const fsc_block_span *b) {
    return b->from > FSC_BLOCK_FC ? b->from : FSC_BLOCK_FC;
}

int fsc_block_span_forward(const fsc_block_span *b, fsc_module *m, const fsc_ctx *ctx,
                           const fsc_tensor *x, fsc_tensor *y, void **saved) {
    const int mf = mlp_from(b);
    part_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    memset(s, 0, sizeof *s);
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

int fsc_block_span_backward(const fsc_block_span *b, fsc_module *m, const fsc_ctx *ctx, void *saved,
                            const fsc_tensor *dy, fsc_tensor *dx) {
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

typedef struct {
    fsc_module base;
    fsc_block_span span;
} block_part;

static int part_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    const fsc_block_span *b = &((const block_part *)m)->span;
    int rc = b->from == FSC_BLOCK_PROJ ? fsc_check_last(m, x, b->C + b->F) : FSC_OK;
    return rc ? rc : fsc_block_span_forward(b, m, ctx, x, y, saved);
}

static int part_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    return fsc_block_span_backward(&((const block_part *)m)->span, m, ctx, saved, dy, dx);
}

static const fsc_module_ops part_ops = {"TransformerBlockPart", part_forward, part_backward, NULL};

/* The block's children for segments [from, to), made and adopted as the
 * whole block makes them (same names and init), into a module of `size`
 * bytes. */
static fsc_module *block_make(const fsc_module_ops *ops, size_t size, const char *name, int C,
                              int NH, float dropout, uint32_t layer_id, int n_layers, int from,
                              int to) {
    if (n_layers <= 0 || from < FSC_BLOCK_ATTN || to > FSC_BLOCK_SEGMENTS || from >= to) {
        fsc_error(FSC_ERR_INVALID,
                  "%s %s: n_layers %d must be positive, segments [%d, %d) in [0, 3)", ops->kind,
                  name, n_layers, from, to);
        return NULL;
    }
    /* GPT-2 init: N(0, 0.02); residual projections scaled by 1/sqrt(2 * n_layers). */
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)n_layers);
    fsc_module *m = fsc_module_alloc(size, ops, name);
    fsc_module *parts[4] = {NULL};
    int n = 0;
    if (from == FSC_BLOCK_ATTN) {
        parts[n++] = fsc_layernorm_new("ln_1", C, 1e-5f);
        parts[n++] = fsc_attention_new("attn", C, NH, dropout, 2 * layer_id + 1, std, proj_std);
    }
    const int mf = from > FSC_BLOCK_FC ? from : FSC_BLOCK_FC;
    if (mf < to) { /* MLP children [0, 2) are c_fc, act; [2, 4) c_proj, dropout */
        if (mf == FSC_BLOCK_FC) parts[n++] = fsc_layernorm_new("ln_2", C, 1e-5f);
        parts[n++] = fsc_mlp_parts_new("mlp", C, dropout, 2 * layer_id + 2, std, proj_std,
                                       mf == FSC_BLOCK_FC ? 0 : 2, to == FSC_BLOCK_PROJ ? 2 : 4);
    }
    bool ok = m != NULL;
    for (int i = 0; i < n; i++) ok = ok && parts[i];
    /* bf16 autocast: each LayerNorm's output in bf16 for the Linear that
     * reads it first (attention's c_attn, the MLP's c_fc) */
    if (ok && from == FSC_BLOCK_ATTN) nn_layernorm_set_feeds(parts[0], parts[1]->children[0]);
    if (ok && mf == FSC_BLOCK_FC) nn_layernorm_set_feeds(parts[n - 2], parts[n - 1]->children[0]);
    int adopted = 0;
    for (; ok && adopted < n; adopted++) ok = fsc_module_add_child(m, parts[adopted]) == FSC_OK;
    if (!ok) { /* the adopted ones go with m */
        for (int i = adopted; i < n; i++) fsc_module_free(parts[i]);
        fsc_module_free(m);
        return NULL;
    }
    return m;
}

fsc_module *fsc_block_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                          int n_layers) {
    return block_make(&block_ops, sizeof(fsc_module), name, C, NH, dropout, layer_id, n_layers,
                      FSC_BLOCK_ATTN, FSC_BLOCK_SEGMENTS);
}

fsc_module *fsc_block_of(const char *name, fsc_module *const children[4]) {
    fsc_module *m = fsc_module_alloc(sizeof *m, &block_ops, name);
    bool ok = m != NULL;
    for (int i = 0; i < 4; i++) ok = ok && children[i];
    for (int i = 0; ok && i < 4; i++) ok = fsc_module_add_child(m, children[i]) == FSC_OK;
    if (!ok) { /* adopted children go with the block; the rest are freed here */
        for (int i = m ? m->nchildren : 0; i < 4; i++) fsc_module_free(children[i]);
        fsc_module_free(m);
        return NULL;
    }
    return m;
}

fsc_module *fsc_block_part_new(const char *name, int C, int NH, float dropout, uint32_t layer_id,
                               int n_layers, int from, int to) {
    block_part *b = (block_part *)block_make(&part_ops, sizeof(block_part), name, C, NH, dropout,
                                             layer_id, n_layers, from, to);
    if (b) b->span = (fsc_block_span){.from = from, .to = to, .C = C, .F = 4 * C};
    return b ? &b->base : NULL;
}

int fsc_blocks_backward(fsc_module *const *h, void *const *saved, int n, const fsc_ctx *ctx,
                        fsc_tensor *cur, fsc_tensor pingpong[2]) {
    int rc = FSC_OK;
    for (int l = n - 1; !rc && l >= 0; l--) {
        fsc_tensor next;
        fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
        rc = fsc_module_backward(h[l], ctx, saved[l], cur, &next);
        if (rc) break;
        /* deferred weight gradients still read this block's buffers; a part
         * that begins at the MLP's c_proj returns a packed gradient wider
         * than pingpong's (the last one here: kept where it is) */
        if (ctx->defer || fsc_tensor_nbytes(&next) > fsc_tensor_nbytes(&pingpong[0])) {
            *cur = next;
            continue;
        }
        fsc_tensor *keep = &pingpong[l & 1];
        if (keep->data == cur->data) keep = &pingpong[(l + 1) & 1];
        memcpy(keep->data, next.data, fsc_tensor_nbytes(&next));
        fsc_arena_release(ctx->arena, mark);
        *cur = *keep;
    }
    return rc;
}
