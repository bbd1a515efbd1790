/* Hybrid sharding (the hsdp row) over 1, 2 and 4 ranks ends with the same
 * parameters, and takes the same gradient norm every step, as one process on
 * the same global batch, for every shard group size that divides the world
 * (on 4 ranks: 2 groups of 2, the hybrid case; 4 replicas of 1; one group of
 * 4); its checkpoints resume under fsdp and one process and a one-process
 * checkpoint resumes under it; a step crosses groups in exactly one
 * all-reduce of this rank's shard; bad sizes are refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <inttypes.h>
#include <string.h>

#include "train/strategy_internal.h"
#include "trainer_test.h"

static int rank, world;
static char dir[64];

static void path(char *buf, const char *name) {
    snprintf(buf, 128, "%s/%s", dir, name);
}

/* Trains c on the world (or alone, for single: each rank its own file),
 * writes c->out and returns the weights read back once every rank has
 * written. */
static float *train(const tt_run *c, int64_t *numel) {
    tt_data *d = tt_data_new();
    fsc_module *model;
    fsc_trainer *t = tt_trainer_new(c, d, &model);
    tt_train(t, c);
    tt_save_and_free(t, model, c->out);
    fsc_group_barrier(tt_ranks(c));
    float *out = tt_read_weights(&EQ_MODEL, c->out, numel);
    tt_data_free(d);
    if (strcmp(c->strategy, "single")) /* read before the next run writes it */
        fsc_group_barrier(fsc_group_world());
    return out;
}

/* With clipping below every step's norm: a shard left unreduced across
 * groups (or counted twice) moves the norm far more than summation order. */
static void test_matches_one_process(void **state) {
    (void)state;
    const float clip = 0.25f;
    double ref[EQ_STEPS], got[EQ_STEPS];
    char mine[128], out[128], what[96];
    snprintf(mine, sizeof mine, "%s/single-%d.safetensors", dir, rank);
    free(train(&(tt_run){.strategy = "single", .clip = clip, .out = mine, .norms = ref},
               &(int64_t){0}));
    path(out, "hsdp.safetensors");
    for (int N = 1; N <= world; N *= 2) {
        if (world % N) continue;
        int64_t n;
        float *w = train(
            &(tt_run){.strategy = "hsdp", .shard_group = N, .clip = clip, .out = out, .norms = got},
            &n);
        snprintf(what, sizeof what, "hsdp, %d group(s) of %d, clip %.2f", world / N, N,
                 (double)clip);
        tt_expect_reference(&(eq_options){.max_norm = clip}, what, w, n);
        if (fsc_fault_active == FSC_FAULT_NONE) tt_expect_norms(what, got, ref, clip);
    }
}

/* Collective bytes this rank hands to each group per step, steady state:
 * hsdp's replica group carries exactly one all-reduce of the shard; fsdp
 * over the world moves every gather and reduce-scatter over all ranks. */
static void test_bytes_across_groups(void **state) {
    (void)state;
    if (world != 4 || fsc_fault_active != FSC_FAULT_NONE) skip();
    const char *rows[] = {"hsdp", "fsdp"};
    int64_t per_step[2][2] = {{0}}; /* the world, the replica group */
    for (int i = 0; i < 2; i++) {
        tt_data *d = tt_data_new();
        fsc_module *model;
        const tt_run c = {.strategy = rows[i], .shard_group = i == 0 ? 2 : 0, .steps = 1};
        fsc_trainer *t = tt_trainer_new(&c, d, &model);
        tt_train(t, &c); /* the first step learns FSDP's order */
        fsc_strategy *s = fsc_trainer_strategy(t);
        fsc_group *groups[2] = {fsc_group_world(), strategy_hsdp_replica(s)};
        for (int g = 0; g < 2; g++) fsc_group_reset_stats(groups[g]);
        const tt_run rest = {.strategy = rows[i], .steps = EQ_STEPS};
        tt_train(t, &rest);
        for (int g = 0; g < 2; g++)
            per_step[i][g] = fsc_group_get_stats(groups[g]).bytes / (EQ_STEPS - 1);
        if (i == 0) { /* one all-reduce of this rank's shard, in fp32 */
            int nr;
            const fsc_optim_range *r = fsc_strategy_grad_ranges(s, &nr);
            int64_t owned = 0;
            for (int k = 0; k < nr; k++) owned += r[k].n;
            assert_int_equal(per_step[0][1], owned * (int64_t)sizeof(float));
            assert_int_equal(fsc_group_get_stats(groups[1]).count[FSC_COLL_ALLREDUCE],
                             EQ_STEPS - 1);
            fsc_strategy_memory mp = fsc_strategy_memory_plan(s);
            assert_int_equal(mp.params_shards, 2);
        }
        fsc_trainer_free(t);
        fsc_module_free(model);
        tt_data_free(d);
    }
    if (rank == 0)
        print_message("bytes per rank and step crossing groups: hsdp 2 x 2 %" PRId64
                      " (replica all-reduce; %" PRId64
                      " on the world: the loss), fsdp over 4 %" PRId64 "\n",
                      per_step[0][1], per_step[0][0], per_step[1][0]);
    assert_true(per_step[0][1] < per_step[1][0]);
}

/* A checkpoint hsdp wrote resumes under fsdp on the world and under one
 * process; one process's resumes under hsdp: each ends as the
 * uninterrupted run. */
static void test_resume_layout_free(void **state) {
    (void)state;
    if (world < 2 || fsc_fault_active != FSC_FAULT_NONE) skip();
    const int N = world / 2;
    char ckpt[128], out[128], mine[128], what[96];
    path(ckpt, "ckpt-hsdp");
    path(out, "resume.safetensors");
    int64_t n;
    free(train(
        &(tt_run){.strategy = "hsdp", .shard_group = N, .save_at = 2, .ckpt = ckpt, .out = out},
        &n));
    float *w = train(&(tt_run){.strategy = "fsdp", .resume = ckpt, .out = out}, &n);
    snprintf(what, sizeof what, "hsdp (%d x %d) -> checkpoint -> fsdp on %d", world / N, N, world);
    tt_expect_reference(NULL, what, w, n);
    snprintf(mine, sizeof mine, "%s/resumed-%d.safetensors", dir, rank);
    w = train(&(tt_run){.strategy = "single", .resume = ckpt, .out = mine}, &n);
    snprintf(what, sizeof what, "hsdp (%d x %d) -> checkpoint -> one process", world / N, N);
    tt_expect_reference(NULL, what, w, n);
    char ckpt1[128];
    path(ckpt1, "ckpt-single");
    snprintf(mine, sizeof mine, "%s/single-save-%d.safetensors", dir, rank);
    if (rank == 0)
        free(train(&(tt_run){.strategy = "single", .save_at = 3, .ckpt = ckpt1, .out = mine}, &n));
    fsc_group_barrier(fsc_group_world());
    w = train(&(tt_run){.strategy = "hsdp", .shard_group = N, .resume = ckpt1, .out = out}, &n);
    snprintf(what, sizeof what, "one process -> checkpoint -> hsdp (%d x %d)", world / N, N);
    tt_expect_reference(NULL, what, w, n);
}

static void expect_refused(const fsc_strategy_options *o, const char *what) {
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_strategy *s = fsc_strategy_new(m, &EQ_ADAMW, o);
    if (s || !strstr(fsc_last_error(), what))
        fail_msg("expected a refusal mentioning \"%s\", got %s%s", what, s ? "a strategy" : "",
                 fsc_last_error());
    fsc_module_free(m);
}

static void test_bad_sizes_refused(void **state) {
    (void)state;
    expect_refused(&(fsc_strategy_options){.name = "hsdp"}, "shard_group 0 must be >= 1");
    expect_refused(&(fsc_strategy_options){.name = "hsdp", .shard_group = 3 * world},
                   "divide the data-parallel group");
    expect_refused(&(fsc_strategy_options){.name = "fsdp", .shard_group = 1},
                   "option shard_group applies to hsdp only, not to fsdp");
    assert_true(fsc_strategy_takes("hsdp", "shard_group"));
    assert_true(fsc_strategy_takes("hsdp", "min_params")); /* fsdp's options, within a group */
    assert_false(fsc_strategy_takes("ddp", "shard_group"));
}

TT_MAIN("fsc_hsdp", dir, cmocka_unit_test(test_matches_one_process),
        cmocka_unit_test(test_bytes_across_groups), cmocka_unit_test(test_resume_layout_free),
        cmocka_unit_test(test_bad_sizes_refused))
