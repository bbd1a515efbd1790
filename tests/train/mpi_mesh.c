/* The full device mesh dp x pp x tp through the trainer: pipeline stages
 * split over tensor-parallel groups (fsc_tp_gpt_stage_new), TP fastest in
 * the rank layout, the last stage's head fused with its loss (the trainer's
 * pipe_targets: a wrong head gradient or input gradient there fails every
 * comparison below). pp 2 x tp 2 on 4 ranks (with and without sequence
 * parallelism) and dp 2 x pp 2 x tp 2 on 8 (ddp, oss, sdp and fsdp between
 * the replicas) end with the parameters of one process on the same global
 * batch (fp32, dropout on) within the noise floor of tests/support/equivalence.h;
 * with clipping active the gradient norm is the one-process norm; a
 * checkpoint of the mesh resumes under one process, under fsdp on 4 ranks
 * and back, by global name. fsdp over TP replicas without a pipeline (dp 2
 * x tp 2: the model one pipeline stage) is one process's training too,
 * keeps 1/dp of the model between steps, and resumes across layouts. The
 * mesh's pipeline writes its last step's trace (fsc_strategy_write_trace:
 * the first TP rank of the first replica writes, every rank learns the
 * outcome); a layout without a pipeline has none to write. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <string.h>

#include "trainer_test.h"

static int rank, world;
static char dir[64];

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

/* The strategy's trace at path: with a pipeline (c->pp stages) every rank
 * returns FSC_OK and rank 0's file holds one named row with boxes for each
 * stage and no other row; a layout without a pipeline refuses. */
static void expect_trace(fsc_strategy *s, const tt_run *c, const char *path) {
    const int rc = fsc_strategy_write_trace(s, path);
    if (!c->pp) {
        assert_int_equal(rc, FSC_ERR_INVALID);
        assert_non_null(strstr(fsc_last_error(), "no pipeline to trace"));
        return;
    }
    if (rc) fail_msg("rank %d: %s", rank, fsc_last_error());
    if (rank != 0) return;
    long len = 0;
    char *text = (char *)mpi_read_file(path, &len);
    assert_non_null(text);
    cJSON *trace = cJSON_ParseWithLength(text, (size_t)len);
    if (!trace) fail_msg("%s is not JSON", path);
    int names[8] = {0}, boxes[8] = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(trace, "traceEvents")) {
        const int tid = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(e, "tid"));
        if (tid < 0 || tid >= c->pp) fail_msg("a row %d in a trace of %d stages", tid, c->pp);
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph"));
        assert_non_null(ph);
        if (!strcmp(ph, "M"))
            names[tid]++;
        else
            boxes[tid]++;
    }
    for (int r = 0; r < c->pp; r++)
        if (names[r] != 1 || boxes[r] < 1)
            fail_msg("stage %d: %d names and %d boxes in %s", r, names[r], boxes[r], path);
    cJSON_Delete(trace);
    free(text);
}

/* Trains the EQ model EQ_STEPS steps through the trainer (2 micro-batches
 * of the global batch per replica) and returns the saved weights; with
 * `slices`, checks that the model is kept in 1/dp slices between steps;
 * with a `trace` path, the strategy's trace (expect_trace). */
static float *train_ex(const tt_run *c, bool slices, const char *trace, int64_t *numel) {
    tt_data *d = tt_data_new();
    fsc_module *model;
    fsc_trainer *t = tt_trainer_new(c, d, &model);
    tt_train(t, c);
    fsc_strategy *s = fsc_trainer_strategy(t);
    if (slices) expect_slices(s, fsc_strategy_world(s));
    if (trace) expect_trace(s, c, trace);
    tt_save_and_free(t, model, c->out);
    fsc_group_barrier(tt_ranks(c)); /* the file is complete */
    float *out = tt_read_weights(&EQ_MODEL, c->out, numel);
    tt_data_free(d);
    return out;
}

static float *train(const tt_run *c, int64_t *numel) {
    return train_ex(c, false, NULL, numel);
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
    free(train(&(tt_run){.strategy = "single", .clip = clip, .out = mine, .norms = ref},
               &(int64_t){0}));
    int64_t n;
    float *w = train(
        &(tt_run){.strategy = "ddp", .pp = 2, .tp = 2, .clip = clip, .out = out, .norms = got}, &n);
    char what[96];
    snprintf(what, sizeof what, "ddp x pp 2 x tp 2 (dp %d), clip %.2f", world / 4, (double)clip);
    tt_expect_reference(&(eq_options){.max_norm = clip}, what, w, n);
    tt_expect_norms(what, got, ref, clip); /* a TP-replicated parameter once, every stage's share */
}

/* Sequence parallelism inside the stages: the activations between them are
 * each TP rank's sequence shard. */
static void test_mesh_sequence_parallel(void **state) {
    (void)state;
    if (world != 4 && world != 8) skip();
    char out[128];
    path(out, "sp.safetensors");
    int64_t n;
    char trace[128];
    path(trace, "sp.trace.json");
    float *w = train_ex(&(tt_run){.strategy = "ddp", .pp = 2, .tp = 2, .sp = true, .out = out},
                        false, trace, &n);
    tt_expect_reference(&(eq_options){0}, "ddp x pp 2 x tp 2 (sp)", w, n);
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
        float *w = train(&(tt_run){.strategy = rows[i], .pp = 2, .tp = 2, .out = out}, &n);
        snprintf(what, sizeof what, "%s x pp 2 x tp 2 (dp 2)", rows[i]);
        tt_expect_reference(&(eq_options){0}, what, w, n);
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
    free(train(&(tt_run){.strategy = row, .pp = 2, .tp = 2, .save_at = 2, .ckpt = ckpt, .out = out},
               &n));
    fsc_group_barrier(fsc_group_world());
    char mine[128];
    snprintf(mine, sizeof mine, "%s/resumed-%d.safetensors", dir, rank);
    float *w = train(&(tt_run){.strategy = "single", .resume = ckpt, .out = mine}, &n);
    snprintf(what, sizeof what, "%s x pp 2 x tp 2 -> checkpoint -> one process", row);
    tt_expect_reference(&(eq_options){0}, what, w, n);
    /* fsdp on 4 ranks: each half of 8 ranks resumes on its own */
    fsc_group *half;
    assert_int_equal(fsc_group_split(fsc_group_world(), rank / 4, rank % 4, "half", &half), FSC_OK);
    snprintf(mine, sizeof mine, "%s/fsdp-%d.safetensors", dir, rank / 4);
    w = train(&(tt_run){.strategy = "fsdp", .group = half, .resume = ckpt, .out = mine}, &n);
    snprintf(what, sizeof what, "%s x pp 2 x tp 2 -> checkpoint -> fsdp on 4", row);
    tt_expect_reference(&(eq_options){0}, what, w, n);
    fsc_group_free(half);
    fsc_group_barrier(fsc_group_world());
    /* and back: one process's checkpoint into the mesh */
    char ckpt1[128];
    path(ckpt1, "ckpt-single");
    snprintf(mine, sizeof mine, "%s/single-save-%d.safetensors", dir, rank);
    if (rank == 0)
        free(train(&(tt_run){.strategy = "single", .save_at = 3, .ckpt = ckpt1, .out = mine}, &n));
    fsc_group_barrier(fsc_group_world());
    w = train(&(tt_run){.strategy = row, .pp = 2, .tp = 2, .resume = ckpt1, .out = out}, &n);
    snprintf(what, sizeof what, "one process -> checkpoint -> %s x pp 2 x tp 2", row);
    tt_expect_reference(&(eq_options){0}, what, w, n);
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
    free(train(&(tt_run){.strategy = "single", .clip = clip, .out = mine, .norms = ref},
               &(int64_t){0}));
    path(out, "fsdp-tp.safetensors");
    char trace[128];
    path(trace, "fsdp-tp.trace.json");
    for (int sp = 0; sp < 2; sp++) {
        int64_t n;
        float *w = train_ex(
            &(tt_run){
                .strategy = "fsdp", .tp = 2, .sp = sp, .clip = clip, .out = out, .norms = got},
            true, sp ? NULL : trace, &n); /* no pipeline: refused */
        snprintf(what, sizeof what, "fsdp x tp 2 (dp 2%s), clip %.2f", sp ? ", sp" : "",
                 (double)clip);
        tt_expect_reference(&(eq_options){.max_norm = clip}, what, w, n);
        tt_expect_norms(what, got, ref, clip);
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
    free(train(&(tt_run){.strategy = "fsdp", .tp = 2, .save_at = 2, .ckpt = ckpt, .out = out}, &n));
    fsc_group_barrier(fsc_group_world());
    snprintf(mine, sizeof mine, "%s/fsdp-tp-resumed-%d.safetensors", dir, rank);
    float *w = train(&(tt_run){.strategy = "single", .resume = ckpt, .out = mine}, &n);
    tt_expect_reference(&(eq_options){0}, "fsdp x tp 2 -> checkpoint -> one process", w, n);
    w = train(&(tt_run){.strategy = "ddp", .resume = ckpt, .out = out}, &n);
    tt_expect_reference(&(eq_options){0}, "fsdp x tp 2 -> checkpoint -> ddp on 4", w, n);
    fsc_group_barrier(fsc_group_world());
    char ckpt1[128];
    path(ckpt1, "ckpt-fsdp-tp-single");
    snprintf(mine, sizeof mine, "%s/fsdp-tp-single-save-%d.safetensors", dir, rank);
    if (rank == 0)
        free(train(&(tt_run){.strategy = "single", .save_at = 3, .ckpt = ckpt1, .out = mine}, &n));
    fsc_group_barrier(fsc_group_world());
    w = train(&(tt_run){.strategy = "fsdp", .tp = 2, .resume = ckpt1, .out = out}, &n);
    tt_expect_reference(&(eq_options){0}, "one process -> checkpoint -> fsdp x tp 2", w, n);
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
    tt_data d = {.cfg = cfg, .T = cfg.seq};
    fsc_strategy_options tp = {.name = "dp",
                               .tp = {.size = 2, .make_model = tt_make_tp_model, .user = &d}};
    assert_null(fsc_strategy_new(NULL, &EQ_ADAMW, &tp));
    if (!strstr(fsc_last_error(), "does not run with tensor parallelism (ddp, oss, sdp and fsdp"))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    tp.name = "fsdp", tp.min_params = 100;
    assert_null(fsc_strategy_new(NULL, &EQ_ADAMW, &tp));
    if (!strstr(fsc_last_error(), "option min_params does not apply with tensor parallelism"))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    if (world % 2) return;
    tp.min_params = 0, tp.tp.make_model = NULL, tp.tp.make_stage = tt_make_tp_stage;
    assert_null(fsc_strategy_new(NULL, &EQ_ADAMW, &tp));
    if (!strstr(fsc_last_error(), "without a pipeline: give tp.make_model"))
        fail_msg("rank %d: %s", rank, fsc_last_error());
}

TT_MAIN("fsc_mesh", dir, cmocka_unit_test(test_mesh_refusals),
        cmocka_unit_test(test_mesh_ddp_clipped), cmocka_unit_test(test_mesh_sequence_parallel),
        cmocka_unit_test(test_mesh_zero_rows), cmocka_unit_test(test_mesh_resume),
        cmocka_unit_test(test_fsdp_tp), cmocka_unit_test(test_fsdp_tp_resume))
