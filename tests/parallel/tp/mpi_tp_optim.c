/* Optimizer state of the tensor-parallel GPT by global name (fsc/tp.h), over
 * the world as one TP group (t = 1, 2, 4), against one process running the
 * "single" strategy's optimizer (OSS over a group of one, fsc/zero.h):
 *  - stepping over runs of the global layout is bitwise stepping whole local
 *    tensors, with or without clipping, the runs skip exactly the padding,
 *    and both optimizers save the same file byte for byte;
 *  - after k AdamW steps the TP state file holds the one-process file's
 *    tensors (names, global shapes, step) with values within equivalence.h's
 *    bounds, the noise floor measured on the optimizer state itself;
 *  - resume across layouts: TP state + weights continue under one process
 *    and under OSS on the world (EVEN: each tensor's state cut between
 *    ranks, as FSDP cuts it), and theirs under TP, each equal (equivalence
 *    bounds) to the uninterrupted one-process run; TP resumed from its own
 *    files is bitwise the uninterrupted TP run;
 *  - a state file of another model (or optimizer) is refused on every rank,
 *    naming the problem, with the state and step unchanged. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <string.h>

#include "equivalence.h"
#include "tp_test.h"
#include "fsc/tp.h"
#include "fsc/weights.h"
#include "fsc/zero.h"
#include "mpi_test.h"

static int rank, world;
static char dir[64];

enum { K1 = 2, K2 = EQ_STEPS - K1 }; /* steps before and after a resume */

/* vocab 67: not divisible by 2 or 4, so the last ranks hold padding rows */
static fsc_gpt_config model(void) {
    fsc_gpt_config c = EQ_MODEL;
    c.vocab = 67;
    return c;
}

static void path_of(char *dst, const char *name) {
    snprintf(dst, 128, "%s/%s.safetensors", dir, name);
}

/* rank 0's count of failed checks, learnt by every rank (rank-0-only work
 * must not stop inside an assert while the others wait in a collective) */
static void assert_rank0_ok(int bad) {
    int32_t b = bad;
    assert_int_equal(fsc_group_broadcast(fsc_group_world(), &b, 1, FSC_DTYPE_I32, 0), FSC_OK);
    assert_int_equal(b, 0);
}

#define CHECK(bad, cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: rank 0: %s failed (%s)\n", __FILE__, __LINE__, #cond,          \
                    fsc_last_error());                                                             \
            (bad)++;                                                                               \
        }                                                                                          \
    } while (0)

/* ---- one process: OSS over a group of one, as the trainer's "single" ------------------- */
typedef struct {
    fsc_gpt_config cfg;
    fsc_module *m;
    fsc_params ps;
    fsc_oss *oss;
    fsc_arena *arena;
    fsc_tokens tk;
} solo;

/* OSS over g (a group of one: the "single" strategy; the world with EVEN:
 * tensors cut between ranks, as oss and fsdp shard them). Over the world
 * every rank computes the whole batch, so the replicas need no reduction. */
static int solo_init_on(solo *s, const fsc_gpt_config *cfg, const fsc_optim_config *optim,
                        fsc_group *g, fsc_partition_policy policy) {
    s->cfg = *cfg;
    s->m = fsc_gpt_new(cfg);
    if (!s->m || fsc_params_bind(s->m, 5, true, &s->ps)) return 1;
    s->oss = fsc_oss_new(optim, &s->ps, g, &(fsc_oss_options){.policy = policy});
    s->arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    eq_tokens(&s->tk);
    return !s->oss || !s->arena;
}

static int solo_init(solo *s, const fsc_gpt_config *cfg, const fsc_optim_config *optim) {
    return solo_init_on(s, cfg, optim, fsc_group_self(), FSC_PARTITION_GREEDY);
}

/* Step s on the global batch as `micro` micro-batches (in reverse order when
 * `reverse`): one summation order of the same step. */
static int solo_step(solo *o, int s, int micro, bool reverse) {
    const int G = EQ_GLOBAL_BATCH, B = G / micro, T = o->cfg.seq;
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    fsc_params_zero_grad(&o->ps);
    for (int j = 0; j < micro; j++) {
        const int k = reverse ? micro - 1 - j : j;
        fsc_arena_reset(o->arena);
        if (fsc_tokens_batch(&o->tk, s, k, 0, B, micro, 1, T, x, y)) return 1;
        fsc_ctx ctx = {.arena = o->arena,
                       .training = true,
                       .keyed = true,
                       .seed = 5,
                       .step = s,
                       .sample0 = fsc_batch_first_sample(s, k, 0, B, micro, 1)};
        float loss;
        if (fsc_gpt_train_micro(o->m, &ctx, x, y, B, T, -1, (double)G * T, &loss)) return 1;
    }
    return fsc_oss_step(o->oss) != FSC_OK;
}

static void solo_free(solo *s) {
    fsc_arena_free(s->arena);
    fsc_oss_free(s->oss);
    fsc_params_free(&s->ps);
    fsc_module_free(s->m);
    fsc_tokens_free(&s->tk);
}

/* ---- the TP model ---------------------------------------------------------------------------- */
typedef struct {
    fsc_gpt_config cfg;
    fsc_module *m;
    fsc_params ps;
    fsc_optim_range *r;
    int nr;
    fsc_optim *opt;
    fsc_tp_optim_state *st;
    fsc_arena *arena;
    fsc_tokens tk;
} tp_run;

static void tp_init(tp_run *t, const fsc_gpt_config *cfg, const fsc_optim_config *optim, bool sp,
                    bool whole_tensors) {
    fsc_tp_options opt = {.group = fsc_group_world(), .sequence_parallel = sp};
    t->cfg = *cfg;
    t->m = fsc_tp_gpt_new(cfg, &opt);
    assert_non_null(t->m);
    assert_int_equal(fsc_tp_params_bind(t->m, 5, true, &t->ps), FSC_OK);
    if (whole_tensors)
        assert_int_equal(fsc_optim_ranges_from_params(&t->ps, &t->r, &t->nr), FSC_OK);
    else
        assert_int_equal(fsc_tp_optim_ranges(t->m, &t->ps, &t->r, &t->nr), FSC_OK);
    t->opt = fsc_optim_new(optim, t->r, t->nr);
    assert_non_null(t->opt);
    t->st = fsc_tp_optim_state_new(t->m, &t->ps, t->opt, fsc_group_world());
    if (!t->st) fail_msg("rank %d: %s", rank, fsc_last_error());
    t->arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    eq_tokens(&t->tk);
}

/* Step s on the global batch; clipped to max_norm when > 0 (*norm receives
 * the norm). */
static void tp_step(tp_run *t, int s, float max_norm, float *norm) {
    float loss;
    if (tp_test_micro(t->m, &t->ps, t->arena, &t->tk, t->cfg.seq, s, &loss))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    if (max_norm > 0)
        assert_int_equal(fsc_tp_clip_grad_norm(t->m, &t->ps, fsc_group_world(), max_norm, norm),
                         FSC_OK);
    assert_int_equal(fsc_optim_step(t->opt), FSC_OK);
}

static void tp_free(tp_run *t) {
    fsc_arena_free(t->arena);
    fsc_tp_optim_state_free(t->st);
    fsc_optim_free(t->opt);
    fsc_optim_ranges_free(t->r);
    fsc_params_free(&t->ps);
    fsc_module_free(t->m);
    fsc_tokens_free(&t->tk);
}

/* ---- files read into the one-process layout -------------------------------------------------- */
/* Every tensor "<prefix><entry name>" of path (prefix "" for weights,
 * "optim.exp_avg." ...) at its entry's offset of ps, the one-process layout;
 * NULL when one is missing or shaped otherwise (said on stderr). */
static float *read_flat(const char *path, const fsc_params *ps, const char *prefix) {
    int rc = FSC_OK;
    fsc_st_file *f = fsc_st_open(path, &rc);
    float *out = calloc((size_t)ps->numel, sizeof *out);
    for (int i = 0; f && out && !rc && i < ps->count; i++) {
        char name[FSC_NAME_MAX * 3];
        snprintf(name, sizeof name, "%s%s", prefix, ps->entries[i].name);
        const fsc_param *p = ps->entries[i].param;
        fsc_tensor t =
            fsc_tensor_make(out + ps->entries[i].offset, FSC_DTYPE_F32, p->ndim, p->shape);
        rc = fsc_st_read(f, name, &t);
    }
    if (!f || rc) fprintf(stderr, "%s: %s\n", path, fsc_last_error());
    fsc_st_close(f);
    if (!f || rc) free(out), out = NULL;
    return out;
}

/* The two state files hold the same tensors (names, shapes: read_flat checks
 * the shapes of the model's) and the same step. */
static int same_tensors(const char *a, const char *b, int64_t step) {
    fsc_st_file *fa = fsc_st_open(a, NULL), *fb = fsc_st_open(b, NULL);
    int bad = 0;
    CHECK(bad, fa && fb);
    if (fa && fb) {
        CHECK(bad, fsc_st_count(fa) == fsc_st_count(fb));
        for (int i = 0; i < fsc_st_count(fa); i++) {
            const fsc_st_entry *e = fsc_st_entry_at(fa, i), *o = fsc_st_find(fb, e->name);
            CHECK(bad, o && o->ndim == e->ndim && o->dtype == e->dtype);
            for (int d = 0; o && d < e->ndim; d++) CHECK(bad, o->shape[d] == e->shape[d]);
        }
        const char *sa = fsc_st_metadata(fa, "step"), *sb = fsc_st_metadata(fb, "step");
        CHECK(bad, sa && sb && atoll(sa) == step && atoll(sb) == step);
    }
    fsc_st_close(fa), fsc_st_close(fb);
    return bad;
}

static unsigned char *slurp(const char *path, long *n) {
    unsigned char *b = mpi_read_file(path, n);
    assert_non_null(b);
    return b;
}

/* ---- runs: bitwise whole tensors, padding skipped ---------------------------------------- */
static void test_runs_bitwise(void **state) {
    (void)state;
    const fsc_gpt_config cfg = model();
    for (int clip = 0; clip < 2; clip++) {
        tp_run a, b;
        tp_init(&a, &cfg, &EQ_ADAMW, clip, false);
        tp_init(&b, &cfg, &EQ_ADAMW, clip, true);
        /* the runs cover every real element once and no padding */
        int first, count, vp;
        fsc_tp_vocab_range(cfg.vocab, world, rank, &first, &count, &vp);
        int64_t covered = 0, real = 0;
        for (int i = 0; i < a.nr; i++) covered += a.r[i].n;
        for (int i = 0; i < a.ps.count; i++) real += a.ps.entries[i].param->numel;
        real -= (int64_t)(vp - count) * cfg.d_model;
        assert_int_equal(covered, real);
        if (world > 1)
            assert_true(a.nr > a.ps.count); /* row runs of column-split weights */
        else
            assert_int_equal(a.nr, a.ps.count); /* t = 1: one run per parameter */
        for (int s = 0; s < 3; s++) {
            float na = 0, nb = 0;
            tp_step(&a, s, clip ? 0.5f : 0.f, &na);
            tp_step(&b, s, clip ? 0.5f : 0.f, &nb);
            assert_true(na == nb);
        }
        assert_memory_equal(a.ps.data, b.ps.data, sizeof(float) * (size_t)a.ps.numel);
        /* and both optimizers save the same file, byte for byte */
        char pa[128], pb[128];
        path_of(pa, "runs"), path_of(pb, "whole");
        assert_int_equal(fsc_tp_save_optim(a.st, pa, 0), FSC_OK);
        assert_int_equal(fsc_tp_save_optim(b.st, pb, world - 1), FSC_OK);
        long na, nb;
        unsigned char *fa = slurp(pa, &na), *fb = slurp(pb, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(fa, fb, (size_t)na);
        free(fa), free(fb);
        fprintf(stderr, "TP %d%s: %d runs step and save bitwise as %d whole tensors\n", world,
                clip ? " (clipped, SP)" : "", a.nr, b.nr);
        tp_free(&a), tp_free(&b);
    }
    /* optimizers over other ranges are refused on every rank */
    tp_run w;
    tp_init(&w, &cfg, &EQ_ADAMW, false, false);
    fsc_optim *part = fsc_optim_new(&EQ_ADAMW, w.r + 1, w.nr - 1); /* wte's run missing */
    assert_null(fsc_tp_optim_state_new(w.m, &w.ps, part, fsc_group_world()));
    assert_non_null(strstr(fsc_last_error(), "wte.weight"));
    fsc_optim_free(part);
    fsc_optim_range *twice = malloc(sizeof *twice * (size_t)(w.nr + 1));
    memcpy(twice, w.r, sizeof *twice * (size_t)w.nr);
    twice[w.nr] = w.r[w.nr - 1];
    fsc_optim *over = fsc_optim_new(&EQ_ADAMW, twice, w.nr + 1); /* a run twice */
    assert_null(fsc_tp_optim_state_new(w.m, &w.ps, over, fsc_group_world()));
    assert_non_null(strstr(fsc_last_error(), "overlap"));
    fsc_optim_free(over), free(twice);
    /* a group of another size than the modules' */
    if (world > 1) {
        assert_null(fsc_tp_optim_state_new(w.m, &w.ps, w.opt, fsc_group_self()));
        assert_non_null(strstr(fsc_last_error(), "group"));
    }
    tp_free(&w);
}

/* ---- the saved file = one process's ---------------------------------------------------- */
/* One process, K1 steps in one summation order, its state saved to path. */
static int solo_state(const char *path, int micro, bool reverse) {
    solo s;
    const fsc_gpt_config cfg = model();
    int bad = solo_init(&s, &cfg, &EQ_ADAMW);
    for (int k = 0; !bad && k < K1; k++) bad = solo_step(&s, k, micro, reverse);
    if (!bad) bad = fsc_oss_save_optim(s.oss, path, 0) != FSC_OK;
    if (bad) fprintf(stderr, "one process: %s\n", fsc_last_error());
    solo_free(&s);
    return bad;
}

static void test_state_equals_one_process(void **state) {
    (void)state;
    const fsc_gpt_config cfg = model();
    char tp[128], one[128];
    path_of(tp, "state_tp"), path_of(one, "state_one");
    tp_run t;
    tp_init(&t, &cfg, &EQ_ADAMW, false, false);
    for (int k = 0; k < K1; k++) tp_step(&t, k, 0.f, NULL);
    assert_int_equal(fsc_tp_save_optim(t.st, rank == 0 ? tp : NULL, 0), FSC_OK);
    tp_free(&t);
    int bad = 0;
    if (rank == 0) {
        /* the reference and three other summation orders (as eq_reference_ex) */
        const int split[EQ_ORDERS] = {2, 4, EQ_GLOBAL_BATCH};
        const bool reverse[EQ_ORDERS] = {false, true, true};
        char alt[EQ_ORDERS][128];
        bad += solo_state(one, 1, false);
        for (int a = 0; a < EQ_ORDERS; a++) {
            char name[32];
            snprintf(name, sizeof name, "state_alt%d", a);
            path_of(alt[a], name);
            bad += solo_state(alt[a], split[a], reverse[a]);
        }
        bad += same_tensors(tp, one, K1);
        fsc_module *m = fsc_gpt_new(&cfg);
        fsc_params ps;
        CHECK(bad, m && fsc_params_collect(m, &ps) == FSC_OK);
        static const char *const kinds[] = {"optim.exp_avg.", "optim.exp_avg_sq."};
        for (int k = 0; !bad && k < 2; k++) {
            float *ref = read_flat(one, &ps, kinds[k]), *got = read_flat(tp, &ps, kinds[k]);
            float *alts[EQ_ORDERS];
            for (int a = 0; a < EQ_ORDERS; a++) alts[a] = read_flat(alt[a], &ps, kinds[k]);
            CHECK(bad, ref && got && alts[0] && alts[1] && alts[2]);
            if (!bad) {
                char what[64];
                snprintf(what, sizeof what, "TP %d %s vs one process", world, kinds[k] + 6);
                eq_set_noise(&ps, ref, alts, EQ_ORDERS);
                bad += eq_compare(what, got, ref, ps.numel) != 0;
            }
            free(ref), free(got);
            for (int a = 0; a < EQ_ORDERS; a++) free(alts[a]);
        }
        fsc_params_free(&ps), fsc_module_free(m);
    }
    assert_rank0_ok(bad);
}

/* ---- resume across layouts ---------------------------------------------------------------- */
static void test_resume(void **state) {
    (void)state;
    const fsc_gpt_config cfg = model();
    char w_tp[128], s_tp[128], w_one[128], s_one[128], w_res[128];
    path_of(w_tp, "w_tp"), path_of(s_tp, "s_tp"), path_of(w_one, "w_one");
    path_of(s_one, "s_one"), path_of(w_res, "w_resumed");
    /* the uninterrupted one-process run and its noise floor (equivalence.h) */
    int64_t numel = 0;
    float *ref = rank == 0 ? eq_reference_ex(&(eq_options){.model = &cfg}, &numel) : NULL;
    /* TP (with sequence parallelism) to K1, saved; and uninterrupted */
    tp_run t, u;
    tp_init(&t, &cfg, &EQ_ADAMW, true, false);
    tp_init(&u, &cfg, &EQ_ADAMW, true, false);
    for (int k = 0; k < K1; k++) tp_step(&t, k, 0.f, NULL);
    assert_int_equal(fsc_tp_save_weights(w_tp, t.m, &t.ps, fsc_group_world(), 0, NULL, NULL),
                     FSC_OK);
    assert_int_equal(fsc_tp_save_optim(t.st, s_tp, 0), FSC_OK);
    tp_free(&t);
    for (int k = 0; k < EQ_STEPS; k++) tp_step(&u, k, 0.f, NULL);
    /* TP resumed from its own files: bitwise the uninterrupted TP run */
    tp_init(&t, &cfg, &EQ_ADAMW, true, false);
    assert_int_equal(fsc_tp_load_weights(w_tp, t.m, &t.ps, NULL), FSC_OK);
    assert_int_equal(fsc_tp_load_optim(t.st, s_tp), FSC_OK);
    assert_int_equal(fsc_optim_get_step(t.opt), K1);
    for (int k = K1; k < EQ_STEPS; k++) tp_step(&t, k, 0.f, NULL);
    assert_memory_equal(t.ps.data, u.ps.data, sizeof(float) * (size_t)t.ps.numel);
    tp_free(&t), tp_free(&u);

    int bad = 0;
    if (rank == 0) {
        /* TP -> one process */
        solo s;
        bad += solo_init(&s, &cfg, &EQ_ADAMW);
        CHECK(bad, s.ps.numel == numel);
        int unused = -1;
        CHECK(bad, fsc_weights_load(w_tp, &s.ps, &unused) == FSC_OK && unused == 0);
        CHECK(bad, fsc_oss_load_optim(s.oss, s_tp) == FSC_OK);
        CHECK(bad, fsc_optim_get_step(fsc_oss_local(s.oss)) == K1);
        for (int k = K1; !bad && k < EQ_STEPS; k++) bad += solo_step(&s, k, 1, false);
        if (!bad) {
            char what[64];
            snprintf(what, sizeof what, "TP %d -> one process, resumed at %d", world, K1);
            bad += eq_compare(what, s.ps.data, ref, numel) != 0;
        }
        solo_free(&s);
        /* one process to K1, saved, for the TP side */
        bad += solo_init(&s, &cfg, &EQ_ADAMW);
        for (int k = 0; !bad && k < K1; k++) bad += solo_step(&s, k, 1, false);
        CHECK(bad, fsc_weights_save(w_one, &s.ps, 0, NULL, NULL) == FSC_OK);
        CHECK(bad, fsc_oss_save_optim(s.oss, s_one, 0) == FSC_OK);
        solo_free(&s);
    }
    assert_rank0_ok(bad);
    /* TP -> OSS over the world, each tensor's state cut between the ranks */
    char w_dp[128], s_dp[128];
    path_of(w_dp, "w_dp"), path_of(s_dp, "s_dp");
    solo d;
    assert_int_equal(solo_init_on(&d, &cfg, &EQ_ADAMW, fsc_group_world(), FSC_PARTITION_EVEN), 0);
    assert_int_equal(fsc_weights_load(w_tp, &d.ps, NULL), FSC_OK);
    assert_int_equal(fsc_oss_load_optim(d.oss, s_tp), FSC_OK);
    for (int k = K1; k < EQ_STEPS; k++) assert_int_equal(solo_step(&d, k, 1, false), 0);
    bad = 0;
    if (rank == 0) {
        char what[64];
        snprintf(what, sizeof what, "TP %d -> OSS (even) on %d, resumed at %d", world, world, K1);
        bad += eq_compare(what, d.ps.data, ref, numel) != 0;
    }
    assert_rank0_ok(bad);
    solo_free(&d);
    /* ... and OSS over the world to K1, saved, for TP below */
    assert_int_equal(solo_init_on(&d, &cfg, &EQ_ADAMW, fsc_group_world(), FSC_PARTITION_EVEN), 0);
    for (int k = 0; k < K1; k++) assert_int_equal(solo_step(&d, k, 1, false), 0);
    assert_int_equal(fsc_oss_save_optim(d.oss, s_dp, 0), FSC_OK);
    bad = rank == 0 ? fsc_weights_save(w_dp, &d.ps, 0, NULL, NULL) != FSC_OK : 0;
    assert_rank0_ok(bad);
    solo_free(&d);
    /* one process -> TP, and OSS on the world -> TP (no sequence parallelism) */
    const char *from_w[] = {w_one, w_dp}, *from_s[] = {s_one, s_dp};
    for (int src = 0; src < 2; src++) {
        tp_init(&t, &cfg, &EQ_ADAMW, false, false);
        assert_int_equal(fsc_tp_load_weights(from_w[src], t.m, &t.ps, NULL), FSC_OK);
        assert_int_equal(fsc_tp_load_optim(t.st, from_s[src]), FSC_OK);
        assert_int_equal(fsc_optim_get_step(t.opt), K1);
        for (int k = K1; k < EQ_STEPS; k++) tp_step(&t, k, 0.f, NULL);
        assert_int_equal(fsc_tp_save_weights(w_res, t.m, &t.ps, fsc_group_world(), 0, NULL, NULL),
                         FSC_OK);
        tp_free(&t);
        bad = 0;
        if (rank == 0) {
            fsc_module *m = fsc_gpt_new(&cfg);
            fsc_params ps;
            CHECK(bad, m && fsc_params_collect(m, &ps) == FSC_OK);
            float *got = bad ? NULL : read_flat(w_res, &ps, "");
            CHECK(bad, got != NULL);
            if (got) {
                char what[64];
                snprintf(what, sizeof what, "%s -> TP %d, resumed at %d",
                         src ? "OSS (even) on the world" : "one process", world, K1);
                bad += eq_compare(what, got, ref, numel) != 0;
            }
            free(got);
            fsc_params_free(&ps), fsc_module_free(m);
        }
        assert_rank0_ok(bad);
    }
    free(ref);
}

/* ---- files of another model or optimizer ----------------------------------------------- */
/* A copy of every range's state. */
static float *snapshot(tp_run *t) {
    int64_t n = 0;
    for (int i = 0; i < t->nr; i++) n += t->r[i].n;
    float *out = malloc(sizeof(float) * (size_t)(2 * n + 1)), *at = out;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < t->nr; i++) {
            float *st;
            assert_int_equal(fsc_optim_state(t->opt, i, k, &st), FSC_OK);
            memcpy(at, st, sizeof(float) * (size_t)t->r[i].n);
            at += t->r[i].n;
        }
    return out;
}

static void expect_refused(tp_run *t, const char *path, int code, const char *says) {
    int64_t n = 0;
    for (int i = 0; i < t->nr; i++) n += t->r[i].n;
    float *before = snapshot(t);
    const int64_t step = fsc_optim_get_step(t->opt);
    const int rc = fsc_tp_load_optim(t->st, path);
    fprintf(stderr, "rank %d: %s refused: %s\n", rank, path, fsc_last_error());
    assert_int_equal(rc, code);
    if (says) assert_non_null(strstr(fsc_last_error(), says));
    float *after = snapshot(t);
    assert_memory_equal(before, after, sizeof(float) * (size_t)(2 * n));
    assert_int_equal(fsc_optim_get_step(t->opt), step);
    free(before), free(after);
}

static void test_refuse_other_files(void **state) {
    (void)state;
    const fsc_gpt_config cfg = model();
    fsc_gpt_config shallow = cfg, narrow = cfg;
    shallow.layers = 1, narrow.vocab = 64;
    const fsc_optim_config sgd = EQ_SGD_MOMENTUM;
    char p_shallow[128], p_narrow[128], p_sgd[128], p_none[128];
    path_of(p_shallow, "shallow"), path_of(p_narrow, "narrow"), path_of(p_sgd, "sgd");
    path_of(p_none, "no_such_file");
    int bad = 0;
    if (rank == 0) {
        const fsc_gpt_config *models[] = {&shallow, &narrow, &cfg};
        const fsc_optim_config *optims[] = {&EQ_ADAMW, &EQ_ADAMW, &sgd};
        const char *paths[] = {p_shallow, p_narrow, p_sgd};
        for (int i = 0; i < 3; i++) {
            solo s;
            bad += solo_init(&s, models[i], optims[i]);
            if (!bad) bad += solo_step(&s, 0, 1, false);
            CHECK(bad, fsc_oss_save_optim(s.oss, paths[i], 0) == FSC_OK);
            solo_free(&s);
        }
    }
    assert_rank0_ok(bad);
    tp_run t;
    tp_init(&t, &cfg, &EQ_ADAMW, false, false);
    for (int k = 0; k < 2; k++) tp_step(&t, k, 0.f, NULL);
    expect_refused(&t, p_shallow, FSC_ERR_NOT_FOUND, "h.1.");
    expect_refused(&t, p_narrow, FSC_ERR_SHAPE, "wte.weight");
    expect_refused(&t, p_sgd, FSC_ERR_INVALID, "SGD");
    expect_refused(&t, p_none, FSC_ERR_IO, NULL);
    /* and the state still saves and steps */
    char ok[128];
    path_of(ok, "after_refusals");
    assert_int_equal(fsc_tp_save_optim(t.st, ok, 0), FSC_OK);
    assert_int_equal(fsc_tp_load_optim(t.st, ok), FSC_OK);
    assert_int_equal(fsc_optim_get_step(t.opt), 2);
    tp_free(&t);
    /* NULL arguments */
    assert_int_equal(fsc_tp_save_optim(NULL, ok, 0), FSC_ERR_INVALID);
    assert_int_equal(fsc_tp_load_optim(NULL, ok), FSC_ERR_INVALID);
    fsc_optim_range *r = (fsc_optim_range *)1;
    int n = 7;
    assert_int_equal(fsc_tp_optim_ranges(NULL, NULL, &r, &n), FSC_ERR_INVALID);
    assert_null(r);
    assert_int_equal(n, 0);
    fsc_tp_optim_state_free(NULL);
}

MPI_TEST_MAIN_IN_SCRATCH("fsc_tp_optim", dir, cmocka_unit_test(test_runs_bitwise),
                         cmocka_unit_test(test_state_equals_one_process),
                         cmocka_unit_test(test_resume), cmocka_unit_test(test_refuse_other_files))
