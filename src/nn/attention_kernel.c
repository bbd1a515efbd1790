/* Which attention kernel runs, and the GPT-2 layout's call of either: the
 * fused qkv (B,T,3C) through fsc_attention_forward_prec (probabilities
 * saved) or through fsc_flash_attention_forward (out and lse saved), and
 * the matching backward; under bf16 autocast, qkv that c_attn wrote in bf16
 * goes to the bf16 kernels, which keep the probabilities in bf16. The
 * choice is made per call from fsc_ctx.attention
 * and T, and recorded in the saved state (lse set or att set), so backward
 * follows forward whatever the context says then. */
#include <inttypes.h>
#include <string.h>

#include "layers_internal.h"

bool fsc_attention_uses_flash(fsc_attention_kind kind, int64_t T) {
    return kind == FSC_ATTENTION_FLASH ||
           (kind == FSC_ATTENTION_AUTO && T >= FSC_ATTENTION_FLASH_MIN_T);
}

int fsc_attention_kind_parse(const char *s, fsc_attention_kind *kind) {
    static const char *const names[] = {"auto", "naive", "flash"};
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, names[i])) {
            *kind = (fsc_attention_kind)i;
            return FSC_OK;
        }
    return fsc_error(FSC_ERR_INVALID, "attention kernel '%s': expected auto, naive or flash",
                     s ? s : "(null)");
}

const char *fsc_attention_kind_name(fsc_attention_kind kind) {
    return kind == FSC_ATTENTION_NAIVE ? "naive" : kind == FSC_ATTENTION_FLASH ? "flash" : "auto";
}

int64_t fsc_attention_saved_bytes(fsc_attention_kind kind, int64_t B, int64_t T, int NH) {
    const int64_t rows = B * NH * T;
    return (int64_t)sizeof(float) * (fsc_attention_uses_flash(kind, T) ? rows : rows * T);
}

int nn_attention_refused(int64_t B, int64_t T, int NH) {
    const double mib = 1024.0 * 1024.0;
    return fsc_error_context(
        FSC_ERR_NOMEM,
        "naive attention keeps (B,NH,T,T) = (%" PRId64 ",%d,%" PRId64 ",%" PRId64
        ") probabilities, %.1f MiB per layer; --attention flash keeps %.3f MiB (or --cp C "
        "splits the sequence over C ranks): ",
        B, NH, T, T, fsc_attention_saved_bytes(FSC_ATTENTION_NAIVE, B, T, NH) / mib,
        fsc_attention_saved_bytes(FSC_ATTENTION_FLASH, B, T, NH) / mib);
}

static fsc_attn_dims fused_dims(int B, int T, int C, int NH) {
    return (fsc_attn_dims){.B = B,
                           .NH = NH,
                           .NKV = NH,
                           .hd = C / NH,
                           .Tq = T,
                           .Tk = T,
                           .ldq = 3 * C,
                           .ldk = 3 * C,
                           .ldv = 3 * C,
                           .ldo = C};
}

int nn_attention_fused_forward(const fsc_ctx *ctx, fsc_attn_saved *s, float *h, int C, int NH) {
    const int B = (int)s->qkv.shape[0], T = (int)s->qkv.shape[1];
    const float *qkv = s->qkv.data;
    s->att = s->lse = NULL;
    s->atth = NULL;
    if (s->qkv.dtype == FSC_DTYPE_BF16) { /* q/k/v and the probabilities kept in bf16 */
        s->atth = fsc_arena_alloc(ctx->arena, (size_t)B * NH * T * T * sizeof(uint16_t));
        if (!s->atth) return nn_attention_refused(B, T, NH);
        return fsc_attention_forward_bf16_act(h, s->atth, s->qkv.data, B, T, C, NH);
    }
    if (fsc_attention_uses_flash(ctx->attention, T)) {
        const fsc_attn_dims d = fused_dims(B, T, C, NH);
        s->lse = fsc_arena_alloc(ctx->arena, (size_t)B * NH * T * sizeof(float));
        if (!s->lse) return FSC_ERR_NOMEM;
        s->out = h;
        fsc_flash_attention_forward(&d, qkv, qkv + C, qkv + 2 * C, h, s->lse, false,
                                    fsc_ctx_prec(ctx));
        return FSC_OK;
    }
    s->att = fsc_arena_alloc(ctx->arena, (size_t)B * NH * T * T * sizeof(float));
    if (!s->att) return nn_attention_refused(B, T, NH);
    fsc_attention_forward_prec(h, s->att, qkv, B, T, C, NH, fsc_ctx_prec(ctx));
    return FSC_OK;
}

int nn_attention_fused_backward(const fsc_ctx *ctx, const fsc_attn_saved *s, const float *dh,
                                float *dqkv, int C, int NH) {
    const int B = (int)s->qkv.shape[0], T = (int)s->qkv.shape[1];
    const float *qkv = s->qkv.data;
    if (s->qkv.dtype == FSC_DTYPE_BF16)
        return fsc_attention_backward_bf16_act(dqkv, dh, s->qkv.data, s->atth, B, T, C, NH);
    if (!s->lse) {
        fsc_attention_backward_prec(dqkv, dh, qkv, s->att, B, T, C, NH, fsc_ctx_prec(ctx));
        return FSC_OK;
    }
    const fsc_attn_dims d = fused_dims(B, T, C, NH);
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    float *delta = fsc_arena_alloc(ctx->arena, (size_t)B * NH * T * sizeof(float));
    if (!delta) return FSC_ERR_NOMEM;
    memset(dqkv, 0, (size_t)B * T * 3 * C * sizeof(float)); /* backward adds */
    fsc_flash_attention_delta(&d, s->out, dh, delta);
    fsc_flash_attention_backward(&d, qkv, qkv + C, qkv + 2 * C, dh, s->lse, delta, dqkv, dqkv + C,
                                 dqkv + 2 * C, fsc_ctx_prec(ctx));
    fsc_arena_release(ctx->arena, mark);
    return FSC_OK;
}
