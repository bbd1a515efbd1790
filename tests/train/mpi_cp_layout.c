/* Context parallelism through the trainer on a layout (fsc/layout.h's
 * layout.cp, fsc-train's --cp): the tiny GPT of equivalence.h, 5 AdamW
 * steps, 2 micro-batches per replica, against one process:
 *  - --cp 2 under ddp, oss, sdp and fsdp (2 ranks: cp 2; 4 ranks: cp 2 x dp
 *    2, gradients over dp x cp, fsdp's shards over all four), and --cp 2
 *    --tp 2 under ddp and fsdp (4 ranks): the per-step losses within the loss noise
 *    of one process's legal orders, the parameters within equivalence.h's
 *    bounds (the TP order in the floor);
 *  - checkpoints are layout-free: 2 steps under --cp 2 resumed in one
 *    process for the other 3, and 2 steps in one process resumed under
 *    --cp 2, end as the uninterrupted run does;
 *  - a layout that asks for cp the mesh lacks, and cp with sequence
 *    parallelism, are refused by name (cp with a pipeline: mpi_cp_pipe). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
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
    (void)user;
    return fsc_tokens_batch(&tokens, mb->step, mb->micro, mb->rank, mb->batch, mb->micros,
                            mb->world, EQ_MODEL.seq, x, y);
}

typedef struct {
    const char *strategy;
    int cp, tp, micros;
    int steps;          /* train up to this step (0: EQ_STEPS) */
    const char *resume; /* a checkpoint directory to resume from first */
    const char *ckpt;   /* save a checkpoint here after `steps` */
} layout_run;

/* Trains r's layout over the world (single: this process); losses[s] each
 * step's; returns the final parameters in the one-process flat layout. */
static float *train(const layout_run *r, double *losses, int64_t *numel) {
    const bool single = !strcmp(r->strategy, "single");
    const int cp = r->cp > 1 ? r->cp : 1, tp = r->tp > 1 ? r->tp : 1;
    const int micros = r->micros ? r->micros : 2, dp = single ? 1 : world / (cp * tp);
    fsc_mesh *mesh = NULL;
    if (!single)
        assert_int_equal(fsc_mesh_new_over(NULL, (fsc_mesh_shape){.tp = tp, .cp = cp}, &mesh),
                         FSC_OK);
    fsc_gpt_layout l = {.strategy = r->strategy,
                        .tp = tp,
                        .cp = cp,
                        .batch = EQ_GLOBAL_BATCH / (dp * micros),
                        .micro_batches = micros,
                        .seed = 5};
    fsc_gpt_plan *plan = NULL;
    if (fsc_gpt_plan_new(&EQ_MODEL, &l, mesh, &plan))
        fail_msg("rank %d: plan: %s", rank, fsc_last_error());
    char path[128];
    snprintf(path, sizeof path, "%s/%s-cp%d-tp%d-%d.safetensors", dir, r->strategy, cp, tp,
             single ? rank : -1);
    plan_train(
        plan, mesh, batch_fn, NULL,
        &(plan_run){.resume = r->resume, .steps = r->steps, .ckpt = r->ckpt, .weights = path},
        losses, rank);
    if (!single) fsc_group_barrier(fsc_group_world()); /* rank 0's file is complete */
    float *out = eq_read_weights(&EQ_MODEL, path, numel);
    if (!out) fail_msg("rank %d: %s: %s", rank, path, fsc_last_error());
    return out;
}

/* One process: parameters (eq_noise set from the legal orders, the TP
 * order of `tp` among them), losses and their noise over 1, 2, 4
 * micro-batches. */
static float *reference(int tp, double *losses, double *loss_noise, int64_t *numel) {
    const fsc_fault fault = fsc_fault_active;
    fsc_fault_active = FSC_FAULT_NONE;
    float *ref = eq_reference_ex(&(eq_options){.tp = {tp}}, numel);
    double alt[3][EQ_STEPS];
    int64_t n;
    for (int a = 0; a < 3; a++)
        free(train(&(layout_run){.strategy = "single", .micros = 1 << a}, alt[a], &n));
    plan_loss_noise(alt, losses, loss_noise);
    fsc_fault_active = fault;
    return ref;
}

/* The layouts checked, one test each (FSC_TEST_ROW): --cp 2 under each
 * strategy, and with --tp 2 on 4 ranks (fsdp over TP replicas is a pipeline
 * of one stage, strategy_pipe.c: its replicas are the mesh's dp x cp ranks). */
static layout_run layouts[] = {
    {.strategy = "ddp", .cp = 2},          {.strategy = "oss", .cp = 2},
    {.strategy = "sdp", .cp = 2},          {.strategy = "fsdp", .cp = 2},
    {.strategy = "ddp", .cp = 2, .tp = 2}, {.strategy = "fsdp", .cp = 2, .tp = 2},
};

static void test_layout(void **state) {
    const layout_run *r = *state;
    const int tp = r->tp > 1 ? r->tp : 1;
    if (world % (2 * tp) || (tp > 1 && world != 4)) skip();
    double ref_losses[EQ_STEPS], losses[EQ_STEPS], noise;
    int64_t n, n2;
    float *ref = reference(tp, ref_losses, &noise, &n);
    float *got = train(r, losses, &n2);
    assert_int_equal(n, n2);
    char what[96];
    snprintf(what, sizeof what, "%s --cp 2 --tp %d on %d ranks", r->strategy, tp, world);
    plan_expect(what, got, losses, ref, ref_losses, noise, n);
    free(ref), free(got);
}

/* --cp 2 for 2 steps, one process for the rest; and the other way round. */
static void test_resume(void **state) {
    (void)state;
    if (world % 2) skip();
    double ref_losses[EQ_STEPS], noise, losses[EQ_STEPS];
    int64_t n, n2;
    float *ref = reference(1, ref_losses, &noise, &n);
    char a[96], b[96];
    snprintf(a, sizeof a, "%s/ckpt-cp", dir);
    snprintf(b, sizeof b, "%s/ckpt-single-%d", dir, rank);
    free(train(&(layout_run){.strategy = "fsdp", .cp = 2, .steps = 2, .ckpt = a}, losses, &n2));
    float *got = train(&(layout_run){.strategy = "single", .resume = a}, losses, &n2);
    plan_expect("fsdp --cp 2 for 2 steps, then one process", got, losses, ref, ref_losses, noise,
                n);
    free(got);
    free(train(&(layout_run){.strategy = "single", .steps = 2, .ckpt = b}, losses, &n2));
    /* every rank resumes from rank 0's directory: the same bytes as its own */
    snprintf(b, sizeof b, "%s/ckpt-single-0", dir);
    got = train(&(layout_run){.strategy = "ddp", .cp = 2, .resume = b}, losses, &n2);
    plan_expect("one process for 2 steps, then ddp --cp 2", got, losses, ref, ref_losses, noise, n);
    free(got), free(ref);
}

static void test_refusals(void **state) {
    (void)state;
    fsc_gpt_plan *plan = NULL;
    fsc_mesh *mesh = NULL;
    assert_int_equal(fsc_mesh_new_over(NULL, (fsc_mesh_shape){0}, &mesh), FSC_OK);
    fsc_gpt_layout l = {.strategy = "ddp", .cp = 2, .batch = 1};
    assert_int_equal(fsc_gpt_plan_new(&EQ_MODEL, &l, mesh, &plan), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "the layout asks for cp 2 but the mesh has cp 1"));
    fsc_mesh_free(mesh);
    if (world % 4) return;
    assert_int_equal(fsc_mesh_new_over(NULL, (fsc_mesh_shape){.tp = 2, .cp = 2}, &mesh), FSC_OK);
    l.tp = 2, l.sequence_parallel = true;
    assert_int_equal(fsc_gpt_plan_new(&EQ_MODEL, &l, mesh, &plan), FSC_ERR_UNSUPPORTED);
    assert_non_null(
        strstr(fsc_last_error(), "does not run with sequence parallelism (--sequence-parallel)"));
    fsc_mesh_free(mesh);
}

MPI_TEST_MAIN_WITH((eq_fault_from_env(), eq_tokens(&tokens)),
                   mpi_run_tests_in_scratch(tests, "fsc_cp_layout", dir), fsc_tokens_free(&tokens),
                   FSC_TEST_ROW("ddp --cp 2", test_layout, &layouts[0]),
                   FSC_TEST_ROW("oss --cp 2", test_layout, &layouts[1]),
                   FSC_TEST_ROW("sdp --cp 2", test_layout, &layouts[2]),
                   FSC_TEST_ROW("fsdp --cp 2", test_layout, &layouts[3]),
                   FSC_TEST_ROW("ddp --cp 2 --tp 2", test_layout, &layouts[4]),
                   FSC_TEST_ROW("fsdp --cp 2 --tp 2", test_layout, &layouts[5]),
                   cmocka_unit_test(test_resume), cmocka_unit_test(test_refusals))
