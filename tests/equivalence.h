/* Shared by the data-parallel equivalence tests: a tiny GPT, deterministic
 * token data, a single-process reference run on the global batch, and a
 * parameter comparison with a stated tolerance. */
#ifndef FSC_TEST_EQUIVALENCE_H
#define FSC_TEST_EQUIVALENCE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/optim.h"

static const fsc_gpt_config EQ_MODEL = {
    .vocab = 64, .seq = 16, .layers = 2, .d_model = 32, .heads = 4, .dropout = 0.1f};
enum { EQ_GLOBAL_BATCH = 8, EQ_STEPS = 5 };
/* After 5 AdamW steps at lr 1e-2, parallel runs sum gradients in another
 * order than one process. EQ_ATOL/EQ_RTOL hold for every parameter except the
 * key slice of each c_attn.bias: its gradient is zero in exact arithmetic (a
 * constant added to a row of scores leaves the softmax unchanged), so it holds
 * pure rounding noise, which Adam scales up to steps of up to ~lr; those
 * elements get EQ_NOISE_ATOL. */
#define EQ_ATOL 2e-5
#define EQ_RTOL 1e-4
#define EQ_NOISE_ATOL 2e-4

#define EQ_MAX_NUMEL (1 << 18)
static bool eq_is_noise[EQ_MAX_NUMEL]; /* by flat element index; set by eq_reference */

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
} eq_options;

static void eq_tokens(fsc_tokens *tk) {
    enum { N = 4096 };
    static int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7 + (i / 5) * 3) % EQ_MODEL.vocab);
    if (fsc_tokens_from_i32(tok, N, EQ_MODEL.vocab, tk)) abort();
}

/* One process, the whole global batch per step: the reference parameters. */
static float *eq_reference_ex(const eq_options *o, int64_t *numel) {
    const fsc_gpt_config *model = o->model ? o->model : &EQ_MODEL;
    fsc_module *m = fsc_gpt_new(model);
    fsc_params ps;
    fsc_optim_range *r;
    int nr;
    fsc_tokens tk;
    eq_tokens(&tk);
    if (!m || fsc_params_bind(m, 5, true, &ps) || fsc_optim_ranges_from_params(&ps, &r, &nr))
        abort();
    if (ps.numel > EQ_MAX_NUMEL) abort();
    fsc_optim *opt = fsc_optim_new(o->optim ? o->optim : &EQ_ADAMW, r, nr);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    int B = EQ_GLOBAL_BATCH, T = model->seq;
    int32_t *x = malloc(sizeof(int32_t) * B * T), *y = malloc(sizeof(int32_t) * B * T);
    for (int s = 0; s < EQ_STEPS; s++) {
        fsc_params_zero_grad(&ps);
        fsc_arena_reset(arena);
        fsc_tokens_batch(&tk, s, 0, 0, B, 1, 1, T, x, y);
        fsc_ctx ctx = {.arena = arena,
                       .training = true,
                       .seed = 5,
                       .step = s,
                       .sample0 = fsc_batch_first_sample(s, 0, 0, B, 1, 1)};
        float loss;
        if (fsc_gpt_train_micro(m, &ctx, x, y, B, T, -1, (double)B * T, &loss)) abort();
        if (o->max_norm > 0) fsc_clip_grad_norm(r, nr, o->max_norm, NULL);
        fsc_optim_step(opt);
        if (o->round_to != FSC_DTYPE_F32) {
            fsc_tensor f = fsc_tensor_1d(ps.data, FSC_DTYPE_F32, ps.numel);
            fsc_tensor h = fsc_tensor_1d(malloc(2 * (size_t)ps.numel), o->round_to, ps.numel);
            if (fsc_tensor_convert(&f, &h) || fsc_tensor_convert(&h, &f)) abort();
            free(h.data);
        }
    }
    memset(eq_is_noise, 0, sizeof eq_is_noise);
    for (int l = 0; l < model->layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "h.%d.attn.c_attn.bias", l);
        fsc_param_entry *e = fsc_params_find(&ps, name);
        for (int c = model->d_model; c < 2 * model->d_model; c++) eq_is_noise[e->offset + c] = true;
    }
    float *out = malloc(sizeof(float) * (size_t)ps.numel);
    for (int64_t i = 0; i < ps.numel; i++) out[i] = ps.data[i];
    *numel = ps.numel;
    free(x), free(y);
    fsc_arena_free(arena);
    fsc_optim_free(opt);
    fsc_optim_ranges_free(r);
    fsc_params_free(&ps);
    fsc_tokens_free(&tk);
    fsc_module_free(m);
    return out;
}

static inline float *eq_reference(int64_t *numel) {
    return eq_reference_ex(&(eq_options){0}, numel);
}

/* Number of elements outside |a - b| <= EQ_ATOL + EQ_RTOL |b|; prints the worst. */
static int64_t eq_compare(const char *what, const float *a, const float *b, int64_t n) {
    int64_t bad = 0, worst = 0;
    double worst_d = 0, max_d = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > max_d) max_d = d;
        double tol = eq_is_noise[i] ? EQ_NOISE_ATOL : EQ_ATOL + EQ_RTOL * fabs(b[i]);
        if (d > tol) {
            if (d > worst_d) worst_d = d, worst = i;
            bad++;
        }
    }
    double max_clean = 0;
    for (int64_t i = 0; i < n; i++)
        if (!eq_is_noise[i] && fabs((double)a[i] - b[i]) > max_clean)
            max_clean = fabs((double)a[i] - b[i]);
    fprintf(stderr, "%s: max |diff| %.2e (%.2e outside the key-bias slices) over %lld elements%s\n",
            what, max_d, max_clean, (long long)n, bad ? " -- MISMATCH" : "");
    if (bad)
        fprintf(stderr, "  worst at %lld: %.8g vs reference %.8g\n", (long long)worst, a[worst],
                b[worst]);
    return bad;
}

#endif
