/* The gradient probe on a pipeline's stages (fsc_pipe_options.probe;
 * AdaScale's samples): each micro-batch's own gradient, as much of it as
 * this rank counts in the mesh's gradient norm.
 *
 * The one idea: a stage's backward adds one micro-batch's gradient to its
 * chunk's flat buffer (+=), so hooks around the chunk's backward see that
 * micro-batch alone as the difference from the buffer before it (the
 * step's first backward needs no copy: the buffer started at zero). Each
 * parameter counts on one rank of the mesh, as in the norm (pipe_state.c):
 * one that every TP rank holds on TP rank 0 only, one that several stages
 * share (the GPT's tied wte) on its owner, once the holders' parts of the
 * micro-batch are summed. Those parts are kept per micro-batch (keyed by
 * its first sample, which every stage knows alike) until the schedule has
 * run; with one micro-batch the summed gradient itself is that sum. Over
 * the mesh, the squares of what the probe sees add up to every replica's
 * micro-batches' squared norms of the whole model's gradient. */
#include <stdlib.h>
#include <string.h>

#include "pipe_exec_internal.h"
#include "parallel/tp/tp_internal.h"

enum { BLOCK = 4096 }; /* floats per difference handed to the probe */

typedef struct {
    int64_t off, n; /* a run of a chunk's flat gradient */
} stretch;

typedef struct {
    struct pipe_probe *pr;
    int chunk;
    stretch *counted; /* this chunk's parameters that count here, shared ones apart */
    int ncounted;
    float *before; /* the buffer before the running backward (FSC_MEM_WORK, made when needed) */
    int backwards; /* since the gradients were zeroed */
} chunk_probe;

struct pipe_probe {
    fsc_pipe *p;
    fsc_grad_probe_fn fn;
    void *user;
    chunk_probe *chunks;
    int64_t *shared_off; /* per p->shared entry: its place in a kept micro-batch */
    int64_t shared_numel;
    bool *shared_counted; /* per p->shared entry: counted on this rank */
    float *kept;          /* micros x shared_numel: each micro-batch's parts (FSC_MEM_WORK) */
    int64_t *kept_sample0;
    int nkept;
    float diff[BLOCK];
};

/* Whether this rank counts parameter q of chunk c (as pipe_state.c does). */
static bool tp_counts(fsc_pipe *p, int c, const fsc_param *q) {
    return !p->opt.tp || p->tp_rank == 0 || tp_place(p->chunk[c], q).s != NULL;
}

static int shared_index(const fsc_pipe *p, const float *grad) {
    for (int i = 0; i < p->nshared; i++)
        if (p->shared[i].grad == grad) return i;
    return -1;
}

/* g - before (before NULL: g), block by block, to the probe. */
static void show(struct pipe_probe *pr, int64_t off, const float *g, const float *before,
                 int64_t n) {
    if (!before) {
        pr->fn(pr->user, off, g, n);
        return;
    }
    for (int64_t at = 0; at < n; at += BLOCK) {
        const int64_t k = n - at < BLOCK ? n - at : BLOCK;
        for (int64_t i = 0; i < k; i++) pr->diff[i] = g[at + i] - before[at + i];
        pr->fn(pr->user, off + at, pr->diff, k);
    }
}

/* The slot of the micro-batch whose first sample is sample0. */
static float *kept_slot(struct pipe_probe *pr, int64_t sample0) {
    fsc_pipe *p = pr->p;
    for (int m = 0; m < pr->nkept; m++)
        if (pr->kept_sample0[m] == sample0) return pr->kept + (size_t)m * pr->shared_numel;
    if (pr->nkept == p->cfg.micros) {
        fsc_error(FSC_ERR_INVALID, "pipeline probe: more than the schedule's %d micro-batches",
                  p->cfg.micros);
        return NULL;
    }
    const size_t bytes = sizeof(float) * (size_t)p->cfg.micros * (size_t)pr->shared_numel;
    if (!pr->kept && !(pr->kept = fsc_mem_alloc(FSC_MEM_WORK, bytes))) {
        fsc_error(FSC_ERR_NOMEM, "pipeline probe: out of memory keeping shared gradients");
        return NULL;
    }
    pr->kept_sample0[pr->nkept] = sample0;
    return pr->kept + (size_t)pr->nkept++ * pr->shared_numel;
}

/* Before a backward that adds to a buffer holding earlier micro-batches. */
static int before_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                           const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    chunk_probe *cp = user;
    const fsc_params *ps = &cp->pr->p->params[cp->chunk];
    if (!cp->backwards) return FSC_OK;
    if (!cp->before &&
        !(cp->before = fsc_mem_alloc(FSC_MEM_WORK, sizeof(float) * (size_t)ps->numel)))
        return fsc_error(FSC_ERR_NOMEM, "pipeline probe: out of memory");
    memcpy(cp->before, ps->grad, sizeof(float) * (size_t)ps->numel);
    return FSC_OK;
}

/* This micro-batch's gradient: counted runs to the probe, shared ones kept. */
static int after_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                          const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)t;
    chunk_probe *cp = user;
    struct pipe_probe *pr = cp->pr;
    fsc_pipe *p = pr->p;
    const fsc_params *ps = &p->params[cp->chunk];
    const float *before = cp->backwards++ ? cp->before : NULL;
    for (int i = 0; i < cp->ncounted; i++) {
        const stretch *s = &cp->counted[i];
        show(pr, s->off, ps->grad + s->off, before ? before + s->off : NULL, s->n);
    }
    if (p->cfg.micros < 2) return FSC_OK; /* the summed shared gradient is this micro-batch's */
    for (int e = 0; e < ps->count; e++) {
        const fsc_param *q = ps->entries[e].param;
        const int i = shared_index(p, q->grad);
        if (i < 0) continue;
        float *slot = kept_slot(pr, ctx->sample0);
        if (!slot) return FSC_ERR_INVALID;
        const float *b = before ? before + ps->entries[e].offset : NULL;
        for (int64_t j = 0; j < q->numel; j++)
            slot[pr->shared_off[i] + j] = b ? q->grad[j] - b[j] : q->grad[j];
    }
    return FSC_OK;
}

/* Chunk c's counted runs: its parameters outside p->shared that count here,
 * adjacent ones merged. */
static int chunk_setup(struct pipe_probe *pr, int c) {
    fsc_pipe *p = pr->p;
    const fsc_params *ps = &p->params[c];
    chunk_probe *cp = &pr->chunks[c];
    cp->pr = pr, cp->chunk = c;
    if (!(cp->counted = calloc((size_t)(ps->count ? ps->count : 1), sizeof *cp->counted)))
        return fsc_error(FSC_ERR_NOMEM, "pipeline probe: out of memory");
    for (int e = 0; e < ps->count; e++) {
        const fsc_param_entry *en = &ps->entries[e];
        if (shared_index(p, en->param->grad) >= 0 || !tp_counts(p, c, en->param)) continue;
        stretch *last = cp->ncounted ? &cp->counted[cp->ncounted - 1] : NULL;
        if (last && last->off + last->n == en->offset)
            last->n += en->param->numel;
        else
            cp->counted[cp->ncounted++] = (stretch){en->offset, en->param->numel};
    }
    int rc = fsc_module_add_hook(p->chunk[c], FSC_HOOK_PRE_BACKWARD, before_backward, cp);
    return rc ? rc : fsc_module_add_hook(p->chunk[c], FSC_HOOK_POST_BACKWARD, after_backward, cp);
}

int pipe_probe_setup(fsc_pipe *p) {
    if (!p->opt.probe) return FSC_OK;
    if (p->cfg.split_backward)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "pipeline: a gradient probe needs each micro-batch's weight gradients "
                         "in its backward; a schedule that splits backward into B and W (zbh1) "
                         "computes them later");
    struct pipe_probe *pr = p->probe = calloc(1, sizeof *pr);
    if (!pr) return fsc_error(FSC_ERR_NOMEM, "pipeline probe: out of memory");
    pr->p = p, pr->fn = p->opt.probe, pr->user = p->opt.probe_user;
    const int S = p->nshared ? p->nshared : 1, M = p->cfg.micros > 0 ? p->cfg.micros : 1;
    pr->chunks = calloc((size_t)p->nchunks, sizeof *pr->chunks);
    pr->shared_off = calloc((size_t)S, sizeof *pr->shared_off);
    pr->shared_counted = calloc((size_t)S, sizeof *pr->shared_counted);
    pr->kept_sample0 = calloc((size_t)M, sizeof *pr->kept_sample0);
    if (!pr->chunks || !pr->shared_off || !pr->shared_counted || !pr->kept_sample0)
        return fsc_error(FSC_ERR_NOMEM, "pipeline probe: out of memory");
    for (int i = 0; i < p->nshared; i++) {
        pr->shared_off[i] = pr->shared_numel;
        pr->shared_numel += p->shared[i].n;
        /* the owner is the lowest holder (pipe_params.c); TP as for the others */
        bool tp_ok = true;
        for (int c = 0; c < p->nchunks; c++)
            for (int e = 0; e < p->params[c].count; e++)
                if (p->params[c].entries[e].param->grad == p->shared[i].grad)
                    tp_ok = tp_counts(p, c, p->params[c].entries[e].param);
        pr->shared_counted[i] = tp_ok && fsc_group_rank(p->shared[i].g) == 0;
    }
    int rc = FSC_OK;
    for (int c = 0; !rc && c < p->nchunks; c++) rc = chunk_setup(pr, c);
    return rc;
}

void pipe_probe_free(fsc_pipe *p) {
    struct pipe_probe *pr = p->probe;
    if (!pr) return;
    for (int c = 0; pr->chunks && c < p->nchunks; c++) {
        chunk_probe *cp = &pr->chunks[c];
        if (p->chunk && p->chunk[c]) {
            fsc_module_remove_hook(p->chunk[c], FSC_HOOK_PRE_BACKWARD, before_backward, cp);
            fsc_module_remove_hook(p->chunk[c], FSC_HOOK_POST_BACKWARD, after_backward, cp);
        }
        free(cp->counted);
        fsc_mem_free(cp->before);
    }
    free(pr->chunks), free(pr->shared_off), free(pr->shared_counted), free(pr->kept_sample0);
    fsc_mem_free(pr->kept);
    free(pr);
    p->probe = NULL;
}

void pipe_probe_zero(fsc_pipe *p) {
    struct pipe_probe *pr = p->probe;
    if (!pr) return;
    for (int c = 0; c < p->nchunks; c++) pr->chunks[c].backwards = 0;
    pr->nkept = 0;
}

/* Slots in the order of their micro-batches' first samples (every holder
 * then sums the same micro-batch's parts). */
static void kept_order(const struct pipe_probe *pr, int *order) {
    for (int m = 0; m < pr->nkept; m++) {
        int j = m;
        for (; j > 0 && pr->kept_sample0[order[j - 1]] > pr->kept_sample0[m]; j--)
            order[j] = order[j - 1];
        order[j] = m;
    }
}

int pipe_probe_flush(fsc_pipe *p) {
    struct pipe_probe *pr = p->probe;
    if (!pr || !p->nshared) return FSC_OK;
    if (p->cfg.micros < 2) { /* pipe_sum_shared summed the one micro-batch's parts */
        for (int i = 0; i < p->nshared; i++)
            if (pr->shared_counted[i]) pr->fn(pr->user, -1, p->shared[i].grad, p->shared[i].n);
        return FSC_OK;
    }
    int order[64], *o = pr->nkept <= 64 ? order : malloc(sizeof *o * (size_t)pr->nkept);
    if (!o) return fsc_error(FSC_ERR_NOMEM, "pipeline probe: out of memory");
    kept_order(pr, o);
    int rc = FSC_OK;
    for (int i = 0; !rc && i < p->nshared; i++) /* the order of pipe_sum_shared */
        for (int m = 0; !rc && m < pr->nkept; m++) {
            float *part = pr->kept + (size_t)o[m] * pr->shared_numel + pr->shared_off[i];
            rc = fsc_group_allreduce(p->shared[i].g, part, p->shared[i].n, FSC_DTYPE_F32,
                                     FSC_REDUCE_SUM);
            if (!rc && pr->shared_counted[i]) pr->fn(pr->user, -1, part, p->shared[i].n);
        }
    if (o != order) free(o);
    pr->nkept = 0;
    return rc ? fsc_error_context(rc, "pipeline probe: summing a shared parameter's parts: ") : rc;
}
