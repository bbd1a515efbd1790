/* GPT generation: a key/value cache over the model's own forward, and
 * sampling.
 *
 * The one idea: a block's output at position t depends on earlier
 * positions only through their keys and values, so those are kept per
 * attention layer, (seq, C) each, and new tokens run the model's one
 * forward (src/nn/gpt.c) on their own rows with fsc_ctx.kv set: attention
 * appends their keys and values and attends over the cached rows
 * (src/nn/attention.c), the embedding starts at the cached length, and the
 * head makes only the logits asked for. Every other layer is per token.
 *
 * A Mixture-of-Experts MLP (fsc/moe.h) is per token too once nothing is
 * dropped: its forward on n new rows routes with capacity at least n when
 * capacity_factor >= experts, so every token keeps both its experts. The
 * module forward over a whole prefix agrees only if it drops nothing
 * either: with capacity_factor < experts it may drop a token's choice at
 * capacity, and a second choice's place even depends on later tokens'
 * first choices, so no causal cache could follow it. The cache therefore
 * refuses such a layer; a sampler builds the model with capacity_factor >=
 * experts (capacity T per row: nothing dropped) for both paths. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpt_internal.h"
#include "moe_internal.h"

struct fsc_gpt_kv {
    fsc_module *gpt;
    int V;
    fsc_kv_cache cache;
    fsc_arena *arena; /* one append's activations, reset at the next */
};

/* m's name below the root, "h.1.mlp". */
static void path_of(const fsc_module *m, char *buf, size_t n) {
    if (m->parent && m->parent->parent) {
        path_of(m->parent, buf, n);
        size_t at = strlen(buf);
        if (snprintf(buf + at, n - at, ".%s", m->name) >= (int)(n - at)) buf[n - 1] = '\0';
    } else {
        snprintf(buf, n, "%s", m->name);
    }
}

/* FSC_OK when every MoE MLP of the tree holds all its experts and drops
 * nothing; else the error, naming the layer. */
static int check_moe(const fsc_module *m) {
    if (fsc_moe_is(m)) {
        const fsc_moe_options *o = moe_options(m);
        char name[128];
        path_of(m, name, sizeof name);
        if (o->ep.ranks > 1)
            return fsc_error(FSC_ERR_UNSUPPORTED,
                             "KV cache: %s holds %d of its %d experts (expert-parallel over %d "
                             "ranks); sampling needs every expert in one process",
                             name, o->experts / o->ep.ranks, o->experts, o->ep.ranks);
        if (o->capacity_factor < (float)o->experts)
            return fsc_error(FSC_ERR_INVALID,
                             "KV cache: %s has capacity factor %g, so its full forward "
                             "may drop tokens that the cache never drops; build the model for "
                             "sampling with capacity_factor >= experts (%d), which drops none in "
                             "either path",
                             name, (double)o->capacity_factor, o->experts);
        return FSC_OK;
    }
    for (int c = 0; c < m->nchildren; c++) {
        int rc = check_moe(m->children[c]);
        if (rc) return rc;
    }
    return FSC_OK;
}

/* FSC_OK when every parameter of the tree has storage. */
static int check_bound(const fsc_module *m) {
    for (int i = 0; i < m->nparams; i++)
        if (!m->params[i].data)
            return fsc_error(FSC_ERR_INVALID,
                             "KV cache: parameter %s of module '%s' is not bound (bind and load "
                             "the model's parameters first)",
                             m->params[i].name, m->name);
    for (int c = 0; c < m->nchildren; c++) {
        int rc = check_bound(m->children[c]);
        if (rc) return rc;
    }
    return FSC_OK;
}

/* ---- the cache ------------------------------------------------------------------------------- */

void fsc_gpt_kv_free(fsc_gpt_kv *kv) {
    if (!kv) return;
    fsc_mem_free(kv->cache.k);
    fsc_mem_free(kv->cache.v);
    fsc_arena_free(kv->arena);
    free(kv);
}

fsc_gpt_kv *fsc_gpt_kv_new(fsc_module *gpt, const fsc_gpt_config *cfg) {
    if (!gpt || !cfg || fsc_gpt_config_check(cfg)) {
        if (!gpt || !cfg) fsc_error(FSC_ERR_INVALID, "KV cache: NULL model or config");
        return NULL;
    }
    const gpt_model *model = gpt_model_decoding(gpt);
    if (!model) {
        fsc_error(FSC_ERR_INVALID,
                  "KV cache: module '%s' is a %s, not a whole one-process model (fsc_gpt_new)",
                  gpt->name, gpt->ops->kind);
        return NULL;
    }
    const fsc_gpt_config *own = &model->cfg;
    if (own->vocab != cfg->vocab || own->seq != cfg->seq || own->layers != cfg->layers ||
        own->d_model != cfg->d_model || own->heads != cfg->heads || own->arch != cfg->arch ||
        own->kv_heads != cfg->kv_heads) {
        fsc_error(FSC_ERR_INVALID,
                  "KV cache: the model is L%d C%d H%d T%d V%d, the config L%d C%d H%d T%d V%d",
                  own->layers, own->d_model, own->heads, own->seq, own->vocab, cfg->layers,
                  cfg->d_model, cfg->heads, cfg->seq, cfg->vocab);
        return NULL;
    }
    if (check_bound(gpt) || check_moe(gpt)) return NULL;
    fsc_gpt_kv *kv = calloc(1, sizeof *kv);
    if (!kv) {
        fsc_error(FSC_ERR_NOMEM, "KV cache: out of memory");
        return NULL;
    }
    kv->gpt = gpt, kv->V = cfg->vocab;
    /* the keys' and values' channels: every head's in GPT-2, the KV heads' in LLaMA */
    const int C = cfg->arch == FSC_ARCH_LLAMA && cfg->kv_heads
                      ? cfg->kv_heads * (cfg->d_model / cfg->heads)
                      : cfg->d_model;
    kv->cache = (fsc_kv_cache){.slots = cfg->layers, .T = cfg->seq, .C = C};
    const size_t bytes = (size_t)cfg->layers * cfg->seq * C * sizeof(float);
    kv->cache.k = fsc_mem_alloc(FSC_MEM_ACTIV, bytes);
    kv->cache.v = fsc_mem_alloc(FSC_MEM_ACTIV, bytes);
    kv->arena = fsc_arena_new(FSC_MEM_ACTIV, 0);
    if (!kv->cache.k || !kv->cache.v || !kv->arena) {
        fsc_error(FSC_ERR_NOMEM, "KV cache: out of memory for %d layers x %d positions",
                  cfg->layers, cfg->seq);
        fsc_gpt_kv_free(kv);
        return NULL;
    }
    return kv;
}

void fsc_gpt_kv_reset(fsc_gpt_kv *kv) {
    kv->cache.len = 0;
}
int fsc_gpt_kv_len(const fsc_gpt_kv *kv) {
    return kv->cache.len;
}

int fsc_gpt_kv_append(fsc_gpt_kv *kv, const int32_t *ids, int n, float *logits, bool all) {
    if (!kv || !ids || !logits || n < 1)
        return fsc_error(FSC_ERR_INVALID, "KV cache: append needs ids, logits and n >= 1");
    fsc_kv_cache *c = &kv->cache;
    if (n > c->T - c->len)
        return fsc_error(FSC_ERR_INVALID,
                         "KV cache: %d cached + %d new positions exceed the model's %d "
                         "(reset and re-run a shorter context)",
                         c->len, n, c->T);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= kv->V)
            return fsc_error(FSC_ERR_INVALID,
                             "KV cache: token %d at position %d outside vocab "
                             "[0,%d)",
                             ids[i], i, kv->V);
    fsc_arena_reset(kv->arena);
    c->next = 0, c->last_only = !all;
    const fsc_ctx ctx = {.arena = kv->arena, .training = false, .kv = c};
    fsc_tensor x = fsc_tensor_2d((void *)ids, FSC_DTYPE_I32, 1, n), y;
    void *saved = NULL;
    int rc = fsc_module_forward(kv->gpt, &ctx, &x, &y, &saved);
    if (rc) return rc;
    if (c->next != c->slots) /* a layer that kept no keys would have attended to stale ones */
        return fsc_error(FSC_ERR_INVALID, "KV cache: %d of the model's %d attention layers ran",
                         c->next, c->slots);
    memcpy(logits, y.data, fsc_tensor_nbytes(&y));
    c->len += n;
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
