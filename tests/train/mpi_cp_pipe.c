/* Context parallelism composed with a pipeline (fsc/layout.h's layout.cp
 * with layout.pp, fsc-train's --cp 2 --pp 2) through the trainer, on 4
 * ranks: each pipeline stage's two ranks form the stage's cp ring (the
 * mesh's cp group), stage 0 embeds this rank's T/2 positions at their
 * global positions, activations between stages carry those positions
 * only, the last stage's loss is normalised by the global target count,
 * and each stage's gradients are summed over its dp x cp ranks. Against
 * one process on the same global batch (5 AdamW steps of equivalence.h's
 * tiny GPT-2, dropout on, and of a grouped-query LLaMA whose rotary angles
 * are taken at global positions):
 *  - the per-step losses within the loss noise of one process's legal
 *    orders and the parameters within equivalence.h's bounds, under
 *    gpipe, 1f1b, interleaved (2 chunks per rank) and zbh1, replicated
 *    (ddp) and sharded (fsdp) between the cp ranks, and with --balance
 *    auto (its probe times each layer on this rank's positions through
 *    the ring, every cp rank together);
 *  - checkpoints are layout-free: 2 steps under cp 2 x pp 2 resumed in one
 *    process for the other 3, and 2 steps in one process resumed under cp
 *    2 x pp 2, end as the uninterrupted run does.
 * At 1 and 2 ranks there is no such mesh and every test skips. The fault
 * tests fault_cp_pipe_* in tests/CMakeLists.txt rerun this program with
 * the replicas' reduction dropped (drop-grad) and with a visiting key block
 * skipped in every ring (cp-skip-block): every comparison must catch them
 * (the losses are then not compared: they diverge by design). */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "plan_test.h"
#include "fsc/layout.h"
#include "fsc/trainer.h"
#include "mpi_test.h"
#include "test_main.h"

static int rank, world;
static char dir[64];
static fsc_tokens tokens;

static int batch_fn(const fsc_micro_batch *mb, void *user, int32_t *x, int32_t *y) {
    const fsc_gpt_config *m = user;
    return fsc_tokens_batch(&tokens, mb->step, mb->micro, mb->rank, mb->batch, mb->micros,
                            mb->world, m->seq, x, y);
}

typedef struct {
    const fsc_gpt_config *model; /* NULL: EQ_MODEL */
    const char *strategy;        /* "single": one process, no mesh */
    const char *schedule;        /* NULL: 1f1b */
    const char *balance;         /* NULL: even */
    int micros;                  /* 0: 2 */
    int steps;                   /* train up to this step (0: EQ_STEPS) */
    const char *resume;          /* a checkpoint directory to resume from first */
    const char *ckpt;            /* save a checkpoint here after `steps` */
} run;

/* Trains r over the world as cp 2 x pp 2 (single: this process alone);
 * losses[s] each step's; returns the final parameters in the one-process
 * flat layout. */
static float *train(const run *r, double *losses, int64_t *numel) {
    const fsc_gpt_config *model = r->model ? r->model : &EQ_MODEL;
    const bool single = !strcmp(r->strategy, "single");
    const int micros = r->micros ? r->micros : 2, cp = single ? 1 : 2, pp = single ? 1 : 2;
    fsc_mesh *mesh = NULL;
    if (!single)
        assert_int_equal(fsc_mesh_new_over(NULL, (fsc_mesh_shape){.pp = pp, .cp = cp}, &mesh),
                         FSC_OK);
    fsc_gpt_layout l = {.strategy = r->strategy,
                        .pp = pp,
                        .cp = cp,
                        .pipe_schedule = r->schedule,
                        .balance = r->balance,
                        .batch = EQ_GLOBAL_BATCH / micros, /* one replica */
                        .micro_batches = micros,
                        .seed = 5};
    fsc_gpt_plan *plan = NULL;
    if (fsc_gpt_plan_new(model, &l, mesh, &plan))
        fail_msg("rank %d: plan: %s", rank, fsc_last_error());
    char path[160];
    snprintf(path, sizeof path, "%s/%s-%s-%d.safetensors", dir, r->strategy,
             r->schedule ? r->schedule : "1f1b", single ? rank : -1);
    plan_train(
        plan, mesh, batch_fn, (void *)model,
        &(plan_run){.resume = r->resume, .steps = r->steps, .ckpt = r->ckpt, .weights = path},
        losses, rank);
    if (!single) fsc_group_barrier(fsc_group_world()); /* rank 0's file is complete */
    float *out = eq_read_weights(model, path, numel);
    if (!out) fail_msg("rank %d: %s: %s", rank, path, fsc_last_error());
    return out;
}

/* One process: parameters (eq_noise set from the legal orders), losses and
 * their noise over 1, 2 and 4 micro-batches. */
static float *reference(const fsc_gpt_config *model, double *losses, double *loss_noise,
                        int64_t *numel) {
    const fsc_fault fault = fsc_fault_active;
    fsc_fault_active = FSC_FAULT_NONE;
    float *ref = eq_reference_ex(&(eq_options){.model = model}, numel);
    double alt[3][EQ_STEPS];
    int64_t n;
    for (int a = 0; a < 3; a++)
        free(train(&(run){.model = model, .strategy = "single", .micros = 1 << a}, alt[a], &n));
    plan_loss_noise(alt, losses, loss_noise);
    fsc_fault_active = fault;
    return ref;
}

static void check(const run *r) {
    if (world != 4) skip();
    const fsc_gpt_config *model = r->model ? r->model : &EQ_MODEL;
    double ref_losses[EQ_STEPS], losses[EQ_STEPS], noise;
    int64_t n, n2;
    float *ref = reference(model, ref_losses, &noise, &n);
    float *got = train(r, losses, &n2);
    assert_int_equal(n, n2);
    char what[160];
    snprintf(what, sizeof what, "%s %s --cp 2 --pp 2 --pipe-schedule %s%s%s",
             model->arch == FSC_ARCH_LLAMA ? "llama" : "gpt2", r->strategy,
             r->schedule ? r->schedule : "1f1b", r->balance ? " --balance " : "",
             r->balance ? r->balance : "");
    plan_expect(what, got, losses, ref, ref_losses, noise, n);
    free(ref), free(got);
}

/* The layouts checked, one test each (FSC_TEST_ROW). */
static run layouts[] = {
    {.strategy = "ddp", .schedule = "gpipe"},
    {.strategy = "ddp", .schedule = "1f1b", .micros = 4},
    {.strategy = "fsdp", .schedule = "interleaved"},
    {.strategy = "oss", .schedule = "zbh1"},
    {.strategy = "ddp", .balance = "auto"},
    {.model = &EQ_LLAMA, .strategy = "ddp", .schedule = "1f1b"},
    {.model = &EQ_LLAMA, .strategy = "sdp", .schedule = "interleaved"},
};

static void test_layout(void **state) {
    check(*state);
}

/* cp 2 x pp 2 for 2 steps, one process for the rest; and the other way round. */
static void test_resume(void **state) {
    (void)state;
    if (world != 4) skip();
    double ref_losses[EQ_STEPS], noise, losses[EQ_STEPS];
    int64_t n, n2;
    float *ref = reference(&EQ_MODEL, ref_losses, &noise, &n);
    char a[96], b[96];
    snprintf(a, sizeof a, "%s/ckpt-cp-pp", dir);
    snprintf(b, sizeof b, "%s/ckpt-single-%d", dir, rank);
    free(train(&(run){.strategy = "fsdp", .steps = 2, .ckpt = a}, losses, &n2));
    float *got = train(&(run){.strategy = "single", .resume = a}, losses, &n2);
    plan_expect("fsdp --cp 2 --pp 2 for 2 steps, then one process", got, losses, ref, ref_losses,
                noise, n);
    free(got);
    free(train(&(run){.strategy = "single", .steps = 2, .ckpt = b}, losses, &n2));
    /* every rank resumes from rank 0's directory: the same bytes as its own */
    snprintf(b, sizeof b, "%s/ckpt-single-0", dir);
    got = train(&(run){.strategy = "ddp", .resume = b}, losses, &n2);
    plan_expect("one process for 2 steps, then ddp --cp 2 --pp 2", got, losses, ref, ref_losses,
                noise, n);
    free(got), free(ref);
}

MPI_TEST_MAIN_WITH((eq_fault_from_env(), eq_tokens(&tokens)),
                   mpi_run_tests_in_scratch(tests, "fsc_cp_pipe", dir), fsc_tokens_free(&tokens),
                   FSC_TEST_ROW("gpt2 ddp gpipe", test_layout, &layouts[0]),
                   FSC_TEST_ROW("gpt2 ddp 1f1b, 4 micro-batches", test_layout, &layouts[1]),
                   FSC_TEST_ROW("gpt2 fsdp interleaved", test_layout, &layouts[2]),
                   FSC_TEST_ROW("gpt2 oss zbh1", test_layout, &layouts[3]),
                   FSC_TEST_ROW("gpt2 ddp --balance auto", test_layout, &layouts[4]),
                   FSC_TEST_ROW("llama ddp 1f1b", test_layout, &layouts[5]),
                   FSC_TEST_ROW("llama sdp interleaved", test_layout, &layouts[6]),
                   cmocka_unit_test(test_resume))
