/* AdaScale on the mesh: pipeline stages and tensor-parallel ranks against
 * ddp with the same data-parallel replicas, global batch and data. A
 * replica's gradient sample is then spread over ranks (a pipeline's stages
 * each hold part of the model, TP ranks their shards and copies of the
 * replicated parameters), so its squared norm is the sum of the parts with
 * every parameter counted once: the tied wte (on the first and last stages)
 * after its two parts of the micro-batch are added, a LayerNorm every TP
 * rank holds on one of them. S is the data-parallel size x grad_accum, not
 * the ranks. Every step's gain must be ddp's within a float sum taken in
 * another order (EQ_FLOOR_ULPS ulps relative, as mpi_adascale_fsdp.c), and
 * the parameters within equivalence.h's noise floor. A part dropped or
 * counted twice moves a term of the variance estimate by its whole size.
 * S = 1 (one replica, one micro-batch) gives gain 1 and one process's
 * training. Runs at 2 ranks (one replica over 2) and 4 (2 replicas of 2);
 * ddp's side runs on a group of the replicas' count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "trainer_test.h"

static int rank, world;
static char scratch[64];

enum { STEPS = EQ_STEPS };

typedef struct ada_run {
    const char *strategy;
    fsc_group *group;
    int pp, tp, accum;
    fsc_pipe_kind schedule; /* with pp (0: gpipe) */
    double gains[STEPS];    /* out */
} ada_run;

/* tt_trainer_config's trainer for c's layout, stepping SGD by AdaScale. */
static fsc_trainer *ada_trainer(const ada_run *c, tt_data *d, fsc_module **model) {
    const tt_run r = {
        .strategy = c->strategy, .group = c->group, .pp = c->pp, .tp = c->tp, .accum = c->accum};
    int dp;
    fsc_trainer_config tc = tt_trainer_config(&r, d, &dp);
    tc.optim = EQ_SGD_MOMENTUM; /* AdaScale is an SGD rule */
    tc.adascale = true;
    tc.adascale_cfg = (fsc_adascale_config){.smoothing = -1}; /* each step's own estimate */
    if (c->pp > 1) tc.strategy.pipe.schedule = c->schedule;
    return tt_trainer_of(&r, d, &tc, dp, model);
}

/* c's run; the final weights in the one-process layout (the caller frees). */
static float *ada_train(ada_run *c, const char *tag, int64_t *numel) {
    tt_data *d = tt_data_new();
    fsc_module *m;
    fsc_trainer *t = ada_trainer(c, d, &m);
    for (int s = 0; s < STEPS; s++) {
        fsc_step_result r;
        if (fsc_trainer_step(t, &r))
            fail_msg("rank %d, %s: %s", rank, c->strategy, fsc_last_error());
        c->gains[s] = r.gain;
    }
    char path[160];
    snprintf(path, sizeof path, "%s/%s_%d.safetensors", scratch, tag,
             fsc_group_rank(fsc_group_world()) / fsc_group_size(c->group));
    tt_save_and_free(t, m, path); /* NULL where the strategy made the model */
    float *w = tt_read_weights(&EQ_MODEL, path, numel);
    tt_data_free(d);
    fsc_group_barrier(fsc_group_world());
    return w;
}

/* Some step's gain must be strictly inside (1, S): a clamped one hides the
 * samples' sum. */
static void expect_measured(const double *gains, int S) {
    bool measured = false;
    for (int s = 0; s < STEPS; s++) measured |= gains[s] > 1.01 && gains[s] < S - 0.01;
    assert_true(measured);
}

/* Groups of n consecutive ranks of the world (each runs the same). */
static fsc_group *groups_of(int n) {
    fsc_group *g = NULL;
    if (fsc_group_split(fsc_group_world(), rank / n, rank % n, "ada-mesh", &g))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    return g;
}

/* `mesh` (its group: the world) against ddp over its replicas' count. */
static void check_against_ddp(ada_run *mesh, const char *what) {
    const int pp = mesh->pp > 1 ? mesh->pp : 1, tp = mesh->tp > 1 ? mesh->tp : 1;
    const int dp = world / (pp * tp);
    mesh->group = fsc_group_world();
    ada_run ddp = {.strategy = "ddp", .group = groups_of(dp), .accum = mesh->accum};
    int64_t n, nd;
    float *w_ddp = ada_train(&ddp, "ddp", &nd), *w = ada_train(mesh, "mesh", &n);
    tt_expect_gains(what, mesh->gains, ddp.gains, STEPS);
    expect_measured(ddp.gains, dp * mesh->accum);
    /* the bound: the noise floor of SGD's training on this model */
    int64_t nr;
    free(eq_reference_ex(&(eq_options){.optim = &EQ_SGD_MOMENTUM}, &nr));
    assert_int_equal(nr, nd);
    tt_expect_close(what, w, n, w_ddp, nd);
    free(w_ddp), free(w);
    fsc_group_free(ddp.group);
}

/* (a) One replica, one micro-batch: S = 1, the gain 1 at every step and
 * the parameters one process's. */
static void test_s1_is_one_process(void **state) {
    (void)state;
    if (world != 2) skip();
    const int layouts[2][2] = {{2, 1}, {1, 2}}; /* pp, tp */
    for (int i = 0; i < 2; i++) {
        ada_run c = {.strategy = "ddp",
                     .group = fsc_group_world(),
                     .pp = layouts[i][0],
                     .tp = layouts[i][1],
                     .accum = 1};
        int64_t n, nr;
        float *w = ada_train(&c, "s1", &n);
        for (int s = 0; s < STEPS; s++) assert_true(c.gains[s] == 1.0);
        tt_expect_reference(&(eq_options){.optim = &EQ_SGD_MOMENTUM},
                            i ? "adascale tp 2, S 1" : "adascale pp 2, S 1", w, n);
        (void)nr;
    }
}

/* One replica over 2 ranks with 2 micro-batches (S = 2) against one
 * process: a pipeline's micro-batches measured one by one (each stage's
 * part the difference its backward made, wte's two parts added per
 * micro-batch), TP's shards with the copies once. */
static void test_one_replica_accumulated(void **state) {
    (void)state;
    if (world != 2) skip();
    ada_run gpipe = {.strategy = "ddp", .pp = 2, .accum = 2, .schedule = FSC_PIPE_GPIPE};
    check_against_ddp(&gpipe, "pp 2 gpipe x2");
    ada_run f1b = {.strategy = "sdp", .pp = 2, .accum = 2, .schedule = FSC_PIPE_1F1B};
    check_against_ddp(&f1b, "sdp pp 2 1f1b x2");
    ada_run inter = {.strategy = "ddp", .pp = 2, .accum = 2, .schedule = FSC_PIPE_INTERLEAVED};
    check_against_ddp(&inter, "pp 2 interleaved x2");
    ada_run tp = {.strategy = "ddp", .tp = 2, .accum = 2};
    check_against_ddp(&tp, "tp 2 x2");
    ada_run tp_oss = {.strategy = "oss", .tp = 2, .accum = 2};
    check_against_ddp(&tp_oss, "oss tp 2 x2");
}

/* (b) 2 replicas of 2 ranks, with and without accumulation; and one
 * replica of pp 2 x tp 2. */
static void test_two_replicas(void **state) {
    (void)state;
    if (world != 4) skip();
    for (int accum = 1; accum <= 2; accum++) {
        char what[64];
        ada_run pp = {.strategy = "ddp", .pp = 2, .accum = accum, .schedule = FSC_PIPE_1F1B};
        snprintf(what, sizeof what, "dp 2 x pp 2 x%d", accum);
        check_against_ddp(&pp, what);
        ada_run tp = {.strategy = "ddp", .tp = 2, .accum = accum};
        snprintf(what, sizeof what, "dp 2 x tp 2 x%d", accum);
        check_against_ddp(&tp, what);
    }
    /* one replica over the whole mesh: TP stages, the head fused with the loss */
    ada_run pt = {.strategy = "ddp", .pp = 2, .tp = 2, .accum = 2, .schedule = FSC_PIPE_1F1B};
    check_against_ddp(&pt, "pp 2 x tp 2 x2");
    ada_run oss = {.strategy = "oss", .pp = 2, .accum = 2, .schedule = FSC_PIPE_1F1B};
    check_against_ddp(&oss, "oss dp 2 x pp 2 x2");
    ada_run sdp = {.strategy = "sdp", .tp = 2, .accum = 2};
    check_against_ddp(&sdp, "sdp dp 2 x tp 2 x2");
}

/* What still cannot see each micro-batch is refused by name. */
static void test_refusals(void **state) {
    (void)state;
    tt_data *d = tt_data_new();
    const struct {
        const char *strategy, *why;
        int pp, tp;
        fsc_pipe_kind schedule;
    } cases[] = {
        {"fsdp", "fsdp over a pipeline", 2, 1, FSC_PIPE_1F1B},
        {"fsdp", "fsdp over a tensor-parallel", 1, 2, FSC_PIPE_GPIPE},
        {"ddp", "zbh1", 2, 1, FSC_PIPE_ZB_H1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fsc_trainer_config tc = {.strategy = {.name = cases[i].strategy},
                                 .optim = EQ_SGD_MOMENTUM,
                                 .batch = 1,
                                 .grad_accum = 2,
                                 .loss = tt_gpt_loss,
                                 .pipe_input = tt_pipe_input,
                                 .pipe_loss = tt_pipe_loss,
                                 .user = d,
                                 .adascale = true};
        tc.strategy.pipe.stages = cases[i].pp, tc.strategy.pipe.schedule = cases[i].schedule;
        tc.strategy.tp.size = cases[i].tp;
        assert_null(fsc_trainer_new(NULL, &tc));
        if (!strstr(fsc_last_error(), cases[i].why) || !strstr(fsc_last_error(), "AdaScale"))
            fail_msg("%s: %s", cases[i].why, fsc_last_error());
    }
    tt_data_free(d);
}

TT_MAIN("fsc_adascale_mesh", scratch, cmocka_unit_test(test_s1_is_one_process),
        cmocka_unit_test(test_one_replica_accumulated), cmocka_unit_test(test_two_replicas),
        cmocka_unit_test(test_refusals))
