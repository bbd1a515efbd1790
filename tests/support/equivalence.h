/* Shared by the data-parallel equivalence tests: a tiny GPT, deterministic
 * token data, a single-process reference run on the global batch, and a
 * parameter comparison with a stated tolerance. */
#ifndef FSC_TEST_EQUIVALENCE_H
#define FSC_TEST_EQUIVALENCE_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/lora.h"
#include "fsc/optim.h"
#include "fsc/weights.h"

static const fsc_gpt_config EQ_MODEL = {
    .vocab = 64, .seq = 16, .layers = 2, .d_model = 32, .heads = 4, .dropout = 0.1f};
/* The LLaMA the parallel tests share: 8 query heads on 4 key/value heads
 * (head_dim 4), so that tensor-parallel sizes 1, 2 and 4 split both and each
 * rank's query heads share its own key/value heads. */
static const fsc_gpt_config EQ_LLAMA = {.arch = FSC_ARCH_LLAMA,
                                        .vocab = 64,
                                        .seq = 16,
                                        .layers = 2,
                                        .d_model = 32,
                                        .heads = 8,
                                        .kv_heads = 4,
                                        .ffn_hidden = 64};
/* The LLaMA the Mixtral (MoE) tests put their MoE layers into (each sets
 * .moe): 4 query heads on 2 key/value heads, dense MLPs and experts 48 wide. */
static const fsc_gpt_config EQ_LLAMA_MOE = {.arch = FSC_ARCH_LLAMA,
                                            .vocab = 64,
                                            .seq = 16,
                                            .layers = 2,
                                            .d_model = 32,
                                            .heads = 4,
                                            .kv_heads = 2,
                                            .ffn_hidden = 48};
enum { EQ_GLOBAL_BATCH = 8, EQ_STEPS = 5 };
/* Tolerance from a measured noise floor, not from one CPU's rounding. Any
 * layout sums each gradient in some legal order; the reference is computed in
 * four such orders (the global batch as one micro-batch, as 2 micro-batches
 * accumulated, as 4 in reverse, as 3), and the spread between them is
 * this element's noise: what the BLAS kernels, the optimizer and 5 steps of
 * training make of rounding differences. Adam turns rounding noise into steps
 * of up to ~lr wherever the second moment is tiny (c_attn's key bias, whose
 * gradient is zero in exact arithmetic; rows of a large vocabulary that see
 * few tokens), and the spread measures exactly that, element by element, so
 * nothing is special-cased. Noise is heavy-tailed (two orders may agree on an
 * element, or a whole row, by chance), so each element takes the largest
 * spread of its row (the last dimension; windows of EQ_NOISE_WINDOW for
 * vectors), and at least the median row's of its tensor, and a layout
 * may differ from the reference by EQ_NOISE_K times that, plus EQ_FLOOR_ULPS
 * float ulps of the value and EQ_ATOL_FLOOR absolute. A tensor-parallel
 * group sums in orders a micro-batch split never does (the reduction
 * dimension of a layer split over its ranks, the partial products added by
 * the all-reduce): for the TP sizes a test names, the reference is also run
 * in that order (eq_tp_orders), so the floor measures those too. The fault switches in
 * tests/CMakeLists.txt (a bucket dropped or reduced twice, a shard offset off
 * by one) must turn these comparisons red. */
#define EQ_NOISE_K 8.0
#define EQ_ORDERS 3   /* summation orders besides the reference's */
#define EQ_TP_SIZES 2 /* TP group sizes one reference can also sum as */
#define EQ_NOISE_WINDOW 8
#define EQ_FLOOR_ULPS 64.0
#define EQ_ATOL_FLOOR 1e-7

#define EQ_MAX_NUMEL (1 << 18)
static float eq_noise[EQ_MAX_NUMEL]; /* by flat element index; set by eq_reference_ex */

static const fsc_optim_config EQ_ADAMW = {
    .kind = FSC_OPTIM_ADAMW, .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1};

/* SGD with momentum (one state float per element), for the sharded optimizers. */
static const fsc_optim_config EQ_SGD_MOMENTUM = {
    .kind = FSC_OPTIM_SGD, .lr = 5e-2, .momentum = 0.9, .weight_decay = 0.01};

/* Variations of the reference run; zero fields mean EQ_MODEL, EQ_ADAMW, no
 * clipping and fp32 parameters. */
typedef struct eq_options {
    const fsc_gpt_config *model;
    const fsc_optim_config *optim;
    float max_norm;     /* > 0: fsc_clip_grad_norm(max_norm) before every step */
    fsc_dtype round_to; /* BF16 / F16: parameters rounded to it after every step */
    int global_batch;   /* sequences per step (0: EQ_GLOBAL_BATCH) */
    /* The TP group sizes of the layouts compared (0 ends the list; 1 adds
     * nothing): the noise floor also takes the order of each (eq_tp_orders). */
    int tp[EQ_TP_SIZES];
    /* LoRA adapters on the model (fsc/lora.h; its other parameters frozen).
     * The TP orders' hooks redo a Linear's base product only: leave tp empty. */
    const fsc_lora_config *lora;
    /* Parameters frozen by fsc_module_freeze's full-name globs (nfreeze of them). */
    const char *const *freeze;
    int nfreeze;
} eq_options;

/* One legal summation order of the reference: the global batch as `micro`
 * micro-batches (accumulated last to first when `reverse`), and with tp > 1
 * every layer whose reduction a TP group of that size splits summed as
 * that group does (eq_tp_orders). */
typedef struct eq_order {
    int micro;
    bool reverse;
    int tp;
} eq_order;

static void eq_tokens(fsc_tokens *tk) {
    enum { N = 4096 };
    static int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7 + (i / 5) * 3) % EQ_MODEL.vocab);
    if (fsc_tokens_from_i32(tok, N, EQ_MODEL.vocab, tk)) abort();
}

/* ---- the order of a tensor-parallel group --------------------------------------------- *
 * A TP group of t ranks computes two kinds of sum in pieces (src/parallel/tp/
 * tp_layers.c): a row-parallel Linear (attention's and the MLP's c_proj)
 * multiplies each rank's 1/t of the input columns by its 1/t of the weight
 * rows, and the all-reduce (under SP its reduce-scatter) adds the t partial
 * products, then the bias; a column-parallel Linear's input gradient (c_attn,
 * c_fc) is each rank's 1/t of the output columns (of q, k and v each, for
 * c_attn) times its weight columns, added the same way. Hooks on the
 * one-process GPT's Linears redo exactly those products after the layer
 * (post-forward: y, post-backward: dx) and sum them in rank order, one legal
 * order of the all-reduce. Not modelled: the vocabulary-parallel head's
 * input gradient and softmax sum (split over vocabulary shards), and under SP
 * the sums over sequence shards of the LayerNorm, row-bias and wpe
 * gradients; the comparisons that involve them keep their margins without.
 * The LLaMA family's Linears (nn.Linear's (out,in) weights) split the same
 * way: o_proj and down_proj row-parallel, q_proj, k_proj, v_proj,
 * gate_proj and up_proj column-parallel, each its own all-reduce. */
typedef struct eq_tp_layer {
    int blocks;  /* column blocks split separately: 3 for c_attn's q, k, v */
    bool row;    /* row-parallel (c_proj): forward split; else backward's dx */
    bool out_in; /* the weight is (out, in) (LLaMA's), else (in, out) */
} eq_tp_layer;

static const eq_tp_layer EQ_TP_ROW = {1, true, false}, EQ_TP_QKV = {3, false, false},
                         EQ_TP_FC = {1, false, false}, EQ_TP_ROW_OI = {1, true, true},
                         EQ_TP_COL_OI = {1, false, true};
static struct {
    int t;
    fsc_tensor seen; /* the layer's input (forward) or dy (backward), from its pre hook */
} eq_tp;

/* dst (rows, k) = rank c's columns of src (rows, width): of each of `blocks`
 * equal blocks, the c-th of t equal parts; k is returned. */
static int64_t eq_tp_columns(float *dst, const float *src, int64_t rows, int64_t width, int blocks,
                             int c) {
    const int64_t w = width / blocks, c0 = c * w / eq_tp.t, c1 = (c + 1) * w / eq_tp.t;
    int64_t k = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int b = 0; b < blocks; b++)
            for (int64_t j = c0; j < c1; j++) dst[k++] = src[i * width + b * w + j];
    return rows ? k / rows : 0;
}

/* out (N, n) = the sum over ranks c = 0..t-1 of rank c's columns of a (N, K)
 * times rank c's part of w: its rows (row: a is x, out is y without the bias)
 * or its columns, transposed (else: a is dy, out is dx). These are the partial
 * products a TP group's all-reduce adds; here they are added in rank order. */
static void eq_tp_sum(float *out, const float *a, int64_t N, int64_t K, int64_t n, int blocks,
                      const fsc_param *w, bool row) {
    const int64_t in = w->shape[0], oc = w->shape[1]; /* IN_OUT: (in, out) */
    float *ac = malloc(sizeof(float) * (size_t)(N * K)),
          *wc = malloc(sizeof(float) * (size_t)(in * oc));
    float *part = malloc(sizeof(float) * (size_t)(N * n));
    if (!ac || !wc || !part) abort();
    for (int c = 0; c < eq_tp.t; c++) {
        const int64_t k = eq_tp_columns(ac, a, N, K, blocks, c);
        if (row) /* y part = x_c (N, k) W[rows c] (k, n) */
            fsc_matmul_forward(part, ac, w->data + c * in / eq_tp.t * oc, NULL, (int)N, (int)k,
                               (int)n, FSC_WEIGHT_IN_OUT);
        else { /* dx part = dy_c (N, k) W[:, columns c]^T, W's columns (n, k) */
            eq_tp_columns(wc, w->data, in, oc, blocks, c);
            fsc_matmul_backward(part, NULL, NULL, ac, NULL, wc, (int)N, (int)n, (int)k,
                                FSC_WEIGHT_IN_OUT);
        }
        for (int64_t i = 0; i < N * n; i++) out[i] = c ? out[i] + part[i] : part[i];
    }
    free(ac), free(wc), free(part);
}

/* The same for an (out, in) weight: row: rank c's input columns of w;
 * else its output rows. */
static void eq_tp_sum_out_in(float *out, const float *a, int64_t N, int64_t K, int64_t n,
                             const fsc_param *w, bool row) {
    const int64_t oc = w->shape[0], in = w->shape[1];
    float *ac = malloc(sizeof(float) * (size_t)(N * K)),
          *wc = malloc(sizeof(float) * (size_t)(in * oc));
    float *part = malloc(sizeof(float) * (size_t)(N * n));
    if (!ac || !wc || !part) abort();
    for (int c = 0; c < eq_tp.t; c++) {
        const int64_t k = eq_tp_columns(ac, a, N, K, 1, c);
        if (row) { /* y part = x_c (N, k) W[:, columns c]^T, W's columns (n, k) */
            eq_tp_columns(wc, w->data, oc, in, 1, c);
            fsc_matmul_forward(part, ac, wc, NULL, (int)N, (int)k, (int)n, FSC_WEIGHT_OUT_IN);
        } else { /* dx part = dy_c (N, k) W[rows c] (k, n) */
            fsc_matmul_backward(part, NULL, NULL, ac, NULL, w->data + c * oc / eq_tp.t * in, (int)N,
                                (int)n, (int)k, FSC_WEIGHT_OUT_IN);
        }
        for (int64_t i = 0; i < N * n; i++) out[i] = c ? out[i] + part[i] : part[i];
    }
    free(ac), free(wc), free(part);
}

static int eq_tp_hook(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx, const fsc_tensor *t,
                      void *user) {
    (void)ctx;
    const eq_tp_layer *l = user;
    if (kind == FSC_HOOK_PRE_FORWARD || kind == FSC_HOOK_PRE_BACKWARD) {
        eq_tp.seen = *t;
        return FSC_OK;
    }
    if (!t) return FSC_OK; /* no dx asked for */
    const fsc_param *w = &m->params[0];
    const int64_t N = fsc_tensor_numel(t) / t->shape[t->ndim - 1];
    const int64_t K = eq_tp.seen.shape[eq_tp.seen.ndim - 1], n = t->shape[t->ndim - 1];
    float *out = t->data;
    if (l->out_in)
        eq_tp_sum_out_in(out, eq_tp.seen.data, N, K, n, w, l->row);
    else
        eq_tp_sum(out, eq_tp.seen.data, N, K, n, l->blocks, w, l->row);
    if (l->row && m->nparams > 1) /* after the sum: the bias is whole on every rank */
        for (int64_t i = 0; i < N * n; i++) out[i] += m->params[1].data[i % n];
    return FSC_OK;
}

/* Hooks every Linear of m's tree that a TP group of t splits (module names
 * as in src/nn/attention.c and mlp.c; llama_attention.c and swiglu.c). */
static void eq_tp_orders(fsc_module *m, int t) {
    eq_tp.t = t;
    const char *name = m->name;
    static const char *const llama_col[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"};
    const eq_tp_layer *l = !strcmp(name, "c_proj")      ? &EQ_TP_ROW
                           : !strcmp(name, "c_attn")    ? &EQ_TP_QKV
                           : !strcmp(name, "c_fc")      ? &EQ_TP_FC
                           : !strcmp(name, "o_proj")    ? &EQ_TP_ROW_OI
                           : !strcmp(name, "down_proj") ? &EQ_TP_ROW_OI
                                                        : NULL;
    for (size_t i = 0; !l && i < sizeof llama_col / sizeof *llama_col; i++)
        if (!strcmp(name, llama_col[i])) l = &EQ_TP_COL_OI;
    if (l && (fsc_module_add_hook(m, l->row ? FSC_HOOK_PRE_FORWARD : FSC_HOOK_PRE_BACKWARD,
                                  eq_tp_hook, (void *)l) ||
              fsc_module_add_hook(m, l->row ? FSC_HOOK_POST_FORWARD : FSC_HOOK_POST_BACKWARD,
                                  eq_tp_hook, (void *)l)))
        abort();
    for (int i = 0; i < m->nchildren; i++) eq_tp_orders(m->children[i], t);
}

/* A one-process training set-up on the test corpus: the model, its
 * parameters bound, their optimizer ranges and the corpus's tokens. */
typedef struct eq_setup {
    fsc_module *m;
    fsc_params ps;
    fsc_optim_range *r;
    int nr;
    fsc_tokens tk;
} eq_setup;

/* e for cfg's GPT, its parameters bound with `seed` (with gradients);
 * FSC_OK or the status of the step that failed (error set). */
static inline int eq_setup_new(eq_setup *e, const fsc_gpt_config *cfg, uint64_t seed) {
    *e = (eq_setup){.m = fsc_gpt_new(cfg)};
    if (!e->m) return FSC_ERR_INVALID;
    eq_tokens(&e->tk);
    int rc = fsc_params_bind(e->m, seed, true, &e->ps);
    return rc ? rc : fsc_optim_ranges_from_params(&e->ps, &e->r, &e->nr);
}

static inline void eq_setup_free(eq_setup *e) {
    fsc_optim_ranges_free(e->r);
    fsc_params_free(&e->ps);
    fsc_tokens_free(&e->tk);
    fsc_module_free(e->m);
}

/* Where a layout's micro-steps come from: the test corpus, step s's global
 * batch of G sequences of T tokens cut into `micros` micro-batches per rank
 * of `world`, B sequences each (G = B * micros * world), read into x and y. */
typedef struct eq_batch {
    const fsc_tokens *tk;
    fsc_arena *arena; /* reset before every micro-step */
    int G, T, B, micros, rank, world;
    int32_t *x, *y; /* B * T each */
} eq_batch;

/* Rank `rank` of `world`'s part of EQ_GLOBAL_BATCH sequences of T tokens per
 * step, in `micros` micro-batches. */
static inline eq_batch eq_batch_of_rank(const fsc_tokens *tk, fsc_arena *arena, int T, int micros,
                                        int rank, int world, int32_t *x, int32_t *y) {
    return (eq_batch){.tk = tk,
                      .arena = arena,
                      .G = EQ_GLOBAL_BATCH,
                      .T = T,
                      .B = EQ_GLOBAL_BATCH / (world * micros),
                      .micros = micros,
                      .rank = rank,
                      .world = world,
                      .x = x,
                      .y = y};
}

/* Micro-step k of step s's input: the arena reset, this rank's micro-batch
 * read into b->x and b->y, and in *ctx the training context every layout
 * and its one-process reference share (dropout keyed by the global sample,
 * seed 5). Returns fsc_tokens_batch's status. */
static inline int eq_micro_input(const eq_batch *b, int s, int k, fsc_ctx *ctx) {
    fsc_arena_reset(b->arena);
    int rc = fsc_tokens_batch(b->tk, s, k, b->rank, b->B, b->micros, b->world, b->T, b->x, b->y);
    *ctx = (fsc_ctx){.arena = b->arena,
                     .training = true,
                     .keyed = true,
                     .seed = 5,
                     .step = s,
                     .sample0 = fsc_batch_first_sample(s, k, b->rank, b->B, b->micros, b->world)};
    return rc;
}

/* Micro-step k of step s on m (the plain GPT or a wrapper around it): this
 * rank's micro-batch (eq_micro_input), the loss normalised by the global
 * token count, gradients accumulated. The layout of every equivalence test
 * and of its one-process reference. Returns fsc_gpt_train_micro's status. */
static inline int eq_micro(fsc_module *m, const eq_batch *b, int s, int k) {
    fsc_ctx ctx;
    int rc = eq_micro_input(b, s, k, &ctx);
    if (rc) return rc;
    float loss;
    return fsc_gpt_train_micro(m, &ctx, b->x, b->y, b->B, b->T, -1, (double)b->G * b->T, &loss);
}

/* One process, the whole global batch per step, summed in order `ord`: the
 * final parameters. *ps and *module (whose parameters ps's entries point at)
 * are the caller's to free. */
static float *eq_run_reference(const eq_options *o, const eq_order *ord, fsc_params *ps,
                               fsc_module **module) {
    const fsc_gpt_config *model = o->model ? o->model : &EQ_MODEL;
    const int micro = ord->micro;
    fsc_module *m = fsc_gpt_new(model);
    fsc_optim_range *r;
    int nr;
    fsc_tokens tk;
    eq_tokens(&tk);
    if (!m || (o->lora && fsc_lora_apply(m, o->lora, NULL)) ||
        (o->nfreeze && fsc_module_freeze(m, o->freeze, o->nfreeze, true, NULL)) ||
        fsc_params_bind(m, 5, true, ps) || fsc_optim_ranges_from_params(ps, &r, &nr))
        abort();
    if (ord->tp > 1) eq_tp_orders(m, ord->tp);
    if (ps->numel > EQ_MAX_NUMEL) abort();
    fsc_optim *opt = fsc_optim_new(o->optim ? o->optim : &EQ_ADAMW, r, nr);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int G = o->global_batch ? o->global_batch : EQ_GLOBAL_BATCH, B = G / micro, T = model->seq;
    int32_t *x = malloc(sizeof(int32_t) * G * T), *y = malloc(sizeof(int32_t) * G * T);
    const eq_batch b = {&tk, arena, G, T, B, micro, 0, 1, x, y};
    for (int s = 0; s < EQ_STEPS; s++) {
        fsc_params_zero_grad(ps);
        for (int j = 0; j < micro; j++)
            if (eq_micro(m, &b, s, ord->reverse ? micro - 1 - j : j)) abort();
        if (o->max_norm > 0) fsc_clip_grad_norm(r, nr, o->max_norm, NULL);
        fsc_optim_step(opt);
        if (o->round_to != FSC_DTYPE_F32) {
            fsc_tensor f = fsc_tensor_1d(ps->data, FSC_DTYPE_F32, ps->numel);
            fsc_tensor h = fsc_tensor_1d(malloc(2 * (size_t)ps->numel), o->round_to, ps->numel);
            if (fsc_tensor_convert(&f, &h) || fsc_tensor_convert(&h, &f)) abort();
            free(h.data);
        }
    }
    float *out = malloc(sizeof(float) * (size_t)ps->numel);
    memcpy(out, ps->data, sizeof(float) * (size_t)ps->numel);
    free(x), free(y);
    fsc_arena_free(arena);
    fsc_optim_free(opt);
    fsc_optim_ranges_free(r);
    fsc_tokens_free(&tk);
    *module = m;
    return out;
}

static int eq_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* eq_noise[i] = the largest spread between the summation orders in i's row
 * (or window, for vectors), and at least the median row's of its tensor:
 * a row where the orders happen to agree still has its tensor's noise. */
static void eq_set_noise(const fsc_params *ps, const float *ref, float *const *alt, int nalt) {
    memset(eq_noise, 0, sizeof eq_noise);
    for (int e = 0; e < ps->count; e++) {
        const fsc_param *p = ps->entries[e].param;
        int64_t off = ps->entries[e].offset;
        int64_t row = p->ndim >= 2 ? p->shape[p->ndim - 1] : EQ_NOISE_WINDOW;
        int64_t nrows = (p->numel + row - 1) / row, k = 0;
        float *rows = malloc(sizeof(float) * (size_t)(nrows ? nrows : 1));
        if (!rows) abort();
        for (int64_t r0 = 0; r0 < p->numel; r0 += row) {
            int64_t r1 = r0 + row < p->numel ? r0 + row : p->numel;
            float spread = 0;
            for (int64_t i = off + r0; i < off + r1; i++)
                for (int a = 0; a < nalt; a++) spread = fmaxf(spread, fabsf(alt[a][i] - ref[i]));
            for (int64_t i = off + r0; i < off + r1; i++) eq_noise[i] = spread;
            rows[k++] = spread;
        }
        qsort(rows, (size_t)nrows, sizeof *rows, eq_cmp_float);
        const float median = nrows ? rows[nrows / 2] : 0.f;
        for (int64_t i = off; i < off + p->numel; i++) eq_noise[i] = fmaxf(eq_noise[i], median);
        free(rows);
    }
}

/* eq_noise from the reference `ref` of model m's parameters (bound as
 * fsc_params_bind(m, 5, false)) and two other summation orders alt[0], alt[1];
 * returns the largest gap between their per-step losses (alt_losses: two rows
 * of `steps`) and the reference's. Frees m and both alternates. */
static inline double eq_noise_of_two(fsc_module *m, const float *ref, float *alt[2],
                                     const double *losses, const double *alt_losses, int steps) {
    fsc_params ps;
    if (fsc_params_bind(m, 5, false, &ps) != FSC_OK) abort();
    eq_set_noise(&ps, ref, alt, 2);
    double loss_noise = 0;
    for (int s = 0; s < steps; s++)
        for (int a = 0; a < 2; a++)
            loss_noise = fmax(loss_noise, fabs(alt_losses[a * steps + s] - losses[s]));
    fsc_params_free(&ps);
    fsc_module_free(m);
    free(alt[0]), free(alt[1]);
    return loss_noise;
}

/* One process, the whole global batch per step: the reference parameters
 * (one micro-batch), with eq_noise set from EQ_ORDERS other summation orders
 * and the order of each TP size in o->tp. */
static float *eq_reference_ex(const eq_options *o, int64_t *numel) {
    const fsc_fault fault = fsc_fault_active; /* the reference never runs with a fault */
    fsc_fault_active = FSC_FAULT_NONE;
    fsc_params ps;
    fsc_module *m;
    /* 2, 4 (reversed) and 3 micro-batches where they divide the batch, else
     * one sample each (forward, reversed) */
    const int G = o->global_batch ? o->global_batch : EQ_GLOBAL_BATCH;
    eq_order order[EQ_ORDERS + EQ_TP_SIZES] = {
        {G % 2 ? G : 2, false, 1}, {G % 4 ? G : 4, true, 1}, {G % 3 ? G : 3, G % 3 != 0, 1}};
    int n = EQ_ORDERS;
    for (int k = 0; k < EQ_TP_SIZES && o->tp[k]; k++)
        if (o->tp[k] > 1) order[n++] = (eq_order){1, false, o->tp[k]};
    float *alt[EQ_ORDERS + EQ_TP_SIZES];
    for (int a = 0; a < n; a++) {
        alt[a] = eq_run_reference(o, &order[a], &ps, &m);
        fsc_params_free(&ps), fsc_module_free(m);
    }
    float *ref = eq_run_reference(o, &(eq_order){1, false, 1}, &ps, &m);
    eq_set_noise(&ps, ref, alt, n);
    *numel = ps.numel;
    fsc_params_free(&ps), fsc_module_free(m);
    for (int a = 0; a < n; a++) free(alt[a]);
    fsc_fault_active = fault;
    return ref;
}

/* FSC_TEST_FAULT=<name> (see src/core/fault.h) turns a fault on for the
 * strategies under test; each equivalence program calls this first. */
static inline void eq_fault_from_env(void) {
    const char *name = getenv("FSC_TEST_FAULT");
    if (!fsc_fault_set(name)) {
        fprintf(stderr, "unknown FSC_TEST_FAULT '%s'\n", name);
        abort();
    }
}

static inline float *eq_reference(int64_t *numel) {
    return eq_reference_ex(&(eq_options){0}, numel);
}

/* The bound for element i against reference value `ref`. */
static inline double eq_tolerance(int64_t i, float ref) {
    return EQ_ATOL_FLOOR + EQ_FLOOR_ULPS * FLT_EPSILON * fabs(ref) + EQ_NOISE_K * eq_noise[i];
}

/* Number of elements outside eq_tolerance; prints the largest difference, the
 * largest share of its bound any element used, and the worst offender. Under
 * FSC_TEST_EXPECT_MISMATCH=1 (the fault-injection runs) a clean comparison is
 * the failure: the injected fault went unnoticed. */
static inline int64_t eq_compare(const char *what, const float *a, const float *b, int64_t n) {
    int64_t bad = 0, worst = 0;
    double worst_r = 0, max_d = 0, max_noise = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]), r = d / eq_tolerance(i, b[i]);
        if (d > max_d) max_d = d;
        if (eq_noise[i] > max_noise) max_noise = eq_noise[i];
        if (r > worst_r) worst_r = r, worst = i;
        bad += r > 1;
    }
    fprintf(stderr,
            "%s: max |diff| %.2e over %lld elements, %.0f%% of the bound at worst (noise floor "
            "up to %.2e)%s\n",
            what, max_d, (long long)n, 100 * worst_r, max_noise, bad ? " -- MISMATCH" : "");
    if (bad)
        fprintf(stderr, "  %lld outside; worst at %lld: %.8g vs reference %.8g (bound %.2e)\n",
                (long long)bad, (long long)worst, a[worst], b[worst],
                eq_tolerance(worst, b[worst]));
    const char *expect = getenv("FSC_TEST_EXPECT_MISMATCH");
    if (expect && strcmp(expect, "1") == 0) {
        fprintf(stderr, "  (fault injected: %s)\n", bad ? "caught" : "NOT CAUGHT");
        return bad ? 0 : 1;
    }
    return bad;
}

/* A weights file's parameters in the one-process flat layout of cfg's GPT
 * (malloc'ed, *numel of them), to compare with eq_reference's; NULL when
 * the file cannot be read into that model. */
static inline float *eq_read_weights(const fsc_gpt_config *cfg, const char *path, int64_t *numel) {
    fsc_module *whole = fsc_gpt_new(cfg);
    fsc_params ps;
    float *out = NULL;
    if (whole && !fsc_params_bind(whole, 99, false, &ps)) {
        if (!fsc_weights_load(path, &ps, NULL) &&
            (out = malloc(sizeof(float) * (size_t)ps.numel))) {
            memcpy(out, ps.data, sizeof(float) * (size_t)ps.numel);
            *numel = ps.numel;
        }
        fsc_params_free(&ps);
    }
    fsc_module_free(whole);
    return out;
}

#endif
