/* Parameters of tensor-parallel trees: which are shards and of what, their
 * initialisation as slices of the global tensors, and the gradient norm that
 * counts replicated parameters once.
 *
 * The one idea: a local parameter is described by a tp_shard (dimension,
 * blocks, global size), from which every local element knows its global flat
 * index; fsc_rng_normal_fill draws by global index, so a shard initialises to
 * the exact slice of the one-process tensor. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tp_internal.h"

const char TP_KIND_COLUMN[] = "ColumnParallelLinear", TP_KIND_ROW[] = "RowParallelLinear",
           TP_KIND_EMBEDDING[] = "VocabParallelEmbedding",
           TP_KIND_LAYERNORM[] = "TensorParallelLayerNorm",
           TP_KIND_DROPOUT[] = "TensorParallelDropout",
           TP_KIND_ATTENTION[] = "TensorParallelAttention", TP_KIND_BLOCK[] = "TensorParallelBlock",
           TP_KIND_MLP[] = "TensorParallelMLP";
/* not a tp_module: the TP layout's kind of src/nn/gpt.c's model (tp_gpt.c) */
const char TP_KIND_GPT[] = "TensorParallelGPT";

tp_module *tp_module_of(const fsc_module *m) {
    static const char *const kinds[] = {TP_KIND_COLUMN,    TP_KIND_ROW,     TP_KIND_EMBEDDING,
                                        TP_KIND_LAYERNORM, TP_KIND_DROPOUT, TP_KIND_ATTENTION,
                                        TP_KIND_BLOCK,     TP_KIND_MLP};
    if (!m || !m->ops) return NULL;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (m->ops->kind == kinds[i]) return (tp_module *)(uintptr_t)m;
    return NULL;
}

void *tp_module_alloc(size_t size, const fsc_module_ops *ops, const char *name,
                      const fsc_tp_options *opt) {
    if (!opt) {
        fsc_error(FSC_ERR_INVALID, "%s %s: the tensor-parallel options are NULL", ops->kind,
                  name ? name : "");
        return NULL;
    }
    fsc_group *g = opt->group ? opt->group : fsc_group_self();
    if (!g) {
        fsc_error(FSC_ERR_INVALID, "%s %s: no group (call fsc_dist_init first)", ops->kind,
                  name ? name : "");
        return NULL;
    }
    tp_module *m = calloc(1, size);
    if (!m) {
        fsc_error(FSC_ERR_NOMEM, "out of memory creating %s %s", ops->kind, name ? name : "");
        return NULL;
    }
    fsc_module_init(&m->base, ops, name);
    m->g = g;
    m->rank = fsc_group_rank(g);
    m->size = fsc_group_size(g);
    m->sp = opt->sequence_parallel;
    for (int i = 0; i < TP_MAX_PARAMS; i++) m->shard[i].dim = -1;
    return m;
}

int fsc_tp_vocab_range(int V, int t, int rank, int *first, int *count, int *padded) {
    if (V < 1 || t < 1 || rank < 0 || rank >= t)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_tp_vocab_range: vocab %d over %d ranks, rank %d (expected vocab >= "
                         "1, ranks >= 1, 0 <= rank < ranks)",
                         V, t, rank);
    int vp = (V + t - 1) / t, f = rank * vp, c = V - f;
    c = c < 0 ? 0 : c > vp ? vp : c;
    if (first) *first = f < V ? f : V;
    if (count) *count = c;
    if (padded) *padded = vp;
    return FSC_OK;
}

int64_t tp_global_index(const tp_module *m, const tp_shard *s, int64_t j) {
    int64_t blk = j / s->local_block, w = j % s->local_block;
    int64_t per_block = s->global_dim / s->blocks, at = (int64_t)m->rank * s->local_block + w;
    return at < per_block ? blk * per_block + at : -1;
}

/* The TP module whose parameter p is (its index in *idx), or NULL. */
static tp_module *owner_of(fsc_module *m, const fsc_param *p, int *idx) {
    if (m->nparams && p >= m->params && p < m->params + m->nparams) {
        *idx = (int)(p - m->params);
        return tp_module_of(m);
    }
    for (int c = 0; c < m->nchildren; c++) {
        int found = -1;
        tp_module *t = owner_of(m->children[c], p, &found);
        if (found >= 0) {
            *idx = found;
            return t;
        }
    }
    return NULL;
}

const tp_shard *tp_param_shard(fsc_module *root, const fsc_param *p, tp_module **owner) {
    int idx = -1;
    tp_module *t = owner_of(root, p, &idx);
    if (!t || idx < 0 || idx >= TP_MAX_PARAMS || t->shard[idx].dim < 0) return NULL;
    *owner = t;
    return &t->shard[idx];
}

/* Entry i's shard, or NULL when every TP rank holds all of it. */
static const tp_shard *shard_of(fsc_module *root, const fsc_params *ps, int i, tp_module **tm) {
    return tp_param_shard(root, ps->entries[i].param, tm);
}

bool fsc_tp_param_is_sharded(fsc_module *root, const fsc_params *ps, int i) {
    tp_module *t;
    return root && ps && i >= 0 && i < ps->count && shard_of(root, ps, i, &t) != NULL;
}

/* Fills local parameter p, a shard of the global tensor `name` under s. */
static void init_shard(const tp_module *t, const tp_shard *s, fsc_param *p, uint64_t key) {
    int64_t outer = 1, inner = 1, L = p->shape[s->dim];
    for (int d = 0; d < s->dim; d++) outer *= p->shape[d];
    for (int d = s->dim + 1; d < p->ndim; d++) inner *= p->shape[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < L; j++) {
            float *dst = p->data + (o * L + j) * inner;
            int64_t g = tp_global_index(t, s, j);
            if (g < 0) { /* padding: zero, never drawn */
                memset(dst, 0, (size_t)inner * sizeof(float));
                continue;
            }
            switch (p->init) {
            case FSC_INIT_ZEROS:
                memset(dst, 0, (size_t)inner * sizeof(float));
                break;
            case FSC_INIT_ONES:
                for (int64_t k = 0; k < inner; k++) dst[k] = 1.f;
                break;
            case FSC_INIT_NORMAL:
                fsc_rng_normal_fill(dst, inner, (o * s->global_dim + g) * inner, key, 0.f,
                                    p->init_std);
                break;
            case FSC_INIT_UNIFORM:
                fsc_params_uniform_fill(dst, inner, (o * s->global_dim + g) * inner, key,
                                        p->init_std);
                break;
            }
        }
}

void fsc_tp_params_init_values(fsc_module *root, fsc_params *ps, uint64_t seed) {
    fsc_params_init_values(ps, seed); /* replicated ones as one process */
    for (int i = 0; i < ps->count; i++) {
        tp_module *t;
        const tp_shard *s = shard_of(root, ps, i, &t);
        if (s) init_shard(t, s, ps->entries[i].param, fsc_rng_key(seed, ps->entries[i].name));
    }
}

int fsc_tp_params_bind(fsc_module *root, uint64_t seed, bool with_grads, fsc_params *out) {
    if (!root || !out) return fsc_error(FSC_ERR_INVALID, "fsc_tp_params_bind: NULL argument");
    int rc = fsc_params_bind(root, seed, with_grads, out);
    if (!rc) fsc_tp_params_init_values(root, out, seed);
    return rc;
}

int fsc_tp_grad_norm(fsc_module *root, const fsc_params *ps, fsc_group *g, float *norm) {
    if (!root || !ps || !g || !norm)
        return fsc_error(FSC_ERR_INVALID, "fsc_tp_grad_norm: NULL argument");
    double sharded = 0, replicated = 0;
    for (int i = 0; i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        if (!p->grad)
            return fsc_error(FSC_ERR_INVALID, "fsc_tp_grad_norm: gradient of %s is not bound",
                             ps->entries[i].name);
        double sq = fsc_sumsq(p->grad, p->numel);
        if (fsc_tp_param_is_sharded(root, ps, i))
            sharded += sq;
        else
            replicated += sq;
    }
    /* Each rank's sharded figure travels as the bits of a double (the dist
     * layer reduces no F64) and every rank adds them in rank order: the same
     * norm everywhere. */
    int t = fsc_group_size(g);
    int64_t bits, *all = malloc((size_t)t * sizeof *all);
    if (!all) return fsc_error(FSC_ERR_NOMEM, "fsc_tp_grad_norm: out of memory");
    memcpy(&bits, &sharded, sizeof bits);
    int rc = fsc_group_allgather(g, &bits, all, 1, FSC_DTYPE_I64);
    double total = replicated;
    for (int r = 0; r < t && !rc; r++) {
        double v;
        memcpy(&v, &all[r], sizeof v);
        total += v;
    }
    free(all);
    if (rc) return fsc_error_context(rc, "fsc_tp_grad_norm: ");
    *norm = (float)sqrt(total);
    return FSC_OK;
}

int fsc_tp_clip_grad_norm(fsc_module *root, const fsc_params *ps, fsc_group *g, float max_norm,
                          float *total_norm) {
    float norm = 0;
    int rc = fsc_tp_grad_norm(root, ps, g, &norm);
    if (rc) return rc;
    if (total_norm) *total_norm = norm;
    if (!(max_norm >= 0.0f))
        return fsc_error(FSC_ERR_INVALID, "fsc_tp_clip_grad_norm: max_norm %g must be >= 0",
                         (double)max_norm);
    if (!isfinite(norm))
        return fsc_error(FSC_ERR_NUMERIC,
                         "fsc_tp_clip_grad_norm: norm is %g; gradients left "
                         "unscaled",
                         (double)norm);
    /* fsc_clip_grads_scale's coefficient, over the bound gradients */
    const float coef = (1.0f / (norm + 1e-6f)) * max_norm;
    if (!(coef < 1.0f)) return FSC_OK;
    for (int i = 0; i < ps->count; i++)
        fsc_scale(ps->entries[i].param->grad, coef, ps->entries[i].param->numel);
    return FSC_OK;
}
