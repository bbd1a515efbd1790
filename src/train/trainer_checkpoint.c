/* Checkpoints of a trainer: weights and optimizer state by global name (the
 * strategy writes them, whatever its sharding; with async_save into memory,
 * written later by trainer_async.c), plus the seed, the fp16
 * loss scale, AdaScale's estimates and progress, who saved it and the
 * caller's state. The data order and the dropout masks are functions of
 * (seed, step), so the step is the whole data position: a run resumes under
 * any strategy and world size. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fsc/checkpoint.h"
#include "fsc/profile.h"
#include "io/ckpt_stage.h"
#include "trainer_internal.h"

/* The state pairs every checkpoint carries, then the caller's. */
static int set_state(fsc_trainer *t, fsc_ckpt_writer *w, int n, const char *const *keys,
                     const char *const *values) {
    char v[512];
    snprintf(v, sizeof v, "%" PRIu64, t->cfg.strategy.seed);
    int rc = fsc_ckpt_set(w, "seed", v);
    snprintf(v, sizeof v,
             "{\"strategy\": \"%s\", \"ranks\": %d, \"batch\": %d, \"grad_accum\": %d}",
             fsc_strategy_name(t->s), fsc_group_size(fsc_strategy_all(t->s)), t->cfg.batch,
             t->cfg.grad_accum);
    if (!rc) rc = fsc_ckpt_set(w, "saved_by", v);
    if (!rc && t->scaler) {
        fsc_grad_scaler_state st = fsc_grad_scaler_get_state(t->scaler);
        snprintf(v, sizeof v, "\"%.17g %lld %lld\"", st.scale, (long long)st.growth_tracker,
                 (long long)st.skipped_steps);
        rc = fsc_ckpt_set(w, "grad_scaler", v);
    }
    if (!rc && t->ada) { /* the gain's estimates and the scale-invariant step */
        char ada[1024];
        rc = trainer_ada_state_json(t, ada, sizeof ada);
        if (!rc) rc = fsc_ckpt_set(w, "adascale", ada);
    }
    for (int i = 0; i < n && !rc; i++) rc = fsc_ckpt_set(w, keys[i], values[i]);
    return rc;
}

int fsc_trainer_save_checkpoint(fsc_trainer *t, const char *dir, int n_state,
                                const char *const *keys, const char *const *json_values) {
    if (!t || !dir || n_state < 0 || (n_state > 0 && (!keys || !json_values)))
        return fsc_error(FSC_ERR_INVALID, "trainer: save_checkpoint needs a trainer, a dir and "
                                          "n_state >= 0 pairs");
    enum { MAX_META = 16 };
    if (n_state > MAX_META - 2)
        return fsc_error(FSC_ERR_INVALID, "trainer: at most %d state pairs (%d given)",
                         MAX_META - 2, n_state);
    /* rank 0 owns the checkpoint directory; the files in it are written by
     * every rank through MPI-IO, or by rank 0 alone (see the strategies) */
    fsc_group *all = fsc_strategy_all(t->s);
    const bool root = fsc_group_rank(all) == 0;
    /* asynchronous: the save in flight ends first (saves never overlap), and
     * this one's files are captured in memory (trainer_async.c) */
    const bool async = t->cfg.async_save;
    int rc = async ? trainer_async_poll(t, true) : FSC_OK;
    if (rc) return rc;
    fsc_ckpt_writer *w = NULL;
    ckpt_stage *stage = async ? trainer_async_stage(t) : NULL;
    rc = async && !stage ? FSC_ERR_NOMEM : FSC_OK;
    if (!rc && root) rc = fsc_ckpt_begin(dir, t->step, &w);
    rc = fsc_group_agree(all, rc, "starting a checkpoint");
    if (rc) {
        fsc_ckpt_abort(w);
        ckpt_stage_free(stage);
        return rc;
    }
    char weights[4096] = "", optim[4096] = "", step[32];
    if (root) {
        snprintf(weights, sizeof weights, "%s", fsc_ckpt_member(w, "model.safetensors"));
        snprintf(optim, sizeof optim, "%s", fsc_ckpt_member(w, "optim.safetensors"));
    }
    /* the weights file says what it is on its own: the step and the state
     * pairs as "fsc.<key>" metadata */
    char names[MAX_META][80];
    const char *mk[MAX_META] = {"format", "fsc.step"}, *mv[MAX_META] = {"pt", step};
    snprintf(step, sizeof step, "%" PRId64, t->step);
    for (int i = 0; i < n_state; i++) {
        snprintf(names[i], sizeof names[i], "fsc.%s", keys[i]);
        mk[2 + i] = names[i], mv[2 + i] = json_values[i];
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    FSC_PROF_BEGIN(FSC_PROF_CKPT, async ? "checkpoint staging" : "checkpoint write");
    ckpt_stage_capture(stage);
    rc = fsc_strategy_save_weights(t->s, weights, 0, 2 + n_state, mk, mv);
    int orc = fsc_strategy_save_optim(t->s, optim, 0);
    if (!rc) rc = orc;
    if (fsc_strategy_has_state(t->s)) { /* e.g. slowmo's slow momentum and local steps */
        char extra[4096] = "";
        if (root) snprintf(extra, sizeof extra, "%s", fsc_ckpt_member(w, "strategy.safetensors"));
        int src = fsc_strategy_save_state(t->s, extra, 0);
        if (!rc) rc = src;
    }
    ckpt_stage_capture(NULL);
    FSC_PROF_END();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fsc_log(FSC_LOG_DEBUG, "checkpoint step-%06" PRId64 ": %s on rank %d in %.3f s", t->step,
            async ? "staged" : "written", fsc_group_rank(all),
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    /* committed only when every rank's part is on disk: a rank whose write
     * failed stops the commit, and every rank names it */
    const char *what = async ? "staging the checkpoint's files" : "writing the checkpoint's files";
    rc = fsc_group_agree(all, rc, what);
    if (root && !rc) rc = set_state(t, w, n_state, keys, json_values); /* this step's state */
    if (async) return trainer_async_start(t, w, stage, fsc_group_agree(all, rc, "staging it"));
    if (root) {
        if (!rc)
            rc = fsc_ckpt_commit(w);
        else
            fsc_ckpt_abort(w);
    }
    return fsc_group_agree(all, rc, "committing the checkpoint");
}

int fsc_trainer_checkpoint_wait(fsc_trainer *t) {
    if (!t) return fsc_error(FSC_ERR_INVALID, "trainer: checkpoint_wait needs a trainer");
    return trainer_async_poll(t, true);
}

/* The checkpoint's value of `key` equals `want` (as JSON). */
static int expect_equal(const fsc_ckpt *c, const char *key, const char *want) {
    const char *have = fsc_ckpt_get(c, key);
    cJSON *a = cJSON_Parse(want), *b = have ? cJSON_Parse(have) : NULL;
    bool same = a && b && cJSON_Compare(a, b, true);
    cJSON_Delete(a), cJSON_Delete(b);
    if (same) return FSC_OK;
    return fsc_error(FSC_ERR_INVALID, "the checkpoint is of another %s (%s); this run's is %s", key,
                     have ? have : "none", want);
}

/* The loss scale travels as "scale tracker skipped". */
static int load_scaler(fsc_grad_scaler *s, const char *v) {
    fsc_grad_scaler_state st;
    long long tracker, skipped;
    if (!v || sscanf(v, "\"%lg %lld %lld\"", &st.scale, &tracker, &skipped) != 3)
        return fsc_error(FSC_ERR_FORMAT, "the checkpoint has no valid grad_scaler entry (%s)",
                         v ? v : "none");
    st.growth_tracker = tracker, st.skipped_steps = skipped;
    return fsc_grad_scaler_set_state(s, &st);
}

int fsc_trainer_resume(fsc_trainer *t, const char *dir, int n_expect, const char *const *keys,
                       const char *const *json_values) {
    if (!t || !dir || (n_expect > 0 && (!keys || !json_values)))
        return fsc_error(FSC_ERR_INVALID, "trainer: resume needs a trainer and a dir");
    fsc_ckpt *c;
    int rc = fsc_ckpt_open(dir, &c);
    if (rc) return rc;
    for (int i = 0; i < n_expect && !rc; i++) rc = expect_equal(c, keys[i], json_values[i]);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, t->cfg.strategy.seed);
    const char *ckseed = fsc_ckpt_get(c, "seed");
    if (!rc && (!ckseed || strcmp(ckseed, seed)))
        rc = fsc_error(FSC_ERR_INVALID, "the checkpoint was trained with seed %s, not %s",
                       ckseed ? ckseed : "?", seed);
    const char *weights = fsc_ckpt_path(c, "model.safetensors");
    const char *optim = fsc_ckpt_path(c, "optim.safetensors");
    if (!rc && (!weights || !optim))
        rc = fsc_error(FSC_ERR_FORMAT,
                       "the checkpoint lacks model.safetensors or optim.safetensors");
    if (!rc) rc = fsc_strategy_load_weights(t->s, weights, NULL);
    if (!rc) rc = fsc_strategy_load_optim(t->s, optim);
    if (!rc) rc = fsc_strategy_load_state(t->s, fsc_ckpt_path(c, "strategy.safetensors"));
    /* a run without fp16 loss scaling may continue one that had it, and back */
    if (!rc && t->scaler && fsc_ckpt_get(c, "grad_scaler"))
        rc = load_scaler(t->scaler, fsc_ckpt_get(c, "grad_scaler"));
    if (!rc && t->ada) rc = trainer_ada_load_json(t, fsc_ckpt_get(c, "adascale"), fsc_ckpt_step(c));
    if (!rc) t->step = fsc_ckpt_step(c);
    fsc_ckpt_close(c);
    return rc;
}
