/* Pipeline stages that end inside a transformer block
 * (fsc_gpt_stage_parts_new): between its attention and MLP halves (k.5) and
 * inside its MLP, between c_fc + GELU and c_proj (k.75, where the residual
 * stream and the GELU output cross together as (B,T,5C)). Under 1F1B,
 * zero-bubble H1 (backward split into B and W), interleaved 1F1B and with
 * activation checkpointing, dropout on, the parameters equal one process's
 * on the same global batch within the noise floor of tests/support/equivalence.h;
 * --balance auto's cut over such parts does too; a checkpoint written at a
 * cut inside the MLP resumes at another cut and without a pipeline; every
 * part has exactly its block's names; a cut inside the MLP without the
 * wider plan fails on both ranks by shape; cuts inside the embedding, head
 * or attention, and balances that do not add up, are refused by value. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "pipe_test.h"

static int rank, world;
static char dir[64];

/* Stage sizes in quarter layers (7 = 1.75 layers) -> parts per stage. */
static void to_parts(const int *quarters, int S, int *parts) {
    fsc_gpt_config cfg = EQ_MODEL;
    int cut = 0, prev = 0;
    for (int s = 0; s < S; s++) {
        int part;
        cut += quarters[s];
        if (fsc_gpt_part_of_cut(&cfg, cut, &part)) fail_msg("%s", fsc_last_error());
        parts[s] = part - prev, prev = part;
    }
}

static fsc_pipe_options parts_options(fsc_gpt_config *cfg, const int *parts, int B) {
    return (fsc_pipe_options){.layers = fsc_gpt_num_parts(cfg),
                              .make_stage = tt_make_parts,
                              .stage_user = cfg,
                              .balance = parts,
                              .act_ndim = 3,
                              .act_shape = {B, cfg->seq, cfg->d_model},
                              .act_shape_at = tt_part_shape,
                              .seed = 5};
}

/* Trains EQ_STEPS steps of the EQ model at `quarters` per stage (ranks x
 * chunks stages; NULL: parts per stage from --balance auto) and returns the
 * whole model's parameters as saved. */
static float *run_cut(fsc_pipe_kind kind, int chunks, const int *quarters, fsc_pipe_checkpoint ck,
                      int64_t *numel) {
    const int m = 4, B = 2;
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(kind, world, chunks, m, &sched), FSC_OK);
    fsc_gpt_config cfg = EQ_MODEL;
    int parts[8];
    fsc_pipe_options opt = parts_options(&cfg, parts, B);
    opt.checkpoint = ck;
    if (quarters)
        to_parts(quarters, world * chunks, parts);
    else if (fsc_pipe_balance_auto(fsc_group_world(), &opt, sched, cfg.vocab, 2, parts, NULL))
        fail_msg("rank %d: balance auto: %s", rank, fsc_last_error());
    fsc_pipe *p = fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, &opt);
    if (!p) fail_msg("fsc_pipe_new: %s", fsc_last_error());
    pt_data *d = pt_data_new(B, m);
    pt_train(p, d);
    char path[128];
    snprintf(path, sizeof path, "%s/half.safetensors", dir);
    return pt_save_read_free(p, sched, d, path, numel);
}

static void expect_one_process(const char *what, float *got, int64_t numel, int global_batch) {
    tt_expect_reference(&(eq_options){.global_batch = global_batch}, what, got, numel);
}

/* 2 ranks: 1.5 | 2.5 and 2.5 | 1.5 (a block cut between attention and MLP),
 * 1.75 | 2.25 and 2.75 | 1.25 (inside h.0's and h.1's MLP); 4 stages
 * (interleaved on 2 ranks, 1F1B and zbh1 on 4): 1.75 | 1 | 0.25 | 1, whose
 * second stage begins at h.0's c_proj and ends after h.1's c_fc and whose
 * third is h.1's c_proj alone. Sizes in quarter layers. */
static void test_cuts(void **state) {
    (void)state;
    static const int two[4][2] = {{6, 10}, {10, 6}, {7, 9}, {11, 5}}, four[4] = {7, 4, 1, 4};
    static const char *const names[4] = {"1.5,2.5", "2.5,1.5", "1.75,2.25", "2.75,1.25"};
    char what[64];
    int64_t n;
    if (world == 2) {
        for (int c = 0; c < 4; c++) {
            float *got = run_cut(FSC_PIPE_1F1B, 1, two[c], FSC_PIPE_CKPT_NEVER, &n);
            snprintf(what, sizeof what, "1f1b at %s", names[c]);
            expect_one_process(what, got, n, 8);
            got = run_cut(FSC_PIPE_ZB_H1, 1, two[c], FSC_PIPE_CKPT_NEVER, &n);
            snprintf(what, sizeof what, "zbh1 at %s", names[c]);
            expect_one_process(what, got, n, 8);
        }
        float *got = run_cut(FSC_PIPE_INTERLEAVED, 2, four, FSC_PIPE_CKPT_NEVER, &n);
        expect_one_process("interleaved at 1.75,1,0.25,1", got, n, 8);
    } else if (world == 4) {
        float *got = run_cut(FSC_PIPE_1F1B, 1, four, FSC_PIPE_CKPT_NEVER, &n);
        expect_one_process("1f1b at 1.75,1,0.25,1", got, n, 8);
        got = run_cut(FSC_PIPE_ZB_H1, 1, four, FSC_PIPE_CKPT_NEVER, &n);
        expect_one_process("zbh1 at 1.75,1,0.25,1", got, n, 8);
    } else {
        skip();
    }
}

/* --balance auto over the parts (each timed on the activation planned at
 * its cut, packed ones included): its cut trains to the one-process result. */
static void test_auto_over_parts(void **state) {
    (void)state;
    if (world != 2 && world != 4) skip();
    int64_t n;
    float *got =
        run_cut(world == 2 ? FSC_PIPE_ZB_H1 : FSC_PIPE_1F1B, 1, NULL, FSC_PIPE_CKPT_NEVER, &n);
    expect_one_process("balance auto over parts", got, n, 8);
}

/* Recomputing the parts in backward changes nothing, bit for bit. */
static void test_cut_checkpoint(void **state) {
    (void)state;
    static const int two[2] = {7, 9}, four[4] = {7, 4, 1, 4};
    if (world != 2 && world != 4) skip();
    const int *b = world == 2 ? two : four;
    int64_t n, n2;
    float *plain = run_cut(FSC_PIPE_1F1B, 1, b, FSC_PIPE_CKPT_NEVER, &n);
    float *ck = run_cut(FSC_PIPE_1F1B, 1, b, FSC_PIPE_CKPT_ALWAYS, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(plain, ck, sizeof(float) * (size_t)n);
    free(plain), free(ck);
}

/* A cut inside the MLP planned as (B,T,C) (no act_shape_at): the stage's
 * (B,T,5C) output is refused on both ranks by shape, not sent as garbage. */
static void test_unplanned_width(void **state) {
    (void)state;
    if (world != 2) skip();
    fsc_gpt_config cfg = EQ_MODEL;
    static const int q[2] = {7, 9};
    int parts[2];
    to_parts(q, 2, parts);
    fsc_pipe_options opt = parts_options(&cfg, parts, 2);
    opt.act_shape_at = NULL;
    pt_expect_shape_refused(&opt, "the tensor to send is (2,16,160), the plan says (2,16,32)",
                            "rank 0 sent (2,16,160), the plan says (2,16,32)");
}

/* The parts carry exactly the names of the layers they cut. */
static void expect_names(int first, int end, const char *const *names, int count) {
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_module *m = fsc_gpt_stage_parts_new(&cfg, first, end);
    if (!m) fail_msg("%s", fsc_last_error());
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, false, &ps), FSC_OK);
    assert_int_equal(ps.count, count);
    for (int i = 0; i < count; i++) assert_string_equal(ps.entries[i].name, names[i]);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

static void expect_refused(int quarters, const char *needle) {
    fsc_gpt_config cfg = EQ_MODEL;
    int part = -1;
    assert_int_equal(fsc_gpt_part_of_cut(&cfg, quarters, &part), FSC_ERR_INVALID);
    if (!strstr(fsc_last_error(), needle))
        fail_msg("cut at %d quarters: \"%s\" lacks \"%s\"", quarters, fsc_last_error(), needle);
}

static void test_names_and_refusals(void **state) {
    (void)state;
    static const char *const attn0[] = {"wte.weight",
                                        "wpe.weight",
                                        "h.0.ln_1.weight",
                                        "h.0.ln_1.bias",
                                        "h.0.attn.c_attn.weight",
                                        "h.0.attn.c_attn.bias",
                                        "h.0.attn.c_proj.weight",
                                        "h.0.attn.c_proj.bias"};
    static const char *const mlp1[] = {"h.1.ln_2.weight",       "h.1.ln_2.bias",
                                       "h.1.mlp.c_fc.weight",   "h.1.mlp.c_fc.bias",
                                       "h.1.mlp.c_proj.weight", "h.1.mlp.c_proj.bias"};
    expect_names(0, 2, attn0, 8);
    expect_names(5, 7, mlp1, 6);     /* h.1's MLP half: c_fc and c_proj parts */
    expect_names(5, 6, mlp1, 4);     /* ln_2, c_fc (and GELU) */
    expect_names(6, 7, mlp1 + 4, 2); /* c_proj (and dropout) */
    /* whole layers map onto parts: layers [1, 3) are parts [1, 7) */
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_module *a = fsc_gpt_stage_new(&cfg, 1, 3), *b = fsc_gpt_stage_parts_new(&cfg, 1, 7);
    assert_non_null(a), assert_non_null(b);
    fsc_params pa, pb;
    assert_int_equal(fsc_params_bind(a, 5, false, &pa), FSC_OK);
    assert_int_equal(fsc_params_bind(b, 5, false, &pb), FSC_OK);
    assert_int_equal(pa.count, pb.count);
    assert_int_equal(pa.count, 24);
    for (int i = 0; i < pa.count; i++) assert_string_equal(pa.entries[i].name, pb.entries[i].name);
    assert_memory_equal(pa.data, pb.data, sizeof(float) * (size_t)pa.numel);
    fsc_params_free(&pa), fsc_params_free(&pb);
    fsc_module_free(a), fsc_module_free(b);
    for (int q = 0, part; q <= 16; q++) /* and back: whole layers, .5 and .75 inside blocks */
        if (q % 4 == 0 || (q > 4 && q < 12 && q % 4 != 1)) {
            assert_int_equal(fsc_gpt_part_of_cut(&cfg, q, &part), FSC_OK);
            assert_int_equal(fsc_gpt_cut_of_part(&cfg, part), q);
            assert_int_equal(fsc_gpt_part_width(&cfg, part),
                             q % 4 == 3 ? 5 * cfg.d_model : cfg.d_model);
        }
    expect_refused(2, "0.5 layers falls inside the embedding");
    expect_refused(13, "3.25 layers falls inside the head");
    expect_refused(5, "1.25 layers falls inside block 0's attention");
    expect_refused(9, "2.25 layers falls inside block 1's attention");
    expect_refused(17, "4.25 layers is outside [0, 4]");
    expect_refused(-4, "-1 layers is outside");
    assert_null(fsc_gpt_stage_parts_new(&cfg, 3, 9));
    assert_non_null(strstr(fsc_last_error(), "parts [3, 9) outside [0, 8)"));
    if (world != 2) return;
    /* parts that do not add up to the model's: refused by the pipe */
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_1F1B, 2, 1, 2, &sched), FSC_OK);
    const int bad[2] = {2, 3};
    fsc_pipe_options opt = parts_options(&cfg, bad, 2);
    assert_null(fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, &opt));
    assert_non_null(strstr(fsc_last_error(), "hold 5 layers, the model has 8"));
    fsc_pipe_schedule_free(sched);
}

/* ---- through the trainer: a checkpoint at a half-block cut resumes elsewhere ---------- */

/* EQ_STEPS steps of ddp (x pp 2 at `quarters` when given; else one stage per
 * replica), resuming from `resume` and stopping at save_at with a
 * checkpoint in <dir>/ckpt when set; returns the saved weights. */
static float *train(const int *quarters, int save_at, bool resume, int64_t *numel) {
    char ckpt[96], path[128];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    snprintf(path, sizeof path, "%s/trainer.safetensors", dir);
    int parts[2];
    if (quarters) to_parts(quarters, 2, parts);
    const tt_run c = {.strategy = "ddp",
                      .pp = quarters ? 2 : 1,
                      .parts = true,
                      .balance = quarters ? parts : NULL,
                      .resume = resume ? ckpt : NULL,
                      .save_at = save_at,
                      .ckpt = ckpt};
    tt_data *d = tt_data_new();
    fsc_module *model;
    fsc_trainer *t = tt_trainer_new(&c, d, &model);
    tt_train(t, &c);
    return tt_save_read_free(t, model, d, path, numel);
}

/* Saved at a cut inside h.0's MLP (1.75 | 2.25), resumed between h.1's
 * attention and MLP (2.5 | 1.5) and without a pipeline. */
static void test_cut_checkpoint_resumes(void **state) {
    (void)state;
    if (world % 2) skip();
    static const int at_1_75[2] = {7, 9}, at_2_5[2] = {10, 6};
    int64_t n;
    float *got = train(at_1_75, 0, false, &n);
    expect_one_process("trainer ddp x pp 2 at 1.75,2.25", got, n, EQ_GLOBAL_BATCH);
    free(train(at_1_75, 2, false, &n));
    got = train(at_2_5, 0, true, &n);
    expect_one_process("1.75,2.25 -> checkpoint -> 2.5,1.5", got, n, EQ_GLOBAL_BATCH);
    got = train(NULL, 0, true, &n);
    expect_one_process("1.75,2.25 -> checkpoint -> pp 1", got, n, EQ_GLOBAL_BATCH);
}

TT_MAIN("fsc_pipe_half", dir, cmocka_unit_test(test_names_and_refusals),
        cmocka_unit_test(test_cuts), cmocka_unit_test(test_auto_over_parts),
        cmocka_unit_test(test_cut_checkpoint), cmocka_unit_test(test_unplanned_width),
        cmocka_unit_test(test_cut_checkpoint_resumes))
