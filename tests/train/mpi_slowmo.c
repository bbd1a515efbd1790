/* The slowmo row (Local SGD with slow momentum) on 1, 2 and 4 ranks, through
 * the trainer on the tiny GPT of tests/support/equivalence.h:
 *  - averaging every step with no slow momentum (slowmo_lr 1, momentum 0)
 *    under SGD with momentum and weight decay is DDP's step: the one-process
 *    reference within the equivalence noise bound;
 *  - Local SGD at frequency k is k local steps on each rank's own batch and
 *    an average, and the slow-momentum outer update is FairScale's formula,
 *    both recomputed here by hand (each rank its own model, its own
 *    micro-batch, an all-reduce average, the outer update on the whole
 *    vector): equal within equivalence.h's eq_tolerance, its noise floor the
 *    spread of the hand's run under other legal orders of the averages' sums
 *    (the row's sharded reduce may sum 4 ranks in another order than the
 *    hand's all-reduce; at 1 and 2 ranks they agree bit for bit);
 *  - communication per step (fsc_group_get_stats bytes) at localsgd
 *    frequency 4 is at most 0.3x DDP's, slow momentum every 48 steps
 *    included (its reduce + broadcast moves twice an average's bytes:
 *    (11 + 2) / 48 = 0.27x).
 * With --dump it is the C side of tests/reference/slowmo_ref.py instead: the
 * row runs through the trainer and every rank writes its gradients and
 * parameters after each step for the PyTorch replay of FairScale's update. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "trainer_test.h"

static int rank, world;
static fsc_tokens tk;

static int gpt_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                    float *loss) {
    (void)user;
    return tt_tokens_micro(&tk, m, ctx, mb, loss);
}

typedef struct slow {
    int localsgd, slowmo;
    double momentum, lr;
} slow;

/* The slowmo row through the trainer: final parameters; *bytes gets the
 * world group's payload bytes over the steps. */
static float *run_row(const char *name, const fsc_optim_config *optim, slow o, int steps,
                      int64_t *bytes) {
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_trainer_config cfg = {
        .strategy = {.name = name, .seed = 5},
        .optim = *optim,
        .batch = EQ_GLOBAL_BATCH / world,
        .targets_per_sample = EQ_MODEL.seq,
        .loss = gpt_loss,
    };
    if (fsc_strategy_takes(name, "slowmo_lr"))
        cfg.strategy.localsgd_frequency = o.localsgd, cfg.strategy.slowmo_frequency = o.slowmo,
        cfg.strategy.slowmo_momentum = o.momentum, cfg.strategy.slowmo_lr = o.lr;
    fsc_trainer *t = fsc_trainer_new(m, &cfg);
    if (!t) fail_msg("%s: %s", name, fsc_last_error());
    fsc_group_reset_stats(fsc_group_world());
    for (int s = 0; s < steps; s++) {
        fsc_step_result r;
        if (fsc_trainer_step(t, &r)) fail_msg("%s: %s", name, fsc_last_error());
    }
    if (bytes) *bytes = fsc_group_get_stats(fsc_group_world()).bytes;
    const fsc_params *ps = fsc_strategy_params(fsc_trainer_strategy(t));
    float *out = malloc(sizeof(float) * (size_t)ps->numel);
    memcpy(out, ps->data, sizeof(float) * (size_t)ps->numel);
    fsc_trainer_free(t);
    fsc_module_free(m);
    return out;
}

/* The average over the world of ps's P floats, in the summation order
 * `order` picks: 0 the all-reduce's, 1 rank 0 to the last one by one, 2 the
 * last rank to rank 0; the sum divided by the world size, as AVG does. */
static void average(float *ps, int P, int order) {
    if (order == 0) {
        fsc_group_allreduce(fsc_group_world(), ps, P, FSC_DTYPE_F32, FSC_REDUCE_AVG);
        return;
    }
    float *all = malloc(sizeof(float) * (size_t)P * (size_t)world);
    if (!all || fsc_group_allgather(fsc_group_world(), ps, all, P, FSC_DTYPE_F32)) abort();
    for (int i = 0; i < P; i++) {
        float sum = 0.f;
        for (int k = 0; k < world; k++)
            sum += all[(size_t)(order == 1 ? k : world - 1 - k) * P + i];
        ps[i] = sum / (float)world;
    }
    free(all);
}

/* By hand: this rank's model steps on its own micro-batch (the local mean),
 * parameters averaged every o.localsgd steps (in summation order `order`, see
 * average), and every o.slowmo steps the outer update on the whole averaged
 * vector instead. */
static float *run_by_hand(const fsc_optim_config *optim, slow o, int steps, int order,
                          int64_t *numel) {
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_params ps;
    fsc_optim_range *r;
    int nr;
    if (!m || fsc_params_bind(m, 5, true, &ps) || fsc_optim_ranges_from_params(&ps, &r, &nr))
        fail_msg("bind: %s", fsc_last_error());
    fsc_optim *opt = fsc_optim_new(optim, r, nr);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    const int B = EQ_GLOBAL_BATCH / world, T = EQ_MODEL.seq, P = (int)ps.numel;
    if (o.lr == 0) o.lr = 1; /* the row's default */
    const bool outer = o.lr != 1 || o.momentum != 0;
    float *old = malloc(sizeof(float) * P), *buf = calloc((size_t)P, sizeof(float));
    memcpy(old, ps.data, sizeof(float) * P);
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    const eq_batch b = eq_batch_of_rank(&tk, arena, T, 1, rank, world, x, y);
    for (int s = 0; s < steps; s++) {
        fsc_params_zero_grad(&ps);
        fsc_ctx ctx;
        float loss;
        if (eq_micro_input(&b, s, 0, &ctx) ||
            fsc_gpt_train_micro(m, &ctx, x, y, B, T, -1, (double)B * T, &loss))
            abort();
        fsc_optim_step(opt);
        const bool avg = (s + 1) % o.localsgd == 0, slow_step = outer && (s + 1) % o.slowmo == 0;
        if ((avg || slow_step) && world > 1) average(ps.data, P, order);
        if (slow_step) { /* FairScale's _perform_local_optimization, all elements */
            const double lr = fsc_optim_get_lr(opt);
            const float inv = (float)(1.0 / lr), step = (float)(o.lr * lr);
            for (int i = 0; i < P; i++) {
                buf[i] = (float)o.momentum * buf[i] + (old[i] - ps.data[i]) * inv;
                old[i] -= step * buf[i];
                ps.data[i] = old[i];
            }
        }
    }
    float *out = malloc(sizeof(float) * P);
    memcpy(out, ps.data, sizeof(float) * P);
    *numel = P;
    free(old), free(buf);
    fsc_arena_free(arena);
    fsc_optim_free(opt);
    fsc_optim_ranges_free(r);
    fsc_params_free(&ps);
    fsc_module_free(m);
    return out;
}

/* The row's parameters against the hand's (its average in the all-reduce's
 * order) within eq_tolerance, the noise floor measured on the hand's own
 * computation: the same run with the averages summed rank by rank forward
 * and backward, legal orders of the same sum (the row's sharded reduce is
 * another), carried through the steps that follow. */
static void expect_close(const char *what, const float *got, const fsc_optim_config *optim, slow o,
                         int steps) {
    int64_t n;
    float *want = run_by_hand(optim, o, steps, 0, &n), *alt[2];
    for (int a = 0; a < 2; a++) alt[a] = run_by_hand(optim, o, steps, 1 + a, &n);
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_params ps;
    if (!m || fsc_params_bind(m, 5, false, &ps)) fail_msg("bind: %s", fsc_last_error());
    eq_set_noise(&ps, want, alt, 2);
    fsc_params_free(&ps), fsc_module_free(m);
    char label[160];
    snprintf(label, sizeof label, "%s, %d ranks, rank %d", what, world, rank);
    if (eq_compare(label, got, want, n)) fail_msg("%s: outside the noise bound", label);
    free(want), free(alt[0]), free(alt[1]);
}

static void test_frequency_one_is_ddp(void **state) {
    (void)state;
    int64_t numel;
    float *ref = eq_reference_ex(&(eq_options){.optim = &EQ_SGD_MOMENTUM}, &numel);
    float *got = run_row("slowmo", &EQ_SGD_MOMENTUM, (slow){.localsgd = 1}, EQ_STEPS, NULL);
    char label[80];
    snprintf(label, sizeof label, "slowmo, localsgd frequency 1, %d ranks, rank %d", world, rank);
    assert_int_equal(eq_compare(label, got, ref, numel), 0);
    free(ref), free(got);
}

static void test_local_sgd_by_hand(void **state) {
    (void)state;
    const slow o = {.localsgd = 2};
    for (int steps = 2; steps <= 5; steps += 3) { /* right after an average, and between */
        float *got = run_row("slowmo", &EQ_SGD_MOMENTUM, o, steps, NULL);
        expect_close(steps == 2 ? "local sgd k=2, 2 steps" : "local sgd k=2, 5 steps", got,
                     &EQ_SGD_MOMENTUM, o, steps);
        free(got);
    }
}

static void test_slow_momentum_by_hand(void **state) {
    (void)state;
    const slow o = {.localsgd = 2, .slowmo = 2, .momentum = 0.5, .lr = 0.8};
    float *got = run_row("slowmo", &EQ_SGD_MOMENTUM, o, 6, NULL);
    expect_close("slow momentum 0.5, slowmo_lr 0.8, 3 outer steps", got, &EQ_SGD_MOMENTUM, o, 6);
    free(got);
    /* Adam as the local optimizer too */
    got = run_row("slowmo", &EQ_ADAMW, o, 4, NULL);
    expect_close("slow momentum over AdamW, 2 outer steps", got, &EQ_ADAMW, o, 4);
    free(got);
}

static void test_communication_saved(void **state) {
    (void)state;
    if (world == 1) skip();
    enum { STEPS = 48 }; /* FairScale's default slowmo_frequency */
    int64_t ddp, local, slow_b;
    free(run_row("ddp", &EQ_SGD_MOMENTUM, (slow){0}, STEPS, &ddp));
    free(run_row("slowmo", &EQ_SGD_MOMENTUM, (slow){.localsgd = 4}, STEPS, &local));
    free(run_row("slowmo", &EQ_SGD_MOMENTUM,
                 (slow){.localsgd = 4, .slowmo = 48, .momentum = 0.5, .lr = 1}, STEPS, &slow_b));
    if (rank == 0)
        print_message("bytes per step on rank 0, %d ranks: ddp %.0f, local sgd (k=4) %.0f "
                      "(%.3fx), + slow momentum every 48 %.0f (%.3fx)\n",
                      world, (double)ddp / STEPS, (double)local / STEPS, (double)local / ddp,
                      (double)slow_b / STEPS, (double)slow_b / ddp);
    assert_true(local <= 0.3 * ddp);
    assert_true(slow_b <= 0.3 * ddp);
}

static void test_refusals(void **state) {
    (void)state;
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_strategy_options bad[3] = {
        {.name = "slowmo", .localsgd_frequency = 3, .slowmo_frequency = 4, .slowmo_momentum = 0.5},
        {.name = "slowmo", .slowmo_momentum = 1.0},
        {.name = "ddp", .localsgd_frequency = 2},
    };
    const char *want[3] = {"multiple", "slowmo_momentum", "applies to slowmo only"};
    for (int i = 0; i < 3; i++) {
        fsc_strategy *s = fsc_strategy_new(m, &EQ_SGD_MOMENTUM, &bad[i]);
        assert_null(s);
        if (!strstr(fsc_last_error(), want[i]))
            fail_msg("expected \"%s\" in: %s", want[i], fsc_last_error());
    }
    fsc_module_free(m);
}

/* Captures the step's local-mean gradient, before the optimizer sees it. */
static int copy_grad(fsc_trainer *t, void *user) {
    const fsc_params *ps = fsc_strategy_params(fsc_trainer_strategy(t));
    memcpy(*(float **)user, ps->grad, sizeof(float) * (size_t)ps->numel);
    return 0;
}

static bool put(FILE *f, const void *p, size_t size, int64_t n) {
    return fwrite(p, size, (size_t)n, f) == (size_t)n;
}

/* --dump DIR OPTIM LOCALSGD SLOWMO MOMENTUM SLOWMO_LR STEPS: the row through
 * the trainer (OPTIM sgd: EQ_SGD_MOMENTUM, adamw: EQ_ADAMW; a warm-up cosine
 * schedule, so the outer update sees a changing lr). DIR/rank<r>.bin, little
 * endian: int32 P, steps, world, rank; float64 optimizer config (kind, lr,
 * momentum, dampening, nesterov, weight_decay, beta1, beta2, eps); P uint8
 * decay flags; P float32 initial parameters; then per step float64 lr, P
 * float32 gradient (the local mean the optimizer steps on), P float32
 * parameters after the step and any averaging. */
static int dump(int argc, char **argv) {
    if (argc != 9 || (strcmp(argv[3], "sgd") && strcmp(argv[3], "adamw"))) {
        fprintf(stderr, "usage: %s --dump DIR sgd|adamw LOCALSGD SLOWMO MOMENTUM SLOWMO_LR STEPS\n",
                argv[0]);
        return mpi_test_finish(1);
    }
    const int steps = atoi(argv[8]);
    fsc_optim_config optim;
    if (fsc_optim_config_resolve(strcmp(argv[3], "sgd") ? &EQ_ADAMW : &EQ_SGD_MOMENTUM, &optim))
        return fprintf(stderr, "dump: %s\n", fsc_last_error()), mpi_test_finish(1);
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    float *grad = NULL; /* sized once the row has bound the parameters */
    fsc_trainer_config cfg = {
        .strategy = {.name = "slowmo",
                     .seed = 5,
                     .localsgd_frequency = atoi(argv[4]),
                     .slowmo_frequency = atoi(argv[5]),
                     .slowmo_momentum = atof(argv[6]),
                     .slowmo_lr = atof(argv[7])},
        .optim = optim,
        .schedule = {.kind = FSC_LR_WARMUP_COSINE,
                     .max_lr = (float)optim.lr,
                     .warmup_steps = 2,
                     .total_steps = steps,
                     .min_lr_ratio = 0.1f},
        .batch = EQ_GLOBAL_BATCH / world,
        .targets_per_sample = EQ_MODEL.seq,
        .loss = gpt_loss,
        .after_backward = copy_grad,
        .user = &grad,
    };
    fsc_trainer *t = m && steps > 0 ? fsc_trainer_new(m, &cfg) : NULL;
    if (!t) {
        fprintf(stderr, "dump: %s\n", fsc_last_error());
        fsc_module_free(m);
        return mpi_test_finish(1);
    }
    fsc_strategy *s = fsc_trainer_strategy(t);
    const fsc_params *ps = fsc_strategy_params(s);
    const int32_t P = (int32_t)ps->numel;
    grad = malloc(sizeof(float) * (size_t)P);
    uint8_t *decay = calloc((size_t)P, 1);
    int nr = 0;
    const fsc_optim_range *r = fsc_strategy_grad_ranges(s, &nr);
    for (int i = 0; i < nr && decay; i++)
        if (r[i].decay) memset(decay + (r[i].param - ps->data), 1, (size_t)r[i].n);
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.bin", argv[2], rank);
    FILE *f = fopen(path, "wb");
    const int32_t hdr[4] = {P, steps, world, rank};
    const double oc[9] = {optim.kind == FSC_OPTIM_SGD ? 0 : 1,
                          optim.lr,
                          optim.momentum,
                          optim.dampening,
                          optim.nesterov,
                          optim.weight_decay,
                          optim.beta1,
                          optim.beta2,
                          optim.eps};
    bool ok = f && grad && decay && put(f, hdr, 4, 4) && put(f, oc, 8, 9) && put(f, decay, 1, P) &&
              put(f, ps->data, 4, P);
    int rc = 0;
    for (int k = 0; k < steps && ok && !rc; k++) {
        fsc_step_result res;
        rc = fsc_trainer_step(t, &res);
        ok = put(f, &res.lr, 8, 1) && put(f, grad, 4, P) && put(f, ps->data, 4, P);
    }
    if (f && fclose(f)) ok = false;
    if (rc) fprintf(stderr, "dump: %s\n", fsc_last_error());
    if (!ok) fprintf(stderr, "dump: cannot write %s\n", path);
    free(grad), free(decay);
    fsc_trainer_free(t);
    fsc_module_free(m);
    fsc_tokens_free(&tk);
    return mpi_test_finish(rc || !ok);
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) return 1;
    rank = fsc_dist_rank(), world = fsc_dist_size();
    eq_tokens(&tk);
    if (argc > 1 && !strcmp(argv[1], "--dump")) return dump(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frequency_one_is_ddp),
        cmocka_unit_test(test_local_sgd_by_hand),
        cmocka_unit_test(test_slow_momentum_by_hand),
        cmocka_unit_test(test_communication_saved),
        cmocka_unit_test(test_refusals),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fsc_tokens_free(&tk);
    return mpi_test_finish(failed);
}
