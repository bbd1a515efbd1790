/* Pipeline stages that end inside a transformer block (between its
 * attention and MLP halves, fsc_gpt_stage_parts_new): under 1F1B, zero-bubble
 * H1 (backward split into B and W), interleaved 1F1B and with activation
 * checkpointing, dropout on, the parameters equal one process's on the same
 * global batch within the noise floor of tests/equivalence.h; a checkpoint
 * written at a half-block cut resumes at another cut and without a
 * pipeline; a half has exactly its block's names; cuts inside the
 * embedding or head, and balances that do not add up, are refused by value. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/pipe.h"
#include "fsc/trainer.h"
#include "mpi_test.h"

static int rank, world;
static char dir[64];

static fsc_module *make_parts(void *user, int first, int end) {
    return fsc_gpt_stage_parts_new(user, first, end);
}

/* Stage sizes in half layers (3 = 1.5 layers) -> parts per stage. */
static void to_parts(const int *halves, int S, int *parts) {
    fsc_gpt_config cfg = EQ_MODEL;
    int cut = 0, prev = 0;
    for (int s = 0; s < S; s++) {
        int part;
        cut += halves[s];
        if (fsc_gpt_part_of_cut(&cfg, cut, &part)) fail_msg("%s", fsc_last_error());
        parts[s] = part - prev, prev = part;
    }
}

typedef struct {
    fsc_tokens tk;
    int64_t step;
    int B, m, T;
    int32_t x[64 * 16], y[64 * 16];
    double norm;
} data;

static int input(void *user, int micro, fsc_tensor *x) {
    data *d = user;
    int32_t *xs = d->x + (size_t)micro * d->B * d->T, *ys = d->y + (size_t)micro * d->B * d->T;
    int rc = fsc_tokens_batch(&d->tk, d->step, micro, 0, d->B, d->m, 1, d->T, xs, ys);
    *x = fsc_tensor_2d(xs, FSC_DTYPE_I32, d->B, d->T);
    return rc;
}

static int loss(void *user, int micro, fsc_tensor *y, fsc_arena *arena, float *out) {
    data *d = user;
    int32_t *xs = d->x + (size_t)micro * d->B * d->T, *ys = d->y + (size_t)micro * d->B * d->T;
    int rc = fsc_tokens_batch(&d->tk, d->step, micro, 0, d->B, d->m, 1, d->T, xs, ys);
    fsc_tensor t = fsc_tensor_2d(ys, FSC_DTYPE_I32, d->B, d->T);
    return rc ? rc : fsc_cross_entropy(out, y, &t, -1, d->norm, arena);
}

static int64_t sample0(void *user, int micro) {
    data *d = user;
    return fsc_batch_first_sample(d->step, micro, 0, d->B, d->m, 1);
}

/* Trains EQ_STEPS steps of the EQ model at `halves` per stage (ranks x
 * chunks stages) and returns the whole model's parameters as saved. */
static float *run_half(fsc_pipe_kind kind, int chunks, const int *halves, fsc_pipe_checkpoint ck,
                       int64_t *numel) {
    const int m = 4, B = 2;
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(kind, world, chunks, m, &sched), FSC_OK);
    fsc_gpt_config cfg = EQ_MODEL;
    int parts[8];
    to_parts(halves, world * chunks, parts);
    fsc_pipe_options opt = {.layers = fsc_gpt_num_parts(&cfg),
                            .make_stage = make_parts,
                            .stage_user = &cfg,
                            .balance = parts,
                            .act_ndim = 3,
                            .act_shape = {B, cfg.seq, cfg.d_model},
                            .seed = 5,
                            .checkpoint = ck};
    fsc_pipe *p = fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, &opt);
    if (!p) fail_msg("fsc_pipe_new: %s", fsc_last_error());
    data *d = calloc(1, sizeof *d);
    eq_tokens(&d->tk);
    d->B = B, d->m = m, d->T = cfg.seq, d->norm = (double)B * m * cfg.seq;
    fsc_pipe_io io = {.input = input, .loss = loss, .sample0 = sample0, .user = d};
    for (int s = 0; s < EQ_STEPS; s++) {
        d->step = s;
        fsc_ctx ctx = {.training = true, .seed = 5, .step = s};
        float l;
        fsc_pipe_zero_grad(p);
        if (fsc_pipe_run(p, &ctx, &io, &l)) fail_msg("rank %d: %s", rank, fsc_last_error());
        assert_int_equal(fsc_pipe_step(p), FSC_OK);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/half.safetensors", dir);
    assert_int_equal(fsc_pipe_save_weights(p, path, 0, 0, NULL, NULL), FSC_OK);
    float *out = eq_read_weights(&cfg, path, numel);
    if (!out) fail_msg("rank %d: %s: %s", rank, path, fsc_last_error());
    fsc_tokens_free(&d->tk);
    free(d);
    fsc_pipe_free(p);
    fsc_pipe_schedule_free(sched);
    fsc_group_barrier(fsc_group_world()); /* everyone read the file before the next run */
    return out;
}

static void expect_one_process(const char *what, float *got, int64_t numel, int global_batch) {
    int64_t n;
    float *ref = eq_reference_ex(&(eq_options){.global_batch = global_batch}, &n);
    assert_int_equal(n, numel);
    char label[160];
    snprintf(label, sizeof label, "%s, %d ranks, rank %d", what, world, rank);
    assert_int_equal(eq_compare(label, got, ref, n), 0);
    free(ref), free(got);
}

/* 2 ranks: 1.5 | 2.5 and 2.5 | 1.5 (each rank a block cut in two); 4 ranks:
 * 1.5 | 0.5 | 1 | 1 (a stage of h.0's MLP half alone). */
static void test_half_cuts(void **state) {
    (void)state;
    static const int two[2][2] = {{3, 5}, {5, 3}}, four[4] = {3, 1, 2, 2};
    int64_t n;
    if (world == 2) {
        for (int c = 0; c < 2; c++) {
            float *got = run_half(FSC_PIPE_1F1B, 1, two[c], FSC_PIPE_CKPT_NEVER, &n);
            expect_one_process(c ? "1f1b at 2.5,1.5" : "1f1b at 1.5,2.5", got, n, 8);
            got = run_half(FSC_PIPE_ZB_H1, 1, two[c], FSC_PIPE_CKPT_NEVER, &n);
            expect_one_process(c ? "zb1 at 2.5,1.5" : "zb1 at 1.5,2.5", got, n, 8);
        }
        /* interleaved: rank 0 runs the embedding with h.0's attention half, and h.1 */
        float *got = run_half(FSC_PIPE_INTERLEAVED, 2, four, FSC_PIPE_CKPT_NEVER, &n);
        expect_one_process("interleaved at 1.5,0.5,1,1", got, n, 8);
    } else if (world == 4) {
        float *got = run_half(FSC_PIPE_1F1B, 1, four, FSC_PIPE_CKPT_NEVER, &n);
        expect_one_process("1f1b at 1.5,0.5,1,1", got, n, 8);
        got = run_half(FSC_PIPE_ZB_H1, 1, four, FSC_PIPE_CKPT_NEVER, &n);
        expect_one_process("zb1 at 1.5,0.5,1,1", got, n, 8);
    } else {
        skip();
    }
}

/* Recomputing the halves in backward changes nothing, bit for bit. */
static void test_half_checkpoint(void **state) {
    (void)state;
    static const int two[2] = {3, 5}, four[4] = {3, 1, 2, 2};
    if (world != 2 && world != 4) skip();
    const int *b = world == 2 ? two : four;
    int64_t n, n2;
    float *plain = run_half(FSC_PIPE_1F1B, 1, b, FSC_PIPE_CKPT_NEVER, &n);
    float *ck = run_half(FSC_PIPE_1F1B, 1, b, FSC_PIPE_CKPT_ALWAYS, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(plain, ck, sizeof(float) * (size_t)n);
    free(plain), free(ck);
}

/* The parts carry exactly the names of the layers they cut. */
static void expect_names(int first, int end, const char *const *names, int count) {
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_module *m = fsc_gpt_stage_parts_new(&cfg, first, end);
    if (!m) fail_msg("%s", fsc_last_error());
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 5, false, &ps), FSC_OK);
    assert_int_equal(ps.count, count);
    for (int i = 0; i < count; i++) assert_string_equal(ps.entries[i].name, names[i]);
    fsc_params_free(&ps);
    fsc_module_free(m);
}

static void expect_refused(int halves, const char *needle) {
    fsc_gpt_config cfg = EQ_MODEL;
    int part = -1;
    assert_int_equal(fsc_gpt_part_of_cut(&cfg, halves, &part), FSC_ERR_INVALID);
    if (!strstr(fsc_last_error(), needle))
        fail_msg("cut at %d halves: \"%s\" lacks \"%s\"", halves, fsc_last_error(), needle);
}

static void test_names_and_refusals(void **state) {
    (void)state;
    static const char *const attn0[] = {"wte.weight",
                                        "wpe.weight",
                                        "h.0.ln_1.weight",
                                        "h.0.ln_1.bias",
                                        "h.0.attn.c_attn.weight",
                                        "h.0.attn.c_attn.bias",
                                        "h.0.attn.c_proj.weight",
                                        "h.0.attn.c_proj.bias"};
    static const char *const mlp1[] = {"h.1.ln_2.weight",       "h.1.ln_2.bias",
                                       "h.1.mlp.c_fc.weight",   "h.1.mlp.c_fc.bias",
                                       "h.1.mlp.c_proj.weight", "h.1.mlp.c_proj.bias"};
    expect_names(0, 2, attn0, 8);
    expect_names(4, 5, mlp1, 6);
    /* whole layers map onto parts: layers [1, 3) are parts [1, 5) */
    fsc_gpt_config cfg = EQ_MODEL;
    fsc_module *a = fsc_gpt_stage_new(&cfg, 1, 3), *b = fsc_gpt_stage_parts_new(&cfg, 1, 5);
    assert_non_null(a), assert_non_null(b);
    fsc_params pa, pb;
    assert_int_equal(fsc_params_bind(a, 5, false, &pa), FSC_OK);
    assert_int_equal(fsc_params_bind(b, 5, false, &pb), FSC_OK);
    assert_int_equal(pa.count, pb.count);
    assert_int_equal(pa.count, 24);
    for (int i = 0; i < pa.count; i++) assert_string_equal(pa.entries[i].name, pb.entries[i].name);
    assert_memory_equal(pa.data, pb.data, sizeof(float) * (size_t)pa.numel);
    fsc_params_free(&pa), fsc_params_free(&pb);
    fsc_module_free(a), fsc_module_free(b);
    for (int h = 0, part; h <= 8; h++) /* and back */
        if (h != 1 && h != 7) {
            assert_int_equal(fsc_gpt_part_of_cut(&cfg, h, &part), FSC_OK);
            assert_int_equal(fsc_gpt_cut_of_part(&cfg, part), h);
        }
    expect_refused(1, "0.5 layers falls inside the embedding");
    expect_refused(7, "3.5 layers falls inside the head");
    expect_refused(9, "4.5 layers is outside [0, 4]");
    expect_refused(-2, "-1 layers is outside");
    assert_null(fsc_gpt_stage_parts_new(&cfg, 3, 7));
    assert_non_null(strstr(fsc_last_error(), "parts [3, 7) outside [0, 6)"));
    if (world != 2) return;
    /* parts that do not add up to the model's: refused by the pipe */
    fsc_pipe_schedule *sched;
    assert_int_equal(fsc_pipe_schedule_make(FSC_PIPE_1F1B, 2, 1, 2, &sched), FSC_OK);
    const int bad[2] = {2, 3};
    fsc_pipe_options opt = {.layers = fsc_gpt_num_parts(&cfg),
                            .make_stage = make_parts,
                            .stage_user = &cfg,
                            .balance = bad,
                            .act_ndim = 3,
                            .act_shape = {2, cfg.seq, cfg.d_model}};
    assert_null(fsc_pipe_new(fsc_group_world(), sched, &EQ_ADAMW, &opt));
    assert_non_null(strstr(fsc_last_error(), "hold 5 layers, the model has 6"));
    fsc_pipe_schedule_free(sched);
}

/* ---- through the trainer: a checkpoint at a half-block cut resumes elsewhere ---------- */

typedef struct {
    fsc_tokens tk;
    int T;
    int32_t x[64 * 16], y[64 * 16], ids[64 * 16];
} tdata;

static int t_load(const fsc_micro_batch *mb, void *user) {
    tdata *d = user;
    return fsc_tokens_batch(&d->tk, mb->step, mb->micro, mb->rank, mb->batch, mb->micros, mb->world,
                            d->T, d->x, d->y);
}

static int t_input(const fsc_micro_batch *mb, void *user, fsc_tensor *x) {
    tdata *d = user; /* stage 0 keeps every micro-batch's ids until its backward */
    int32_t *ids = d->ids + (size_t)mb->micro * mb->batch * d->T;
    memcpy(ids, d->x, sizeof *ids * (size_t)mb->batch * d->T);
    *x = fsc_tensor_2d(ids, FSC_DTYPE_I32, mb->batch, d->T);
    return FSC_OK;
}

static int t_loss(const fsc_micro_batch *mb, void *user, fsc_tensor *y, fsc_arena *arena,
                  float *out) {
    tdata *d = user;
    fsc_tensor t = fsc_tensor_2d(d->y, FSC_DTYPE_I32, mb->batch, d->T);
    return fsc_cross_entropy(out, y, &t, -1, mb->norm, arena);
}

static int t_gpt_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                      float *loss) {
    tdata *d = user;
    return fsc_gpt_train_micro(m, ctx, d->x + (size_t)mb->row0 * d->T,
                               d->y + (size_t)mb->row0 * d->T, mb->rows, d->T, -1, mb->norm, loss);
}

/* EQ_STEPS steps of ddp (x pp 2 at `halves` when given; else one stage per
 * replica), resuming from `resume` and stopping at save_at with a
 * checkpoint in <dir>/ckpt when set; returns the saved weights. */
static float *train(const int *halves, int save_at, bool resume, int64_t *numel) {
    fsc_gpt_config cfg = EQ_MODEL;
    const int pp = halves ? 2 : 1, m = 2, dp = world / pp, B = EQ_GLOBAL_BATCH / (dp * m);
    tdata *d = calloc(1, sizeof *d);
    eq_tokens(&d->tk);
    d->T = cfg.seq;
    int parts[2];
    fsc_trainer_config tc = {.strategy = {.name = "ddp", .seed = 5},
                             .optim = EQ_ADAMW,
                             .batch = B,
                             .grad_accum = m,
                             .targets_per_sample = cfg.seq,
                             .load = t_load,
                             .loss = t_gpt_loss,
                             .pipe_input = t_input,
                             .pipe_loss = t_loss,
                             .user = d};
    if (halves) {
        to_parts(halves, 2, parts);
        tc.strategy.pipe = (fsc_pipe_strategy_options){.stages = 2,
                                                       .schedule = FSC_PIPE_1F1B,
                                                       .layers = fsc_gpt_num_parts(&cfg),
                                                       .make_stage = make_parts,
                                                       .stage_user = &cfg,
                                                       .balance = parts,
                                                       .act_ndim = 3,
                                                       .act_shape = {B, cfg.seq, cfg.d_model}};
    }
    fsc_module *model = halves ? NULL : fsc_gpt_new(&cfg);
    fsc_trainer *t = fsc_trainer_new(model, &tc);
    if (!t) fail_msg("%s", fsc_last_error());
    char ckpt[96], path[128];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    if (resume && fsc_trainer_resume(t, ckpt, 0, NULL, NULL))
        fail_msg("rank %d: resume: %s", rank, fsc_last_error());
    for (int64_t s = fsc_trainer_get_step(t); s < EQ_STEPS; s++) {
        fsc_step_result r;
        if (fsc_trainer_step(t, &r)) fail_msg("rank %d: %s", rank, fsc_last_error());
        if (save_at && fsc_trainer_get_step(t) == save_at) {
            if (fsc_trainer_save_checkpoint(t, ckpt, 0, NULL, NULL))
                fail_msg("rank %d: checkpoint: %s", rank, fsc_last_error());
            break;
        }
    }
    snprintf(path, sizeof path, "%s/trainer.safetensors", dir);
    assert_int_equal(fsc_trainer_save_weights(t, path, 0, NULL, NULL), FSC_OK);
    fsc_trainer_free(t);
    fsc_module_free(model);
    float *out = eq_read_weights(&cfg, path, numel);
    if (!out) fail_msg("rank %d: %s: %s", rank, path, fsc_last_error());
    fsc_tokens_free(&d->tk);
    free(d);
    fsc_group_barrier(fsc_group_world()); /* every rank read the file */
    return out;
}

static void test_half_checkpoint_resumes(void **state) {
    (void)state;
    if (world % 2) skip();
    static const int at_1_5[2] = {3, 5}, at_2_5[2] = {5, 3};
    int64_t n;
    float *got = train(at_1_5, 0, false, &n);
    expect_one_process("trainer ddp x pp 2 at 1.5,2.5", got, n, EQ_GLOBAL_BATCH);
    free(train(at_1_5, 2, false, &n));
    got = train(at_2_5, 0, true, &n);
    expect_one_process("1.5,2.5 -> checkpoint -> 2.5,1.5", got, n, EQ_GLOBAL_BATCH);
    got = train(NULL, 0, true, &n);
    expect_one_process("1.5,2.5 -> checkpoint -> pp 1", got, n, EQ_GLOBAL_BATCH);
}

static int setup_dir(void **state) {
    (void)state;
    return mpi_scratch_dir(dir, "fsc_pipe_half");
}

static int teardown_dir(void **state) {
    (void)state;
    return mpi_scratch_dir_remove(dir);
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) return 1;
    rank = fsc_dist_rank(), world = fsc_dist_size();
    eq_fault_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_refusals),
        cmocka_unit_test(test_half_cuts),
        cmocka_unit_test(test_half_checkpoint),
        cmocka_unit_test(test_half_checkpoint_resumes),
    };
    return mpi_test_finish(cmocka_run_group_tests(tests, setup_dir, teardown_dir));
}
