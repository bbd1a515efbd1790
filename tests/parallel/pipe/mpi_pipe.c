/* The pipeline (fsc/pipe.h) over 2, 3 and 4 ranks, the GPT cut into stages
 * (embedding, blocks, head with the tied wte): GPipe, 1F1B, zero-bubble H1
 * (backward split into input and weight gradients) and interleaved 1F1B at
 * m = 1, p and 2p+1 micro-batches (interleaved: multiples of p), even
 * and uneven balance (a one-layer stage, the head alone), dropout on, end
 * with the parameters of one process on the same global batch within the
 * noise floor of tests/support/equivalence.h. The activations held at once on each
 * rank are the validator's prediction; a stage whose output is not the
 * planned shape fails on both ends of the message; bad set-ups are refused.
 * Through the trainer, the model-parallel strategies (pipeline with every
 * data-parallel row between its replicas, tensor parallelism) = one process
 * too, and their checkpoints resume under other layouts. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>
#include <unistd.h>

#include "pipe_test.h"

static int rank, world;
static char dir[64];

typedef struct {
    fsc_pipe_kind kind;
    int chunks, m, B;
    const int *balance;
    fsc_pipe_checkpoint ckpt;
    size_t activ_peak; /* out: this rank's most activation bytes held in the last step */
} pipe_cfg;

/* Trains EQ_STEPS steps; returns the whole model's parameters as saved, and
 * checks the activations held against the validator's figure. */
static float *run_pipe(pipe_cfg *c, int64_t *numel) {
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(c->kind, world, c->chunks, c->m, &sched), FSC_OK);
    fsc_pipe_rank_stats *per = calloc((size_t)world, sizeof *per);
    assert_int_equal(fsc_pipe_schedule_validate(sched, NULL, NULL, per), FSC_OK);
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_pipe_options opt = {.layers = fsc_gpt_num_layers(&cfg),
                            .make_stage = tt_make_stage,
                            .stage_user = &cfg,
                            .balance = c->balance,
                            .act_ndim = 3,
                            .act_shape = {c->B, cfg.seq, cfg.d_model},
                            .seed = 5,
                            .checkpoint = c->ckpt};
    fsc_pipe *p = fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, &opt);
    if (!p) fail_msg("fsc_pipe_new: %s", fsc_last_error());
    pt_data *d = pt_data_new(c->B, c->m);
    pt_train(p, d);
    assert_int_equal(fsc_pipe_get_stats(p).peak_inflight, per[rank].peak_inflight);
    c->activ_peak = fsc_pipe_get_stats(p).peak_held_bytes;
    free(per);
    char path[128];
    snprintf(path, sizeof path, "%s/pipe.safetensors", dir);
    return pt_save_read_free(p, sched, d, path, numel);
}

static void expect_one_process(pipe_cfg *c) {
    int64_t numel;
    float *got = run_pipe(c, &numel);
    char what[128];
    snprintf(what, sizeof what, "pipeline %s, %d chunks, m %d, B %d%s", fsc_pipe_kind_name(c->kind),
             c->chunks ? c->chunks : 1, c->m, c->B, c->balance ? ", uneven" : "");
    tt_expect_reference(&(eq_options){.global_batch = c->B * c->m}, what, got, numel);
}

static void test_gpipe_1f1b_zbh1(void **state) {
    (void)state;
    if (world < 2) skip();
    fsc_pipe_kind kinds[] = {FSC_PIPE_GPIPE, FSC_PIPE_1F1B, FSC_PIPE_ZB_H1};
    int ms[] = {1, world, 2 * world + 1};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 3; i++)
            expect_one_process(&(pipe_cfg){.kind = kinds[k], .m = ms[i], .B = 2});
}

static void test_interleaved(void **state) {
    (void)state;
    /* 4 layers: 2 ranks x 2 chunks, one layer each (the head alone on a stage) */
    if (world != 2) skip();
    for (int m = 2; m <= 4; m += 2)
        expect_one_process(&(pipe_cfg){.kind = FSC_PIPE_INTERLEAVED, .chunks = 2, .m = m, .B = 2});
}

static void test_uneven_balance(void **state) {
    (void)state;
    static const int two_a[] = {1, 3}, two_b[] = {3, 1}, three[] = {2, 1, 1};
    if (world == 2) {
        expect_one_process(&(pipe_cfg){.kind = FSC_PIPE_1F1B, .m = 3, .B = 2, .balance = two_a});
        expect_one_process(&(pipe_cfg){.kind = FSC_PIPE_GPIPE, .m = 2, .B = 2, .balance = two_b});
    } else if (world == 3) {
        expect_one_process(&(pipe_cfg){.kind = FSC_PIPE_1F1B, .m = 4, .B = 2, .balance = three});
    } else {
        skip();
    }
}

/* Activation checkpointing inside the stages: the same parameters bit for
 * bit under always and except_last as without it, and less activation
 * memory held (always < except_last <= never on the first stage). */
static void test_pipe_checkpoint(void **state) {
    (void)state;
    if (world < 2) skip();
    int64_t n;
    pipe_cfg c[3] = {{.kind = FSC_PIPE_1F1B, .m = 4, .B = 2, .ckpt = FSC_PIPE_CKPT_NEVER},
                     {.kind = FSC_PIPE_1F1B, .m = 4, .B = 2, .ckpt = FSC_PIPE_CKPT_ALWAYS},
                     {.kind = FSC_PIPE_1F1B, .m = 4, .B = 2, .ckpt = FSC_PIPE_CKPT_EXCEPT_LAST}};
    float *got[3];
    for (int i = 0; i < 3; i++) got[i] = run_pipe(&c[i], &n);
    for (int i = 1; i < 3; i++) assert_memory_equal(got[0], got[i], sizeof(float) * (size_t)n);
    /* this rank's layers under the even balance: does it hold a block? */
    int first = 0, end = 0;
    for (int r = 0; r <= rank; r++) first = end, end += 4 / world + (r < 4 % world);
    const bool block = first <= EQ_MODEL.layers && end > 1;
    fprintf(stderr,
            "pipeline checkpointing, rank %d (layers %d..%d): most activation bytes held: "
            "never %zu, except_last %zu, always %zu\n",
            rank, first, end - 1, c[0].activ_peak, c[2].activ_peak, c[1].activ_peak);
    /* a micro-batch run plainly under except_last adds a 64-byte record per
     * checkpointed part to what never holds */
    assert_true(c[1].activ_peak <= c[2].activ_peak && c[2].activ_peak <= c[0].activ_peak + 1024);
    if (block) assert_true(c[1].activ_peak < c[0].activ_peak);
    for (int i = 0; i < 3; i++) free(got[i]);
}

/* A pipeline of cfg's GPT (4 layers) cut at whole layers, micro-batches of 2. */
static fsc_pipe_options layer_options(fsc_gpt_config *cfg) {
    return (fsc_pipe_options){.layers = 4,
                              .make_stage = tt_make_stage,
                              .stage_user = cfg,
                              .act_ndim = 3,
                              .act_shape = {2, cfg->seq, cfg->d_model},
                              .seed = 5};
}

/* A plan of the wrong activation shape: the sender and the receiver both
 * fail at once (2 ranks: a third would wait for the second under the
 * watchdog, which mpi_watchdog covers). */
static void test_shape_mismatch(void **state) {
    (void)state;
    if (world != 2) skip();
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_pipe_options opt = layer_options(&cfg);
    opt.act_shape[2] += 1; /* one more feature than the stages send */
    pt_expect_shape_refused(&opt, "the tensor to send is (2,16,32), the plan says (2,16,33)",
                            "rank 0 sent (2,16,32), the plan says (2,16,33)");
}

static void test_bad_setups(void **state) {
    (void)state;
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_pipe_options opt = layer_options(&cfg);
    fsc_pipe_schedule *sched;
    /* a schedule for another number of ranks */
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_GPIPE, world + 1, 1, 2, &sched), FSC_OK);
    assert_null(fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, &opt));
    assert_non_null(strstr(fsc_last_error(), "the group has"));
    fsc_pipe_schedule_free(sched);
    if (world < 2) return;
    /* balance that does not add up, and a split backward */
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_GPIPE, world, 1, 2, &sched), FSC_OK);
    int bad[4] = {6 - world, 1, 1, 1}; /* 5 layers in all: one more than the model */
    opt.balance = bad;
    assert_null(fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, &opt));
    assert_non_null(strstr(fsc_last_error(), "the model has 4"));
    fsc_pipe_schedule_free(sched);
    opt.balance = NULL;
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_ZB_H1, world, 1, 2, &sched), FSC_OK);
    opt.checkpoint = FSC_PIPE_CKPT_ALWAYS;
    assert_null(fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, &opt));
    assert_non_null(strstr(fsc_last_error(), "does not combine with activation checkpointing"));
    fsc_pipe_schedule_free(sched);
}

/* Automatic balance: a valid cut, the same on every rank, and a budget no
 * cut fits refused by name. */
static void test_balance_auto(void **state) {
    (void)state;
    if (world < 2) skip();
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_1F1B, world, 1, 4, &sched), FSC_OK);
    fsc_pipe_options opt = layer_options(&cfg);
    int b[4] = {0}, all[16] = {0};
    fsc_pipe_balance_report rep;
    assert_int_equal(fsc_pipe_balance_auto(fsc_group_world(), &opt, sched, cfg.vocab, 2, b, &rep),
                     FSC_OK);
    int sum = 0;
    for (int s = 0; s < world; s++) sum += b[s], assert_true(b[s] >= 1);
    assert_int_equal(sum, 4);
    assert_int_equal(rep.stages, world);
    assert_int_equal(fsc_group_allgather(fsc_group_world(), b, all, 4, FSC_DTYPE_I32), FSC_OK);
    for (int r = 1; r < world; r++) assert_memory_equal(all, all + 4 * r, sizeof b);
    /* the training with it equals one process too */
    expect_one_process(&(pipe_cfg){.kind = FSC_PIPE_1F1B, .m = 4, .B = 2, .balance = b});
    size_t old = fsc_mem_get_limit();
    fsc_mem_set_limit(1 << 20); /* 1 MiB: no stage fits */
    int rc = fsc_pipe_balance_auto(fsc_group_world(), &opt, sched, cfg.vocab, 2, b, NULL);
    fsc_mem_set_limit(old);
    assert_int_not_equal(rc, FSC_OK);
    fsc_pipe_schedule_free(sched);
}

/* ---- through the trainer: ddp x pipeline on the world (dp = world / 2) ------------------ */

/* Trains the EQ model EQ_STEPS steps through the trainer (2 micro-batches
 * of the global batch per replica; checkpoints in c->ckpt, else <dir>/ckpt)
 * and returns the saved weights. */
static float *train_gpt(const tt_run *c, int64_t *numel) {
    tt_data *d = tt_data_new();
    fsc_module *model;
    fsc_trainer *t = tt_trainer_new(c, d, &model);
    char ckpt[96];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    tt_run steps = *c;
    if (!steps.ckpt) steps.ckpt = ckpt;
    tt_train(t, &steps);
    if (c->pp > 1 && !strcmp(c->strategy, "fsdp")) { /* between steps: this rank's slices */
        fsc_strategy *st = fsc_trainer_strategy(t);
        fsc_pipe *p = fsc_strategy_get_pipe(st);
        const int dp = fsc_strategy_world(st);
        int64_t stage = 0;
        for (int k = 0; k < fsc_pipe_chunks(p); k++) stage += fsc_pipe_chunk_params(p, k)->numel;
        const size_t slice = (size_t)((stage + dp - 1) / dp + 16) * sizeof(float);
        assert_true(fsc_mem_current(FSC_MEM_PARAMS) <= slice);
        assert_true(fsc_mem_current(FSC_MEM_GRADS) <= slice);
        if (dp > 1) assert_true(fsc_mem_current(FSC_MEM_PARAMS) < (size_t)stage * sizeof(float));
    }
    char path[128];
    snprintf(path, sizeof path, "%s/trainer.safetensors", dir);
    return tt_save_read_free(t, model, d, path, numel);
}

/* oss, sdp and fsdp between the replicas of a pipeline (dp = world / 2)
 * = one process; a checkpoint of fsdp x pp 2 resumes under plain ddp and
 * under oss x pp 2, and a plain fsdp one under sdp x pp 2. */
static void test_trainer_zero_pipeline(void **state) {
    (void)state;
    if (world % 2) skip();
    int64_t n;
    const char *rows[] = {"oss", "sdp", "fsdp"};
    for (int i = 0; i < 3; i++) {
        float *got = train_gpt(&(tt_run){.strategy = rows[i], .pp = 2}, &n);
        char what[64];
        snprintf(what, sizeof what, "trainer %s x pp 2 (1f1b, m 2)", rows[i]);
        tt_expect_reference(NULL, what, got, n);
    }
    char ckpt[96];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-zero", dir);
    free(train_gpt(&(tt_run){.strategy = "fsdp", .pp = 2, .save_at = 2, .ckpt = ckpt}, &n));
    float *got = train_gpt(&(tt_run){.strategy = "ddp", .resume = ckpt}, &n);
    tt_expect_reference(NULL, "fsdp x pp 2 -> checkpoint -> ddp", got, n);
    got = train_gpt(&(tt_run){.strategy = "oss", .pp = 2, .resume = ckpt}, &n);
    tt_expect_reference(NULL, "fsdp x pp 2 -> checkpoint -> oss x pp 2", got, n);
    free(train_gpt(&(tt_run){.strategy = "fsdp", .save_at = 3, .ckpt = ckpt}, &n));
    got = train_gpt(&(tt_run){.strategy = "sdp", .pp = 2, .resume = ckpt}, &n);
    tt_expect_reference(NULL, "fsdp -> checkpoint -> sdp x pp 2", got, n);
}

/* Tensor parallelism through the trainer, the data-parallel rows between
 * its replicas = one process: tp 2 (and 4) as one replica, dp 2 x tp 2 with
 * and without sequence parallelism. */
static void test_trainer_tensor_parallel(void **state) {
    (void)state;
    if (world % 2) skip();
    int64_t n;
    double ref[EQ_STEPS], got_norm[EQ_STEPS];
    free(train_gpt(&(tt_run){.strategy = "ddp", .norms = ref}, &n));
    const char *rows[] = {"ddp", "oss", "sdp"};
    for (int i = 0; i < 3; i++)
        for (int sp = 0; sp < 2; sp++) {
            float *got =
                train_gpt(&(tt_run){.strategy = rows[i], .tp = 2, .sp = sp, .norms = got_norm}, &n);
            char what[64];
            snprintf(what, sizeof what, "trainer %s x tp 2%s", rows[i], sp ? " (sp)" : "");
            tt_expect_reference(NULL, what, got, n);
            tt_expect_norms(what, got_norm, ref, 0); /* each parameter counted once */
        }
    if (world == 4) {
        float *got = train_gpt(&(tt_run){.strategy = "ddp", .tp = 4, .sp = true}, &n);
        tt_expect_reference(NULL, "trainer tp 4 (sp)", got, n);
    }
    /* checkpoints by global name: tp 2 -> plain ddp, and a ddp one -> tp 2 */
    char ckpt[96];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-tp", dir);
    free(train_gpt(&(tt_run){.strategy = "ddp", .tp = 2, .save_at = 2, .ckpt = ckpt}, &n));
    float *got = train_gpt(&(tt_run){.strategy = "ddp", .resume = ckpt}, &n);
    tt_expect_reference(NULL, "tp 2 -> checkpoint -> ddp", got, n);
    free(train_gpt(&(tt_run){.strategy = "ddp", .save_at = 3, .ckpt = ckpt}, &n));
    got = train_gpt(&(tt_run){.strategy = "ddp", .tp = 2, .sp = true, .resume = ckpt}, &n);
    tt_expect_reference(NULL, "ddp -> checkpoint -> tp 2 (sp)", got, n);
}

/* ddp x pipeline through the trainer = one process; a checkpoint written
 * under it resumes under plain ddp, fsdp and another pipeline depth. */
static void test_trainer_ddp_pipeline(void **state) {
    (void)state;
    if (world % 2) skip();
    int64_t n;
    float *got = train_gpt(&(tt_run){.strategy = "ddp", .pp = 2}, &n);
    tt_expect_reference(NULL, "trainer ddp x pp 2 (1f1b, m 2)", got, n);
    char ckpt[96];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    free(train_gpt(&(tt_run){.strategy = "ddp", .pp = 2, .save_at = 2}, &n));
    got = train_gpt(&(tt_run){.strategy = "ddp", .resume = ckpt}, &n);
    tt_expect_reference(NULL, "pp 2 -> checkpoint -> ddp", got, n);
    got = train_gpt(&(tt_run){.strategy = "fsdp", .resume = ckpt}, &n);
    tt_expect_reference(NULL, "pp 2 -> checkpoint -> fsdp", got, n);
    if (world == 4) {
        got = train_gpt(&(tt_run){.strategy = "ddp", .pp = 4, .resume = ckpt}, &n);
        tt_expect_reference(NULL, "pp 2 -> checkpoint -> pp 4", got, n);
    }
    /* and back: a ddp checkpoint resumed by a pipeline */
    free(train_gpt(&(tt_run){.strategy = "ddp", .save_at = 3}, &n));
    got = train_gpt(&(tt_run){.strategy = "ddp", .pp = 2, .resume = ckpt}, &n);
    tt_expect_reference(NULL, "ddp -> checkpoint -> pp 2", got, n);
}

TT_MAIN("fsc_pipe", dir, cmocka_unit_test(test_gpipe_1f1b_zbh1), cmocka_unit_test(test_interleaved),
        cmocka_unit_test(test_uneven_balance), cmocka_unit_test(test_shape_mismatch),
        cmocka_unit_test(test_bad_setups), cmocka_unit_test(test_trainer_ddp_pipeline),
        cmocka_unit_test(test_balance_auto), cmocka_unit_test(test_pipe_checkpoint),
        cmocka_unit_test(test_trainer_zero_pipeline),
        cmocka_unit_test(test_trainer_tensor_parallel))
