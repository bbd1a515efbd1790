/* The fsdp row (ZeRO-3): parameters, gradients and optimizer state sharded
 * over the data-parallel group, units gathered as they compute. The model's
 * parameters are never bound whole; FSDP's hooks do the work, so forward and
 * backward run on the model itself. */
#include <stdlib.h>
#include <string.h>

#include "strategy_internal.h"

/* Default units: each child of the model that has parameters of its own
 * below it and whose parameters the model does not use directly. */
static int default_units(fsc_module *model, fsc_module ***units, int *n) {
    *units = calloc(model->nchildren > 0 ? (size_t)model->nchildren : 1, sizeof **units);
    if (!*units) return fsc_error(FSC_ERR_NOMEM, "fsdp: out of memory");
    *n = 0;
    for (int c = 0; c < model->nchildren; c++) {
        fsc_module *m = model->children[c];
        if (!m->params_used_by_parent && (m->nparams > 0 || m->nchildren > 0)) (*units)[(*n)++] = m;
    }
    return FSC_OK;
}

static int setup(fsc_strategy *s, const fsc_optim_config *optim) {
    const fsc_strategy_options *o = &s->opt;
    fsc_fsdp_options fo = {.keep_after_forward = o->keep_after_forward,
                           .compute_dtype = o->compute_dtype,
                           .reduce_dtype = o->reduce_dtype,
                           .probe = o->grad_probe,
                           .probe_user = o->grad_probe_user};
    /* FairScale's default: reduce in the compute dtype unless told otherwise */
    if (fo.reduce_dtype == FSC_DTYPE_F32 && !o->fp32_reduce_scatter)
        fo.reduce_dtype = fo.compute_dtype;
    fsc_module **units = NULL;
    int n = 0, rc = FSC_OK;
    if (o->units)
        n = o->nunits;
    else if (o->units_kind)
        rc = fsc_fsdp_wrap_kind(s->model, o->units_kind, &units, &n);
    else if (o->min_params > 0)
        rc = fsc_fsdp_auto_wrap(s->model, o->min_params, &units, &n);
    else
        rc = default_units(s->model, &units, &n);
    if (rc) return rc;
    s->fsdp = fsc_fsdp_new(s->model, s->group, o->seed, o->units ? o->units : units, n, optim, &fo);
    free(units);
    if (!s->fsdp) return FSC_ERR_INVALID; /* its message names FSDP */
    s->optim = fsc_fsdp_optim(s->fsdp);
    return FSC_OK;
}

static void teardown(fsc_strategy *s) {
    fsc_fsdp_free(s->fsdp);
}
void strategy_fsdp_zero_grad(fsc_strategy *s) {
    fsc_fsdp_zero_grad(s->fsdp);
}

/* Only with accum_no_sync: otherwise each micro-step reduce-scatters into the
 * shards (shard memory only). */
static void set_no_sync(fsc_strategy *s, bool no_sync) {
    fsc_fsdp_set_no_sync(s->fsdp, s->opt.accum_no_sync && no_sync);
}

int strategy_fsdp_clip(fsc_strategy *s, float max_norm, float *total) {
    return fsc_fsdp_clip_grad_norm(s->fsdp, max_norm, false, total);
}

int strategy_fsdp_step(fsc_strategy *s) {
    return fsc_fsdp_step(s->fsdp);
}

static int save_weights(fsc_strategy *s, const char *path, int root, int n_meta,
                        const char *const *keys, const char *const *values) {
    return fsc_fsdp_save_weights(s->fsdp, s->rank == root ? path : NULL, root, n_meta, keys,
                                 values);
}

int strategy_fsdp_load_weights(fsc_strategy *s, const char *path, int *n_unused) {
    if (n_unused) *n_unused = 0; /* FSDP reads its slices by name and ignores the rest */
    return fsc_fsdp_load_weights(s->fsdp, path);
}

static int save_optim(fsc_strategy *s, const char *path, int root) {
    return fsc_fsdp_save_optim(s->fsdp, s->rank == root ? path : "", root);
}

int strategy_fsdp_load_optim(fsc_strategy *s, const char *path) {
    return fsc_fsdp_load_optim(s->fsdp, path);
}

static int save_sharded(fsc_strategy *s, const char *path, int n_meta, const char *const *keys,
                        const char *const *values) {
    return fsc_fsdp_save_sharded(s->fsdp, path, n_meta, keys, values);
}

/* Every rank reads its own file; a refusal on one is a refusal on all. */
static int load_sharded(fsc_strategy *s, const char *path) {
    int rc = fsc_fsdp_load_sharded(s->fsdp, path);
    return fsc_group_agree(s->group, rc, "loading the sharded state dict");
}

static void stats(const fsc_strategy *s, fsc_strategy_stats *out) {
    fsc_fsdp_stats st = fsc_fsdp_get_stats(s->fsdp);
    *out = (fsc_strategy_stats){.wait_s = st.wait_s,
                                .reductions = st.reduce_scatters,
                                .gathers = st.allgathers,
                                .units = st.units};
}

const strategy_ops fsc_strategy_fsdp = {
    .name = "fsdp",
    .summary = "FullyShardedDataParallel: parameters sharded too, gathered per unit (ZeRO-3)",
    .spans_ranks = true,
    .zero_stage = 3,
    .composes_with_pipe = true,
    .accepts = OPT_REDUCE | OPT_FSDP | OPT_PROBE,
    .setup = setup,
    .teardown = teardown,
    .set_no_sync = set_no_sync,
    .save_weights = save_weights,
    .save_optim = save_optim,
    .save_sharded = save_sharded,
    .load_sharded = load_sharded,
    .stats = stats,
    STRATEGY_FSDP_SHARED_OPS,
};
