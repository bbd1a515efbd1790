/* FSDP (ZeRO-3) over 1, 2 and 4 ranks ends with the same parameters as one
 * process on the same global batch: units by auto-wrap, nested units, with
 * and without resharding after forward, both accumulation modes, clipping;
 * issues exactly 2N-1 (or N) all-gathers and N reduce-scatters per step; and
 * keeps params + grads + optimizer state at the shard's size, with gathered
 * buffers of at most the root and two other units at once (allocator; the
 * released ones are kept for the next step, within the same bound). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <inttypes.h>
#include <string.h>

#include "trainer_test.h"
#include "fsc/checkpoint_wrapper.h"
#include "fsc/fsdp.h"
#include "fsdp_test.h"

static int rank, world;

typedef enum { UNITS_BLOCKS = 0, UNITS_NONE, UNITS_NESTED, UNITS_MLPS } unit_plan;

typedef struct {
    unit_plan plan;
    const fsc_optim_config *optim;
    fsc_fsdp_options opt;
    int accum;
    bool no_sync; /* accumulate under no_sync (else reduce-scatter every micro-step) */
    float max_norm;
    bool checkpoint_blocks; /* activation checkpointing on every block */
} fsdp_cfg;

typedef struct {
    int units;
    int64_t gathers_per_step, scatters_per_step, scatters_in_no_sync;
    int64_t buffer_allocs_late; /* FSDP buffers allocated fresh in steps 2.. */
    size_t params, grads, optim, shard_bytes, optim_expected, gathered_peak, gathered_bound,
        gathered_after;
    int64_t numel; /* of the full parameters returned */
} fsdp_out;

/* Units: every block (auto-wrap at a block's size), none, every block and,
 * inside it, its MLP, or the MLPs alone. */
static fsc_module **pick_units(fsc_module *m, unit_plan plan, int *n) {
    const int64_t C = EQ_MODEL.d_model, block = 12 * C * C + 13 * C;
    fsc_module **units = NULL;
    *n = 0;
    if (plan == UNITS_NONE) return NULL;
    assert_int_equal(fsc_fsdp_auto_wrap(m, block, &units, n), FSC_OK);
    assert_int_equal(*n, EQ_MODEL.layers); /* exactly the blocks reach a block's size */
    if (plan == UNITS_NESTED || plan == UNITS_MLPS) {
        units = realloc(units, sizeof *units * (size_t)(2 * *n));
        for (int l = 0; l < EQ_MODEL.layers; l++) {
            fsc_module *blk = units[l], *mlp = NULL;
            for (int c = 0; c < blk->nchildren; c++)
                if (!strcmp(blk->children[c]->name, "mlp")) mlp = blk->children[c];
            assert_non_null(mlp);
            units[*n + l] = mlp;
        }
        *n *= 2;
    }
    if (plan == UNITS_MLPS) memmove(units, units + *n / 2, sizeof *units * (size_t)(*n / 2));
    if (plan == UNITS_MLPS) *n /= 2;
    return units;
}

static float *run_fsdp(const fsdp_cfg *c, fsdp_out *out) {
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    fsc_tokens tk;
    eq_tokens(&tk);
    int nunits;
    fsc_module **units = pick_units(m, c->plan, &nunits);
    const fsc_optim_config *optim = c->optim ? c->optim : &EQ_ADAMW;
    for (int l = 0; c->checkpoint_blocks && l < m->nchildren; l++)
        if (!strncmp(m->children[l]->name, "h.", 2))
            assert_int_equal(fsc_checkpoint_wrap(m->children[l]), FSC_OK);
    fsc_fsdp *f = fsc_fsdp_new(m, fsc_group_world(), 5, units, nunits, optim, &c->opt);
    assert_non_null(f);
    free(units);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    const int accum = c->accum ? c->accum : 1;
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    const eq_batch b = eq_batch_of_rank(&tk, arena, EQ_MODEL.seq, accum, rank, world, x, y);
    fsc_fsdp_stats before = {0};
    int64_t allocs2 = 0; /* step 0 learns the order, step 1 is the first to prefetch */
    for (int s = 0; s < EQ_STEPS; s++) {
        if (s == 2) allocs2 = fsc_fsdp_get_stats(f).buffer_allocs;
        if (s == 1) {
            fsc_mem_reset_peaks();
            before = fsc_fsdp_get_stats(f);
        }
        fsc_fsdp_zero_grad(f);
        for (int k = 0; k < accum; k++) {
            bool quiet = c->no_sync && k < accum - 1;
            fsc_fsdp_set_no_sync(f, quiet);
            int64_t rs0 = fsc_fsdp_get_stats(f).reduce_scatters;
            assert_int_equal(eq_micro(m, &b, s, k), FSC_OK);
            if (quiet && out)
                out->scatters_in_no_sync += fsc_fsdp_get_stats(f).reduce_scatters - rs0;
        }
        if (c->max_norm > 0) {
            float norm;
            assert_int_equal(fsc_fsdp_clip_grad_norm(f, c->max_norm, false, &norm), FSC_OK);
        }
        assert_int_equal(fsc_fsdp_step(f), FSC_OK);
    }
    fsc_fsdp_stats st = fsc_fsdp_get_stats(f);
    if (out) {
        out->units = st.units;
        out->gathers_per_step = (st.allgathers - before.allgathers) / (EQ_STEPS - 1);
        out->scatters_per_step = (st.reduce_scatters - before.reduce_scatters) / (EQ_STEPS - 1);
        out->buffer_allocs_late = st.buffer_allocs - allocs2;
        out->params = fsc_mem_current(FSC_MEM_PARAMS);
        out->grads = fsc_mem_current(FSC_MEM_GRADS);
        out->optim = fsc_mem_current(FSC_MEM_OPTIM);
        out->shard_bytes = (size_t)st.shard_elems * sizeof(float);
        int n;
        const fsc_optim_range *r = fsc_fsdp_ranges(f, &n);
        int64_t owned = 0;
        for (int i = 0; i < n; i++) owned += r[i].n;
        out->optim_expected = (size_t)fsc_optim_state_count(optim) * sizeof(float) * (size_t)owned;
        int64_t root_numel = 0, largest = 0, numel;
        fsc_fsdp_unit_info(f, 0, NULL, &root_numel);
        for (int u = 1; u < st.units; u++) {
            fsc_fsdp_unit_info(f, u, NULL, &numel);
            if (numel > largest) largest = numel;
        }
        /* parameters and gradients of the root and two more units */
        out->gathered_bound = (size_t)(root_numel + 2 * largest) * sizeof(float) * 2;
        out->gathered_peak = fsc_mem_peak(FSC_MEM_GATHERED);
        out->gathered_after = fsc_mem_current(FSC_MEM_GATHERED);
    }
    int64_t numel;
    float *got = fsdp_full_params(f, m, &numel);
    if (out) out->numel = numel;
    fsc_arena_free(arena);
    fsc_fsdp_free(f);
    fsc_tokens_free(&tk);
    fsc_module_free(m);
    return got;
}

static void expect_equal(const char *what, const fsdp_cfg *c, const eq_options *ref_opt) {
    fsdp_out out = {0};
    float *got = run_fsdp(c, &out);
    tt_expect_reference(ref_opt, what, got, out.numel);
}

static void test_blocks_match_one_process(void **state) {
    (void)state;
    expect_equal("fsdp blocks", &(fsdp_cfg){.plan = UNITS_BLOCKS}, NULL);
}

static void test_root_only_matches(void **state) {
    (void)state;
    expect_equal("fsdp root only", &(fsdp_cfg){.plan = UNITS_NONE}, NULL);
}

static void test_nested_matches(void **state) {
    (void)state;
    expect_equal("fsdp nested", &(fsdp_cfg){.plan = UNITS_NESTED}, NULL);
}

/* Checkpointing inside units (a checkpointed block is a unit) and around them
 * (a checkpointed block holds an MLP unit, gathered again for the recompute). */
static void test_activation_checkpointing_matches(void **state) {
    (void)state;
    expect_equal("fsdp checkpointed units",
                 &(fsdp_cfg){.plan = UNITS_BLOCKS, .checkpoint_blocks = true}, NULL);
    expect_equal("fsdp units inside checkpointed blocks",
                 &(fsdp_cfg){.plan = UNITS_MLPS, .checkpoint_blocks = true}, NULL);
}

static void test_keep_after_forward_matches(void **state) {
    (void)state;
    expect_equal("fsdp keep after forward",
                 &(fsdp_cfg){.plan = UNITS_BLOCKS, .opt = {.keep_after_forward = true}}, NULL);
}

static void test_no_prefetch_matches(void **state) {
    (void)state;
    expect_equal("fsdp no prefetch",
                 &(fsdp_cfg){.plan = UNITS_BLOCKS, .opt = {.no_prefetch = true}}, NULL);
}

static void test_accumulation_both_ways(void **state) {
    (void)state;
    if (EQ_GLOBAL_BATCH % (world * 2)) skip();
    expect_equal("fsdp accum (reduce every micro-step)",
                 &(fsdp_cfg){.plan = UNITS_BLOCKS, .accum = 2}, NULL);
    expect_equal("fsdp accum (no_sync)",
                 &(fsdp_cfg){.plan = UNITS_BLOCKS, .accum = 2, .no_sync = true}, NULL);
}

static void test_sgd_momentum_with_clipping(void **state) {
    (void)state;
    expect_equal("fsdp sgd+clip",
                 &(fsdp_cfg){.plan = UNITS_NESTED, .optim = &EQ_SGD_MOMENTUM, .max_norm = 0.5f},
                 &(eq_options){.optim = &EQ_SGD_MOMENTUM, .max_norm = 0.5f});
}

/* 2N-1 all-gathers with resharding (the root is gathered once), N without;
 * N reduce-scatters per step; none under no_sync. */
static void test_collective_counts(void **state) {
    (void)state;
    fsdp_out a = {0}, b = {0}, c = {0};
    free(run_fsdp(&(fsdp_cfg){.plan = UNITS_BLOCKS}, &a));
    assert_int_equal(a.units, EQ_MODEL.layers + 1);
    assert_int_equal(a.gathers_per_step, 2 * a.units - 1);
    assert_int_equal(a.scatters_per_step, a.units);
    free(run_fsdp(&(fsdp_cfg){.plan = UNITS_NESTED, .opt = {.keep_after_forward = true}}, &b));
    assert_int_equal(b.units, 2 * EQ_MODEL.layers + 1);
    assert_int_equal(b.gathers_per_step, b.units);
    assert_int_equal(b.scatters_per_step, b.units);
    if (EQ_GLOBAL_BATCH % (world * 2)) return;
    free(run_fsdp(&(fsdp_cfg){.plan = UNITS_BLOCKS, .accum = 2, .no_sync = true}, &c));
    assert_int_equal(c.scatters_in_no_sync, 0);
    assert_int_equal(c.scatters_per_step, c.units);
}

/* From the third step every gathered, gradient and staging buffer comes
 * from FSDP's caches, in fp32 and bf16: a fresh one would be mapped and
 * page-faulted inside the step (a bf16 medium step did ~100 such faults when
 * the half-precision cache overflowed at a step's end). */
static void test_steady_steps_allocate_nothing(void **state) {
    (void)state;
    const fsc_fsdp_options half = {.compute_dtype = FSC_DTYPE_BF16, .reduce_dtype = FSC_DTYPE_BF16};
    const fsdp_cfg cfgs[] = {{.plan = UNITS_BLOCKS},
                             {.plan = UNITS_BLOCKS, .opt = half},
                             {.plan = UNITS_NESTED, .opt = half}};
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
        fsdp_out o = {0};
        free(run_fsdp(&cfgs[i], &o));
        if (o.buffer_allocs_late)
            fprintf(stderr, "rank %d, config %zu: %" PRId64 " fresh buffers in steps 2-%d\n", rank,
                    i, o.buffer_allocs_late, EQ_STEPS - 1);
        assert_int_equal(o.buffer_allocs_late, 0);
    }
}

/* Params, grads and optimizer state are the shard's, exactly; gathered
 * buffers stay within the root and two more units (parameters and
 * gradients), in use or cached for the next step. */
static void test_memory_is_the_shard(void **state) {
    (void)state;
    size_t p0 = fsc_mem_current(FSC_MEM_PARAMS), g0 = fsc_mem_current(FSC_MEM_GRADS),
           o0 = fsc_mem_current(FSC_MEM_OPTIM);
    fsdp_out o = {0};
    free(run_fsdp(&(fsdp_cfg){.plan = UNITS_BLOCKS}, &o));
    fprintf(stderr,
            "rank %d/%d: params %zu grads %zu optim %zu (shard %zu B, optim expected %zu); "
            "gathered peak %zu <= %zu\n",
            rank, world, o.params - p0, o.grads - g0, o.optim - o0, o.shard_bytes, o.optim_expected,
            o.gathered_peak, o.gathered_bound);
    assert_int_equal(o.params - p0, o.shard_bytes);
    assert_int_equal(o.grads - g0, o.shard_bytes);
    assert_int_equal(o.optim - o0, o.optim_expected);
    assert_true(o.gathered_peak <= o.gathered_bound);
    assert_true(o.gathered_after <= o.gathered_peak); /* released buffers kept for reuse */
    /* the shard is the model's 1/world share plus padding below one 16-float
     * alignment per unit and parameter */
    fsc_params whole;
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    assert_int_equal(fsc_params_collect(m, &whole), FSC_OK);
    int64_t total = 0;
    for (int e = 0; e < whole.count; e++) total += whole.entries[e].param->numel;
    size_t share = (size_t)(total + world - 1) / (size_t)world * sizeof(float);
    size_t slack = (size_t)(whole.count + o.units) * 16 * sizeof(float);
    assert_true(o.shard_bytes >= share && o.shard_bytes <= share + slack);
    free(whole.entries);
    fsc_module_free(m);
}

/* Shards start as the slices of what fsc_params_bind initialises. */
static void test_initial_values_match_bind(void **state) {
    (void)state;
    fsc_module *a = fsc_gpt_new(&EQ_MODEL), *b = fsc_gpt_new(&EQ_MODEL);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(a, 5, false, &ps), FSC_OK);
    int n;
    fsc_module **units = pick_units(b, UNITS_NESTED, &n);
    fsc_fsdp *f = fsc_fsdp_new(b, fsc_group_world(), 5, units, n, &EQ_ADAMW, NULL);
    assert_non_null(f);
    free(units);
    int64_t numel;
    float *full = fsdp_full_params(f, b, &numel);
    assert_int_equal(numel, ps.numel);
    assert_memory_equal(full, ps.data, sizeof(float) * (size_t)ps.numel);
    /* between steps the model's views point nowhere */
    fsc_params views;
    assert_int_equal(fsc_params_collect(b, &views), FSC_OK);
    for (int e = 0; e < views.count; e++) assert_null(views.entries[e].param->data);
    free(views.entries);
    /* summoned parameters written back persist */
    assert_int_equal(fsc_fsdp_summon_full_params(f), FSC_OK);
    fsc_params_collect(b, &views);
    views.entries[0].param->data[3] = 42.f;
    assert_int_equal(fsc_fsdp_release_full_params(f, true), FSC_OK);
    float *again = fsdp_full_params(f, b, &numel);
    assert_float_equal(again[views.entries[0].offset + 3], 42.f, 0);
    free(views.entries);
    free(full), free(again);
    fsc_fsdp_free(f);
    fsc_params_free(&ps);
    fsc_module_free(a), fsc_module_free(b);
}

static void test_bad_configurations_refused(void **state) {
    (void)state;
    fsc_module *m = fsc_gpt_new(&EQ_MODEL), *other = fsc_gpt_new(&EQ_MODEL);
    fsc_module *stranger[] = {other->children[3]};
    assert_null(fsc_fsdp_new(m, fsc_group_world(), 5, stranger, 1, &EQ_ADAMW, NULL));
    assert_non_null(strstr(fsc_last_error(), "not a submodule"));
    fsc_module *twice[] = {m->children[3], m->children[3]};
    assert_null(fsc_fsdp_new(m, fsc_group_world(), 5, twice, 2, &EQ_ADAMW, NULL));
    assert_non_null(strstr(fsc_last_error(), "twice"));
    fsc_module *root[] = {m};
    assert_null(fsc_fsdp_new(m, fsc_group_world(), 5, root, 1, &EQ_ADAMW, NULL));
    assert_non_null(strstr(fsc_last_error(), "root"));
    assert_null(fsc_fsdp_new(m, fsc_group_world(), 5, NULL, 0, &EQ_ADAMW,
                             &(fsc_fsdp_options){.compute_dtype = FSC_DTYPE_I32}));
    assert_non_null(strstr(fsc_last_error(), "compute dtype"));
    fsc_module **units;
    int n;
    assert_int_not_equal(fsc_fsdp_auto_wrap(m, 0, &units, &n), FSC_OK);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, true, &ps), FSC_OK);
    assert_null(fsc_fsdp_new(m, fsc_group_world(), 5, NULL, 0, &EQ_ADAMW, NULL));
    assert_non_null(strstr(fsc_last_error(), "bound already"));
    fsc_params_free(&ps);
    fsc_module_free(m), fsc_module_free(other);
}

MPI_EQ_MAIN(cmocka_unit_test(test_blocks_match_one_process),
            cmocka_unit_test(test_root_only_matches), cmocka_unit_test(test_nested_matches),
            cmocka_unit_test(test_keep_after_forward_matches),
            cmocka_unit_test(test_activation_checkpointing_matches),
            cmocka_unit_test(test_no_prefetch_matches),
            cmocka_unit_test(test_accumulation_both_ways),
            cmocka_unit_test(test_sgd_momentum_with_clipping),
            cmocka_unit_test(test_collective_counts), cmocka_unit_test(test_memory_is_the_shard),
            cmocka_unit_test(test_steady_steps_allocate_nothing),
            cmocka_unit_test(test_initial_values_match_bind),
            cmocka_unit_test(test_bad_configurations_refused))
