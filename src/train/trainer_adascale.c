/* AdaScale in the trainer (cfg.adascale): each rank's gradient samples
 * measured where the strategy is about to reduce them, the gain that scales
 * the learning rate, and the scale-invariant step the schedule is read at
 * (fsc/adascale.h has the estimator). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/kernels.h"
#include "trainer_internal.h"

/* AdaScale's per-step figures. Each micro-batch of each data-parallel
 * replica is a gradient sample; its squared norm is taken where the
 * strategy is about to reduce it (the grad_probe, inside backward, bucket
 * by bucket or fsdp's unit by unit) or, for a micro-step that reduces
 * nothing (no_sync, or a row of one process), from the gradient buffer
 * after it. Backward accumulates (+=), so with grad_accum > 1 `prev` keeps
 * the sum before the micro-step and a sample is the difference. fsdp holds
 * no unsharded gradient and needs no `prev`: its probe sees each unit's
 * gradient of the micro-step alone (reduce-scattered every micro-step from
 * a fresh full gradient, or under accum_no_sync computed apart from the
 * kept sum). On the mesh a replica spans ranks: the probe sees each rank's
 * part of it (a pipeline's stages each micro-batch's own, fsc/pipe.h; TP
 * ranks their shards, a parameter every TP rank holds on one of them), so
 * the parts add up over every rank of the strategy, not its group. */
struct trainer_adascale {
    fsc_adascale est;
    double progress; /* scale-invariant steps so far */
    float *prev;     /* grad_accum > 1: the accumulated gradient (FSC_MEM_WORK) */
    bool use_prev;   /* prev holds this step's earlier micro-batches */
    double micro_sq; /* the probe's sum over the micro-step being run (a
                        pipeline's: over its schedule, every micro-batch) */
    int64_t probed;  /* elements the probe saw in it */
    double sum_sq;   /* this rank's samples' squared norms, this step */
};

static void probe(void *user, int64_t offset, const float *g, int64_t n) {
    struct trainer_adascale *a = user;
    if (!a->use_prev) {
        a->micro_sq += fsc_sumsq(g, n);
    } else {
        const float *p = a->prev + offset;
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += ((double)g[i] - p[i]) * ((double)g[i] - p[i]);
        a->micro_sq += s;
    }
    a->probed += n;
}

/* Refuses what AdaScale cannot see into, then wires the probe. */
int trainer_ada_begin(fsc_trainer *t, fsc_strategy_options *so) {
    const fsc_trainer_config *c = &t->cfg;
    const char *name = so->name ? so->name : "single";
    fsc_strategy_info info;
    int rc = fsc_strategy_info_get(name, &info);
    if (rc) return rc;
    const bool mesh = so->pipe.stages > 1 || so->tp.size > 1;
    if (mesh && info.zero_stage == 3)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "trainer: AdaScale does not run with fsdp over a %s yet (use ddp, oss "
                         "or sdp between the replicas)",
                         so->pipe.stages > 1 ? "pipeline" : "tensor-parallel dimension");
    if (so->pipe.stages > 1 && so->pipe.schedule == FSC_PIPE_ZB_H1)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "trainer: AdaScale does not run with the zbh1 schedule: its split "
                         "backward computes weight gradients after the probe could see each "
                         "micro-batch's (use gpipe, 1f1b or interleaved)");
    if (info.spans_ranks && !fsc_strategy_takes(name, "grad_probe"))
        return fsc_error(
            FSC_ERR_UNSUPPORTED,
            "trainer: AdaScale needs each rank's gradient before it is reduced, which "
            "strategy %s does not expose (%s); use ddp, oss, sdp or fsdp",
            name, info.local_steps ? "it reduces no gradient" : "its reduction takes no probe");
    if (!(t->ada = calloc(1, sizeof *t->ada)))
        return fsc_error(FSC_ERR_NOMEM, "trainer: out of memory");
    rc = fsc_adascale_init(&t->ada->est, &c->adascale_cfg);
    if (rc) return fsc_error_context(rc, "trainer: ");
    if (info.spans_ranks) so->grad_probe = probe, so->grad_probe_user = t->ada;
    return FSC_OK;
}

/* After the strategy exists: the sample count sets S, and a copy of the
 * gradients tells micro-batches apart where they accumulate in one buffer
 * (not under fsdp, which has no unsharded buffer: see above). */
int trainer_ada_ready(fsc_trainer *t) {
    struct trainer_adascale *a = t->ada;
    const int n = t->cfg.grad_accum * fsc_strategy_world(t->s);
    if (a->est.scale == 0 && fsc_adascale_set_scale(&a->est, n))
        return fsc_error_context(FSC_ERR_INVALID, "trainer: ");
    const fsc_params *ps = fsc_strategy_params(t->s);
    if (ps && t->cfg.grad_accum > 1 &&
        !(a->prev = fsc_mem_alloc(FSC_MEM_WORK, sizeof(float) * (size_t)ps->numel)))
        return fsc_error(FSC_ERR_NOMEM, "trainer: AdaScale: out of memory");
    return FSC_OK;
}

/* Micro-step k has run: its sample's squared norm joins the step's. */
void trainer_ada_after_micro(fsc_trainer *t, int k) {
    struct trainer_adascale *a = t->ada;
    const fsc_params *ps = fsc_strategy_params(t->s);
    if (!a->probed && ps) /* nothing reduced: the gradient buffer is this rank's own */
        probe(a, 0, ps->grad, ps->numel);
    a->sum_sq += a->micro_sq;
    a->micro_sq = 0;
    if (a->prev && k + 1 < t->cfg.grad_accum) {
        memcpy(a->prev, ps->grad, sizeof(float) * (size_t)ps->numel);
        a->use_prev = true;
    }
}

/* The step's samples against the averaged gradient's norm (global): the
 * estimate, in the units of one sample's mean gradient (the trainer's loss
 * makes each micro-gradient 1/n of its micro-batch's mean). n counts the
 * data-parallel samples; the parts are summed over every rank (the mesh's
 * stages and TP ranks hold parts of one sample). A step clipped by
 * c = clip / norm enters at the size it is applied: both sums times c^2, as
 * if every sample had been scaled by c. Unclipped, one spike (norms of
 * 100-400 against a median of 2 on a small GPT under SGD) outweighed the
 * smoothed sums for the next ~600 steps and pinned the gain at 1.1-1.3. */
int trainer_ada_update(fsc_trainer *t, double grad_norm, double clip, double loss_scale,
                       double *gain) {
    struct trainer_adascale *a = t->ada;
    const int n = t->cfg.grad_accum * fsc_strategy_world(t->s);
    fsc_group *all = fsc_strategy_all(t->s);
    float sum = (float)((a->sum_sq + a->micro_sq) * (double)n * n / (loss_scale * loss_scale));
    if (n > 1 && fsc_group_size(all) > 1 &&
        fsc_group_allreduce(all, &sum, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM))
        return FSC_ERR_MPI;
    const double c = clip > 0 && grad_norm > clip ? clip / grad_norm : 1.0;
    int rc = n < 2 ? FSC_OK
                   : fsc_adascale_update(&a->est, sum * c * c, n, grad_norm * grad_norm * c * c);
    *gain = fsc_adascale_gain(&a->est);
    return rc;
}

void trainer_ada_before_micro(fsc_trainer *t) {
    t->ada->micro_sq = 0, t->ada->probed = 0;
}

void trainer_ada_begin_step(fsc_trainer *t) {
    t->ada->sum_sq = t->ada->micro_sq = 0, t->ada->use_prev = false;
}

void trainer_ada_advance(fsc_trainer *t, double gain) {
    t->ada->progress += gain;
}

double trainer_ada_progress(const fsc_trainer *t) {
    return t->ada->progress;
}

/* The estimates a checkpoint carries, in the order of STATE_KEYS. The
 * config-derived fields (smoothing, paper_average) come from the resuming
 * run's config instead; S is saved so a new S rescales the variance. */
static const char *const STATE_KEYS[] = {"progress", "scale",      "sqr_avg",
                                         "var_avg",  "sqr_biased", "var_biased",
                                         "unbias",   "sqr_total",  "var_total"};
enum { NSTATE = sizeof STATE_KEYS / sizeof *STATE_KEYS };

static void state_fields(struct trainer_adascale *a, double *f[NSTATE]) {
    fsc_adascale *e = &a->est;
    double *all[NSTATE] = {&a->progress,   &e->scale,  &e->sqr_avg,   &e->var_avg,  &e->sqr_biased,
                           &e->var_biased, &e->unbias, &e->sqr_total, &e->var_total};
    memcpy(f, all, sizeof all);
}

int trainer_ada_state_json(const fsc_trainer *t, char *buf, size_t n) {
    double *f[NSTATE];
    state_fields(t->ada, f);
    size_t at = (size_t)snprintf(buf, n, "{");
    for (int i = 0; i < NSTATE && at < n; i++) /* %.17g: doubles come back bit for bit */
        at += (size_t)snprintf(buf + at, n - at, "\"%s\": %.17g, ", STATE_KEYS[i], *f[i]);
    if (at < n)
        at += (size_t)snprintf(buf + at, n - at, "\"updates\": %lld}",
                               (long long)t->ada->est.updates);
    if (at >= n) return fsc_error(FSC_ERR_INVALID, "trainer: AdaScale state exceeds %zu bytes", n);
    return FSC_OK;
}

int trainer_ada_load_json(fsc_trainer *t, const char *json, int64_t step) {
    struct trainer_adascale *a = t->ada;
    if (!json) { /* saved without AdaScale: every step so far had gain 1 */
        const double scale = a->est.scale;
        int rc = fsc_adascale_init(&a->est, &t->cfg.adascale_cfg);
        if (!rc && scale >= 1) rc = fsc_adascale_set_scale(&a->est, scale);
        a->progress = (double)step;
        return rc;
    }
    cJSON *j = cJSON_Parse(json);
    double v[NSTATE + 1];
    const char *bad = j ? NULL : "JSON object";
    for (int i = 0; i <= NSTATE && !bad; i++) {
        const char *key = i < NSTATE ? STATE_KEYS[i] : "updates";
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
        v[i] = cJSON_IsNumber(x) ? x->valuedouble : NAN;
        /* every field is >= 0; the scale >= 1; updates a whole count */
        if (!(v[i] >= 0) || isinf(v[i]) || (i == 1 && v[i] < 1) ||
            (i == NSTATE && (v[i] != floor(v[i]) || v[i] > 9e15)))
            bad = key;
    }
    cJSON_Delete(j);
    if (bad)
        return fsc_error(FSC_ERR_FORMAT, "the checkpoint's adascale entry has no valid %s (%s)",
                         bad, json);
    const double scale = a->est.scale; /* this run's S */
    double *f[NSTATE];
    state_fields(a, f);
    for (int i = 0; i < NSTATE; i++) *f[i] = v[i];
    a->est.updates = (int64_t)v[NSTATE];
    /* another world x accumulation: the variance estimate follows S, as
     * FairScale's set_scale does */
    return scale >= 1 ? fsc_adascale_set_scale(&a->est, scale) : FSC_OK;
}

void trainer_ada_free(fsc_trainer *t) {
    if (t->ada) fsc_mem_free(t->ada->prev);
    free(t->ada);
    t->ada = NULL;
}
