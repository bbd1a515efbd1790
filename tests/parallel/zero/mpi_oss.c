/* OSS (ZeRO-1) over 1, 2 and 4 ranks: DDP gradients + a sharded optimizer end
 * with the same parameters as one process on the same global batch (AdamW
 * and SGD with momentum, GREEDY and EVEN partitions, gradient accumulation,
 * global-norm clipping, half-precision sharing, a model dominated by one
 * tensor); optimizer state per rank is exactly K x 4 x owned elements; and
 * the state file by global name saves, reloads at another world size and
 * refuses files of another model, another kind or a truncated one without
 * touching the state. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>
#include <unistd.h>

#include "test_main.h"
#include "trainer_test.h"
#include "fsc/parallel.h"
#include "fsc/zero.h"

static int rank, world;

/* A tensor larger than all the others together: wte is 2048 x 32 = 65536
 * floats, the rest about 26000. */
static const fsc_gpt_config BIG_EMBEDDING = {
    .vocab = 2048, .seq = 16, .layers = 2, .d_model = 32, .heads = 4, .dropout = 0.1f};
/* share_dtype BF16: compared with a reference that rounds its parameters to
 * bf16 after every step. Both hold bf16 values, and a value that lands near a
 * rounding boundary may round the other way, one bf16 ulp (2^-8 relative);
 * after that the runs stay within a few ulps. */
#define BF16_RTOL (1.0 / 64)
#define BF16_ATOL 1e-4

typedef struct run_cfg {
    const fsc_gpt_config *model; /* NULL: EQ_MODEL */
    const fsc_optim_config *optim;
    fsc_partition_policy policy;
    int accum;      /* micro-batches per step (0: 1) */
    float max_norm; /* > 0: fsc_oss_clip_grad_norm before each step */
    fsc_dtype share;
    int steps;        /* 0: EQ_STEPS */
    const char *save; /* non-NULL: save the optimizer state here after the steps */
} run_cfg;

typedef struct run_out {
    float *params; /* caller frees */
    int64_t numel;
    fsc_group_stats stats; /* of the OSS group */
    int64_t owners;        /* ranks that own something */
    float first_norm;
} run_out;

static fsc_group *oss_group(void) {
    fsc_group *g;
    assert_int_equal(fsc_group_split(fsc_group_world(), 0, rank, "oss", &g), FSC_OK);
    return g;
}

/* Every rank holds bit-identical parameters. */
static void assert_replicas_identical(const float *p, int64_t n) {
    float *root = malloc(sizeof(float) * (size_t)n);
    memcpy(root, p, sizeof(float) * (size_t)n);
    assert_int_equal(fsc_group_broadcast(fsc_group_world(), root, n, FSC_DTYPE_F32, 0), FSC_OK);
    assert_memory_equal(root, p, sizeof(float) * (size_t)n);
    free(root);
}

static void assert_state_is_file(fsc_oss *o, int grank, const fsc_params *ps, const char *path);

/* DDP (on the world group) for the gradients, OSS (on its own group, so its
 * collectives can be counted) for the step. */
static void run_oss(const run_cfg *c, run_out *out) {
    const fsc_gpt_config *model = c->model ? c->model : &EQ_MODEL;
    int accum = c->accum ? c->accum : 1, steps = c->steps ? c->steps : EQ_STEPS;
    fsc_module *m = fsc_gpt_new(model);
    fsc_params ps;
    fsc_tokens tk;
    eq_tokens(&tk);
    /* a different seed on other ranks: DDP's wrap-time broadcast must fix it */
    assert_int_equal(fsc_params_bind(m, rank == 0 ? 5 : 99, true, &ps), FSC_OK);
    fsc_module *ddp = fsc_ddp_wrap(m, &ps, fsc_group_world(), NULL);
    assert_non_null(ddp);
    fsc_group *g = oss_group();
    fsc_oss *o = fsc_oss_new(c->optim, &ps, g,
                             &(fsc_oss_options){.policy = c->policy, .share_dtype = c->share});
    assert_non_null(o);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int32_t x[EQ_GLOBAL_BATCH * 16], y[EQ_GLOBAL_BATCH * 16];
    const eq_batch b = eq_batch_of_rank(&tk, arena, model->seq, accum, rank, world, x, y);
    out->first_norm = 0;
    for (int s = 0; s < steps; s++) {
        fsc_params_zero_grad(&ps);
        for (int k = 0; k < accum; k++) {
            fsc_ddp_set_no_sync(ddp, k < accum - 1);
            assert_int_equal(eq_micro(ddp, &b, s, k), FSC_OK);
        }
        if (c->max_norm > 0) {
            float norm;
            assert_int_equal(fsc_oss_clip_grad_norm(o, c->max_norm, false, &norm), FSC_OK);
            if (s == 0) out->first_norm = norm;
        }
        assert_int_equal(fsc_oss_step(o), FSC_OK);
    }
    if (c->save) {
        assert_int_equal(fsc_oss_save_optim(o, c->save, 0), FSC_OK);
        assert_state_is_file(o, fsc_group_rank(g), &ps, c->save);
    }
    out->stats = fsc_group_get_stats(g);
    out->owners = 0;
    for (int r = 0; r < world; r++) out->owners += fsc_oss_partition(o)->elems[r] > 0;
    out->numel = ps.numel;
    out->params = malloc(sizeof(float) * (size_t)ps.numel);
    memcpy(out->params, ps.data, sizeof(float) * (size_t)ps.numel);
    assert_replicas_identical(out->params, out->numel);
    fsc_arena_free(arena);
    fsc_oss_free(o);
    fsc_group_free(g);
    fsc_module_free(ddp);
    fsc_params_free(&ps);
    fsc_tokens_free(&tk);
    fsc_module_free(m);
}

static void check_against_reference(const char *what, const run_cfg *c, run_out *out) {
    char label[128];
    snprintf(label, sizeof label, "%s, %s", what,
             c->policy == FSC_PARTITION_EVEN ? "EVEN" : "GREEDY");
    tt_expect_reference(
        &(eq_options){
            .model = c->model, .optim = c->optim, .max_norm = c->max_norm, .round_to = c->share},
        label, out->params, out->numel);
}

static void equivalence(const char *what, run_cfg c) {
    if (EQ_GLOBAL_BATCH % (world * (c.accum ? c.accum : 1))) skip();
    for (int pol = 0; pol < 2; pol++) {
        c.policy = pol ? FSC_PARTITION_EVEN : FSC_PARTITION_GREEDY;
        run_out out;
        run_oss(&c, &out);
        int steps = c.steps ? c.steps : EQ_STEPS;
        /* sharing: one broadcast per owner (GREEDY) or one allgather (EVEN) per step */
        if (c.policy == FSC_PARTITION_GREEDY) {
            assert_int_equal(out.stats.count[FSC_COLL_BROADCAST], steps * out.owners);
            assert_int_equal(out.stats.count[FSC_COLL_ALLGATHER], c.max_norm > 0 ? steps : 0);
        } else {
            assert_int_equal(out.stats.count[FSC_COLL_BROADCAST], 0);
            assert_int_equal(out.stats.count[FSC_COLL_ALLGATHER], steps * (c.max_norm > 0 ? 2 : 1));
        }
        if (c.max_norm > 0) assert_true(out.first_norm > 2 * c.max_norm); /* clipping bites */
        check_against_reference(what, &c, &out);
    }
}

/* The equivalence runs, one test each (FSC_TEST_ROW). */
typedef struct {
    const char *what;
    run_cfg cfg;
} oss_case;
static oss_case cases[] = {
    {"OSS AdamW", {.optim = &EQ_ADAMW}},
    {"OSS SGD momentum, 2 micro-batches", {.optim = &EQ_SGD_MOMENTUM, .accum = 2}},
    {"OSS AdamW, 2 micro-batches, clip 0.05", {.optim = &EQ_ADAMW, .accum = 2, .max_norm = 0.05f}},
    {"OSS SGD momentum, clip 0.05", {.optim = &EQ_SGD_MOMENTUM, .max_norm = 0.05f}},
};

static void test_equivalence(void **state) {
    const oss_case *c = *state;
    equivalence(c->what, c->cfg);
}

static void test_big_embedding(void **state) {
    (void)state;
    fsc_module *m = fsc_gpt_new(&BIG_EMBEDDING);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, true, &ps), FSC_OK);
    int wte = (int)(fsc_params_find(&ps, "wte.weight") - ps.entries);
    fsc_partition *p;
    assert_int_equal(fsc_partition_new(&ps, world, FSC_PARTITION_GREEDY, 0, &p), FSC_OK);
    if (world > 1) { /* GREEDY: the embedding alone on rank 0, which then gets nothing else */
        assert_int_equal(p->nranges[0], 1);
        assert_int_equal(p->ranges[0][0].entry, wte);
        assert_int_equal(p->elems[0], 2048 * 32);
    }
    fsc_partition_free(p);
    assert_int_equal(fsc_partition_new(&ps, world, FSC_PARTITION_EVEN, 0, &p), FSC_OK);
    int holders = 0;
    for (int r = 0; r < world; r++)
        for (int k = 0; k < p->nranges[r]; k++) holders += p->ranges[r][k].entry == wte;
    assert_int_equal(holders, world < 3 ? world : 3); /* 65536 of ~92000 floats: 3 of 4 shards */
    fsc_partition_free(p);
    fsc_params_free(&ps);
    fsc_module_free(m);
    equivalence("OSS AdamW, vocab 2048", (run_cfg){.model = &BIG_EMBEDDING, .optim = &EQ_ADAMW});
}

/* BF16 sharing: every rank (owner included) holds the same rounded values. */
static void test_bf16_share(void **state) {
    (void)state;
    for (int pol = 0; pol < 2; pol++) {
        run_cfg c = {.optim = &EQ_ADAMW,
                     .share = FSC_DTYPE_BF16,
                     .policy = pol ? FSC_PARTITION_EVEN : FSC_PARTITION_GREEDY};
        run_out out;
        run_oss(&c, &out); /* also asserts the replicas are bit-identical */
        for (int64_t i = 0; i < out.numel; i++)
            assert_true(fsc_bf16_to_f32(fsc_f32_to_bf16(out.params[i])) == out.params[i]);
        int64_t n;
        float *ref = eq_reference_ex(&(eq_options){.round_to = FSC_DTYPE_BF16}, &n);
        double max_d = 0;
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)out.params[i] - ref[i]);
            if (d > max_d) max_d = d;
            bad += d > BF16_ATOL + BF16_RTOL * fabs(ref[i]);
        }
        fprintf(stderr,
                "OSS AdamW, BF16 share, %s, %d ranks, rank %d: max |diff| %.2e vs the "
                "bf16-rounded reference, %lld outside %g + %g|ref|\n",
                pol ? "EVEN" : "GREEDY", world, rank, max_d, (long long)bad, BF16_ATOL, BF16_RTOL);
        assert_int_equal(bad, 0);
        free(ref);
        free(out.params);
    }
}

/* ---- memory and partition ------------------------------------------------------- */
static void test_state_memory(void **state) {
    (void)state;
    const fsc_optim_config *cfgs[2] = {&EQ_ADAMW, &EQ_SGD_MOMENTUM};
    fsc_module *m = fsc_gpt_new(&BIG_EMBEDDING);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, true, &ps), FSC_OK);
    int64_t params = 0, largest = 0;
    for (int i = 0; i < ps.count; i++) {
        params += ps.entries[i].param->numel;
        if (ps.entries[i].param->numel > largest) largest = ps.entries[i].param->numel;
    }
    for (int c = 0; c < 2; c++)
        for (int pol = 0; pol < 2; pol++) {
            size_t before = fsc_mem_current(FSC_MEM_OPTIM);
            fsc_oss *o = fsc_oss_new(cfgs[c], &ps, fsc_group_world(),
                                     &(fsc_oss_options){.policy = (fsc_partition_policy)pol});
            assert_non_null(o);
            const fsc_partition *p = fsc_oss_partition(o);
            size_t K = (size_t)fsc_optim_state_count(cfgs[c]);
            size_t want = K * 4 * (size_t)p->elems[rank];
            assert_int_equal(fsc_mem_current(FSC_MEM_OPTIM) - before, want);
            assert_int_equal(fsc_oss_state_bytes(o), want);
            int64_t sum = 0, lo = INT64_MAX, hi = 0;
            for (int r = 0; r < world; r++) {
                sum += p->elems[r];
                lo = p->elems[r] < lo ? p->elems[r] : lo;
                hi = p->elems[r] > hi ? p->elems[r] : hi;
            }
            assert_int_equal(sum, params); /* every element owned exactly once */
            if (pol == FSC_PARTITION_EVEN) {
                /* each shard: numel/world rounded up to 16, less the padding inside it */
                assert_int_equal(p->shard % 16, 0);
                assert_true(p->shard - (ps.numel + world - 1) / world < 16);
                assert_int_equal(p->padded_numel, p->shard * world);
                int64_t pad = ps.numel - params;
                for (int r = 0; r < world; r++) {
                    assert_true(p->elems[r] <= p->shard);
                    assert_true(p->elems[r] >= params / world - pad - 16 ||
                                r == world - 1); /* the last shard takes the remainder */
                }
            } else {
                assert_true(hi - lo <= largest); /* greedy: within one tensor */
            }
            /* owner() agrees with the ranges; the padding between tensors is nobody's */
            int64_t *seen = calloc((size_t)(world > 0 ? world : 1), sizeof *seen);
            for (int64_t i = 0; i < ps.numel; i++) {
                int r = fsc_partition_owner(p, &ps, i);
                bool in_param = false;
                for (int e = 0; e < ps.count && !in_param; e++)
                    in_param = i >= ps.entries[e].offset &&
                               i < ps.entries[e].offset + ps.entries[e].param->numel;
                if (pol == FSC_PARTITION_GREEDY) assert_true(in_param ? r >= 0 : r == -1);
                if (r >= 0 && in_param) seen[r]++;
            }
            for (int r = 0; r < world; r++) assert_int_equal(seen[r], p->elems[r]);
            free(seen);
            fsc_oss_free(o);
            assert_int_equal(fsc_mem_current(FSC_MEM_OPTIM), before);
        }
    fsc_params_free(&ps);
    fsc_module_free(m);
}

/* A model smaller than world x 16 floats: under EVEN the last ranks own
 * nothing (empty optimizers, zero-length shards in the allgather); the step
 * still equals one fsc_optim over the whole buffer. Bad arguments are refused. */
static void test_tiny_model_and_bad_arguments(void **state) {
    (void)state;
    fsc_module *lin = fsc_linear_new("lin", 2, 3, true, FSC_WEIGHT_OUT_IN, 0.5f);
    fsc_params ps, ref;
    assert_int_equal(fsc_params_bind(lin, 3, true, &ps), FSC_OK);
    fsc_module *lin2 = fsc_linear_new("lin", 2, 3, true, FSC_WEIGHT_OUT_IN, 0.5f);
    assert_int_equal(fsc_params_bind(lin2, 3, true, &ref), FSC_OK);
    fsc_optim_range *r;
    int nr;
    assert_int_equal(fsc_optim_ranges_from_params(&ref, &r, &nr), FSC_OK);
    for (int pol = 0; pol < 2; pol++) {
        fsc_params_init_values(&ps, 3);
        fsc_params_init_values(&ref, 3);
        fsc_optim *single = fsc_optim_new(&EQ_ADAMW, r, nr);
        fsc_oss *o = fsc_oss_new(&EQ_ADAMW, &ps, fsc_group_world(),
                                 &(fsc_oss_options){.policy = (fsc_partition_policy)pol});
        assert_non_null(o);
        if (pol == FSC_PARTITION_EVEN && world == 4) { /* 32 floats, shards of 16 */
            assert_int_equal(fsc_oss_partition(o)->shard, 16);
            assert_int_equal(fsc_oss_partition(o)->elems[3], 0);
            assert_int_equal(fsc_oss_state_bytes(o), rank < 2 ? 2 * 4 * (rank ? 3 : 6) : 0);
        }
        for (int s = 0; s < 3; s++) {
            for (int64_t i = 0; i < ps.numel; i++)
                ps.grad[i] = ref.grad[i] = (float)((i * 7 + s) % 5) - 2.0f;
            assert_int_equal(fsc_oss_step(o), FSC_OK);
            assert_int_equal(fsc_optim_step(single), FSC_OK);
        }
        assert_memory_equal(ps.data, ref.data, sizeof(float) * (size_t)ps.numel);
        /* bad arguments: refused before any communication */
        assert_int_equal(fsc_oss_save_optim(o, "/nonexistent/x", world), FSC_ERR_INVALID);
        assert_non_null(strstr(fsc_last_error(), "root"));
        assert_int_equal(fsc_oss_clip_grad_norm(o, -1.0f, false, NULL), FSC_ERR_INVALID);
        assert_int_equal(fsc_oss_set_lr(o, -1.0), FSC_ERR_INVALID);
        fsc_oss_free(o);
        fsc_optim_free(single);
    }
    assert_null(fsc_oss_new(&EQ_ADAMW, &ps, fsc_group_world(),
                            &(fsc_oss_options){.share_dtype = FSC_DTYPE_I32}));
    assert_non_null(strstr(fsc_last_error(), "share_dtype"));
    fsc_partition *p;
    assert_int_equal(fsc_partition_new(&ps, 0, FSC_PARTITION_EVEN, 0, &p), FSC_ERR_INVALID);
    assert_int_equal(fsc_partition_new(&ps, 2, (fsc_partition_policy)7, 0, &p), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "policy"));
    fsc_optim_ranges_free(r);
    fsc_params_free(&ps);
    fsc_params_free(&ref);
    fsc_module_free(lin);
    fsc_module_free(lin2);
}

/* ---- optimizer state by global name ------------------------------------------------ */
static char dir[64];

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

typedef struct model {
    fsc_module *m;
    fsc_params ps;
    fsc_group *g;
    fsc_oss *o;
} model;

/* A fresh model and OSS over group g (NULL: a new split of the world). */
static void model_new(model *md, const fsc_gpt_config *cfg, const fsc_optim_config *optim,
                      fsc_partition_policy policy, fsc_group *g) {
    md->m = fsc_gpt_new(cfg);
    assert_int_equal(fsc_params_bind(md->m, 5, true, &md->ps), FSC_OK);
    md->g = g ? g : oss_group();
    md->o = fsc_oss_new(optim, &md->ps, md->g, &(fsc_oss_options){.policy = policy});
    assert_non_null(md->o);
}

static void model_free(model *md) {
    fsc_oss_free(md->o);
    fsc_group_free(md->g);
    fsc_params_free(&md->ps);
    fsc_module_free(md->m);
}

/* This rank's state (group rank grank of o's group) equals the file's slices
 * bit for bit, and its step count the file's. */
static void assert_state_is_file(fsc_oss *o, int grank, const fsc_params *ps, const char *path) {
    fsc_st_file *f = fsc_st_open(path, NULL);
    assert_non_null(f);
    fsc_optim *opt = fsc_oss_local(o);
    fsc_optim_config c = fsc_optim_get_config(opt);
    int K = fsc_optim_state_count(&c);
    const char *names[2] = {c.kind == FSC_OPTIM_SGD ? "momentum" : "exp_avg", "exp_avg_sq"};
    const fsc_partition *p = fsc_oss_partition(o);
    assert_int_equal(fsc_optim_num_ranges(opt), p->nranges[grank]);
    for (int i = 0; i < p->nranges[grank]; i++) {
        const fsc_shard_range *s = &p->ranges[grank][i];
        for (int k = 0; k < K; k++) {
            char name[512];
            snprintf(name, sizeof name, "optim.%s.%s", names[k], ps->entries[s->entry].name);
            const fsc_st_entry *e = fsc_st_find(f, name);
            assert_non_null(e);
            float *st, *want = malloc(sizeof(float) * (size_t)s->count);
            assert_int_equal(fsc_optim_state(opt, i, k, &st), FSC_OK);
            assert_int_equal(
                fsc_st_read_bytes(f, e, (uint64_t)s->begin * 4, want, (size_t)s->count * 4),
                FSC_OK);
            assert_memory_equal(st, want, (size_t)s->count * 4);
            free(want);
        }
    }
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)fsc_optim_get_step(opt));
    assert_string_equal(fsc_st_metadata(f, "step"), step);
    fsc_st_close(f);
}

/* A load that must be refused on every rank with `code` (FSC_ERR_FORMAT or
 * FSC_ERR_IO both allowed for a truncated file: code 0), a message naming
 * `needle`, and the state still equal to `intact`. */
static void assert_refused(model *md, const char *path, int code, const char *needle,
                           const char *intact) {
    int rc = fsc_oss_load_optim(md->o, path);
    fprintf(stderr, "rank %d: refused %s: %s\n", rank, path, fsc_last_error());
    if (code)
        assert_int_equal(rc, code);
    else
        assert_true(rc == FSC_ERR_FORMAT || rc == FSC_ERR_IO);
    assert_non_null(strstr(fsc_last_error(), needle));
    assert_state_is_file(md->o, fsc_group_rank(md->g), &md->ps, intact);
}

static void save_fresh(const fsc_gpt_config *cfg, const fsc_optim_config *optim, const char *path) {
    model md;
    model_new(&md, cfg, optim, FSC_PARTITION_EVEN, NULL);
    assert_int_equal(fsc_oss_save_optim(md.o, path, fsc_group_size(md.g) - 1), FSC_OK);
    model_free(&md);
}

static void test_state_dict(void **state) {
    (void)state;
    char file[256], big[256], onel[256], sgd[256], cut[256], absent[256];
    snprintf(file, sizeof file, "%s", path_of("adamw.safetensors"));
    snprintf(big, sizeof big, "%s", path_of("big.safetensors"));
    snprintf(onel, sizeof onel, "%s", path_of("onelayer.safetensors"));
    snprintf(sgd, sizeof sgd, "%s", path_of("sgd.safetensors"));
    snprintf(cut, sizeof cut, "%s", path_of("truncated.safetensors"));
    snprintf(absent, sizeof absent, "%s", path_of("absent.safetensors"));
    /* N ranks, GREEDY, 3 steps; run_oss checks the saved file against each
     * rank's own state */
    run_cfg c = {.optim = &EQ_ADAMW, .policy = FSC_PARTITION_GREEDY, .steps = 3, .save = file};
    run_out out;
    run_oss(&c, &out);
    free(out.params);
    fsc_st_file *f = fsc_st_open(file, NULL);
    assert_non_null(f);
    assert_string_equal(fsc_st_metadata(f, "kind"), "AdamW");
    assert_string_equal(fsc_st_metadata(f, "step"), "3");
    assert_non_null(fsc_st_find(f, "optim.exp_avg_sq.h.1.mlp.c_fc.weight"));
    fsc_st_close(f);

    /* the same world size under either policy */
    for (int pol = 0; pol < 2; pol++) {
        model md;
        model_new(&md, &EQ_MODEL, &EQ_ADAMW, (fsc_partition_policy)pol, NULL);
        assert_int_equal(fsc_oss_load_optim(md.o, file), FSC_OK);
        assert_int_equal(fsc_optim_get_step(fsc_oss_local(md.o)), 3);
        assert_state_is_file(md.o, rank, &md.ps, file);
        model_free(&md);
    }
    /* saved under EVEN (tensors split between ranks), SGD with momentum, by
     * the last rank; loaded by a group of one below */
    char even[256];
    snprintf(even, sizeof even, "%s", path_of("sgd_even.safetensors"));
    run_cfg ce = {
        .optim = &EQ_SGD_MOMENTUM, .policy = FSC_PARTITION_EVEN, .steps = 2, .save = even};
    run_oss(&ce, &out);
    free(out.params);
    /* a file that cannot be written: every rank fails, none hangs */
    assert_int_equal(fsc_oss_save_optim(NULL, "x", 0), FSC_ERR_INVALID);
    {
        model md;
        model_new(&md, &EQ_MODEL, &EQ_ADAMW, FSC_PARTITION_EVEN, NULL);
        int rc = fsc_oss_save_optim(md.o, "/nonexistent-dir/state.safetensors", 0);
        fprintf(stderr, "rank %d: unwritable: %s\n", rank, fsc_last_error());
        assert_int_equal(rc, FSC_ERR_IO);
        /* MPI-IO (the default): every rank names the file; one writer: the others say so */
        const char *e = fsc_last_error();
        assert_true(strstr(e, "nonexistent-dir") || (rank != 0 && strstr(e, "another rank")));
        model_free(&md);
    }
    /* a group of one: every rank loads the whole state alone */
    fsc_group *alone;
    assert_int_equal(fsc_group_split(fsc_group_world(), rank, 0, "alone", &alone), FSC_OK);
    model one;
    model_new(&one, &EQ_MODEL, &EQ_ADAMW, FSC_PARTITION_GREEDY, alone);
    assert_int_equal(fsc_oss_load_optim(one.o, file), FSC_OK);
    assert_int_equal(fsc_oss_partition(one.o)->world, 1);
    assert_state_is_file(one.o, 0, &one.ps, file);
    model_free(&one);
    assert_int_equal(fsc_group_split(fsc_group_world(), rank, 0, "alone", &alone), FSC_OK);
    model_new(&one, &EQ_MODEL, &EQ_SGD_MOMENTUM, FSC_PARTITION_EVEN, alone);
    assert_int_equal(fsc_oss_load_optim(one.o, even), FSC_OK);
    assert_int_equal(fsc_optim_get_step(fsc_oss_local(one.o)), 2);
    assert_state_is_file(one.o, 0, &one.ps, even);
    model_free(&one);

    /* refusals: the loaded state stays as it was */
    save_fresh(&BIG_EMBEDDING, &EQ_ADAMW, big);
    fsc_gpt_config one_layer = EQ_MODEL;
    one_layer.layers = 1;
    save_fresh(&one_layer, &EQ_ADAMW, onel);
    save_fresh(&EQ_MODEL, &EQ_SGD_MOMENTUM, sgd);
    if (rank == 0) {
        FILE *fp = fopen(file, "rb");
        assert_non_null(fp);
        fseek(fp, 0, SEEK_END);
        long n = ftell(fp);
        rewind(fp);
        char *bytes = malloc((size_t)n);
        assert_int_equal(fread(bytes, 1, (size_t)n, fp), (size_t)n);
        fclose(fp);
        fp = fopen(cut, "wb");
        assert_non_null(fp);
        assert_int_equal(fwrite(bytes, 1, (size_t)n - 1000, fp), (size_t)n - 1000);
        fclose(fp);
        free(bytes);
    }
    fsc_group_barrier(fsc_group_world());
    model md;
    model_new(&md, &EQ_MODEL, &EQ_ADAMW, FSC_PARTITION_EVEN, NULL);
    assert_int_equal(fsc_oss_load_optim(md.o, file), FSC_OK);
    assert_refused(&md, big, FSC_ERR_SHAPE, "wte.weight", file);
    assert_refused(&md, onel, FSC_ERR_NOT_FOUND, "optim.exp_avg.h.1.", file);
    assert_refused(&md, sgd, FSC_ERR_INVALID, "SGD", file);
    assert_refused(&md, cut, 0, "truncated.safetensors", file);
    assert_refused(&md, absent, FSC_ERR_IO, "absent.safetensors", file);
    assert_int_equal(fsc_optim_get_step(fsc_oss_local(md.o)), 3);
    model_free(&md);
    /* and the other way: SGD momentum refuses the AdamW file, keeps its own */
    model sg;
    model_new(&sg, &EQ_MODEL, &EQ_SGD_MOMENTUM, FSC_PARTITION_GREEDY, NULL);
    assert_int_equal(fsc_oss_load_optim(sg.o, sgd), FSC_OK);
    assert_refused(&sg, file, FSC_ERR_INVALID, "AdamW", sgd);
    model_free(&sg);
}

TT_MAIN("fsc_oss", dir, FSC_TEST_ROW("adamw", test_equivalence, &cases[0]),
        FSC_TEST_ROW("sgd_momentum_accumulation", test_equivalence, &cases[1]),
        FSC_TEST_ROW("adamw_accumulation_clipping", test_equivalence, &cases[2]),
        FSC_TEST_ROW("sgd_clipping", test_equivalence, &cases[3]),
        cmocka_unit_test(test_big_embedding), cmocka_unit_test(test_bf16_share),
        cmocka_unit_test(test_state_memory), cmocka_unit_test(test_tiny_model_and_bad_arguments),
        cmocka_unit_test(test_state_dict))
