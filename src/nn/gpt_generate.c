/* GPT generation: a key/value cache and incremental forward, and sampling.
 *
 * The one idea: a block's output at position t depends on earlier
 * positions only through their keys and values, so those are kept per
 * layer, (L, seq, C) each, and a new token runs every layer on its own row
 * and attends over the cached rows. The weights are the model's own
 * parameter views (found by their Hugging Face names), read through the
 * same kernels the module forward uses.
 *
 * A Mixture-of-Experts MLP (fsc/moe.h) is per token too once nothing is
 * dropped: the new rows go through the layer's gate and its router
 * (moe_route_forward, the module's own code, so the same two experts and
 * combine weights), each expert runs on the rows that chose it, and no
 * capacity applies (a step of n tokens routes with capacity n). The module
 * forward agrees only if it drops nothing either: with capacity_factor <
 * experts a whole-prefix forward may drop a token's choice at capacity, and
 * a second choice's place even depends on later tokens' first choices, so
 * no causal cache could follow it. The cache therefore refuses such a
 * layer; a sampler builds the model with capacity_factor >= experts
 * (capacity T per row: nothing dropped) for both paths. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fsc/gpt.h"
#include "layers_internal.h"
#include "moe_internal.h"

typedef struct {
    const float *ln1_w, *ln1_b, *attn_w, *attn_b, *aproj_w, *aproj_b;
    const float *ln2_w, *ln2_b, *fc_w, *fc_b, *mproj_w, *mproj_b;
    int E, H;            /* an MoE MLP of E experts H wide (E == 0: the dense one above) */
    const float *gate_w; /* (E,C) */
    const float **ex;    /* per expert: c_fc weight, c_fc bias, c_proj weight, c_proj bias */
} layer_weights;

struct fsc_gpt_kv {
    int L, C, NH, V, T;
    int len; /* positions cached */
    const float *wte, *wpe, *lnf_w, *lnf_b;
    layer_weights *layer;
    float *k, *v; /* (L, T, C) each */
    /* scratch for up to T rows at once */
    float *x, *h, *qkv, *y, *fc, *mean, *rstd, *scores;
    int fc_width;     /* fc's columns: the widest MLP, dense (4C) or expert (H) */
    float *eo;        /* (T, 2, C): each row's two expert outputs (MoE layers) */
    fsc_arena *arena; /* routing scratch (MoE layers) */
};

/* ---- finding the weights by name --------------------------------------------------------------
 */

static fsc_module *child(fsc_module *m, const char *name) {
    for (int c = 0; m && c < m->nchildren; c++)
        if (!strcmp(m->children[c]->name, name)) return m->children[c];
    return NULL;
}

/* The data of parameter `name` of m, checked to hold `numel` elements. */
static const float *weight(fsc_module *m, const char *name, int64_t numel, int *bad) {
    for (int i = 0; m && i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name) && m->params[i].numel == numel && m->params[i].data)
            return m->params[i].data;
    if (!*bad)
        fsc_error(FSC_ERR_INVALID,
                  "KV cache: module '%s' has no bound parameter %s of %lld elements (a GPT "
                  "of this config, parameters bound?)",
                  m ? m->name : "(missing)", name, (long long)numel);
    *bad = 1;
    return NULL;
}

/* An MoE MLP's gate and experts (every one of them: the cache routes to
 * any), after checking that the module forward drops nothing either. */
static void find_moe_weights(fsc_gpt_kv *kv, layer_weights *w, fsc_module *mlp, int l, int *bad) {
    const fsc_moe_options *o = moe_options(mlp);
    const int64_t C = kv->C;
    if (o->ep.ranks > 1) {
        *bad = fsc_error(FSC_ERR_UNSUPPORTED,
                         "KV cache: h.%d.mlp holds %d of its %d experts (expert-parallel over %d "
                         "ranks); sampling needs every expert in one process",
                         l, o->experts / o->ep.ranks, o->experts, o->ep.ranks);
        return;
    }
    if (o->capacity_factor < (float)o->experts) {
        *bad = fsc_error(FSC_ERR_INVALID,
                         "KV cache: h.%d.mlp has capacity factor %g, so its full forward may drop "
                         "tokens that the cache never drops; build the model for sampling with "
                         "capacity_factor >= experts (%d), which drops none in either path",
                         l, (double)o->capacity_factor, o->experts);
        return;
    }
    w->E = o->experts, w->H = o->hidden;
    const int64_t H = w->H;
    if (!(w->ex = calloc((size_t)w->E * 4, sizeof *w->ex))) {
        *bad = fsc_error(FSC_ERR_NOMEM, "KV cache: out of memory");
        return;
    }
    w->gate_w = weight(child(mlp, "gate"), "weight", w->E * C, bad);
    fsc_module *experts = child(mlp, "experts");
    for (int e = 0; e < w->E && !*bad; e++) {
        char name[16];
        snprintf(name, sizeof name, "%d", e);
        fsc_module *ex = child(experts, name), *fc = child(ex, "c_fc"), *proj = child(ex, "c_proj");
        w->ex[4 * e + 0] = weight(fc, "weight", C * H, bad);
        w->ex[4 * e + 1] = weight(fc, "bias", H, bad);
        w->ex[4 * e + 2] = weight(proj, "weight", H * C, bad);
        w->ex[4 * e + 3] = weight(proj, "bias", C, bad);
    }
    if (w->H > kv->fc_width) kv->fc_width = w->H;
}

static int find_weights(fsc_gpt_kv *kv, fsc_module *g) {
    const int64_t C = kv->C;
    int bad = 0;
    kv->wte = weight(child(g, "wte"), "weight", (int64_t)kv->V * C, &bad);
    kv->wpe = weight(child(g, "wpe"), "weight", (int64_t)kv->T * C, &bad);
    kv->lnf_w = weight(child(g, "ln_f"), "weight", C, &bad);
    kv->lnf_b = weight(child(g, "ln_f"), "bias", C, &bad);
    for (int l = 0; l < kv->L && !bad; l++) {
        char name[32];
        snprintf(name, sizeof name, "h.%d", l);
        fsc_module *h = child(g, name), *attn = child(h, "attn"), *mlp = child(h, "mlp");
        layer_weights *w = &kv->layer[l];
        w->ln1_w = weight(child(h, "ln_1"), "weight", C, &bad);
        w->ln1_b = weight(child(h, "ln_1"), "bias", C, &bad);
        w->attn_w = weight(child(attn, "c_attn"), "weight", 3 * C * C, &bad);
        w->attn_b = weight(child(attn, "c_attn"), "bias", 3 * C, &bad);
        w->aproj_w = weight(child(attn, "c_proj"), "weight", C * C, &bad);
        w->aproj_b = weight(child(attn, "c_proj"), "bias", C, &bad);
        w->ln2_w = weight(child(h, "ln_2"), "weight", C, &bad);
        w->ln2_b = weight(child(h, "ln_2"), "bias", C, &bad);
        if (fsc_moe_is(mlp)) {
            find_moe_weights(kv, w, mlp, l, &bad);
            continue;
        }
        w->fc_w = weight(child(mlp, "c_fc"), "weight", 4 * C * C, &bad);
        w->fc_b = weight(child(mlp, "c_fc"), "bias", 4 * C, &bad);
        w->mproj_w = weight(child(mlp, "c_proj"), "weight", 4 * C * C, &bad);
        w->mproj_b = weight(child(mlp, "c_proj"), "bias", C, &bad);
    }
    return bad ? FSC_ERR_INVALID : FSC_OK;
}

/* ---- the cache ------------------------------------------------------------------------------- */

void fsc_gpt_kv_free(fsc_gpt_kv *kv) {
    if (!kv) return;
    float *bufs[] = {kv->k, kv->v,  kv->x,    kv->h,    kv->qkv,
                     kv->y, kv->fc, kv->mean, kv->rstd, kv->scores};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) fsc_mem_free(bufs[i]);
    fsc_mem_free(kv->eo);
    fsc_arena_free(kv->arena);
    for (int l = 0; kv->layer && l < kv->L; l++) free(kv->layer[l].ex);
    free(kv->layer);
    free(kv);
}

fsc_gpt_kv *fsc_gpt_kv_new(fsc_module *gpt, const fsc_gpt_config *cfg) {
    if (!gpt || !cfg || fsc_gpt_config_check(cfg)) {
        if (!gpt || !cfg) fsc_error(FSC_ERR_INVALID, "KV cache: NULL model or config");
        return NULL;
    }
    if (strcmp(gpt->ops->kind, "GPT")) {
        fsc_error(FSC_ERR_INVALID, "KV cache: module '%s' is a %s, not a GPT (fsc_gpt_new)",
                  gpt->name, gpt->ops->kind);
        return NULL;
    }
    fsc_gpt_kv *kv = calloc(1, sizeof *kv);
    if (!kv) {
        fsc_error(FSC_ERR_NOMEM, "KV cache: out of memory");
        return NULL;
    }
    *kv = (fsc_gpt_kv){.L = cfg->layers,
                       .C = cfg->d_model,
                       .NH = cfg->heads,
                       .V = cfg->vocab,
                       .T = cfg->seq,
                       .fc_width = 4 * cfg->d_model};
    const size_t T = (size_t)kv->T, C = (size_t)kv->C, f = sizeof(float);
    kv->layer = calloc((size_t)kv->L, sizeof *kv->layer);
    if (!kv->layer || find_weights(kv, gpt)) {
        if (!kv->layer) fsc_error(FSC_ERR_NOMEM, "KV cache: out of memory");
        fsc_gpt_kv_free(kv);
        return NULL;
    }
    kv->k = fsc_mem_alloc(FSC_MEM_ACTIV, (size_t)kv->L * T * C * f);
    kv->v = fsc_mem_alloc(FSC_MEM_ACTIV, (size_t)kv->L * T * C * f);
    kv->x = fsc_mem_alloc(FSC_MEM_ACTIV, T * C * f);
    kv->h = fsc_mem_alloc(FSC_MEM_ACTIV, T * C * f);
    kv->qkv = fsc_mem_alloc(FSC_MEM_ACTIV, 3 * T * C * f);
    kv->y = fsc_mem_alloc(FSC_MEM_ACTIV, T * C * f);
    kv->fc = fsc_mem_alloc(FSC_MEM_ACTIV, T * (size_t)kv->fc_width * f);
    kv->mean = fsc_mem_alloc(FSC_MEM_ACTIV, T * f);
    kv->rstd = fsc_mem_alloc(FSC_MEM_ACTIV, T * f);
    kv->scores = fsc_mem_alloc(FSC_MEM_ACTIV, T * T * f);
    if (!kv->k || !kv->v || !kv->x || !kv->h || !kv->qkv || !kv->y || !kv->fc || !kv->mean ||
        !kv->rstd || !kv->scores) {
        fsc_gpt_kv_free(kv);
        return NULL;
    }
    bool moe = false;
    for (int l = 0; l < kv->L; l++) moe |= kv->layer[l].E > 0;
    if (moe && (!(kv->eo = fsc_mem_alloc(FSC_MEM_ACTIV, 2 * T * C * f)) ||
                !(kv->arena = fsc_arena_new(FSC_MEM_ACTIV, 0)))) {
        fsc_gpt_kv_free(kv);
        return NULL;
    }
    return kv;
}

void fsc_gpt_kv_reset(fsc_gpt_kv *kv) {
    kv->len = 0;
}
int fsc_gpt_kv_len(const fsc_gpt_kv *kv) {
    return kv->len;
}

/* Causal attention of rows p0..p0+n-1 over cached rows 0..p0+n-1 of one
 * layer. q is (n, 3C) (the qkv rows), k and v (T, C); y is (n, C). */
static void attend(fsc_gpt_kv *kv, const float *q, const float *k, const float *v, float *y, int p0,
                   int n) {
    const int C = kv->C, hs = C / kv->NH, keys = p0 + n;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int hh = 0; hh < kv->NH; hh++) {
        const int o = hh * hs;
        /* scores (n, keys) = q_h k_h^T / sqrt(hs), then row i sees keys 0..p0+i */
        fsc_sgemm(false, true, n, keys, hs, scale, q + o, 3 * C, k + o, C, 0.f, kv->scores, keys);
        /* the training forward's softmax (its exp and its 1/sum), so the two
         * paths differ only in the order of their sums, which the noise floor
         * of the equivalence tests measures; libm's expf differed from it by
         * more than that on some CPUs */
        for (int i = 0; i < n; i++)
            fsc_softmax_causal_row(kv->scores + (size_t)i * keys, p0 + i, keys);
        fsc_sgemm(false, false, n, hs, keys, 1.f, kv->scores, keys, v + o, C, 0.f, y + o, C);
    }
}

/* The MoE MLP of layer w on rows h (n,C), into y (n,C): gate and router as
 * the module's, with capacity n (nothing dropped); each expert runs on the
 * rows that chose it, gathered into y, and the outputs are combined in the
 * module's order (c1 o1, then + c2 o2). */
static int moe_mlp(fsc_gpt_kv *kv, const layer_weights *w, const float *h, float *y, int n) {
    const int C = kv->C, E = w->E, H = w->H;
    const size_t row = (size_t)C * sizeof(float);
    fsc_arena_reset(kv->arena);
    float *logits = fsc_arena_alloc(kv->arena, (size_t)n * E * sizeof(float));
    int32_t *rows = fsc_arena_alloc(kv->arena, (size_t)n * sizeof(int32_t));
    if (!logits || !rows)
        return fsc_error(FSC_ERR_NOMEM, "KV cache: out of memory routing %d tokens", n);
    fsc_matmul_forward(logits, h, w->gate_w, NULL, n, C, E, FSC_WEIGHT_OUT_IN);
    moe_route r;
    if (moe_route_forward(&r, logits, 1, n, E, n, kv->arena))
        return fsc_error(FSC_ERR_NOMEM, "KV cache: out of memory routing %d tokens", n);
    for (int e = 0; e < E; e++) {
        int k = 0;
        for (int t = 0; t < n; t++) { /* gather the rows that chose e, into y */
            if (r.e1[t] != e && r.e2[t] != e) continue;
            memcpy(y + (size_t)k * C, h + (size_t)t * C, row);
            rows[k++] = t;
        }
        if (!k) continue;
        const float *const *p = w->ex + 4 * e;
        fsc_matmul_forward(kv->fc, y, p[0], p[1], k, C, H, FSC_WEIGHT_IN_OUT);
        fsc_gelu_forward(kv->fc, kv->fc, (int64_t)k * H);
        fsc_matmul_forward(y, kv->fc, p[2], p[3], k, H, C, FSC_WEIGHT_IN_OUT);
        for (int i = 0; i < k; i++) {
            const int t = rows[i];
            memcpy(kv->eo + ((size_t)2 * t + (r.e2[t] == e)) * C, y + (size_t)i * C, row);
        }
    }
    for (int t = 0; t < n; t++) {
        const float *o1 = kv->eo + (size_t)2 * t * C, *o2 = o1 + C;
        float *yt = y + (size_t)t * C;
        for (int c = 0; c < C; c++) {
            float v = 0.f; /* both choices kept: capacity n holds every token */
            v += r.c1[t] * o1[c];
            v += r.c2[t] * o2[c];
            yt[c] = v;
        }
    }
    return FSC_OK;
}

int fsc_gpt_kv_append(fsc_gpt_kv *kv, const int32_t *ids, int n, float *logits, bool all) {
    if (!kv || !ids || !logits || n < 1)
        return fsc_error(FSC_ERR_INVALID, "KV cache: append needs ids, logits and n >= 1");
    if (n > kv->T - kv->len)
        return fsc_error(FSC_ERR_INVALID,
                         "KV cache: %d cached + %d new positions exceed the model's %d "
                         "(reset and re-run a shorter context)",
                         kv->len, n, kv->T);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= kv->V)
            return fsc_error(FSC_ERR_INVALID,
                             "KV cache: token %d at position %d outside vocab "
                             "[0,%d)",
                             ids[i], i, kv->V);
    const int C = kv->C, p0 = kv->len;
    const size_t cache_row = (size_t)kv->T * C;
    /* x (n,C) = wte[ids] + wpe[p0..p0+n) */
    fsc_encoder_forward(kv->x, ids, kv->wte, kv->wpe + (size_t)p0 * C, 1, n, C);
    for (int l = 0; l < kv->L; l++) {
        const layer_weights *w = &kv->layer[l];
        float *kc = kv->k + l * cache_row, *vc = kv->v + l * cache_row;
        fsc_layernorm_forward(kv->h, kv->mean, kv->rstd, kv->x, w->ln1_w, w->ln1_b, n, C, 1e-5f);
        fsc_matmul_forward(kv->qkv, kv->h, w->attn_w, w->attn_b, n, C, 3 * C, FSC_WEIGHT_IN_OUT);
        for (int i = 0; i < n; i++) {
            const float *row = kv->qkv + (size_t)i * 3 * C;
            memcpy(kc + (size_t)(p0 + i) * C, row + C, (size_t)C * sizeof(float));
            memcpy(vc + (size_t)(p0 + i) * C, row + 2 * C, (size_t)C * sizeof(float));
        }
        attend(kv, kv->qkv, kc, vc, kv->y, p0, n);
        fsc_matmul_forward(kv->h, kv->y, w->aproj_w, w->aproj_b, n, C, C, FSC_WEIGHT_IN_OUT);
        fsc_add_inplace(kv->x, kv->h, (int64_t)n * C);
        fsc_layernorm_forward(kv->h, kv->mean, kv->rstd, kv->x, w->ln2_w, w->ln2_b, n, C, 1e-5f);
        if (w->E) {
            int rc = moe_mlp(kv, w, kv->h, kv->y, n);
            if (rc) return rc;
            fsc_add_inplace(kv->x, kv->y, (int64_t)n * C);
            continue;
        }
        fsc_matmul_forward(kv->fc, kv->h, w->fc_w, w->fc_b, n, C, 4 * C, FSC_WEIGHT_IN_OUT);
        fsc_gelu_forward(kv->fc, kv->fc, (int64_t)n * 4 * C);
        fsc_matmul_forward(kv->h, kv->fc, w->mproj_w, w->mproj_b, n, 4 * C, C, FSC_WEIGHT_IN_OUT);
        fsc_add_inplace(kv->x, kv->h, (int64_t)n * C);
    }
    kv->len += n;
    /* the head: ln_f and the tied wte, on the rows asked for */
    const int first = all ? 0 : n - 1, rows = n - first;
    fsc_layernorm_forward(kv->h, kv->mean, kv->rstd, kv->x + (size_t)first * C, kv->lnf_w,
                          kv->lnf_b, rows, C, 1e-5f);
    fsc_matmul_forward(logits, kv->h, kv->wte, NULL, rows, C, kv->V, FSC_WEIGHT_OUT_IN);
    return FSC_OK;
}

/* ---- sampling -------------------------------------------------------------------------------- */

/* The k-th largest of a[0..n) (1 <= k <= n); a is reordered (quickselect). */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = a[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j], a[j--] = t;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            break;
    }
    return a[want];
}

int32_t fsc_gpt_sample(const float *logits, int V, float temperature, int top_k, uint64_t seed,
                       int64_t index, float *work) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (!(temperature > 0)) return best;
    float floor = -FLT_MAX;
    if (top_k > 0 && top_k < V) {
        memcpy(work, logits, (size_t)V * sizeof *work);
        floor = kth_largest(work, V, top_k);
    }
    double sum = 0;
    for (int i = 0; i < V; i++) {
        work[i] = logits[i] >= floor ? expf((logits[i] - logits[best]) / temperature) : 0.f;
        sum += work[i];
    }
    fsc_philox_out r = fsc_philox4x32(fsc_rng_key_ints(seed, 0x5A3D1E, 0), 0, (uint64_t)index);
    double u = fsc_rng_uniform(r.v[0]) * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += work[i];
        if (work[i] > 0 && u < acc) return i;
    }
    return best; /* rounding left u at the very top */
}
