/* GPT-2's attention under context parallelism (fsc_ctx.seq): c_attn, c_proj
 * and the dropout run on this rank's rows as always; the attention itself
 * is the ring's (ctx->seq->attend), which keeps per-row log-sum-exps instead
 * of probabilities, so the record holds qkv, the attention output and lse:
 * O(T/cp) per layer instead of O(T^2). Also LLaMA's rotary tables at the
 * global positions of this rank's runs. */
#include "attention_seq.h"

typedef struct {
    fsc_attn_saved base; /* base.att stays NULL */
    fsc_tensor h;        /* (B, T, C): the attention output, for backward's row sums */
    float *lse;          /* B * NH * T floats, the ring's layout */
} seq_saved;

static fsc_attn_dims dims(const fsc_tensor *qkv, int C, int NH) {
    return (fsc_attn_dims){.B = (int)qkv->shape[0],
                           .NH = NH,
                           .NKV = NH,
                           .hd = C / NH,
                           .Tq = (int)qkv->shape[1],
                           .Tk = (int)qkv->shape[1],
                           .ldq = 3 * C,
                           .ldk = 3 * C,
                           .ldv = 3 * C,
                           .ldo = C};
}

int nn_attention_seq_forward(fsc_module *const parts[3], const fsc_ctx *ctx, const fsc_tensor *x,
                             fsc_tensor *y, void **saved, int C, int NH) {
    const fsc_seq_split *q = ctx->seq;
    seq_saved *s = fsc_arena_calloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    int rc = fsc_module_forward(parts[0], ctx, x, &s->base.qkv, &s->base.c_attn);
    if (rc) return rc;
    const fsc_attn_dims d = dims(&s->base.qkv, C, NH);
    if (d.Tq != q->runs * q->len)
        return fsc_error(FSC_ERR_SHAPE,
                         "attention under context parallelism: %d rows per sequence, expected %d "
                         "runs of %d",
                         d.Tq, q->runs, q->len);
    s->lse = fsc_arena_alloc(ctx->arena, (size_t)d.B * NH * d.Tq * sizeof(float));
    rc = s->lse ? fsc_alloc_like(ctx->arena, &s->base.qkv, C, &s->h) : FSC_ERR_NOMEM;
    if (rc) return rc;
    const float *qkv = s->base.qkv.data;
    rc = q->attend(q->impl, &d, qkv, qkv + C, qkv + 2 * C, s->h.data, s->lse, fsc_ctx_prec(ctx));
    fsc_tensor p;
    if (!rc) rc = fsc_module_forward(parts[1], ctx, &s->h, &p, &s->base.c_proj);
    if (!rc) rc = fsc_module_forward(parts[2], ctx, &p, y, &s->base.drop);
    *saved = s;
    return rc;
}

int nn_attention_seq_backward(fsc_module *const parts[3], const fsc_ctx *ctx, const void *saved,
                              const fsc_tensor *dy, fsc_tensor *dx, int C, int NH) {
    const seq_saved *s = saved;
    const fsc_seq_split *q = ctx->seq;
    fsc_tensor dp, dh, dqkv;
    int rc = fsc_module_backward(parts[2], ctx, s->base.drop, dy, &dp);
    if (!rc) rc = fsc_module_backward(parts[1], ctx, s->base.c_proj, &dp, &dh);
    if (!rc) rc = fsc_alloc_like(ctx->arena, &s->base.qkv, 3 * C, &dqkv);
    if (rc) return rc;
    const fsc_attn_dims d = dims(&s->base.qkv, C, NH);
    const float *qkv = s->base.qkv.data;
    float *g = dqkv.data;
    rc = q->attend_backward(q->impl, &d, qkv, qkv + C, qkv + 2 * C, s->h.data, dh.data, s->lse, g,
                            g + C, g + 2 * C, fsc_ctx_prec(ctx));
    return rc ? rc : fsc_module_backward(parts[0], ctx, s->base.c_attn, &dqkv, dx);
}

int nn_rope_tables_seq(fsc_arena *a, const float *inv_freq, const fsc_seq_split *q, int hd,
                       float **cos_t, float **sin_t) {
    const size_t run = (size_t)q->len * (size_t)(hd / 2);
    *cos_t = fsc_arena_alloc(a, run * q->runs * sizeof(float));
    *sin_t = fsc_arena_alloc(a, run * q->runs * sizeof(float));
    if (!*cos_t || !*sin_t) return FSC_ERR_NOMEM;
    for (int r = 0; r < q->runs; r++)
        fsc_rope_table(*cos_t + r * run, *sin_t + r * run, inv_freq, q->len, hd, (int)q->pos0[r]);
    return FSC_OK;
}
