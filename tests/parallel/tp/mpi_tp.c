/* Tensor parallelism (fsc/tp.h) over the world as one TP group (t = 1, 2, 4),
 * and at 4 ranks also as two groups of 2, against one process:
 *  - the padding rule of vocabularies not divisible by t;
 *  - vocab-parallel cross-entropy = full cross-entropy (loss and gradients),
 *    V divisible and not, within a bound derived from the one difference
 *    (the order in which the sum of exps is added);
 *  - a column-parallel (gather_output) -> row-parallel (split input) pair =
 *    two Linears, within forward/backward error bounds computed in the test;
 *  - the TP GPT trained 5 steps of AdamW with dropout on, with and without
 *    sequence parallelism, V divisible and not, with clipping biting = one
 *    process on the same global batch, by the noise floor of equivalence.h;
 *    also with the attention probabilities recomputed in backward, and with
 *    the LM head fused with its loss over several chunks of rows (V 200)
 *    and the GELU output recomputed.
 * The fault row "tp:drop-grad" reruns this program with the last rank's
 * share of every TP gradient reduction lost; each GPT comparison must catch
 * it (non-SP: the all-reduce of a column layer's input gradient; SP: the
 * reduction of LayerNorm, row-bias and wpe gradients). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/checkpoint_wrapper.h"
#include "fsc/tp.h"
#include "fsc/weights.h"
#include "mpi_test.h"
#include "tp_test.h"

static int rank, world;
static char dir[64];
static const double U = FLT_EPSILON / 2; /* unit roundoff of f32 */

/* The TP groups of size t over the world (adjacent ranks); *color names this
 * rank's. The world itself when t == world. */
static fsc_group *tp_group(int t, int *color) {
    *color = rank / t;
    if (t == world) return fsc_group_world();
    fsc_group *g = NULL;
    assert_int_equal(fsc_group_split(fsc_group_world(), *color, rank, "tp", &g), FSC_OK);
    return g;
}

static void tp_group_free(fsc_group *g) {
    if (g != fsc_group_world()) fsc_group_free(g);
}

static void test_vocab_range(void **state) {
    (void)state;
    int f, c, p;
    /* V = 67 over 4: 17 rows each, the last holds 16 real and one pad row */
    assert_int_equal(fsc_tp_vocab_range(67, 4, 3, &f, &c, &p), FSC_OK);
    assert_int_equal(f, 51), assert_int_equal(c, 16), assert_int_equal(p, 17);
    /* V = 5 over 4: 2 rows each; rank 3 holds none */
    assert_int_equal(fsc_tp_vocab_range(5, 4, 3, &f, &c, &p), FSC_OK);
    assert_int_equal(c, 0), assert_int_equal(p, 2);
    assert_int_equal(fsc_tp_vocab_range(5, 4, 2, &f, &c, &p), FSC_OK);
    assert_int_equal(f, 4), assert_int_equal(c, 1);
    assert_int_equal(fsc_tp_vocab_range(64, 1, 0, &f, &c, &p), FSC_OK);
    assert_int_equal(c, 64), assert_int_equal(p, 64);
    assert_int_equal(fsc_tp_vocab_range(4, 2, 2, NULL, NULL, NULL), FSC_ERR_INVALID);
}

/* ---- vocab-parallel cross-entropy ------------------------------------------------------ */
static void check_cross_entropy(int V) {
    enum { N = 24, IGNORE = -1 };
    int t = world, first, count, vp;
    assert_int_equal(fsc_tp_vocab_range(V, t, rank, &first, &count, &vp), FSC_OK);
    float *full = malloc(sizeof(float) * N * V), *local = malloc(sizeof(float) * N * vp);
    int32_t y[N];
    for (int i = 0; i < N; i++) {
        y[i] = i % 7 == 3 ? IGNORE : (i * 13 + 5) % V;
        for (int v = 0; v < V; v++) full[i * V + v] = 3.f * sinf(0.37f * (float)(i * V + v));
        for (int v = 0; v < vp; v++) /* padding holds garbage: it must not count */
            local[i * vp + v] = v < count ? full[i * V + first + v] : 1e30f;
    }
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_tensor lf = fsc_tensor_2d(full, FSC_DTYPE_F32, N, V),
               tg = fsc_tensor_1d(y, FSC_DTYPE_I32, N);
    fsc_tensor ll = fsc_tensor_2d(local, FSC_DTYPE_F32, N, vp);
    /* per-row loss terms in double, for the bound */
    double terms = 0, norm = 40.0;
    for (int i = 0; i < N; i++) {
        if (y[i] == IGNORE) continue;
        double m = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) m = fmax(m, full[i * V + v]);
        for (int v = 0; v < V; v++) s += exp(full[i * V + v] - m);
        terms += fabs(log(s)) + fabs(full[i * V + y[i]] - m);
    }
    float ref, got;
    assert_int_equal(fsc_cross_entropy(&ref, &lf, &tg, IGNORE, norm, arena), FSC_OK);
    assert_int_equal(
        fsc_tp_cross_entropy(&got, &ll, &tg, V, IGNORE, norm, fsc_group_world(), arena), FSC_OK);
    /* The exps are the same floats (same max, same fsc_fast_expf); only the
     * order of their sum S differs: each order is within (V-1)u S of the exact
     * sum, so |dS|/S <= 2(V-1)u, and log S moves by at most that; add 4u of
     * each row's terms for the rounding of log and the subtractions. */
    const int rows = N - (N + 3) / 7;
    double bound = (rows * 2.0 * (V - 1) * U + 4 * U * terms) / norm + 4 * U * fabs(ref);
    fprintf(stderr, "tp cross-entropy V %d over %d: loss %.9g vs %.9g (bound %.2e)\n", V, t, got,
            ref, bound);
    assert_true(fabs(got - ref) <= bound);
    float all = got; /* the same loss on every rank */
    assert_int_equal(fsc_group_allreduce(fsc_group_world(), &all, 1, FSC_DTYPE_F32, FSC_REDUCE_MAX),
                     FSC_OK);
    assert_true(all == got);
    /* gradient: p = e * (scale / S), minus scale at the target; relative
     * error of p at most 2(V-1)u + 4u (S, and two roundings on each side) */
    const double scale = 1.0 / norm;
    for (int i = 0; i < N; i++)
        for (int v = 0; v < vp; v++) {
            float g = local[i * vp + v];
            if (v >= count || y[i] == IGNORE) {
                assert_true(g == 0.f); /* padding and ignored rows: exactly zero */
                continue;
            }
            float r = full[i * V + first + v];
            double p = r + (first + v == y[i] ? scale : 0.0);
            double b = (2.0 * (V - 1) + 4) * U * fabs(p) + 2 * U * fabs(r) + 1e-30;
            if (fabs((double)g - r) > b)
                fail_msg("V %d row %d col %d: %.9g vs %.9g (bound %.2e)", V, i, first + v, g, r, b);
        }
    fsc_arena_free(arena);
    free(full), free(local);
}

static void test_cross_entropy(void **state) {
    (void)state;
    check_cross_entropy(64);
    check_cross_entropy(67);                /* not divisible by 2 or 4: a padded last rank */
    if (world == 4) check_cross_entropy(5); /* a rank without real rows */
}

/* ---- column(gather_output) -> row(split input) = two Linears ---------------------------- */
enum { LN = 6, LIN = 8, LHID = 16, LOUT = 8 };

/* |A| |B| and error-bound helpers on row-major matrices: out (n,m) = a (n,k) b (k,m). */
static void absmm(double *out, const double *a, const double *b, int n, int k, int m) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int l = 0; l < k; l++) s += fabs(a[i * k + l]) * fabs(b[l * m + j]);
            out[i * m + j] = s;
        }
}

/* A weight gradient of the pair, a^T b over the LN rows, a (LN x R) exact
 * and b (LN x LHID, magnitudes mb) within eb: this rank's h columns got
 * (R x h) against the one-process gradient ref (R x LHID) within sum_n |a|
 * (eb + 2 LN u mb). */
static void expect_weight_grad(const char *what, const float *ref, const float *got,
                               const double *a, int R, const double *mb, const double *eb, int h) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < h; j++) {
            const int k = rank * h + j;
            double b = 0;
            for (int n = 0; n < LN; n++)
                b += fabs(a[n * R + r]) * (eb[n * LHID + k] + 2 * LN * U * mb[n * LHID + k]);
            if (fabs((double)ref[r * LHID + k] - got[r * h + j]) > b + 1e-30)
                fail_msg("%s[%d,%d] %.9g vs %.9g", what, r, k, got[r * h + j], ref[r * LHID + k]);
        }
}

static void test_column_row_pair(void **state) {
    (void)state;
    if (fsc_fault_active != FSC_FAULT_NONE) skip(); /* compared without eq_compare */
    const int t = world;
    fsc_tp_options opt = {.group = fsc_group_world()};
    fsc_module *ref_parts[2] = {fsc_linear_new("fc", LIN, LHID, true, FSC_WEIGHT_IN_OUT, 0.5f),
                                fsc_linear_new("proj", LHID, LOUT, true, FSC_WEIGHT_OUT_IN, 0.5f)};
    fsc_module *tp_parts[2] = {
        fsc_tp_column_linear_new("fc", LIN, LHID, true, FSC_WEIGHT_IN_OUT, 0.5f, true, &opt),
        fsc_tp_row_linear_new("proj", LHID, LOUT, true, FSC_WEIGHT_OUT_IN, 0.5f, false, &opt)};
    fsc_module *ref = fsc_sequential_new("net", 2, ref_parts);
    fsc_module *tp = fsc_sequential_new("net", 2, tp_parts);
    assert_non_null(ref), assert_non_null(tp);
    fsc_params pr, pt;
    assert_int_equal(fsc_params_bind(ref, 3, true, &pr), FSC_OK);
    assert_int_equal(fsc_tp_params_bind(tp, 3, true, &pt), FSC_OK);
    float *W1 = pr.entries[0].param->data, *W2 = pr.entries[2].param->data;
    float *w1 = pt.entries[0].param->data, *w2 = pt.entries[2].param->data;
    const int h = LHID / t; /* fc: (LIN, LHID) split on columns; proj: (LOUT, LHID) likewise */
    for (int i = 0; i < LIN; i++)
        for (int j = 0; j < h; j++) assert_true(w1[i * h + j] == W1[i * LHID + rank * h + j]);
    for (int o = 0; o < LOUT; o++)
        for (int j = 0; j < h; j++) assert_true(w2[o * h + j] == W2[o * LHID + rank * h + j]);
    for (int k = 0; k < LHID; k++) pr.entries[1].param->data[k] = 0.1f * (float)k; /* fc.bias */
    for (int k = 0; k < h; k++) pt.entries[1].param->data[k] = 0.1f * (float)(rank * h + k);
    for (int o = 0; o < LOUT; o++) /* proj.bias: whole on every rank */
        pr.entries[3].param->data[o] = pt.entries[3].param->data[o] = -0.05f * (float)o;
    float xd[LN * LIN], dyd[LN * LOUT];
    for (int i = 0; i < LN * LIN; i++) xd[i] = cosf(0.7f * (float)i);
    for (int i = 0; i < LN * LOUT; i++) dyd[i] = sinf(0.3f * (float)i);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true};
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, LN, LIN),
               dy = fsc_tensor_2d(dyd, FSC_DTYPE_F32, LN, LOUT);
    fsc_tensor yr, yt, dxr, dxt;
    void *sr, *st;
    fsc_params_zero_grad(&pr), fsc_params_zero_grad(&pt);
    assert_int_equal(fsc_module_forward(ref, &ctx, &x, &yr, &sr), FSC_OK);
    assert_int_equal(fsc_module_forward(tp, &ctx, &x, &yt, &st), FSC_OK);
    assert_int_equal(fsc_module_backward(ref, &ctx, sr, &dy, &dxr), FSC_OK);
    assert_int_equal(fsc_module_backward(tp, &ctx, st, &dy, &dxt), FSC_OK);
    /* Forward error bounds, both sides: h = x W1 + b1 is computed alike
     * (each output from one dot of LIN terms: |dh| <= 2 LIN u |x||W1| + 2u|b1|);
     * y = h W2^T + b2 adds the row split (|dy| <= |dh||W2|^T + 2(LHID+1)u
     * (|h||W2|^T + |b2|)). Backward likewise, from dy exact on both sides. */
    double X[LN * LIN], A1[LIN * LHID], A2t[LHID * LOUT], H[LN * LHID], eH[LN * LHID];
    double DY[LN * LOUT], A2[LOUT * LHID], DH[LN * LHID], eDH[LN * LHID], A1t[LHID * LIN];
    for (int i = 0; i < LN * LIN; i++) X[i] = xd[i];
    for (int i = 0; i < LIN * LHID; i++) A1[i] = W1[i];
    for (int o = 0; o < LOUT; o++)
        for (int k = 0; k < LHID; k++) A2t[k * LOUT + o] = A2[o * LHID + k] = W2[o * LHID + k];
    for (int i = 0; i < LIN; i++)
        for (int k = 0; k < LHID; k++) A1t[k * LIN + i] = W1[i * LHID + k];
    for (int i = 0; i < LN * LOUT; i++) DY[i] = dyd[i];
    absmm(H, X, A1, LN, LIN, LHID);
    for (int i = 0; i < LN * LHID; i++)
        eH[i] = 2 * LIN * U * H[i] + 2 * U * 0.1 * LHID, H[i] += 0.1 * LHID;
    double eY[LN * LOUT], hy[LN * LOUT];
    absmm(eY, eH, A2t, LN, LHID, LOUT);
    absmm(hy, H, A2t, LN, LHID, LOUT);
    const float *y1 = yr.data, *y2 = yt.data;
    for (int i = 0; i < LN * LOUT; i++) {
        double b = eY[i] + 2 * (LHID + 1) * U * (hy[i] + 0.05 * LOUT);
        if (fabs((double)y1[i] - y2[i]) > b)
            fail_msg("y[%d] %.9g vs %.9g (bound %.2e)", i, y2[i], y1[i], b);
    }
    absmm(DH, DY, A2, LN, LOUT, LHID); /* |dy||W2| */
    for (int i = 0; i < LN * LHID; i++) eDH[i] = 2 * LOUT * U * DH[i];
    double eDX[LN * LIN], dxa[LN * LIN];
    absmm(eDX, eDH, A1t, LN, LHID, LIN);
    absmm(dxa, DH, A1t, LN, LHID, LIN);
    const float *d1 = dxr.data, *d2 = dxt.data;
    for (int i = 0; i < LN * LIN; i++) {
        double b = eDX[i] + 2 * LHID * U * dxa[i] + 1e-30;
        if (fabs((double)d1[i] - d2[i]) > b)
            fail_msg("dx[%d] %.9g vs %.9g (bound %.2e)", i, d2[i], d1[i], b);
    }
    /* dW2 = dy^T h: same rows, h within eH; dW1 = x^T dh: dh within eDH */
    expect_weight_grad("dW2", pr.entries[2].param->grad, pt.entries[2].param->grad, DY, LOUT, H, eH,
                       h);
    expect_weight_grad("dW1", pr.entries[0].param->grad, pt.entries[0].param->grad, X, LIN, DH, eDH,
                       h);
    /* proj.bias: sum of dy rows, the same order on both sides: bitwise */
    assert_memory_equal(pr.entries[3].param->grad, pt.entries[3].param->grad, LOUT * sizeof(float));
    fsc_arena_free(arena);
    fsc_params_free(&pr), fsc_params_free(&pt);
    fsc_module_free(ref), fsc_module_free(tp);
}

/* ---- the TP GPT against one process ------------------------------------------------------- */
typedef struct {
    fsc_gpt_config model;
    bool sp;
    float max_norm;
    bool checkpoint;    /* the blocks activation-checkpointed */
    bool recompute;     /* fsc_tp_options.recompute_attention */
    bool recompute_act; /* fsc_tp_options.recompute_activation */
} gpt_run;

/* The whole model's parameters as the file at path holds them, in the
 * one-process flat layout (caller frees). */
static float *read_whole(const fsc_gpt_config *cfg, const char *path, int64_t *numel) {
    float *out = eq_read_weights(cfg, path, numel);
    if (!out) fail_msg("rank %d: %s: %s", rank, path, fsc_last_error());
    return out;
}

/* Trains EQ_STEPS steps on the whole global batch with TP size t; returns the
 * parameters as saved by global name. */
static float *run_tp(const gpt_run *c, int t, int64_t *numel) {
    int color;
    fsc_group *g = tp_group(t, &color);
    fsc_tp_options opt = {.group = g,
                          .sequence_parallel = c->sp,
                          .recompute_attention = c->recompute,
                          .recompute_activation = c->recompute_act};
    fsc_module *m = fsc_tp_gpt_new(&c->model, &opt);
    if (!m) fail_msg("fsc_tp_gpt_new: %s", fsc_last_error());
    if (c->checkpoint)
        for (int i = 0; i < m->nchildren; i++)
            if (strncmp(m->children[i]->name, "h.", 2) == 0)
                assert_int_equal(fsc_checkpoint_wrap(m->children[i]), FSC_OK);
    fsc_params ps;
    assert_int_equal(fsc_tp_params_bind(m, 5, true, &ps), FSC_OK);
    float first_norm = 0;
    char path[128];
    snprintf(path, sizeof path, "%s/tp%d_%d.safetensors", dir, t, color);
    tp_test_train_save(m, &ps, g, c->model.seq, c->max_norm, &first_norm, path);
    if (c->max_norm > 0) assert_true(first_norm > c->max_norm); /* the clip bites */
    float *out = read_whole(&c->model, path, numel);
    assert_int_equal(fsc_group_barrier(g), FSC_OK); /* read before the next run rewrites it */
    fsc_params_free(&ps);
    fsc_module_free(m);
    tp_group_free(g);
    return out;
}

static void expect_one_process(const gpt_run *runs, int n) {
    int64_t ref_n;
    const int sizes[2] = {world, 2}, nsizes = world == 4 ? 2 : 1; /* 4 ranks: also 2 x tp 2 */
    /* the floor also sums as TP groups of these sizes do */
    float *ref = eq_reference_ex(&(eq_options){.model = &runs[0].model,
                                               .max_norm = runs[0].max_norm,
                                               .tp = {sizes[0], nsizes > 1 ? sizes[1] : 0}},
                                 &ref_n);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < nsizes; k++) {
            const int t = sizes[k];
            int64_t numel;
            float *got = run_tp(&runs[i], t, &numel);
            assert_int_equal(numel, ref_n);
            char label[160];
            snprintf(label, sizeof label, "TP %d%s, V %d%s%s%s%s, rank %d", t,
                     runs[i].sp ? " + SP" : "", runs[i].model.vocab,
                     runs[i].max_norm > 0 ? ", clipped" : "", runs[i].checkpoint ? ", ckpt" : "",
                     runs[i].recompute ? ", recompute" : "",
                     runs[i].recompute_act ? ", GELU recomputed" : "", rank);
            assert_int_equal(eq_compare(label, got, ref, ref_n), 0);
            free(got);
        }
    free(ref);
}

static void test_gpt_equals_one_process(void **state) {
    (void)state;
    gpt_run runs[3] = {{.model = EQ_MODEL},
                       {.model = EQ_MODEL, .sp = true},
                       {.model = EQ_MODEL, .sp = true, .recompute = true}};
    expect_one_process(runs, 3);
}

static void test_gpt_padded_vocab(void **state) {
    (void)state;
    fsc_gpt_config v67 = EQ_MODEL;
    v67.vocab = 67; /* ceil(67/t) rows per rank; the last holds padding */
    gpt_run runs[2] = {{.model = v67}, {.model = v67, .sp = true, .checkpoint = true}};
    expect_one_process(runs, 2);
}

/* V 200 over C 32 and 128 rows: the fused head runs 4 chunks of 32 rows at
 * t = 1, 40 + 40 + 40 + 8 at t = 2 (100 rows of the vocabulary each) and
 * 81 + 47 at t = 4: chunk boundaries, a short last chunk and padding-free
 * shards, with and without SP, the GELU output recomputed too. */
static void test_gpt_chunked_head(void **state) {
    (void)state;
    fsc_gpt_config v200 = EQ_MODEL;
    v200.vocab = 200;
    gpt_run runs[3] = {{.model = v200},
                       {.model = v200, .sp = true},
                       {.model = v200, .sp = true, .recompute = true, .recompute_act = true}};
    expect_one_process(runs, 3);
}

static void test_gpt_clipped(void **state) {
    (void)state;
    gpt_run runs[2] = {{.model = EQ_MODEL, .max_norm = 0.2f},
                       {.model = EQ_MODEL, .sp = true, .max_norm = 0.2f}};
    expect_one_process(runs, 2);
}

MPI_EQ_MAIN_IN_SCRATCH("fsc_tp", dir, cmocka_unit_test(test_vocab_range),
                       cmocka_unit_test(test_cross_entropy), cmocka_unit_test(test_column_row_pair),
                       cmocka_unit_test(test_gpt_equals_one_process),
                       cmocka_unit_test(test_gpt_padded_vocab), cmocka_unit_test(test_gpt_clipped),
                       cmocka_unit_test(test_gpt_chunked_head))
