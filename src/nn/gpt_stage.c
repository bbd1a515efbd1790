/* A contiguous range of the GPT's layers as one module, for a pipeline
 * stage: layer 0 is the embedding (wte, wpe, dropout), layers 1..L the
 * blocks h.0..h.L-1, layer L+1 the head (ln_f and the LM head tied to wte).
 * Underneath, the range is one of parts, each block three of them (its
 * attention half, its MLP's c_fc + GELU, its c_proj), so a stage may end
 * inside a block: a block wholly in range is one child, a block cut by the
 * range the segments of it in range (fsc_block_part_new).
 * Children and parameters keep the full model's names, so a stage reads and
 * writes its part of the one-process weights file, and its dropout masks
 * (keyed by layer, step and global sample) are the full model's. A stage
 * with the head but not the embedding holds its own copy of wte: the
 * pipeline keeps the copies equal by summing their gradients. */
#include <stdio.h>
#include <string.h>

#include "fsc/gpt.h"
#include "fsc/kernels.h"
#include "layers_internal.h"
#include "moe_internal.h"

typedef struct {
    fsc_module base;
    fsc_gpt_config cfg;
    bool embed, head;
    int in_w, out_w; /* channels of the activation in and out (C, or 5C inside an MLP) */
    fsc_module *wte, *wpe, *drop, *ln_f;
    fsc_module **h; /* the blocks and half blocks in range, in order: (B,T,C) -> (B,T,C) */
    int nh;
} gpt_stage;

typedef struct {
    fsc_tensor in; /* ids (embedding stage) or the input activation */
    void *drop, *ln_f;
    void **h;
    fsc_tensor final; /* ln_f output: the head's input */
} stage_saved;

static int stage_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                         void **saved) {
    gpt_stage *g = (gpt_stage *)m;
    const int C = g->cfg.d_model, V = g->cfg.vocab;
    int B, T;
    if (g->embed) {
        if (x->dtype != FSC_DTYPE_I32 || x->ndim != 2 || x->shape[1] < 1 ||
            x->shape[1] > g->cfg.seq)
            return fsc_error(FSC_ERR_SHAPE, "GPT stage %s: expected int32 (B,T) ids, T <= %d",
                             m->name, g->cfg.seq);
        B = (int)x->shape[0], T = (int)x->shape[1];
        const int32_t *ids = x->data;
        for (int64_t i = 0; i < (int64_t)B * T; i++)
            if (ids[i] < 0 || ids[i] >= V)
                return fsc_error(FSC_ERR_INVALID,
                                 "GPT: token %d at position %lld outside vocab [0,%d)", ids[i],
                                 (long long)i, V);
    } else {
        if (x->dtype != FSC_DTYPE_F32 || x->ndim != 3 || x->shape[2] != g->in_w)
            return fsc_error(FSC_ERR_SHAPE, "GPT stage %s: expected F32 (B,T,%d) activations",
                             m->name, g->in_w);
        B = (int)x->shape[0], T = (int)x->shape[1];
    }
    stage_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    memset(s, 0, sizeof *s);
    s->in = *x;
    s->h = fsc_arena_alloc(ctx->arena, sizeof(void *) * (size_t)(g->nh ? g->nh : 1));
    if (!s->h) return FSC_ERR_NOMEM;
    fsc_tensor cur = *x;
    int rc = FSC_OK;
    if (g->embed) {
        fsc_tensor e = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
        if (!e.data) return FSC_ERR_NOMEM;
        fsc_encoder_forward(e.data, x->data, g->wte->params[0].data, g->wpe->params[0].data, B, T,
                            C);
        rc = fsc_module_forward(g->drop, ctx, &e, &cur, &s->drop);
    }
    for (int l = 0; !rc && l < g->nh; l++) {
        fsc_tensor next;
        rc = fsc_module_forward(g->h[l], ctx, &cur, &next, &s->h[l]);
        cur = next;
    }
    if (rc) return rc;
    if (g->head) {
        if ((rc = fsc_module_forward(g->ln_f, ctx, &cur, &s->final, &s->ln_f))) return rc;
        *y = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, V});
        if (!y->data) return FSC_ERR_NOMEM;
        fsc_matmul_forward_prec(y->data, s->final.data, g->wte->params[0].data, NULL, B * T, C, V,
                                FSC_WEIGHT_OUT_IN, fsc_ctx_prec(ctx));
    } else {
        *y = cur;
    }
    *saved = s;
    return FSC_OK;
}

static int stage_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                          fsc_tensor *dx) {
    gpt_stage *g = (gpt_stage *)m;
    stage_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (rc) return rc;
    const int B = (int)s->in.shape[0], T = (int)s->in.shape[1], C = g->cfg.d_model;
    const int V = g->cfg.vocab;
    if ((rc = fsc_module_check_dy(m, dy, 3, (int64_t[]){B, T, g->head ? V : g->out_w}))) return rc;
    fsc_tensor cur = *dy;
    if (g->head) {
        fsc_param *wte = &g->wte->params[0];
        fsc_tensor dfinal = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
        if (!dfinal.data) return FSC_ERR_NOMEM;
        const fsc_gemm_prec prec = fsc_ctx_prec(ctx);
        fsc_matmul_backward_prec(dfinal.data, ctx->defer ? NULL : wte->grad, NULL, dy->data,
                                 s->final.data, wte->data, B * T, C, V, FSC_WEIGHT_OUT_IN, prec);
        if (ctx->defer &&
            (rc = fsc_deferred_matmul_prec(ctx->defer, wte->grad, NULL, dy->data, s->final.data,
                                           wte->data, B * T, C, V, FSC_WEIGHT_OUT_IN, prec)))
            return rc;
        if ((rc = fsc_module_backward(g->ln_f, ctx, s->ln_f, &dfinal, &cur))) return rc;
    }
    fsc_tensor pingpong[2];
    for (int i = 0; g->nh && i < 2; i++) {
        pingpong[i] = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 3, (int64_t[]){B, T, C});
        if (!pingpong[i].data) return FSC_ERR_NOMEM;
    }
    rc = fsc_blocks_backward(g->h, s->h, g->nh, ctx, &cur, pingpong);
    if (rc) return rc;
    if (g->embed) {
        fsc_tensor de;
        if ((rc = fsc_module_backward(g->drop, ctx, s->drop, &cur, &de))) return rc;
        fsc_encoder_backward(g->wte->params[0].grad, g->wpe->params[0].grad, de.data, s->in.data, B,
                             T, C);
    } else if (dx) {
        *dx = cur;
    }
    return FSC_OK;
}

static void stage_free(fsc_module *m) {
    gpt_stage *g = (gpt_stage *)m;
    free(g->h);
    free(g);
}

static const fsc_module_ops stage_ops = {"GPTStage", stage_forward, stage_backward, stage_free};

int fsc_gpt_num_layers(const fsc_gpt_config *cfg) {
    return cfg->layers + 2;
}

int fsc_gpt_num_parts(const fsc_gpt_config *cfg) {
    return 3 * cfg->layers + 2;
}

/* Where each of a block's three parts starts, in quarters of the block. */
static const int seg_quarter[3] = {0, 2, 3};

/* Part p (embedding 0, block b's parts 3b+1..3b+3, head 3L+1) starts at
 * the quarter its block starts (4 (b + 1)) plus its segment's offset. */
int fsc_gpt_cut_of_part(const fsc_gpt_config *cfg, int part) {
    const int L = cfg->layers;
    if (part <= 0) return 0;
    if (part > 3 * L) return part == 3 * L + 1 ? 4 * (L + 1) : 4 * (L + 2);
    return 4 * ((part - 1) / 3 + 1) + seg_quarter[(part - 1) % 3];
}

int fsc_gpt_part_of_cut(const fsc_gpt_config *cfg, int quarters, int *part) {
    const int L = cfg->layers, n = fsc_gpt_num_parts(cfg);
    if (quarters < 0 || quarters > 4 * (L + 2))
        return fsc_error(FSC_ERR_INVALID, "GPT: a cut after %g layers is outside [0, %d]",
                         quarters / 4.0, L + 2);
    const int layer = quarters / 4, q = quarters % 4;
    if (q && (layer == 0 || layer == L + 1))
        return fsc_error(FSC_ERR_INVALID,
                         "GPT: a cut after %g layers falls inside the %s, which cannot be split "
                         "(only blocks 1..%d split: after attention, .5, or after the MLP's "
                         "c_fc and GELU, .75)",
                         quarters / 4.0,
                         layer == 0 ? "embedding (layer 0)" : "head (the last layer)", L);
    if (q == 1)
        return fsc_error(FSC_ERR_INVALID,
                         "GPT: a cut after %g layers falls inside block %d's attention (a block "
                         "splits after its attention, .5, or after its MLP's c_fc and GELU, .75)",
                         quarters / 4.0, layer - 1);
    const int seg = q ? q - 1 : 0; /* in block layer - 1: k -> 0, k.5 -> 1, k.75 -> 2 */
    *part = quarters == 0    ? 0
            : layer == L + 2 ? n
            : layer == L + 1 ? 3 * L + 1
                             : 3 * layer - 2 + seg;
    return FSC_OK;
}

int fsc_gpt_part_width(const fsc_gpt_config *cfg, int part) {
    const bool proj = part >= 1 && part <= 3 * cfg->layers && (part - 1) % 3 == FSC_BLOCK_PROJ;
    return proj ? 5 * cfg->d_model : cfg->d_model;
}

/* Adds a child made by the caller; frees it and fails if it is NULL or rc is set. */
static int adopt(gpt_stage *g, fsc_module *child, fsc_module **slot, int rc) {
    if (rc || !child) {
        fsc_module_free(child);
        return rc ? rc : FSC_ERR_INVALID;
    }
    *slot = child;
    return fsc_module_add_child(&g->base, child);
}

fsc_module *fsc_gpt_stage_new(const fsc_gpt_config *cfg, int first, int end) {
    if (fsc_gpt_config_check(cfg)) return NULL;
    const int n = cfg->layers + 2;
    if (first < 0 || end > n || first >= end) {
        fsc_error(FSC_ERR_INVALID, "GPT stage: layers [%d, %d) outside [0, %d) or empty", first,
                  end, n);
        return NULL;
    }
    int pf, pe; /* whole layers: cuts at whole quarters, never inside a layer */
    if (fsc_gpt_part_of_cut(cfg, 4 * first, &pf) || fsc_gpt_part_of_cut(cfg, 4 * end, &pe))
        return NULL;
    return fsc_gpt_stage_parts_new(cfg, pf, pe);
}

fsc_module *fsc_gpt_stage_parts_new(const fsc_gpt_config *cfg, int first, int end) {
    if (fsc_gpt_config_check(cfg) || moe_refuse(cfg->moe, "fsc_gpt_stage_new (pipeline stages)"))
        return NULL;
    const int n = fsc_gpt_num_parts(cfg);
    if (first < 0 || end > n || first >= end) {
        fsc_error(FSC_ERR_INVALID, "GPT stage: parts [%d, %d) outside [0, %d) or empty", first, end,
                  n);
        return NULL;
    }
    char name[48];
    snprintf(name, sizeof name, "gpt[%g:%g]", fsc_gpt_cut_of_part(cfg, first) / 4.0,
             fsc_gpt_cut_of_part(cfg, end) / 4.0);
    gpt_stage *g = fsc_module_alloc(sizeof *g, &stage_ops, name);
    if (!g) return NULL;
    g->cfg = *cfg;
    g->embed = first == 0, g->head = end == n;
    g->in_w = fsc_gpt_part_width(cfg, first), g->out_w = fsc_gpt_part_width(cfg, end);
    /* block b's parts 3b+1 .. 3b+3 within [first, end) */
    const int p0 = first > 1 ? first : 1, p1 = end < n - 1 ? end : n - 1;
    g->h = calloc((size_t)(p1 > p0 ? p1 - p0 : 1), sizeof *g->h);
    int rc = g->h ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "out of memory creating a GPT stage");
    /* the full model's children, in its order, so names and init match it */
    if (g->embed || g->head) {
        rc = adopt(g, fsc_embedding_new("wte", cfg->vocab, cfg->d_model, 0.02f), &g->wte, rc);
        if (!rc) g->wte->params_used_by_parent = true;
    }
    if (g->embed) {
        rc = adopt(g, fsc_embedding_new("wpe", cfg->seq, cfg->d_model, 0.02f), &g->wpe, rc);
        if (!rc) g->wpe->params_used_by_parent = true;
        rc = adopt(g, fsc_dropout_new("drop", cfg->dropout, 0), &g->drop, rc);
    }
    for (int p = p0; p < p1;) {
        const int b = (p - 1) / 3, from = (p - 1) % 3;
        const int to = p1 - 3 * b - 1 < FSC_BLOCK_SEGMENTS ? p1 - 3 * b - 1 : FSC_BLOCK_SEGMENTS;
        const bool whole = from == FSC_BLOCK_ATTN && to == FSC_BLOCK_SEGMENTS;
        snprintf(name, sizeof name, "h.%d", b);
        fsc_module *blk = whole ? fsc_block_new(name, cfg->d_model, cfg->heads, cfg->dropout,
                                                (uint32_t)b, cfg->layers)
                                : fsc_block_part_new(name, cfg->d_model, cfg->heads, cfg->dropout,
                                                     (uint32_t)b, cfg->layers, from, to);
        rc = adopt(g, blk, &g->h[g->nh++], rc);
        p += to - from;
    }
    if (g->head) rc = adopt(g, fsc_layernorm_new("ln_f", cfg->d_model, 1e-5f), &g->ln_f, rc);
    if (rc) {
        fsc_module_free(&g->base);
        return NULL;
    }
    return &g->base;
}
