/* fsc-bench's GEMM peak for the model's own shapes (bench_peak.h).
 *
 * A Linear of in -> out over N rows runs three GEMMs a step: the forward
 * (N,out,in), the input gradient (N,in,out) and the weight gradient added
 * into dW (in,out,N), or (out,in,N) in torch's (out,in) layout; the
 * transposes are those fsc_matmul_forward_prec and _backward_prec pass. The
 * model's Linears come from its config (GPT-2: c_attn, attn c_proj, c_fc,
 * mlp c_proj in Conv1D's (in,out) layout, the head tied to wte (V,C); LLaMA:
 * q, k, v, o, gate, up, down and lm_head in nn.Linear's (out,in)).
 * Attention's score and value GEMMs (batched over heads) are not listed:
 * their share of a step is in the model FLOPs but not in this peak. */
#include <stdio.h>
#include <string.h>

#include "bench_peak.h"
#include "fsc/core.h"

typedef struct {
    const char *name;
    int in, out, count;
    bool in_out; /* Conv1D (in,out) weight */
} linear_shape;

static int model_linears(const fsc_gpt_config *c, linear_shape *l) {
    const int C = c->d_model, L = c->layers, V = c->vocab;
    int n = 0;
    if (c->arch == FSC_ARCH_LLAMA) {
        const int hd = C / c->heads, kv = (c->kv_heads ? c->kv_heads : c->heads) * hd;
        const int F = fsc_gpt_ffn_hidden(c);
        l[n++] = (linear_shape){"q_proj/o_proj", C, C, 2 * L, false};
        l[n++] = (linear_shape){"k_proj/v_proj", C, kv, 2 * L, false};
        l[n++] = (linear_shape){"gate_proj/up_proj", C, F, 2 * L, false};
        l[n++] = (linear_shape){"down_proj", F, C, L, false};
        l[n++] = (linear_shape){"lm_head", C, V, 1, false};
    } else {
        l[n++] = (linear_shape){"c_attn", C, 3 * C, L, true};
        l[n++] = (linear_shape){"attn.c_proj", C, C, L, true};
        l[n++] = (linear_shape){"c_fc", C, 4 * C, L, true};
        l[n++] = (linear_shape){"mlp.c_proj", 4 * C, C, L, true};
        l[n++] = (linear_shape){"head (wte)", C, V, 1, false};
    }
    return n;
}

static const char *KIND[3] = {"fwd", "dx", "dw"};

/* The three GEMMs of linear l at N rows into s[0..2]. */
static void linear_gemms(const linear_shape *l, int N, bench_shape *s) {
    const bool io = l->in_out;
    s[0] = (bench_shape){.ta = false, .tb = !io, .m = N, .n = l->out, .k = l->in};
    s[1] = (bench_shape){.ta = false, .tb = io, .m = N, .n = l->in, .k = l->out};
    s[2] = io ? (bench_shape){.ta = true, .m = l->in, .n = l->out, .k = N, .acc = true}
              : (bench_shape){.ta = true, .m = l->out, .n = l->in, .k = N, .acc = true};
    for (int i = 0; i < 3; i++) s[i].count = l->count;
}

/* Seconds of flops at gflops; a shape that did not run makes the peak 0. */
static void add_time(double *t, double flops, double gflops) {
    *t = gflops > 0 && *t >= 0 ? *t + flops / gflops / 1e9 : -1;
}

int bench_peaks_measure(const fsc_gpt_config *cfg, int rows, bool with_bf16, int reps,
                        bench_peaks *out) {
    memset(out, 0, sizeof *out);
    linear_shape lin[8];
    const int nl = model_linears(cfg, lin);
    static char names[BENCH_PEAK_SHAPES][48];
    double t[6] = {0}; /* bf16, fp32, best; then per CPU-second */
    for (int i = 0; i < nl && out->nshapes + 3 <= BENCH_PEAK_SHAPES; i++) {
        bench_shape *s = &out->shapes[out->nshapes];
        linear_gemms(&lin[i], rows, s);
        for (int j = 0; j < 3; j++, out->nshapes++) {
            int k = out->nshapes;
            snprintf(names[k], sizeof names[k], "%s %s", lin[i].name, KIND[j]);
            s[j].what = names[k];
            int rc = fsc_gemm_shape_peak(FSC_GEMM_F32, s[j].ta, s[j].tb, s[j].m, s[j].n, s[j].k,
                                         s[j].acc, reps, &s[j].fp32);
            if (!rc && with_bf16 &&
                fsc_gemm_shape_peak(FSC_GEMM_BF16, s[j].ta, s[j].tb, s[j].m, s[j].n, s[j].k,
                                    s[j].acc, reps, &s[j].bf16))
                memset(&s[j].bf16, 0, sizeof s[j].bf16); /* no oneDNN: reported as 0 */
            if (rc) return rc;
            const double f = 2.0 * s[j].m * s[j].n * (double)s[j].k * s[j].count;
            const fsc_gemm_peak *b = &s[j].bf16, *p = &s[j].fp32;
            out->flops += f;
            add_time(&t[0], f, b->gflops);
            add_time(&t[1], f, p->gflops);
            add_time(&t[2], f, b->gflops > p->gflops ? b->gflops : p->gflops);
            add_time(&t[3], f, b->cpu_gflops);
            add_time(&t[4], f, p->cpu_gflops);
            add_time(&t[5], f, b->cpu_gflops > p->cpu_gflops ? b->cpu_gflops : p->cpu_gflops);
        }
    }
    double *dst[6] = {&out->bf16,     &out->fp32,     &out->best,
                      &out->cpu_bf16, &out->cpu_fp32, &out->cpu_best};
    for (int i = 0; i < 6; i++) *dst[i] = t[i] > 0 ? out->flops / t[i] / 1e9 : 0;
    return FSC_OK;
}

void bench_peaks_print(const bench_peaks *p) {
    printf("\"gemm_shapes\": [");
    for (int i = 0; i < p->nshapes; i++) {
        const bench_shape *s = &p->shapes[i];
        printf("%s{\"gemm\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"ta\": %d, \"tb\": %d, "
               "\"acc\": %d, \"per_step\": %d, \"bf16_gflops\": %.1f, \"bf16_cpu_gflops\": %.1f, "
               "\"bf16_impl\": \"%s\", \"fp32_gflops\": %.1f, \"fp32_cpu_gflops\": %.1f}",
               i ? ", " : "", s->what, s->m, s->n, s->k, s->ta, s->tb, s->acc, s->count,
               s->bf16.gflops, s->bf16.cpu_gflops, s->bf16.impl ? s->bf16.impl : "", s->fp32.gflops,
               s->fp32.cpu_gflops);
    }
    printf("], \"bf16_shape_peak_gflops\": %.1f, \"fp32_shape_peak_gflops\": %.1f, "
           "\"best_shape_peak_gflops\": %.1f, \"bf16_shape_peak_cpu_gflops\": %.1f, "
           "\"fp32_shape_peak_cpu_gflops\": %.1f, \"best_shape_peak_cpu_gflops\": %.1f, ",
           p->bf16, p->fp32, p->best, p->cpu_bf16, p->cpu_fp32, p->cpu_best);
}
