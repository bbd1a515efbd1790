/* The full device mesh dp x pp x tp through the trainer: pipeline stages
 * split over tensor-parallel groups (fsc_tp_gpt_stage_new), TP fastest in
 * the rank layout. pp 2 x tp 2 on 4 ranks (with and without sequence
 * parallelism) and dp 2 x pp 2 x tp 2 on 8 (ddp, oss, sdp and fsdp between
 * the replicas) end with the parameters of one process on the same global
 * batch (fp32, dropout on) within the noise floor of tests/equivalence.h;
 * with clipping active the gradient norm is the one-process norm; a
 * checkpoint of the mesh resumes under one process, under fsdp on 4 ranks
 * and back, by global name. fsdp over TP replicas without a pipeline (dp 2
 * x tp 2: the model one pipeline stage) is one process's training too,
 * keeps 1/dp of the model between steps, and resumes across layouts. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/trainer.h"
#include "mpi_test.h"

static int rank, world;
static char dir[64];

typedef struct {
    fsc_tokens tk;
    fsc_gpt_config cfg;
    fsc_group *tp; /* the last stage's TP group, for the vocab-parallel loss */
    int T;
    int32_t x[64 * 16], y[64 * 16], ids[64 * 16];
} tdata;

static int t_load(const fsc_micro_batch *mb, void *user) {
    tdata *d = user;
    return fsc_tokens_batch(&d->tk, mb->step, mb->micro, mb->rank, mb->batch, mb->micros, mb->world,
                            d->T, d->x, d->y);
}

static int t_input(const fsc_micro_batch *mb, void *user, fsc_tensor *x) {
    tdata *d = user; /* stage 0 keeps every micro-batch's ids until its backward */
    int32_t *ids = d->ids + (size_t)mb->micro * mb->batch * d->T;
    memcpy(ids, d->x, sizeof *ids * (size_t)mb->batch * d->T);
    *x = fsc_tensor_2d(ids, FSC_DTYPE_I32, mb->batch, d->T);
    return FSC_OK;
}

static int t_loss(const fsc_micro_batch *mb, void *user, fsc_tensor *y, fsc_arena *arena,
                  float *out) {
    tdata *d = user;
    fsc_tensor t = fsc_tensor_2d(d->y, FSC_DTYPE_I32, mb->batch, d->T);
    return d->tp ? fsc_tp_cross_entropy(out, y, &t, d->cfg.vocab, -1, mb->norm, d->tp, arena)
                 : fsc_cross_entropy(out, y, &t, -1, mb->norm, arena);
}

static int t_gpt_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                      float *loss) {
    tdata *d = user;
    return fsc_gpt_train_micro(m, ctx, d->x + (size_t)mb->row0 * d->T,
                               d->y + (size_t)mb->row0 * d->T, mb->rows, d->T, -1, mb->norm, loss);
}

/* Without a pipeline: the whole TP model, trained through fsc_tp_gpt_train_micro. */
static fsc_module *make_tp_model(void *user, const fsc_tp_options *tp) {
    tdata *d = user;
    return fsc_tp_gpt_new(&d->cfg, tp);
}

static int t_tp_gpt_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                         float *loss) {
    tdata *d = user;
    return fsc_tp_gpt_train_micro(m, ctx, d->x + (size_t)mb->row0 * d->T,
                                  d->y + (size_t)mb->row0 * d->T, mb->rows, d->T, -1, mb->norm,
                                  loss);
}

static fsc_module *make_tp_stage(void *user, int first, int end, const fsc_tp_options *tp) {
    tdata *d = user;
    d->tp = tp->group;
    return fsc_tp_gpt_stage_new(&d->cfg, first, end, tp);
}

typedef struct {
    const char *strategy;
    int pp, tp; /* 0 or 1: none */
    bool sp;
    fsc_group *group;   /* NULL: the world (single: this process) */
    float clip;         /* > 0: clip the global norm */
    int save_at;        /* > 0: checkpoint after this step and stop */
    const char *resume; /* resume from this checkpoint directory first */
    const char *ckpt;   /* where save_at saves */
    const char *out;    /* the weights file written at the end */
    double *norms;      /* if set: each step's gradient norm */
    bool slices;        /* expect 1/dp of the parameters and gradients between steps */
} mesh_run;

static int64_t module_numel(const fsc_module *m) {
    int64_t n = 0;
    for (int i = 0; i < m->nparams; i++) n += m->params[i].numel;
    for (int c = 0; c < m->nchildren; c++) n += module_numel(m->children[c]);
    return n;
}

/* Between steps a rank of fsdp over TP replicas holds its 1/dp slice (16
 * elements of alignment) of its TP model's parameters and gradients, by the
 * allocator's figures, and the memory plan says so. */
static void expect_slices(fsc_strategy *s, int dp) {
    const int64_t local = module_numel(fsc_strategy_module(s));
    const size_t slice = (size_t)((local + dp - 1) / dp + 16) * sizeof(float);
    const size_t params = fsc_mem_current(FSC_MEM_PARAMS), grads = fsc_mem_current(FSC_MEM_GRADS);
    const fsc_strategy_memory plan = fsc_strategy_memory_plan(s);
    if (rank == 0)
        fprintf(stderr,
                "fsdp x tp (dp %d): between steps %zu B of parameters, %zu B of gradients; the "
                "TP model %lld B, its 1/dp slice <= %zu B; plan %.0f B, %.0f B\n",
                dp, params, grads, (long long)local * 4, slice, plan.params_bytes,
                plan.grads_bytes);
    assert_int_equal(plan.params_shards, dp);
    assert_int_equal(plan.grads_shards, dp);
    assert_true(params <= slice && grads <= slice);
    if (dp > 1) assert_true(params < (size_t)local * sizeof(float));
}

/* Trains the EQ model EQ_STEPS steps through the trainer (2 micro-batches
 * of the global batch per replica) and returns the saved weights. */
static float *train(const mesh_run *c, int64_t *numel) {
    const int pp = c->pp > 1 ? c->pp : 1, tp = c->tp > 1 ? c->tp : 1, m = 2;
    const bool single = !strcmp(c->strategy, "single");
    fsc_group *g = single ? fsc_group_self() : c->group ? c->group : fsc_group_world();
    const int dp = single ? 1 : fsc_group_size(g) / (pp * tp), B = EQ_GLOBAL_BATCH / (dp * m);
    tdata *d = calloc(1, sizeof *d);
    eq_tokens(&d->tk);
    d->cfg = EQ_MODEL, d->T = EQ_MODEL.seq;
    fsc_trainer_config tc = {.strategy = {.name = c->strategy, .group = c->group, .seed = 5},
                             .optim = EQ_ADAMW,
                             .batch = B,
                             .grad_accum = m,
                             .targets_per_sample = d->T,
                             .clip = c->clip,
                             .load = t_load,
                             .loss = t_gpt_loss,
                             .pipe_input = t_input,
                             .pipe_loss = t_loss,
                             .user = d};
    if (pp > 1)
        tc.strategy.pipe =
            (fsc_pipe_strategy_options){.stages = pp,
                                        .schedule = FSC_PIPE_1F1B,
                                        .layers = fsc_gpt_num_layers(&d->cfg),
                                        .act_ndim = 3,
                                        .act_shape = {B, d->T / (c->sp ? tp : 1), d->cfg.d_model}};
    if (tp > 1)
        tc.strategy.tp = (fsc_tp_strategy_options){
            .size = tp, .sequence_parallel = c->sp, .make_stage = make_tp_stage, .user = d};
    if (tp > 1 && pp == 1) /* the whole TP model */
        tc.loss = t_tp_gpt_loss, tc.strategy.tp.make_stage = NULL,
        tc.strategy.tp.make_model = make_tp_model;
    fsc_module *model = pp > 1 || tp > 1 ? NULL : fsc_gpt_new(&d->cfg);
    fsc_trainer *t = fsc_trainer_new(model, &tc);
    if (!t) fail_msg("rank %d: %s", rank, fsc_last_error());
    assert_int_equal(fsc_strategy_world(fsc_trainer_strategy(t)), dp);
    if (c->resume && fsc_trainer_resume(t, c->resume, 0, NULL, NULL))
        fail_msg("rank %d: resume: %s", rank, fsc_last_error());
    for (int64_t s = fsc_trainer_get_step(t); s < EQ_STEPS; s++) {
        fsc_step_result r;
        if (fsc_trainer_step(t, &r)) fail_msg("rank %d: %s", rank, fsc_last_error());
        if (c->norms) c->norms[s] = r.grad_norm;
        if (c->save_at && fsc_trainer_get_step(t) == c->save_at) {
            if (fsc_trainer_save_checkpoint(t, c->ckpt, 0, NULL, NULL))
                fail_msg("rank %d: checkpoint: %s", rank, fsc_last_error());
            break;
        }
    }
    if (c->slices) expect_slices(fsc_trainer_strategy(t), dp);
    assert_int_equal(fsc_trainer_save_weights(t, c->out, 0, NULL, NULL), FSC_OK);
    fsc_trainer_free(t);
    fsc_module_free(model);
    fsc_group_barrier(g); /* the file is complete */
    float *out = eq_read_weights(&EQ_MODEL, c->out, numel);
    if (!out) fail_msg("rank %d: %s: %s", rank, c->out, fsc_last_error());
    fsc_tokens_free(&d->tk);
    free(d);
    return out;
}

static void expect_reference(const eq_options *o, const char *what, float *got, int64_t numel) {
    int64_t n;
    float *ref = eq_reference_ex(o, &n);
    assert_int_equal(n, numel);
    char label[160];
    snprintf(label, sizeof label, "%s, %d ranks, rank %d", what, world, rank);
    assert_int_equal(eq_compare(label, got, ref, n), 0);
    free(ref), free(got);
}

static void path(char *buf, const char *name) {
    snprintf(buf, 128, "%s/%s", dir, name);
}

/* pp 2 x tp 2 (4 ranks) and dp 2 x pp 2 x tp 2 (8 ranks) = one process,
 * with clipping active: the norm each step is the one-process norm. */
static void test_mesh_ddp_clipped(void **state) {
    (void)state;
    if (world != 4 && world != 8) skip();
    enum { CLIP_PERMILLE = 250 }; /* below every step's norm: clipping scales each step */
    const float clip = CLIP_PERMILLE / 1000.f;
    char out[128];
    path(out, "ref.safetensors");
    double ref[EQ_STEPS], got[EQ_STEPS];
    /* the one-process norms; every rank runs it alone and writes its own file */
    char mine[128];
    snprintf(mine, sizeof mine, "%s/single-%d.safetensors", dir, rank);
    free(train(&(mesh_run){.strategy = "single", .clip = clip, .out = mine, .norms = ref},
               &(int64_t){0}));
    int64_t n;
    float *w = train(
        &(mesh_run){.strategy = "ddp", .pp = 2, .tp = 2, .clip = clip, .out = out, .norms = got},
        &n);
    char what[96];
    snprintf(what, sizeof what, "ddp x pp 2 x tp 2 (dp %d), clip %.2f", world / 4, (double)clip);
    expect_reference(&(eq_options){.max_norm = clip}, what, w, n);
    for (int k = 0; k < EQ_STEPS; k++) {
        if (!(ref[k] > clip))
            fail_msg("step %d: norm %.4g does not clip at %.2f", k + 1, ref[k], (double)clip);
        /* counting a TP-replicated parameter twice or dropping a stage's
         * share moves the norm by far more than summation order */
        if (fabs(got[k] - ref[k]) > 1e-5 * ref[k])
            fail_msg("%s step %d: gradient norm %.8g, one process %.8g", what, k + 1, got[k],
                     ref[k]);
    }
}

/* Sequence parallelism inside the stages: the activations between them are
 * each TP rank's sequence shard. */
static void test_mesh_sequence_parallel(void **state) {
    (void)state;
    if (world != 4 && world != 8) skip();
    char out[128];
    path(out, "sp.safetensors");
    int64_t n;
    float *w = train(&(mesh_run){.strategy = "ddp", .pp = 2, .tp = 2, .sp = true, .out = out}, &n);
    expect_reference(&(eq_options){0}, "ddp x pp 2 x tp 2 (sp)", w, n);
}

/* The ZeRO rows between the replicas of the mesh (dp 2 on 8 ranks). */
static void test_mesh_zero_rows(void **state) {
    (void)state;
    if (world != 8) skip();
    const char *rows[] = {"oss", "sdp", "fsdp"};
    for (int i = 0; i < 3; i++) {
        char out[128], what[64];
        path(out, "zero.safetensors");
        int64_t n;
        float *w = train(&(mesh_run){.strategy = rows[i], .pp = 2, .tp = 2, .out = out}, &n);
        snprintf(what, sizeof what, "%s x pp 2 x tp 2 (dp 2)", rows[i]);
        expect_reference(&(eq_options){0}, what, w, n);
        fsc_group_barrier(fsc_group_world()); /* every rank read it before the next run */
    }
}

/* A checkpoint of the mesh (weights and optimizer state by global name)
 * resumes under one process and under fsdp on 4 ranks; a one-process
 * checkpoint resumes under the mesh. Each ends as the uninterrupted run. */
static void test_mesh_resume(void **state) {
    (void)state;
    if (world != 4 && world != 8) skip();
    const char *row = world == 8 ? "sdp" : "ddp"; /* sharded state between replicas on 8 */
    char ckpt[128], out[128], what[96];
    path(ckpt, "ckpt-mesh");
    path(out, "resume.safetensors");
    int64_t n;
    free(train(
        &(mesh_run){.strategy = row, .pp = 2, .tp = 2, .save_at = 2, .ckpt = ckpt, .out = out},
        &n));
    fsc_group_barrier(fsc_group_world());
    char mine[128];
    snprintf(mine, sizeof mine, "%s/resumed-%d.safetensors", dir, rank);
    float *w = train(&(mesh_run){.strategy = "single", .resume = ckpt, .out = mine}, &n);
    snprintf(what, sizeof what, "%s x pp 2 x tp 2 -> checkpoint -> one process", row);
    expect_reference(&(eq_options){0}, what, w, n);
    /* fsdp on 4 ranks: each half of 8 ranks resumes on its own */
    fsc_group *half;
    assert_int_equal(fsc_group_split(fsc_group_world(), rank / 4, rank % 4, "half", &half), FSC_OK);
    snprintf(mine, sizeof mine, "%s/fsdp-%d.safetensors", dir, rank / 4);
    w = train(&(mesh_run){.strategy = "fsdp", .group = half, .resume = ckpt, .out = mine}, &n);
    snprintf(what, sizeof what, "%s x pp 2 x tp 2 -> checkpoint -> fsdp on 4", row);
    expect_reference(&(eq_options){0}, what, w, n);
    fsc_group_free(half);
    fsc_group_barrier(fsc_group_world());
    /* and back: one process's checkpoint into the mesh */
    char ckpt1[128];
    path(ckpt1, "ckpt-single");
    snprintf(mine, sizeof mine, "%s/single-save-%d.safetensors", dir, rank);
    if (rank == 0)
        free(
            train(&(mesh_run){.strategy = "single", .save_at = 3, .ckpt = ckpt1, .out = mine}, &n));
    fsc_group_barrier(fsc_group_world());
    w = train(&(mesh_run){.strategy = row, .pp = 2, .tp = 2, .resume = ckpt1, .out = out}, &n);
    snprintf(what, sizeof what, "one process -> checkpoint -> %s x pp 2 x tp 2", row);
    expect_reference(&(eq_options){0}, what, w, n);
}

/* fsdp over the replicas of a TP model without a pipeline, dp 2 x tp 2 =
 * one process on the same global batch, with clipping active (the norm each
 * step is one process's: a TP-replicated parameter counted twice, or a
 * replica's slice left out, moves it far more than summation order), with
 * and without sequence parallelism; between steps each rank keeps 1/dp. */
static void test_fsdp_tp(void **state) {
    (void)state;
    if (world != 4) skip();
    const float clip = 0.25f; /* below every step's norm */
    double ref[EQ_STEPS], got[EQ_STEPS];
    char mine[128], out[128], what[96];
    snprintf(mine, sizeof mine, "%s/fsdp-tp-single-%d.safetensors", dir, rank);
    free(train(&(mesh_run){.strategy = "single", .clip = clip, .out = mine, .norms = ref},
               &(int64_t){0}));
    path(out, "fsdp-tp.safetensors");
    for (int sp = 0; sp < 2; sp++) {
        int64_t n;
        float *w = train(&(mesh_run){.strategy = "fsdp",
                                     .tp = 2,
                                     .sp = sp,
                                     .clip = clip,
                                     .out = out,
                                     .norms = got,
                                     .slices = true},
                         &n);
        snprintf(what, sizeof what, "fsdp x tp 2 (dp 2%s), clip %.2f", sp ? ", sp" : "",
                 (double)clip);
        expect_reference(&(eq_options){.max_norm = clip}, what, w, n);
        for (int k = 0; k < EQ_STEPS; k++) {
            if (!(ref[k] > clip))
                fail_msg("step %d: norm %.4g does not clip at %.2f", k + 1, ref[k], (double)clip);
            if (fabs(got[k] - ref[k]) > 1e-5 * ref[k])
                fail_msg("%s step %d: gradient norm %.8g, one process %.8g", what, k + 1, got[k],
                         ref[k]);
        }
        fsc_group_barrier(fsc_group_world()); /* every rank read it before the next run */
    }
}

/* A checkpoint of fsdp x tp 2 (weights: the one-process file; optimizer
 * state by global name) resumes under one process and under plain ddp on 4
 * ranks; a one-process checkpoint resumes under fsdp x tp 2. */
static void test_fsdp_tp_resume(void **state) {
    (void)state;
    if (world != 4) skip();
    char ckpt[128], out[128], mine[128];
    path(ckpt, "ckpt-fsdp-tp");
    path(out, "fsdp-tp-resume.safetensors");
    int64_t n;
    free(train(&(mesh_run){.strategy = "fsdp", .tp = 2, .save_at = 2, .ckpt = ckpt, .out = out},
               &n));
    fsc_group_barrier(fsc_group_world());
    snprintf(mine, sizeof mine, "%s/fsdp-tp-resumed-%d.safetensors", dir, rank);
    float *w = train(&(mesh_run){.strategy = "single", .resume = ckpt, .out = mine}, &n);
    expect_reference(&(eq_options){0}, "fsdp x tp 2 -> checkpoint -> one process", w, n);
    w = train(&(mesh_run){.strategy = "ddp", .resume = ckpt, .out = out}, &n);
    expect_reference(&(eq_options){0}, "fsdp x tp 2 -> checkpoint -> ddp on 4", w, n);
    fsc_group_barrier(fsc_group_world());
    char ckpt1[128];
    path(ckpt1, "ckpt-fsdp-tp-single");
    snprintf(mine, sizeof mine, "%s/fsdp-tp-single-save-%d.safetensors", dir, rank);
    if (rank == 0)
        free(
            train(&(mesh_run){.strategy = "single", .save_at = 3, .ckpt = ckpt1, .out = mine}, &n));
    fsc_group_barrier(fsc_group_world());
    w = train(&(mesh_run){.strategy = "fsdp", .tp = 2, .resume = ckpt1, .out = out}, &n);
    expect_reference(&(eq_options){0}, "one process -> checkpoint -> fsdp x tp 2", w, n);
}

/* What the mesh refuses, by name. */
static void test_mesh_refusals(void **state) {
    (void)state;
    if (world < 2) skip();
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_strategy_options so = {.name = "ddp",
                               .pipe = {.stages = 2,
                                        .layers = fsc_gpt_num_layers(&cfg),
                                        .act_ndim = 3,
                                        .act_shape = {2, cfg.seq, cfg.d_model}},
                               .tp = {.size = world == 4 ? 4 : 2}};
    /* no stage maker */
    fsc_strategy *s = fsc_strategy_new(NULL, &EQ_ADAMW, &so);
    assert_null(s);
    const char *want = world == 4  ? "cannot form pipelines of 2 stages x 4 tensor-parallel ranks"
                       : world % 4 ? "cannot form pipelines"
                                   : "tp.make_stage is NULL";
    if (!strstr(fsc_last_error(), want)) fail_msg("rank %d: %s", rank, fsc_last_error());
    /* TP without a pipeline: not under a row of this process alone; fsdp's
     * own options have no meaning (the model is sharded whole); the whole
     * model comes from tp.make_model */
    tdata d = {.cfg = cfg, .T = cfg.seq};
    fsc_strategy_options tp = {.name = "dp",
                               .tp = {.size = 2, .make_model = make_tp_model, .user = &d}};
    assert_null(fsc_strategy_new(NULL, &EQ_ADAMW, &tp));
    if (!strstr(fsc_last_error(), "does not run with tensor parallelism (ddp, oss, sdp and fsdp"))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    tp.name = "fsdp", tp.min_params = 100;
    assert_null(fsc_strategy_new(NULL, &EQ_ADAMW, &tp));
    if (!strstr(fsc_last_error(), "option min_params does not apply with tensor parallelism"))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    if (world % 2) return;
    tp.min_params = 0, tp.tp.make_model = NULL, tp.tp.make_stage = make_tp_stage;
    assert_null(fsc_strategy_new(NULL, &EQ_ADAMW, &tp));
    if (!strstr(fsc_last_error(), "without a pipeline: give tp.make_model"))
        fail_msg("rank %d: %s", rank, fsc_last_error());
}

static int setup_dir(void **state) {
    (void)state;
    return mpi_scratch_dir(dir, "fsc_mesh");
}

static int teardown_dir(void **state) {
    (void)state;
    return mpi_scratch_dir_remove(dir);
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) return 1;
    rank = fsc_dist_rank(), world = fsc_dist_size();
    eq_fault_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mesh_refusals),
        cmocka_unit_test(test_mesh_ddp_clipped),
        cmocka_unit_test(test_mesh_sequence_parallel),
        cmocka_unit_test(test_mesh_zero_rows),
        cmocka_unit_test(test_mesh_resume),
        cmocka_unit_test(test_fsdp_tp),
        cmocka_unit_test(test_fsdp_tp_resume),
    };
    return mpi_test_finish(cmocka_run_group_tests(tests, setup_dir, teardown_dir));
}
