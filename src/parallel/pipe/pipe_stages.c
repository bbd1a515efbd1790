/* The pipeline's stages: which layers each holds (the balance, checked),
 * this rank's stage modules and their parameters, and the shape of the
 * activation crossing every cut, which each message is checked against
 * (the model's act_shape_at, for cuts that pass more than act_shape). */
#include <stdlib.h>
#include <string.h>

#include "fsc/tp.h"
#include "pipe_exec_internal.h"

static int even_balance(fsc_pipe *p, int *out) {
    const int S = p->stages, L = p->opt.layers;
    if (L < S) return fsc_error(FSC_ERR_INVALID, "pipeline: %d layers cannot fill %d stages", L, S);
    for (int s = 0; s < S; s++) out[s] = L / S + (s < L % S);
    return FSC_OK;
}

static int check_balance(const fsc_pipe *p, const int *b) {
    int sum = 0;
    for (int s = 0; s < p->stages; s++) {
        if (b[s] < 1)
            return fsc_error(FSC_ERR_INVALID, "pipeline balance: stage %d has %d layers (>= 1)", s,
                             b[s]);
        sum += b[s];
    }
    if (sum != p->opt.layers)
        return fsc_error(FSC_ERR_INVALID,
                         "pipeline balance: the stages hold %d layers, the model has %d", sum,
                         p->opt.layers);
    return FSC_OK;
}

/* Checkpoints the children of a stage that compute with parameters of their
 * own (the GPT stage's blocks and ln_f; not wte/wpe, which the stage reads
 * itself, nor parameter-free ones). */
static int checkpoint_parts(fsc_module *stage) {
    for (int i = 0; i < stage->nchildren; i++) {
        fsc_module *m = stage->children[i];
        if (m->params_used_by_parent || (m->nparams == 0 && m->nchildren == 0)) continue;
        int rc = fsc_checkpoint_wrap(m);
        if (rc) return rc;
    }
    return FSC_OK;
}

/* The shape of the activation at every cut (act_shape unless the model
 * says otherwise), which each message is checked against. */
static int plan_cuts(fsc_pipe *p) {
    const int S = p->stages;
    if (!(p->cut = calloc((size_t)S + 1, sizeof *p->cut)))
        return fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    for (int s = 0; s <= S; s++) {
        pipe_cut *c = &p->cut[s];
        memcpy(c->shape, p->opt.act_shape, sizeof c->shape);
        if (p->opt.act_shape_at && s > 0 && s < S)
            p->opt.act_shape_at(p->opt.stage_user, p->first[s], c->shape);
        c->numel = 1;
        for (int d = 0; d < p->opt.act_ndim; d++) c->numel *= c->shape[d];
    }
    return FSC_OK;
}

/* Stages, their modules and parameters on this rank. */
int pipe_make_stages(fsc_pipe *p) {
    const int S = p->stages;
    int *b = malloc(sizeof(int) * (size_t)S);
    p->first = calloc((size_t)S + 1, sizeof(int));
    if (!b || !p->first) return free(b), fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    int rc = p->opt.balance ? FSC_OK : even_balance(p, b);
    if (p->opt.balance) memcpy(b, p->opt.balance, sizeof(int) * (size_t)S);
    if (!rc) rc = check_balance(p, b);
    for (int s = 0; !rc && s < S; s++) p->first[s + 1] = p->first[s] + b[s];
    free(b);
    if (!rc) rc = plan_cuts(p);
    if (rc) return rc;
    p->nchunks = p->cfg.chunks;
    p->chunk = calloc((size_t)p->nchunks, sizeof *p->chunk);
    p->params = calloc((size_t)p->nchunks, sizeof *p->params);
    if (!p->chunk || !p->params) return fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    for (int c = 0; c < p->nchunks; c++) {
        int s = c * p->cfg.ranks + p->rank;
        p->chunk[c] = p->opt.make_stage(p->opt.stage_user, p->first[s], p->first[s + 1]);
        if (!p->chunk[c])
            return fsc_error_context(FSC_ERR_INVALID, "pipeline stage %d (layers %d..%d): ", s,
                                     p->first[s], p->first[s + 1] - 1);
        if (p->opt.checkpoint != FSC_PIPE_CKPT_NEVER && (rc = checkpoint_parts(p->chunk[c])))
            return fsc_error_context(rc, "pipeline stage %d: ", s);
        rc = p->opt.tp ? fsc_tp_params_bind(p->chunk[c], p->opt.seed, true, &p->params[c])
                       : fsc_params_bind(p->chunk[c], p->opt.seed, true, &p->params[c]);
        if (rc) return fsc_error_context(rc, "pipeline stage %d: ", s);
    }
    return FSC_OK;
}
