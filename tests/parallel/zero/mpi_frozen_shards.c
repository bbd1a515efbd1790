/* Frozen parameters under ZeRO (ShardedDDP with OSS) and FSDP on 1, 2 and 4
 * ranks: the bytes reduced per step, the gradient bytes and the optimizer
 * state a rank holds follow the trainable parameters alone (a GPT with its
 * MLPs and token embedding frozen, and one with LoRA adapters on c_attn), and
 * the run still ends with one process's parameters. FSDP's shard files carry
 * the frozen region as a unit of its own: they load back and consolidate
 * offline to the full weights.
 *
 * Bounds are exact sums of the trainable tensors' spans where the layout
 * makes them exact (ShardedDDP's reductions), else the trainable elements
 * plus the alignment each tensor and unit may add (16 floats, per rank for a
 * unit's shard); the whole model is 3x (freeze) to 25x (LoRA) larger, so a
 * layout that reduces or keeps gradients for frozen tensors fails them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "trainer_test.h"
#include "fsc/flat_shards.h"
#include "fsc/fsdp.h"
#include "fsdp_test.h"
#include "fsc/zero.h"
#include "zero_test.h"

static int rank, world;
static char scratch[64];

static const char *const FREEZE[] = {"h.*.mlp.*", "wte.*"};
static const char *const TARGETS[] = {"c_attn"};
static const fsc_lora_config LORA = {.rank = 4, .alpha = 8, .targets = TARGETS, .ntargets = 1};

typedef enum { FROZEN_GLOBS, FROZEN_LORA } frozen_kind;

static eq_options reference_of(frozen_kind k) {
    return k == FROZEN_LORA ? (eq_options){.lora = &LORA}
                            : (eq_options){.freeze = FREEZE, .nfreeze = 2};
}

static fsc_module *model_of(frozen_kind k) {
    fsc_module *m = fsc_gpt_new(&EQ_MODEL);
    assert_non_null(m);
    if (k == FROZEN_LORA)
        assert_int_equal(fsc_lora_apply(m, &LORA, NULL), FSC_OK);
    else
        assert_int_equal(fsc_module_freeze(m, FREEZE, 2, true, NULL), FSC_OK);
    return m;
}

/* Trainable elements, trainable tensors and all elements of m. */
typedef struct {
    int64_t elems, tensors, total;
} trainable;

static trainable count_trainable(fsc_module *m) {
    fsc_params ps;
    assert_int_equal(fsc_params_collect(m, &ps), FSC_OK);
    trainable t = {0};
    for (int e = 0; e < ps.count; e++) {
        const fsc_param *p = ps.entries[e].param;
        t.total += p->numel;
        if (!p->frozen) t.elems += p->numel, t.tensors++;
    }
    free(ps.entries);
    return t;
}

static int64_t sum_over_ranks(int64_t v) {
    assert_int_equal(fsc_group_allreduce(fsc_group_world(), &v, 1, FSC_DTYPE_I64, FSC_REDUCE_SUM),
                     FSC_OK);
    return v;
}

static int64_t owned_state(const fsc_optim_range *r, int n) {
    int64_t owned = 0;
    for (int i = 0; i < n; i++) owned += r[i].n;
    return owned;
}

/* ---- ShardedDDP ---------------------------------------------------------------------- */

static void sdp_case(frozen_kind k, fsc_partition_policy policy, const char *what) {
    fsc_module *m = model_of(k);
    const trainable t = count_trainable(m);
    const size_t g0 = fsc_mem_current(FSC_MEM_GRADS), o0 = fsc_mem_current(FSC_MEM_OPTIM);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, true, &ps), FSC_OK);
    fsc_oss *oss =
        fsc_oss_new(&EQ_ADAMW, &ps, fsc_group_world(), &(fsc_oss_options){.policy = policy});
    assert_non_null(oss);
    fsc_module *sdp = fsc_sdp_wrap(m, &ps, oss, NULL);
    assert_non_null(sdp);
    /* a trainable tensor's span (with its padding) is reduced once per step */
    int64_t spans = 0, frozen_pad = 0;
    for (int e = 0; e < ps.count; e++) {
        int64_t hi = e + 1 < ps.count ? ps.entries[e + 1].offset : ps.numel;
        if (!ps.entries[e].param->frozen)
            spans += hi - ps.entries[e].offset;
        else
            frozen_pad += hi - ps.entries[e].offset - ps.entries[e].param->numel;
    }
    fsc_tokens tk;
    eq_tokens(&tk);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    const eq_batch b = eq_batch_of_rank(&tk, arena, EQ_MODEL.seq, 1, rank, world, x, y);
    int64_t reduced = 0, held = 0;
    for (int s = 0; s < EQ_STEPS; s++) {
        fsc_sdp_zero_grad(sdp);
        const int64_t r0 = fsc_sdp_get_stats(sdp).reduced_bytes;
        assert_int_equal(eq_micro(sdp, &b, s, 0), FSC_OK);
        reduced = fsc_sdp_get_stats(sdp).reduced_bytes - r0;
        held = (int64_t)(fsc_mem_current(FSC_MEM_GRADS) - g0);
        assert_int_equal(fsc_oss_step(oss), FSC_OK);
    }
    const fsc_partition *part = fsc_oss_partition(oss);
    int64_t owned = 0;
    for (int i = 0; i < part->nranges[rank]; i++)
        if (!ps.entries[part->ranges[rank][i].entry].param->frozen)
            owned += part->ranges[rank][i].count;
    const int64_t all_owned = sum_over_ranks(owned);
    const int64_t optim = (int64_t)(fsc_mem_current(FSC_MEM_OPTIM) - o0);
    const int64_t all_held = sum_over_ranks(held);
    if (rank == 0)
        fprintf(stderr,
                "%s np%d: trainable %lld of %lld; reduced %lld B/step (spans %lld B); grads "
                "%lld B over all ranks; optimizer state %lld B here for %lld owned\n",
                what, world, (long long)t.elems, (long long)t.total, (long long)reduced,
                (long long)spans * 4, (long long)all_held, (long long)optim, (long long)owned);
    assert_int_equal(reduced, spans * 4);
    assert_int_equal(all_owned, t.elems);
    assert_int_equal(optim, 2 * 4 * owned); /* AdamW: two state floats per element */
    /* after backward each rank holds its owned trainable spans; frozen
     * tensors only the alignment padding after them, on every rank */
    assert_int_equal(all_held, (spans + world * frozen_pad) * 4);
    if (policy == FSC_PARTITION_GREEDY) { /* balanced by trainable elements alone */
        int64_t largest = 0;
        for (int e = 0; e < ps.count; e++)
            if (!ps.entries[e].param->frozen && ps.entries[e].param->numel > largest)
                largest = ps.entries[e].param->numel;
        assert_true(owned <= (t.elems + world - 1) / world + largest);
    }
    eq_options ref = reference_of(k);
    tt_expect_reference(&ref, what, params_copy(&ps), ps.numel);
    sdp_run_free(arena, sdp, oss, &ps, &tk, m);
}

static void test_sdp_freeze(void **state) {
    (void)state;
    sdp_case(FROZEN_GLOBS, FSC_PARTITION_GREEDY, "ShardedDDP --freeze (greedy)");
    sdp_case(FROZEN_GLOBS, FSC_PARTITION_EVEN, "ShardedDDP --freeze (even)");
}

static void test_sdp_lora(void **state) {
    (void)state;
    sdp_case(FROZEN_LORA, FSC_PARTITION_GREEDY, "ShardedDDP LoRA (greedy)");
}

/* ---- FSDP ------------------------------------------------------------------------------ */

static fsc_module **blocks(fsc_module *m, int *n) {
    fsc_module **units = calloc((size_t)m->nchildren, sizeof *units);
    *n = 0;
    for (int c = 0; c < m->nchildren; c++)
        if (!strncmp(m->children[c]->name, "h.", 2)) units[(*n)++] = m->children[c];
    assert_int_equal(*n, EQ_MODEL.layers);
    return units;
}

static fsc_fsdp *fsdp_of(fsc_module *m) {
    int n;
    fsc_module **units = blocks(m, &n);
    fsc_fsdp *f = fsc_fsdp_new(m, fsc_group_world(), 5, units, n, &EQ_ADAMW, NULL);
    free(units);
    assert_non_null(f);
    return f;
}

/* Shard files of f (a frozen region in every unit) load into a fresh FSDP
 * and consolidate offline to the full weights. */
static void shard_files_round_trip(frozen_kind k, fsc_fsdp *f, const float *want, int64_t numel) {
    char path[256], full[256];
    snprintf(path, sizeof path, "%s/frozen_rank%d.st", scratch, rank);
    assert_int_equal(fsc_fsdp_save_sharded(f, path, 0, NULL, NULL), FSC_OK);
    fsc_module *m2 = model_of(k);
    fsc_fsdp *f2 = fsdp_of(m2);
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK);
    assert_int_equal(fsc_fsdp_load_sharded(f2, path), FSC_OK);
    int64_t n2;
    float *back = fsdp_full_params(f2, m2, &n2);
    assert_int_equal(n2, numel);
    assert_memory_equal(back, want, sizeof(float) * (size_t)numel);
    if (rank == 0) {
        const char **paths = calloc((size_t)world, sizeof *paths);
        char (*names)[256] = calloc((size_t)world, sizeof *names);
        for (int r = 0; r < world; r++) {
            snprintf(names[r], sizeof names[r], "%s/frozen_rank%d.st", scratch, r);
            paths[r] = names[r];
        }
        snprintf(full, sizeof full, "%s/frozen_full.st", scratch);
        assert_int_equal(fsc_flat_consolidate(world, paths, full), FSC_OK);
        fsc_params ps;
        fsc_module *m3 = model_of(k);
        assert_int_equal(fsc_params_bind(m3, 1, false, &ps), FSC_OK);
        assert_int_equal(fsc_weights_load(full, &ps, NULL), FSC_OK);
        assert_int_equal(ps.numel, numel);
        assert_memory_equal(ps.data, want, sizeof(float) * (size_t)numel);
        fsc_params_free(&ps);
        fsc_module_free(m3);
        free(paths), free(names);
    }
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK);
    free(back);
    fsc_fsdp_free(f2);
    fsc_module_free(m2);
}

static void fsdp_case(frozen_kind k, const char *what) {
    fsc_module *m = model_of(k);
    const trainable t = count_trainable(m);
    const size_t g0 = fsc_mem_current(FSC_MEM_GRADS), o0 = fsc_mem_current(FSC_MEM_OPTIM);
    fsc_fsdp *f = fsdp_of(m);
    const int64_t grads = (int64_t)(fsc_mem_current(FSC_MEM_GRADS) - g0);
    const int units = fsc_fsdp_get_stats(f).units;
    fsc_tokens tk;
    eq_tokens(&tk);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    const eq_batch b = eq_batch_of_rank(&tk, arena, EQ_MODEL.seq, 1, rank, world, x, y);
    int64_t reduced = 0;
    for (int s = 0; s < EQ_STEPS; s++) {
        fsc_fsdp_zero_grad(f);
        const int64_t r0 = fsc_fsdp_get_stats(f).reduced_bytes;
        assert_int_equal(eq_micro(m, &b, s, 0), FSC_OK);
        reduced = fsc_fsdp_get_stats(f).reduced_bytes - r0;
        assert_int_equal(fsc_fsdp_step(f), FSC_OK);
    }
    int n;
    const fsc_optim_range *r = fsc_fsdp_ranges(f, &n);
    const int64_t owned = owned_state(r, n), all_owned = sum_over_ranks(owned);
    const int64_t optim = (int64_t)(fsc_mem_current(FSC_MEM_OPTIM) - o0);
    const int64_t all_grads = sum_over_ranks(grads);
    /* alignment: 16 floats per trainable tensor, and per rank per unit */
    const int64_t slack = 16 * (t.tensors + (int64_t)world * units);
    if (rank == 0)
        fprintf(stderr,
                "%s np%d: trainable %lld of %lld; reduce-scattered %lld B/step (bound %lld); "
                "gradient shards %lld B over all ranks; optimizer state %lld B here for %lld "
                "owned\n",
                what, world, (long long)t.elems, (long long)t.total, (long long)reduced,
                (long long)(t.elems + slack) * 4, (long long)all_grads, (long long)optim,
                (long long)owned);
    assert_true(reduced >= t.elems * 4 && reduced <= (t.elems + slack) * 4);
    assert_true(all_grads >= t.elems * 4 && all_grads <= (t.elems + slack) * 4);
    assert_int_equal(all_owned, t.elems);
    assert_int_equal(optim, 2 * 4 * owned);
    int64_t numel;
    float *got = fsdp_full_params(f, m, &numel);
    shard_files_round_trip(k, f, got, numel);
    eq_options ref = reference_of(k);
    tt_expect_reference(&ref, what, got, numel);
    fsc_arena_free(arena);
    fsc_fsdp_free(f);
    fsc_tokens_free(&tk);
    fsc_module_free(m);
}

static void test_fsdp_freeze(void **state) {
    (void)state;
    fsdp_case(FROZEN_GLOBS, "FSDP --freeze");
}

static void test_fsdp_lora(void **state) {
    (void)state;
    fsdp_case(FROZEN_LORA, "FSDP LoRA");
}

TT_MAIN("fsc_frozen", scratch, cmocka_unit_test(test_sdp_freeze), cmocka_unit_test(test_sdp_lora),
        cmocka_unit_test(test_fsdp_freeze), cmocka_unit_test(test_fsdp_lora))
