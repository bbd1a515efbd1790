/* Tensor-parallel pipeline stages (fsc_tp_gpt_stage_new) beyond the mesh's
 * equivalence runs (tests/train/mpi_mesh.c), on pp 2 x tp 2 (4 ranks):
 *  - the last stage runs its head fused with the loss when the pipeline is
 *    given the targets (fsc_pipe_io.targets): the pipeline's loss callback
 *    is then never called, and the step's loss, every gradient and an
 *    evaluation's loss are the unfused run's bit for bit (one chunk of rows
 *    at these sizes: the same arithmetic); under a split backward (zbh1) the
 *    stage runs unfused and the callback is called;
 *  - with a vocabulary of 200 the fused head runs 2 chunks of rows per
 *    micro-batch, and training through the trainer ends with one process's
 *    parameters within the noise floor of tests/support/equivalence.h, with and
 *    without sequence parallelism;
 *  - --balance auto times TP stages with their TP groups: every rank picks
 *    the same cut, and training at it is one process's;
 *  - stages cut inside a block (fsc_tp_gpt_stage_parts_new) at .5 and .75,
 *    with sequence parallelism at .5, train as one process does; a .75 cut
 *    under sequence parallelism or recompute_activation is refused by name;
 *    a checkpoint taken at a .75 cut resumes at a .5 cut and in one
 *    process. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "fsc/pipe.h"
#include "fsc/tp.h"
#include "trainer_test.h"

static int rank, world;
static char dir[64];

/* ---- the pipeline by hand: who computes the loss --------------------------------------------- */

enum { MICROS = 2, MB = 2 }; /* micro-batches per step, samples each */

typedef struct {
    fsc_tokens tk;
    fsc_group *tp;
    int32_t x[MICROS][MB * 16], y[MICROS][MB * 16];
    int loss_calls;
} pipe_data;

static fsc_module *make_stage(void *user, int first, int end) {
    pipe_data *d = user;
    return fsc_tp_gpt_stage_new(&EQ_MODEL, first, end, &(fsc_tp_options){.group = d->tp});
}

static int input(void *user, int micro, fsc_tensor *x) {
    pipe_data *d = user;
    *x = fsc_tensor_2d(d->x[micro], FSC_DTYPE_I32, MB, EQ_MODEL.seq);
    return FSC_OK;
}

static int loss(void *user, int micro, fsc_tensor *y, fsc_arena *arena, float *out) {
    pipe_data *d = user;
    d->loss_calls++;
    fsc_tensor t = fsc_tensor_2d(d->y[micro], FSC_DTYPE_I32, MB, EQ_MODEL.seq);
    return fsc_tp_cross_entropy(out, y, &t, EQ_MODEL.vocab, -1, MICROS * MB * EQ_MODEL.seq, d->tp,
                                arena);
}

static int targets(void *user, int micro, fsc_head_loss *hl) {
    pipe_data *d = user;
    *hl = (fsc_head_loss){
        .targets = d->y[micro], .ignore_index = -1, .norm = MICROS * MB * EQ_MODEL.seq};
    return FSC_OK;
}

static int64_t sample0(void *user, int micro) {
    (void)user;
    return (int64_t)micro * MB;
}

/* One training step and one evaluation of the pipeline under schedule
 * `kind`, the head fused or not: *train_loss, *eval_loss, and this rank's
 * gradients (the caller frees them; *n floats). */
static float *run_pipe(pipe_data *d, fsc_pipe_kind kind, bool fused, float *train_loss,
                       float *eval_loss, int64_t *n) {
    fsc_group *pp;
    assert_int_equal(fsc_group_split(fsc_group_world(), rank % 2, rank / 2, "pp", &pp), FSC_OK);
    fsc_pipe_schedule *s;
    assert_int_equal(fsc_pipe_schedule_make(kind, 2, 1, MICROS, &s), FSC_OK);
    fsc_pipe_options po = {.layers = fsc_gpt_num_layers(&EQ_MODEL),
                           .make_stage = make_stage,
                           .stage_user = d,
                           .act_ndim = 3,
                           .act_shape = {MB, EQ_MODEL.seq, EQ_MODEL.d_model},
                           .seed = 5,
                           .mesh = fsc_group_world(),
                           .tp = d->tp};
    fsc_pipe *p = fsc_pipe_new(pp, s, &EQ_ADAMW, &po);
    if (!p) fail_msg("rank %d: %s", rank, fsc_last_error());
    fsc_pipe_io io = {.input = input,
                      .loss = loss,
                      .targets = fused ? targets : NULL,
                      .sample0 = sample0,
                      .user = d};
    fsc_pipe_zero_grad(p);
    fsc_ctx ctx = {.training = true, .seed = 5, .keyed = true};
    if (fsc_pipe_run(p, &ctx, &io, train_loss)) fail_msg("rank %d: %s", rank, fsc_last_error());
    ctx.training = false;
    if (fsc_pipe_eval(p, &ctx, &io, eval_loss)) fail_msg("rank %d: %s", rank, fsc_last_error());
    const fsc_params *ps = fsc_pipe_chunk_params(p, 0);
    float *g = malloc(sizeof(float) * (size_t)ps->numel);
    memcpy(g, ps->grad, sizeof(float) * (size_t)ps->numel);
    *n = ps->numel;
    fsc_pipe_free(p);
    fsc_pipe_schedule_free(s);
    fsc_group_free(pp);
    return g;
}

/* Given the targets, the last stage's head runs with the loss (the loss
 * callback is not called) and computes what the unfused head computes; a
 * split backward runs it unfused. */
static void test_fused_head_contract(void **state) {
    (void)state;
    if (world != 4) skip();
    pipe_data *d = calloc(1, sizeof *d);
    assert_non_null(d);
    eq_tokens(&d->tk);
    for (int m = 0; m < MICROS; m++)
        assert_int_equal(
            fsc_tokens_batch(&d->tk, 0, m, 0, MB, MICROS, 1, EQ_MODEL.seq, d->x[m], d->y[m]),
            FSC_OK);
    assert_int_equal(fsc_group_split(fsc_group_world(), rank / 2, rank % 2, "tp", &d->tp), FSC_OK);
    const bool last = rank / 2 == 1;
    const fsc_pipe_kind kinds[] = {FSC_PIPE_1F1B, FSC_PIPE_GPIPE, FSC_PIPE_ZB_H1};
    for (int k = 0; k < 3; k++) {
        float tl[2], el[2];
        int64_t n[2];
        int calls[2];
        float *g[2];
        for (int f = 0; f < 2; f++) {
            d->loss_calls = 0;
            g[f] = run_pipe(d, kinds[k], f == 1, &tl[f], &el[f], &n[f]);
            calls[f] = d->loss_calls;
        }
        /* unfused: the callback per micro-batch, in training and evaluation */
        assert_int_equal(calls[0], last ? 2 * MICROS : 0);
        /* fused: never, except for training under a split backward */
        assert_int_equal(calls[1], last && kinds[k] == FSC_PIPE_ZB_H1 ? MICROS : 0);
        /* Exact by construction, not by one BLAS kernel's luck: a
         * micro-batch's 32 rows are one chunk of the fused head (tp_head.c:
         * max(32, N*C/vp) = 32 rows = N at vp = 32), so fused and unfused run
         * the same GEMMs (M = 32, K = C, N = vp, and back), the same
         * all-reduces and the same cross-entropy rows on the same data. The
         * chunked case (other GEMM shapes) is compared with a tolerance
         * below and in mpi_tp_memory. */
        if (tl[0] != tl[1] || el[0] != el[1])
            fail_msg("rank %d, schedule %d: losses %.9g / %.9g fused, %.9g / %.9g unfused", rank, k,
                     (double)tl[1], (double)el[1], (double)tl[0], (double)el[0]);
        assert_int_equal(n[0], n[1]);
        if (memcmp(g[0], g[1], sizeof(float) * (size_t)n[0]))
            fail_msg("rank %d, schedule %d: the fused head's gradients differ from the unfused",
                     rank, k);
        free(g[0]), free(g[1]);
    }
    fsc_group_free(d->tp);
    fsc_tokens_free(&d->tk);
    free(d);
}

/* ---- through the trainer, several chunks of rows --------------------------------------------- */

/* pp 2 x tp 2 on a vocabulary of 200 (100 rows per TP rank): each
 * micro-batch's 64 rows go through the fused head as 2 chunks of 32, so the
 * head's weight gradient sums over chunks; the result is one process's. */
static void test_chunked_head_equals_one_process(void **state) {
    (void)state;
    if (world != 4) skip();
    fsc_gpt_config v200 = EQ_MODEL;
    v200.vocab = 200;
    char out[128];
    snprintf(out, sizeof out, "%s/v200.safetensors", dir);
    for (int sp = 0; sp < 2; sp++) {
        tt_data *d = tt_data_new();
        d->cfg = v200;
        fsc_module *model;
        const tt_run c = {.strategy = "ddp", .pp = 2, .tp = 2, .sp = sp, .out = out};
        fsc_trainer *t = tt_trainer_new(&c, d, &model);
        tt_train(t, &c);
        tt_save_and_free(t, model, out);
        fsc_group_barrier(fsc_group_world());
        int64_t n;
        float *w = tt_read_weights(&v200, out, &n);
        tt_data_free(d);
        tt_expect_reference(&(eq_options){.model = &v200},
                            sp ? "pp 2 x tp 2, vocab 200, sp" : "pp 2 x tp 2, vocab 200", w, n);
        fsc_group_barrier(fsc_group_world()); /* every rank read it before the next run */
    }
}

/* ---- --balance auto over TP stages ----------------------------------------------------------- */

static fsc_module *balance_stage(void *user, int first, int end) {
    return fsc_tp_gpt_stage_new(&EQ_MODEL, first, end, user);
}

/* pp 2 x tp 2: the layers are timed as TP stages, each TP group running
 * their collectives together; every rank picks the same cut (the times are
 * averaged over the world), and training at that cut is one process's. */
static void test_balance_auto(void **state) {
    (void)state;
    if (world != 4) skip();
    fsc_tp_options tp = {0};
    assert_int_equal(fsc_group_split(fsc_group_world(), rank / 2, rank % 2, "tp", &tp.group),
                     FSC_OK);
    const int B = EQ_GLOBAL_BATCH / 2, L = fsc_gpt_num_layers(&EQ_MODEL);
    for (int sp = 0; sp < 2; sp++) {
        tp.sequence_parallel = sp;
        fsc_pipe_options po = {.layers = L,
                               .make_stage = balance_stage,
                               .stage_user = &tp,
                               .act_ndim = 3,
                               .act_shape = {B, EQ_MODEL.seq / (sp ? 2 : 1), EQ_MODEL.d_model},
                               .seq_len = EQ_MODEL.seq,
                               .seed = 5,
                               .tp = tp.group};
        fsc_pipe_schedule *s;
        assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_1F1B, 2, 1, 2, &s), FSC_OK);
        int balance[2], all[4][2];
        fsc_pipe_balance_report rep;
        if (fsc_pipe_balance_auto(fsc_group_world(), &po, s, EQ_MODEL.vocab, 2, balance, &rep))
            fail_msg("rank %d: %s", rank, fsc_last_error());
        fsc_pipe_schedule_free(s);
        assert_int_equal(fsc_group_allgather(fsc_group_world(), balance, all, 2, FSC_DTYPE_I32),
                         FSC_OK);
        for (int r = 0; r < 4; r++)
            if (all[r][0] != balance[0] || all[r][1] != balance[1])
                fail_msg("rank %d chose %d,%d, rank %d %d,%d", rank, balance[0], balance[1], r,
                         all[r][0], all[r][1]);
        assert_true(balance[0] >= 1 && balance[1] >= 1 && balance[0] + balance[1] == L);
        assert_true(rep.stages == 2 && rep.stage_seconds[0] > 0 && rep.stage_seconds[1] > 0);
        char out[128], what[64];
        snprintf(out, sizeof out, "%s/auto.safetensors", dir);
        int64_t n;
        tt_data *d = tt_data_new();
        fsc_module *model;
        const tt_run c = {
            .strategy = "ddp", .pp = 2, .tp = 2, .sp = sp, .balance = balance, .out = out};
        fsc_trainer *t = tt_trainer_new(&c, d, &model);
        tt_train(t, &c);
        tt_save_and_free(t, model, out);
        fsc_group_barrier(fsc_group_world());
        float *w = tt_read_weights(&EQ_MODEL, out, &n);
        tt_data_free(d);
        snprintf(what, sizeof what, "pp 2 x tp 2%s, --balance auto: %d,%d", sp ? " (sp)" : "",
                 balance[0], balance[1]);
        tt_expect_reference(NULL, what, w, n);
        fsc_group_barrier(fsc_group_world());
    }
    fsc_group_free(tp.group);
}

/* ---- stages cut inside a block ----------------------------------------------------------------
 */

/* pp 2 x tp 2 trainers whose stages are TP parts (fsc_tp_gpt_stage_parts_new),
 * cut after `cut` quarter layers: tt_trainer_new's run, the stages in parts. */
typedef struct {
    tt_data *d;
    int t;
} tp_parts;

static fsc_module *make_parts(void *user, int first, int end, const fsc_tp_options *tp) {
    tp_parts *u = user;
    u->d->tp = tp->group;
    return fsc_tp_gpt_stage_parts_new(&u->d->cfg, first, end, tp);
}

static void part_shape(void *user, int part, int64_t shape[FSC_MAX_DIMS]) {
    const tp_parts *u = user;
    shape[2] = fsc_tp_gpt_part_width(&u->d->cfg, u->t, part);
}

static fsc_trainer *parts_trainer(const tt_run *c, tp_parts *u, int cut, fsc_pipe_kind kind,
                                  int balance[2]) {
    const int B = EQ_GLOBAL_BATCH / 2, n = fsc_gpt_num_parts(&EQ_MODEL);
    assert_int_equal(fsc_gpt_part_of_cut(&EQ_MODEL, cut, &balance[0]), FSC_OK);
    balance[1] = n - balance[0];
    fsc_trainer_config tc = {.strategy = {.name = c->strategy, .seed = 5},
                             .optim = EQ_ADAMW,
                             .batch = B,
                             .grad_accum = 2,
                             .targets_per_sample = u->d->T,
                             .load = tt_load,
                             .pipe_input = tt_pipe_input,
                             .pipe_loss = tt_pipe_loss,
                             .pipe_targets = tt_pipe_targets,
                             .user = u->d};
    tc.strategy.pipe =
        (fsc_pipe_strategy_options){.stages = 2,
                                    .schedule = kind,
                                    .balance = balance,
                                    .layers = n,
                                    .stage_user = u,
                                    .act_ndim = 3,
                                    .act_shape = {B, u->d->T / (c->sp ? 2 : 1), EQ_MODEL.d_model},
                                    .act_shape_at = part_shape};
    tc.strategy.tp = (fsc_tp_strategy_options){
        .size = 2, .sequence_parallel = c->sp, .make_stage = make_parts, .user = u};
    fsc_trainer *t = fsc_trainer_new(NULL, &tc);
    if (!t) fail_msg("rank %d: %s", rank, fsc_last_error());
    return t;
}

/* Trains (or resumes, checkpoints) c's run of `model` (NULL: EQ_MODEL) at
 * the cut under schedule `kind`; the weights read back. */
static float *train_at_cut(const tt_run *c, int cut, fsc_pipe_kind kind,
                           const fsc_gpt_config *model, int64_t *n) {
    tt_data *d = tt_data_new();
    if (model) d->cfg = *model;
    tp_parts u = {.d = d, .t = 2};
    int balance[2];
    fsc_trainer *t = parts_trainer(c, &u, cut, kind, balance);
    tt_train(t, c);
    tt_save_and_free(t, NULL, c->out);
    fsc_group_barrier(fsc_group_world());
    float *w = tt_read_weights(&EQ_MODEL, c->out, n);
    tt_data_free(d);
    return w;
}

/* A cut after a block's attention half (.5: the residual stream) and one
 * after its MLP's c_fc and GELU (.75: the residual, then each TP rank's
 * GELU columns), with sequence parallelism at .5: one process's training.
 * Under zero-bubble H1 (weight gradients deferred to W) too, with dropout
 * off: then a layer's deferred weight gradient reads the very gradient
 * buffer the block passes on, which a block that summed its residual
 * gradient into it (as tp_blocks.c once did) would corrupt before W. */
static void test_cuts_inside_blocks(void **state) {
    (void)state;
    if (world != 4) skip();
    fsc_gpt_config no_dropout = EQ_MODEL;
    no_dropout.dropout = 0;
    const struct {
        int cut; /* quarter layers */
        bool sp;
        fsc_pipe_kind kind;
    } runs[] = {{6, false, FSC_PIPE_1F1B}, {7, false, FSC_PIPE_1F1B}, {11, false, FSC_PIPE_1F1B},
                {6, true, FSC_PIPE_1F1B},  {10, true, FSC_PIPE_1F1B}, {8, false, FSC_PIPE_ZB_H1},
                {7, false, FSC_PIPE_ZB_H1}};
    char out[128], what[64];
    snprintf(out, sizeof out, "%s/cut.safetensors", dir);
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        const bool zb = runs[i].kind == FSC_PIPE_ZB_H1;
        int64_t n;
        float *w = train_at_cut(
            &(tt_run){.strategy = "ddp", .pp = 2, .tp = 2, .sp = runs[i].sp, .out = out},
            runs[i].cut, runs[i].kind, zb ? &no_dropout : NULL, &n);
        snprintf(what, sizeof what, "pp 2 x tp 2%s cut at %g%s", runs[i].sp ? " (sp)" : "",
                 runs[i].cut / 4.0, zb ? ", zbh1, no dropout" : "");
        tt_expect_reference(zb ? &(eq_options){.model = &no_dropout} : NULL, what, w, n);
        fsc_group_barrier(fsc_group_world());
    }
}

/* A .75 cut under sequence parallelism or recompute_activation is refused by name. */
static void test_cut_refusals(void **state) {
    (void)state;
    fsc_tp_options tp = {.sequence_parallel = true};
    assert_null(fsc_tp_gpt_stage_parts_new(&EQ_MODEL, 0, 3, &tp)); /* ends before c_proj */
    if (!strstr(fsc_last_error(), "not there with sequence parallelism"))
        fail_msg("%s", fsc_last_error());
    tp = (fsc_tp_options){.recompute_activation = true};
    assert_null(fsc_tp_gpt_stage_parts_new(&EQ_MODEL, 3, 8, &tp)); /* starts at c_proj */
    if (!strstr(fsc_last_error(), "recompute_activation has nothing to recompute"))
        fail_msg("%s", fsc_last_error());
}

/* A checkpoint written at a .75 cut resumes at a .5 cut and in one process,
 * each ending as the uninterrupted run (by global name at any cut). */
static void test_cut_resume(void **state) {
    (void)state;
    if (world != 4) skip();
    char ckpt[128], out[128], mine[128];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-cut", dir);
    snprintf(out, sizeof out, "%s/cut-resume.safetensors", dir);
    int64_t n;
    free(train_at_cut(
        &(tt_run){.strategy = "ddp", .pp = 2, .tp = 2, .save_at = 2, .ckpt = ckpt, .out = out}, 7,
        FSC_PIPE_1F1B, NULL, &n));
    float *w =
        train_at_cut(&(tt_run){.strategy = "ddp", .pp = 2, .tp = 2, .resume = ckpt, .out = out}, 10,
                     FSC_PIPE_1F1B, NULL, &n);
    tt_expect_reference(NULL, "pp 2 x tp 2, cut 1.75 -> checkpoint -> cut 2.5", w, n);
    fsc_group_barrier(fsc_group_world());
    snprintf(mine, sizeof mine, "%s/cut-single-%d.safetensors", dir, rank);
    tt_data *d = tt_data_new();
    fsc_module *model;
    const tt_run one = {.strategy = "single", .resume = ckpt, .out = mine};
    fsc_trainer *t = tt_trainer_new(&one, d, &model);
    tt_train(t, &one);
    tt_save_and_free(t, model, mine);
    w = tt_read_weights(&EQ_MODEL, mine, &n);
    tt_data_free(d);
    tt_expect_reference(NULL, "pp 2 x tp 2, cut 1.75 -> checkpoint -> one process", w, n);
}

TT_MAIN("fsc_tp_pipe", dir, cmocka_unit_test(test_fused_head_contract),
        cmocka_unit_test(test_chunked_head_equals_one_process), cmocka_unit_test(test_balance_auto),
        cmocka_unit_test(test_cuts_inside_blocks), cmocka_unit_test(test_cut_refusals),
        cmocka_unit_test(test_cut_resume))
