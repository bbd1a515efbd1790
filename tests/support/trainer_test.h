/* Shared by the programs that train on a layout of ranks and compare with
 * one process (mpi_pipe.c, mpi_pipe_half.c, mpi_mesh.c, mpi_moe.c,
 * mpi_trainer.c): the EQ GPT's callbacks for the trainer under any layout
 * (whole model, pipeline stages of layers or of parts of blocks, tensor
 * parallelism, both), the step loop with its resume and checkpoint, the
 * weights read back and compared with tests/support/equivalence.h's reference, and
 * the program's main with one scratch directory for the world. Include
 * after cmocka.h. */
#ifndef FSC_TEST_TRAINER_TEST_H
#define FSC_TEST_TRAINER_TEST_H

#include "equivalence.h"
#include "fsc/trainer.h"
#include "mpi_test.h"

/* ---- the EQ GPT's data through the trainer's callbacks ----------------------------------- */

typedef struct tt_data {
    fsc_tokens tk;
    fsc_gpt_config cfg; /* EQ_MODEL */
    fsc_group *tp;      /* the last stage's TP group, for the vocab-parallel loss */
    int T;
    int32_t x[64 * 16], y[64 * 16], ids[64 * 16];
} tt_data;

static inline tt_data *tt_data_new(void) {
    tt_data *d = calloc(1, sizeof *d);
    assert_non_null(d);
    eq_tokens(&d->tk);
    d->cfg = EQ_MODEL, d->T = EQ_MODEL.seq;
    return d;
}

static inline void tt_data_free(tt_data *d) {
    fsc_tokens_free(&d->tk);
    free(d);
}

static inline int tt_load(const fsc_micro_batch *mb, void *user) {
    tt_data *d = user;
    return fsc_tokens_batch(&d->tk, mb->step, mb->micro, mb->rank, mb->batch, mb->micros, mb->world,
                            d->T, d->x, d->y);
}

static inline int tt_pipe_input(const fsc_micro_batch *mb, void *user, fsc_tensor *x) {
    tt_data *d = user; /* stage 0 keeps every micro-batch's ids until its backward */
    int32_t *ids = d->ids + (size_t)mb->micro * mb->batch * d->T;
    memcpy(ids, d->x, sizeof *ids * (size_t)mb->batch * d->T);
    *x = fsc_tensor_2d(ids, FSC_DTYPE_I32, mb->batch, d->T);
    return FSC_OK;
}

static inline int tt_pipe_loss(const fsc_micro_batch *mb, void *user, fsc_tensor *y,
                               fsc_arena *arena, float *out) {
    tt_data *d = user;
    fsc_tensor t = fsc_tensor_2d(d->y, FSC_DTYPE_I32, mb->batch, d->T);
    return d->tp ? fsc_tp_cross_entropy(out, y, &t, d->cfg.vocab, -1, mb->norm, d->tp, arena)
                 : fsc_cross_entropy(out, y, &t, -1, mb->norm, arena);
}

/* TP stages: the last one's head runs fused with the loss on these. */
static inline int tt_pipe_targets(const fsc_micro_batch *mb, void *user, const int32_t **targets,
                                  int *ignore_index) {
    (void)mb;
    *targets = ((tt_data *)user)->y, *ignore_index = -1;
    return FSC_OK;
}

static inline int tt_gpt_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb,
                              void *user, float *loss) {
    tt_data *d = user;
    return fsc_gpt_train_micro(m, ctx, d->x + (size_t)mb->row0 * d->T,
                               d->y + (size_t)mb->row0 * d->T, mb->rows, d->T, -1, mb->norm, loss);
}

static inline int tt_tp_gpt_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb,
                                 void *user, float *loss) {
    tt_data *d = user;
    return fsc_tp_gpt_train_micro(m, ctx, d->x + (size_t)mb->row0 * d->T,
                                  d->y + (size_t)mb->row0 * d->T, mb->rows, d->T, -1, mb->norm,
                                  loss);
}

/* mb's micro-batch of EQ_MODEL's sequences read from tk and trained on m
 * (fsc_gpt_train_micro): the body of a trainer loss whose user pointer
 * carries something else than a tt_data. */
static inline int tt_tokens_micro(const fsc_tokens *tk, fsc_module *m, const fsc_ctx *ctx,
                                  const fsc_micro_batch *mb, float *loss) {
    const int T = EQ_MODEL.seq;
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    if (mb->batch > EQ_GLOBAL_BATCH || T > 16) return FSC_ERR_INVALID; /* the buffers above */
    int rc = fsc_tokens_batch(tk, mb->step, mb->micro, mb->rank, mb->batch, mb->micros, mb->world,
                              T, x, y);
    return rc ? rc : fsc_gpt_train_micro(m, ctx, x, y, mb->batch, T, -1, mb->norm, loss);
}

/* Layers [first, end) of the GPT whose config is user. */
static inline fsc_module *tt_make_stage(void *user, int first, int end) {
    return fsc_gpt_stage_new(user, first, end);
}

/* Parts [first, end) of the GPT whose config is user: stages that may end
 * inside a block (fsc_gpt_stage_parts_new). */
static inline fsc_module *tt_make_parts(void *user, int first, int end) {
    return fsc_gpt_stage_parts_new(user, first, end);
}

/* The activation entering a part: (B,T,5C) before a block's c_proj. */
static inline void tt_part_shape(void *user, int part, int64_t shape[FSC_MAX_DIMS]) {
    shape[2] = fsc_gpt_part_width(user, part);
}

/* Without a pipeline: the whole TP model, trained through fsc_tp_gpt_train_micro. */
static inline fsc_module *tt_make_tp_model(void *user, const fsc_tp_options *tp) {
    tt_data *d = user;
    return fsc_tp_gpt_new(&d->cfg, tp);
}

static inline fsc_module *tt_make_tp_stage(void *user, int first, int end,
                                           const fsc_tp_options *tp) {
    tt_data *d = user;
    d->tp = tp->group;
    return fsc_tp_gpt_stage_new(&d->cfg, first, end, tp);
}

/* ---- a run: the layout, the steps around it ---------------------------------------------- */

typedef struct tt_run {
    const char *strategy;
    fsc_group *group;       /* NULL: the world (single: this process) */
    int shard_group;        /* hsdp: ranks per shard group */
    int pp, tp;             /* pipeline stages, tensor-parallel size (0 or 1: none) */
    bool parts;             /* with pp, no tp: stages of parts, cut inside blocks too */
    const int *balance;     /* with pp: layers (parts) per stage (NULL: even) */
    bool sp;                /* with tp: sequence parallelism */
    float clip;             /* > 0: clip the global norm */
    int accum;              /* micro-batches per replica and step (0: 2) */
    int steps;              /* train up to this step (0: EQ_STEPS) */
    const char *resume;     /* resume from this checkpoint directory first */
    int save_at;            /* > 0: checkpoint into ckpt after this step and stop */
    const char *ckpt;       /* where save_at saves */
    const char *out;        /* the weights file written at the end */
    double *losses, *norms; /* if set: each step's loss and gradient norm, by step */
} tt_run;

/* Every rank of c's run: this process alone under single, else its group. */
static inline fsc_group *tt_ranks(const tt_run *c) {
    return !strcmp(c->strategy, "single") ? fsc_group_self()
           : c->group                     ? c->group
                                          : fsc_group_world();
}

/* The configuration of a trainer of d's EQ GPT under c's layout (AdamW,
 * seed 5), the global batch per step as c->accum micro-batches per replica;
 * *dp gets the data-parallel size. Pipeline stages are GPT stages (parts
 * under c->parts), or TP stages under tp; tp without a pipeline is the whole
 * TP model. A test about something else (an optimizer rule) changes it
 * before tt_trainer_of. */
static inline fsc_trainer_config tt_trainer_config(const tt_run *c, tt_data *d, int *dp) {
    const int pp = c->pp > 1 ? c->pp : 1, tp = c->tp > 1 ? c->tp : 1;
    const int m = c->accum > 0 ? c->accum : 2;
    const bool single = !strcmp(c->strategy, "single");
    *dp = single ? 1 : fsc_group_size(tt_ranks(c)) / (pp * tp);
    const int B = EQ_GLOBAL_BATCH / (*dp * m);
    fsc_trainer_config tc = {.strategy = {.name = c->strategy,
                                          .group = c->group,
                                          .seed = 5,
                                          .shard_group = c->shard_group},
                             .optim = EQ_ADAMW,
                             .batch = B,
                             .grad_accum = m,
                             .targets_per_sample = d->T,
                             .clip = c->clip,
                             .load = tt_load,
                             .loss = tt_gpt_loss,
                             .pipe_input = tt_pipe_input,
                             .pipe_loss = tt_pipe_loss,
                             .user = d};
    if (pp > 1)
        tc.strategy.pipe =
            (fsc_pipe_strategy_options){.stages = pp,
                                        .schedule = FSC_PIPE_1F1B,
                                        .balance = c->balance,
                                        .layers = fsc_gpt_num_layers(&d->cfg),
                                        .act_ndim = 3,
                                        .act_shape = {B, d->T / (c->sp ? tp : 1), d->cfg.d_model}};
    if (pp > 1 && tp == 1)
        tc.strategy.pipe.make_stage = tt_make_stage, tc.strategy.pipe.stage_user = &d->cfg;
    if (pp > 1 && tp == 1 && c->parts)
        tc.strategy.pipe.layers = fsc_gpt_num_parts(&d->cfg),
        tc.strategy.pipe.make_stage = tt_make_parts, tc.strategy.pipe.act_shape_at = tt_part_shape;
    if (tp > 1)
        tc.strategy.tp =
            (fsc_tp_strategy_options){.size = tp, .sequence_parallel = c->sp, .user = d};
    if (tp > 1 && pp > 1)
        tc.strategy.tp.make_stage = tt_make_tp_stage, tc.pipe_targets = tt_pipe_targets;
    if (tp > 1 && pp == 1) tc.loss = tt_tp_gpt_loss, tc.strategy.tp.make_model = tt_make_tp_model;
    return tc;
}

/* The trainer of tc (tt_trainer_config's for c, data-parallel size dp);
 * *model is the whole model where the layout has one (else NULL), the
 * caller's to free after the trainer. A refusal fails the test, naming the
 * rank and the strategy. */
static inline fsc_trainer *tt_trainer_of(const tt_run *c, tt_data *d, const fsc_trainer_config *tc,
                                         int dp, fsc_module **model) {
    *model = c->pp > 1 || c->tp > 1 ? NULL : fsc_gpt_new(&d->cfg);
    fsc_trainer *t = fsc_trainer_new(*model, tc);
    if (!t) fail_msg("rank %d, %s: %s", fsc_dist_rank(), c->strategy, fsc_last_error());
    assert_int_equal(fsc_strategy_world(fsc_trainer_strategy(t)), dp);
    return t;
}

/* A trainer of d's EQ GPT under c's layout (tt_trainer_config, tt_trainer_of). */
static inline fsc_trainer *tt_trainer_new(const tt_run *c, tt_data *d, fsc_module **model) {
    int dp;
    const fsc_trainer_config tc = tt_trainer_config(c, d, &dp);
    return tt_trainer_of(c, d, &tc, dp, model);
}

/* Resumes t from c->resume when set, then steps it up to c->steps, keeping
 * each step's loss and norm, until the checkpoint c->save_at asks for.
 * Returns the step it started from. A failure fails the test, naming the
 * rank and the error. */
static inline int64_t tt_train(fsc_trainer *t, const tt_run *c) {
    const int rank = fsc_dist_rank();
    if (c->resume && fsc_trainer_resume(t, c->resume, 0, NULL, NULL))
        fail_msg("rank %d: resume: %s", rank, fsc_last_error());
    const int64_t first = fsc_trainer_get_step(t), steps = c->steps ? c->steps : EQ_STEPS;
    for (int64_t s = first; s < steps; s++) {
        fsc_step_result r;
        if (fsc_trainer_step(t, &r)) fail_msg("rank %d: %s", rank, fsc_last_error());
        if (c->losses) c->losses[s] = r.loss;
        if (c->norms) c->norms[s] = r.grad_norm;
        if (c->save_at && fsc_trainer_get_step(t) == c->save_at) {
            if (fsc_trainer_save_checkpoint(t, c->ckpt, 0, NULL, NULL))
                fail_msg("rank %d: checkpoint: %s", rank, fsc_last_error());
            break;
        }
    }
    return first;
}

/* Saves t's weights to path (every rank of its strategy calls), then frees
 * t and model. */
static inline void tt_save_and_free(fsc_trainer *t, fsc_module *model, const char *path) {
    assert_int_equal(fsc_trainer_save_weights(t, path, 0, NULL, NULL), FSC_OK);
    fsc_trainer_free(t);
    fsc_module_free(model);
}

/* ---- against one process ----------------------------------------------------------------- */

/* A weights file in the one-process flat layout of cfg's GPT (the caller
 * frees it); a file that does not read fails the test. */
static inline float *tt_read_weights(const fsc_gpt_config *cfg, const char *path, int64_t *numel) {
    *numel = 0;
    float *out = eq_read_weights(cfg, path, numel);
    if (!out) fail_msg("rank %d: %s: %s", fsc_dist_rank(), path, fsc_last_error());
    return out;
}

/* AdaScale's gains of n steps against a reference layout's (ddp): the same
 * per-rank parts summed in another order, so EQ_FLOOR_ULPS float ulps,
 * relative (equivalence.h's floor); rank 0 prints the worst. */
static inline void tt_expect_gains(const char *what, const double *got, const double *ref, int n) {
    double worst = 0;
    for (int s = 0; s < n; s++) {
        const double rel = fabs(got[s] - ref[s]) / ref[s];
        if (rel > worst) worst = rel;
        if (rel > EQ_FLOOR_ULPS * FLT_EPSILON)
            fail_msg("%s, %d ranks, step %d: gain %.9g, ddp %.9g (%.1e relative)", what,
                     fsc_dist_size(), s + 1, got[s], ref[s], rel);
    }
    if (fsc_dist_rank() == 0)
        print_message("%s, %d ranks: gains %.6f..%.6f, worst relative difference from ddp %.1e\n",
                      what, fsc_dist_size(), ref[0], ref[n - 1], worst);
}

/* A run's end on the world: saves t's weights to path, frees t, model and
 * d, and returns the weights read back (the caller frees them). The barrier
 * keeps the next run from writing path before every rank has read it. */
static inline float *tt_save_read_free(fsc_trainer *t, fsc_module *model, tt_data *d,
                                       const char *path, int64_t *numel) {
    tt_save_and_free(t, model, path);
    float *out = tt_read_weights(&EQ_MODEL, path, numel);
    tt_data_free(d);
    fsc_group_barrier(fsc_group_world());
    return out;
}

/* got equals ref (n elements each) within the noise floor that computing
 * ref set; the label is what, the world's size and this rank. */
static inline void tt_expect_close(const char *what, const float *got, int64_t numel,
                                   const float *ref, int64_t n) {
    assert_int_equal(n, numel);
    char label[192];
    snprintf(label, sizeof label, "%s, %d ranks, rank %d", what, fsc_dist_size(), fsc_dist_rank());
    assert_int_equal(eq_compare(label, got, ref, n), 0);
}

/* got (freed here) equals one process's run under o (NULL: the defaults). */
static inline void tt_expect_reference(const eq_options *o, const char *what, float *got,
                                       int64_t numel) {
    int64_t n;
    float *ref = eq_reference_ex(o ? o : &(eq_options){0}, &n);
    tt_expect_close(what, got, numel, ref, n);
    free(ref), free(got);
}

/* Each step's gradient norm is one process's, ref (EQ_STEPS of them):
 * counting a replicated parameter twice or dropping a rank's share moves it
 * by far more than summation order. With clip > 0, clipping acts on every
 * step of the reference. */
static inline void tt_expect_norms(const char *what, const double *got, const double *ref,
                                   float clip) {
    for (int k = 0; k < EQ_STEPS; k++) {
        if (clip > 0 && !(ref[k] > clip))
            fail_msg("step %d: norm %.4g does not clip at %.2f", k + 1, ref[k], (double)clip);
        if (fabs(got[k] - ref[k]) > 1e-5 * ref[k])
            fail_msg("%s step %d: gradient norm %.8g, one process %.8g", what, k + 1, got[k],
                     ref[k]);
    }
}

/* ---- the program --------------------------------------------------------------------------- */

/* main() of a trainer test program, whose file-scope `rank` and `world` it
 * sets: the fault switch on, then the entries (cmocka_unit_test(...)) run as
 * MPI_EQ_MAIN_IN_SCRATCH (mpi_test.h) runs them: one scratch directory for
 * the world in dir (64 bytes), one verdict for every rank. */
#define TT_MAIN(prefix, dir, ...) MPI_EQ_MAIN_IN_SCRATCH(prefix, dir, __VA_ARGS__)

#endif
