/* Rotary embeddings as a layer without parameters: x (B,T,H*hd) rotated per
 * head at positions pos0 .. pos0+T-1. The inverse frequencies are part of
 * the configuration (computed once, at construction); the (T, hd/2) cos and
 * sin tables of a call are the saved record, all backward needs. */
#include "layers_internal.h"
#include "llama_internal.h"

typedef struct {
    fsc_module base;
    int H, hd, pos0;
    float inv_freq[]; /* (hd/2) */
} rope;

typedef struct {
    fsc_tensor x; /* shape only */
    float *cos_t, *sin_t;
} rope_saved;

int fsc_rope_tables_alloc(fsc_arena *a, const float *inv_freq, int T, int hd, int pos0,
                          float **cos_t, float **sin_t) {
    size_t n = (size_t)T * (size_t)(hd / 2) * sizeof(float);
    *cos_t = fsc_arena_alloc(a, n);
    *sin_t = fsc_arena_alloc(a, n);
    if (!*cos_t || !*sin_t) return FSC_ERR_NOMEM;
    fsc_rope_table(*cos_t, *sin_t, inv_freq, T, hd, pos0);
    return FSC_OK;
}

int fsc_rope_check_config(const char *kind, const char *name, int hd, float theta,
                          const fsc_rope_scaling *sc) {
    if (hd <= 0 || hd % 2)
        return fsc_error(FSC_ERR_INVALID, "%s %s: head_dim %d must be even and positive", kind,
                         name, hd);
    if (!(theta > 0.f) || !isfinite(theta))
        return fsc_error(FSC_ERR_INVALID, "%s %s: rope_theta %g must be positive", kind, name,
                         (double)theta);
    if (sc && sc->factor > 0.f &&
        (!(sc->low_freq_factor > 0.f) || !(sc->high_freq_factor > sc->low_freq_factor) ||
         sc->original_max_position_embeddings <= 0 || !isfinite(sc->factor) ||
         !isfinite(sc->high_freq_factor)))
        return fsc_error(FSC_ERR_INVALID,
                         "%s %s: rope_scaling needs 0 < low_freq_factor (%g) < high_freq_factor "
                         "(%g) and original_max_position_embeddings (%d) > 0",
                         kind, name, (double)sc->low_freq_factor, (double)sc->high_freq_factor,
                         sc->original_max_position_embeddings);
    return FSC_OK;
}

static int rope_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    rope *r = (rope *)m;
    if (x->ndim != 3 || x->dtype != FSC_DTYPE_F32 || x->shape[2] != (int64_t)r->H * r->hd)
        return fsc_error(FSC_ERR_SHAPE, "RotaryEmbedding %s: expected f32 (B,T,%d) input", m->name,
                         r->H * r->hd);
    int B = (int)x->shape[0], T = (int)x->shape[1];
    rope_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    int rc = s ? fsc_alloc_like(ctx->arena, x, x->shape[2], y) : FSC_ERR_NOMEM;
    if (!rc)
        rc =
            fsc_rope_tables_alloc(ctx->arena, r->inv_freq, T, r->hd, r->pos0, &s->cos_t, &s->sin_t);
    if (rc) return rc;
    s->x = *x;
    fsc_rope_forward(y->data, x->data, s->cos_t, s->sin_t, B, T, r->H, r->hd);
    *saved = s;
    return FSC_OK;
}

static int rope_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    rope *r = (rope *)m;
    rope_saved *s = saved;
    int rc = fsc_check_saved(m, saved);
    if (!rc) rc = fsc_check_dy_like(m, dy, &s->x, s->x.shape[2]);
    if (rc || !dx) return rc;
    rc = fsc_alloc_like(ctx->arena, &s->x, s->x.shape[2], dx);
    if (rc) return rc;
    fsc_rope_backward(dx->data, dy->data, s->cos_t, s->sin_t, (int)s->x.shape[0],
                      (int)s->x.shape[1], r->H, r->hd);
    return FSC_OK;
}

static const fsc_module_ops rope_ops = {"RotaryEmbedding", rope_forward, rope_backward, NULL};

fsc_module *fsc_rope_new(const char *name, int n_heads, int head_dim, float theta,
                         const fsc_rope_scaling *scaling, int pos0) {
    if (theta <= 0.f) theta = 10000.f;
    if (fsc_rope_check_config("RotaryEmbedding", name, head_dim, theta, scaling)) return NULL;
    if (n_heads <= 0 || pos0 < 0) {
        fsc_error(FSC_ERR_INVALID, "RotaryEmbedding %s: %d heads, first position %d", name, n_heads,
                  pos0);
        return NULL;
    }
    rope *r = fsc_module_alloc(sizeof *r + (size_t)(head_dim / 2) * sizeof(float), &rope_ops, name);
    if (!r) return NULL;
    r->H = n_heads, r->hd = head_dim, r->pos0 = pos0;
    fsc_rope_inv_freq(r->inv_freq, head_dim, theta, scaling);
    return &r->base;
}
