/* fsc-bench: throughput of the reference configurations, one JSON line each.
 *
 * GPT-2 or, with --arch llama, the LLaMA family at the same sizes.
 * The same training loop as fsc-train (AdamW, fp32) on uniformly random
 * tokens, as the PyTorch side of the comparisons does: warm-up steps,
 * then timed steps; tokens/s over the timed steps, ms/step median, model
 * GFLOP/s, and its share of the sgemm peak measured in this same process;
 * on one thread also tokens per second of this process's CPU time, which a
 * shared machine's other load stretches far less than the wall clock. One
 * process also measures the GEMM peak of the model's own shapes (bench_peak.h)
 * in bf16 and fp32 and gives the model's share of it, by both clocks.
 * `--blas-info` prints the BLAS kernels fsc would run here, as one JSON line,
 * so that scripts give a peer the same kernels. `--cp C` splits each
 * sequence over C ranks and reports the ring's waits beside the baseline
 * (bench_cp.h); --seq, --batch and --layers resize a config. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench_blas.h"
#include "bench_cp.h"
#include "bench_peak.h"
#include "bench_pipe.h"
#include "fsc/profile.h"
#include "fsc/version.h"
#include "tool_flags.h"
#include "train_common.h"
#include "train_profile.h"

typedef struct {
    const char *name;
    fsc_gpt_config model;
    int batch;
} bench_config;

/* --arch gpt2 (default) */
static const bench_config CONFIGS[] = {
    {"small", {.vocab = 512, .seq = 128, .layers = 4, .d_model = 256, .heads = 4}, 8},
    {"medium", {.vocab = 8192, .seq = 256, .layers = 8, .d_model = 512, .heads = 8}, 4},
};

/* --arch llama: the same sizes with 2 KV heads (grouped-query), SwiGLU of
 * LLaMA's default width (small 768, medium 1536) and an untied head */
static const bench_config LLAMA_CONFIGS[] = {
    {"small",
     {.vocab = 512,
      .seq = 128,
      .layers = 4,
      .d_model = 256,
      .heads = 4,
      .arch = FSC_ARCH_LLAMA,
      .kv_heads = 2},
     8},
    {"medium",
     {.vocab = 8192,
      .seq = 256,
      .layers = 8,
      .d_model = 512,
      .heads = 8,
      .arch = FSC_ARCH_LLAMA,
      .kv_heads = 2},
     4},
};
_Static_assert(sizeof LLAMA_CONFIGS == sizeof CONFIGS, "one LLaMA config per GPT-2 config");

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int random_tokens(int vocab, int64_t n, uint64_t seed, fsc_tokens *out) {
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    if (!tok) return fsc_error(FSC_ERR_NOMEM, "out of memory for benchmark tokens");
    uint64_t key = fsc_rng_key(seed, "bench-tokens");
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)(fsc_philox4x32(key, 0, (uint64_t)i).v[0] % (uint32_t)vocab);
    int rc = fsc_tokens_from_i32(tok, n, vocab, out);
    free(tok);
    return rc;
}

/* fsdp: --mixed-precision; every strategy: --checkpoint-activations; ddp:
 * --pp stages, their --pipe-schedule and --chunks micro-batches. */
static const char *mixed_precision = "fp32";
static const char *attention = "auto"; /* --attention */
static bool checkpoint_activations;
static int pp = 1, chunks = 1, virtual_stages = 0;
static int tp = 1;                      /* --tp: tensor-parallel ranks per replica */
static int cp = 1; /* --cp: context-parallel ranks per replica (ring attention) */
/* --seq, --batch, --layers: the config's own unless given (0) */
static int seq_flag = 0, batch_flag = 0, layers_flag = 0;
static bool sequence_parallel = false; /* --sequence-parallel */
static bool recompute_attention;       /* --recompute-attention */
static bool recompute_activation;      /* --recompute-activation */
static const char *pipe_schedule = "1f1b", *balance = NULL;
static const char *trace = NULL; /* --trace: the last step's pipeline as a Chrome trace */
static const char *profile = NULL; /* --profile: the timed steps' spans, and a summary */
static bool profiling;             /* this measure() is the profiled one (not the baseline) */
static bool no_shape_peak;       /* --no-shape-peak: skip bench_peaks_measure */
/* --moe-experts: an MoE GPT (fsc/moe.h), its experts over the ranks under ddp */
static int moe_experts = 0, moe_every = 2, moe_hidden = 0;
static double moe_capacity = 2.0;

typedef struct {
    double tok_s, ms_median, gflops, peak, first, last, comm_share;
    int64_t mem[FSC_MEM_TAG_COUNT];    /* this rank's peaks over the whole run */
    int64_t steady[FSC_MEM_TAG_COUNT]; /* ... over the timed steps only */
    /* --mixed-precision bf16: bf16 GEMM counters over the timed steps, and
     * oneDNN's bf16 matmul peak (0 without oneDNN) */
    fsc_bf16_gemm_stats bf16;
    double bf16_peak, elapsed; /* elapsed: seconds of the timed steps */
    double cpu;                /* this process's CPU seconds in the timed steps */
    double tp_share;           /* --tp: share of the timed steps blocked in TP collectives */
    /* --pp: this rank's pipeline waits, spans and compute summed over the
     * timed steps (fsc_pipe_run_stats): wait / span is its measured bubble */
    double pipe_wait, pipe_span, pipe_compute;
    float pipe_slowest; /* the largest pipe_compute among this rank's pipeline's stages */
    /* --moe-experts: share of the timed steps in all-to-all exchanges (this
     * rank) and of the choices dropped past capacity */
    double alltoall_share, dropped_share;
    /* minor page faults (fresh pages) of this process: in the first timed
     * step, and per step over the later ones */
    double faults_first, faults_later;
    fsc_cp_stats ring; /* --cp: this rank's ring over the timed steps */
} bench_result;

/* CPU seconds of this process (all its threads) so far. */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* Trains `steps` timed steps after `warmup` ones under `strategy`. */
static int measure(const bench_config *c, const char *strategy, int steps, int warmup, int threads,
                   bench_result *out) {
    train_options o;
    train_options_default(&o);
    o.strategy = strategy;
    o.model = c->model;
    o.batch = c->batch;
    o.steps = warmup + steps;
    o.threads = threads;
    o.lr = 3e-4, o.weight_decay = 0.1, o.beta1 = 0.9, o.beta2 = 0.95, o.clip = 0;
    o.schedule = "constant";
    o.skip_grad_norm = true; /* as the PyTorch peer: no clipping, no norm */
    o.local_in_world = true; /* the baseline runs on rank 0 alone */
    o.mixed_precision = mixed_precision; /* bf16: autocast under every strategy */
    o.attention = attention;
    o.checkpoint_activations = checkpoint_activations;
    o.moe_experts = moe_experts, o.moe_every = moe_every, o.moe_hidden = moe_hidden;
    o.moe_capacity = moe_capacity;
    const bool alone = fsc_strategy_is_single(strategy);
    if (tp > 1 && !alone) /* the baseline stays one process */
        o.tp = tp, o.sequence_parallel = sequence_parallel,
        o.recompute_attention = recompute_attention, o.recompute_activation = recompute_activation;
    if (pp > 1 && !alone) { /* the baseline stays one process */
        o.pp = pp, o.grad_accum = chunks, o.pipe_schedule = pipe_schedule;
        o.virtual_stages = virtual_stages, o.balance = balance;
    }
    if (cp > 1 && !alone) o.cp = cp; /* the baseline stays one process */
    fsc_mem_reset_peaks();
    trainer t;
    int rc = trainer_init(&t, &o);
    if (!rc) { /* random tokens, as the peer; enough for every rank's batches */
        fsc_tokens_free(&t.tokens);
        rc = random_tokens(o.model.vocab,
                           (int64_t)o.steps * o.grad_accum * o.batch * o.model.seq * t.world + 1,
                           1234, &t.tokens);
    }
    if (rc) {
        trainer_free(&t);
        return rc;
    }
    /* BLAS threads the peak measurement uses */
    int cores = fsc_strategy_takes(strategy, "threads") ? 1 : threads;
    double peak = fsc_sgemm_peak_gflops(1024, 5) / cores;
    double *ms = calloc((size_t)steps, sizeof *ms), elapsed = 0, comm = 0, tp_wait0 = 0;
    fsc_moe_stats moe0 = {0};
    for (int s = 0; s < warmup + steps && !rc; s++) {
        if (s == warmup) { /* whole-run peaks so far; then the steady state alone */
            for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
                out->mem[tag] = (int64_t)fsc_mem_peak((fsc_mem_tag)tag);
            /* The next step would first trade the arena's blocks (the first
             * step's chained and spare ones) for one block of what a step
             * uses; done here, they stay out of the steady peaks. */
            fsc_arena_reset(fsc_trainer_arena(t.tr));
            fsc_mem_reset_peaks();
            fsc_bf16_gemm_reset_stats();
            tp_wait0 = fsc_strategy_get_stats(t.s).tp_wait_s;
            moe0 = fsc_moe_get_stats(t.model);
            fsc_cp_reset_stats(fsc_gpt_plan_cp(t.plan));
            if (t.world > 1) rc = fsc_group_barrier(fsc_group_world());
            if (!rc && profiling) rc = fsc_prof_start();
        }
        fsc_step_result r;
        long faults0 = minor_faults();
        const double cpu0 = cpu_seconds();
        if (!rc) rc = trainer_step(&t, &r);
        if (s >= warmup) out->cpu += cpu_seconds() - cpu0;
        if (rc) break;
        if (s == warmup)
            out->faults_first = (double)(minor_faults() - faults0);
        else if (s > warmup)
            out->faults_later += (double)(minor_faults() - faults0) / (steps - 1);
        if (s == 0) out->first = r.loss;
        out->last = r.loss;
        if (s >= warmup)
            ms[s - warmup] = 1e3 * r.seconds, elapsed += r.seconds, comm += r.comm_wait_s;
        fsc_pipe *pipe = fsc_strategy_get_pipe(t.s);
        if (pipe && s >= warmup) {
            const fsc_pipe_run_stats ps = fsc_pipe_get_stats(pipe);
            out->pipe_wait += ps.wait_s, out->pipe_span += ps.span_s;
            out->pipe_compute += ps.compute_s;
        }
    }
    if (!rc && profiling) rc = train_profile_finish(profile, fsc_group_world(), stderr);
    if (!rc && trace && fsc_strategy_get_pipe(t.s)) rc = fsc_strategy_write_trace(t.s, trace);
    if (!rc && fsc_strategy_get_pipe(t.s)) { /* over the stages of this rank's pipeline */
        out->pipe_slowest = (float)out->pipe_compute;
        rc = fsc_group_allreduce(fsc_mesh_group(t.mesh, FSC_MESH_PP), &out->pipe_slowest, 1,
                                 FSC_DTYPE_F32, FSC_REDUCE_MAX);
    }
    out->bf16 = fsc_bf16_gemm_get_stats();
    double peak2 = fsc_sgemm_peak_gflops(1024, 5) / cores; /* the machine drifts: keep the best */
    if (!strcmp(mixed_precision, "bf16"))
        out->bf16_peak = fsc_bf16_gemm_peak_gflops(1024, 5) / cores;
    if (!rc) {
        qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
        /* the strategy's world counts --cp's ranks, which share each sequence */
        double tokens = (double)steps * o.grad_accum * o.batch * o.model.seq * t.world / o.cp;
        out->tok_s = tokens / elapsed;
        out->ms_median = ms[steps / 2];
        out->elapsed = elapsed;
        out->gflops = out->tok_s * fsc_gpt_flops_per_token(&t.opt.model, o.model.seq) / 1e9;
        out->peak = peak2 > peak ? peak2 : peak;
        out->comm_share = comm / elapsed;
        out->ring = fsc_cp_get_stats(fsc_gpt_plan_cp(t.plan));
        out->tp_share = (fsc_strategy_get_stats(t.s).tp_wait_s - tp_wait0) / elapsed;
        const fsc_moe_stats moe1 = fsc_moe_get_stats(t.model);
        const double choices = 2.0 * (double)(moe1.tokens - moe0.tokens);
        out->alltoall_share = (moe1.exchange_s - moe0.exchange_s) / elapsed;
        out->dropped_share = choices > 0 ? (double)(moe1.dropped1 + moe1.dropped2 -
                                                    moe0.dropped1 - moe0.dropped2) /
                                               choices
                                         : 0;
        for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++) {
            out->steady[tag] = (int64_t)fsc_mem_peak((fsc_mem_tag)tag);
            if (out->steady[tag] > out->mem[tag]) out->mem[tag] = out->steady[tag];
        }
    }
    free(ms);
    trainer_free(&t);
    return rc;
}

static void print_result(const bench_config *c, const char *strategy, int ranks, int threads,
                         int steps, const bench_result *r, const bench_result *single,
                         const int64_t *stage_mem, const float *pipe_figs, const float *cp_figs,
                         const float *faults, int fault_ranks, const bench_peaks *peaks) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fsc_strategy_info info;
    fsc_strategy_info_get(strategy, &info);
    bool multi_rank = info.spans_ranks;
    int workers = multi_rank ? ranks : fsc_strategy_takes(strategy, "threads") ? threads : 1;
    const bool llama = c->model.arch == FSC_ARCH_LLAMA;
    printf("{\"config\": \"%s\", \"arch\": \"%s\", \"strategy\": \"%s\", \"ranks\": %d, "
           "\"threads\": %d, \"layers\": %d, \"d_model\": %d, \"heads\": %d, ",
           c->name, llama ? "llama" : "gpt2", strategy, ranks, threads, c->model.layers,
           c->model.d_model, c->model.heads);
    if (llama)
        printf("\"kv_heads\": %d, \"ffn_hidden\": %d, ", c->model.kv_heads,
               fsc_gpt_ffn_hidden(&c->model));
    printf("\"seq\": %d, \"vocab\": %d, \"batch_per_worker\": %d, \"params\": %" PRId64 ", "
           "\"steps\": %d, \"tokens_per_s\": %.1f, \"ms_per_step_median\": %.2f, "
           "\"model_gflops\": %.1f, \"sgemm_peak_gflops\": %.1f, \"share_of_peak\": %.3f, ",
           c->model.seq, c->model.vocab, c->batch, fsc_gpt_num_params(&c->model), steps, r->tok_s,
           r->ms_median, r->gflops, r->peak, r->gflops / (r->peak * workers));
    { /* what attention keeps for backward on a rank: its heads, its stage's blocks */
        fsc_attention_kind kind = FSC_ATTENTION_AUTO;
        fsc_attention_kind_parse(attention, &kind); /* checked by make_trainer already */
        const int blocks = (c->model.layers + pp - 1) / pp, heads = c->model.heads / tp;
        const int T = c->model.seq / (multi_rank ? cp : 1); /* --cp: this rank's positions */
        const int64_t per = fsc_attention_saved_bytes(kind, c->batch, T, heads);
        printf("\"attention\": \"%s\", \"attention_saved_mib_per_rank\": %.3f, ",
               fsc_attention_uses_flash(kind, c->model.seq) ? "flash" : "naive",
               (double)per * blocks / (1024.0 * 1024.0));
    }
    if (single)
        printf("\"single_tokens_per_s\": %.1f, \"scaling_efficiency\": %.3f, ", single->tok_s,
               r->tok_s / (workers * single->tok_s));
    if (multi_rank) printf("\"comm_wait_share\": %.4f, ", r->comm_share);
    if (workers == 1 && threads == 1) /* one thread: a measure other load does not stretch */
        printf("\"cpu_tokens_per_s\": %.1f, ", r->cpu > 0 ? r->tok_s * r->elapsed / r->cpu : 0);
    if (moe_experts) { /* all parameters, and those a token is computed with (2 experts) */
        fsc_moe_options mo = {.experts = moe_experts, .every = moe_every, .hidden = moe_hidden};
        fsc_gpt_config mc = c->model;
        mc.moe = &mo;
        double active = (fsc_gpt_flops_per_token(&mc, mc.seq) -
                         12.0 * mc.layers * mc.d_model * mc.seq) / 6 + (double)mc.seq * mc.d_model;
        printf("\"moe_experts\": %d, \"moe_every\": %d, \"moe_hidden\": %d, "
               "\"moe_capacity\": %g, \"moe_params\": %" PRId64 ", \"active_params\": %.0f, "
               "\"alltoall_share\": %.4f, \"alltoall_ms_per_step\": %.2f, "
               "\"dropped_share\": %.4f, ",
               moe_experts, moe_every, moe_hidden ? moe_hidden : 4 * mc.d_model, moe_capacity,
               fsc_gpt_num_params(&mc), active, r->alltoall_share,
               r->alltoall_share * r->ms_median, r->dropped_share);
    }
    if (tp > 1 && multi_rank)
        printf("\"tp\": %d, \"sequence_parallel\": %s, \"tp_collective_share\": %.4f, "
               "\"tp_collective_ms_per_step\": %.2f, ",
               tp, sequence_parallel ? "true" : "false", r->tp_share, r->tp_share * r->ms_median);
    if (pp > 1 && multi_rank && single && pipe_figs) {
        fsc_pipe_kind kind;
        fsc_pipe_kind_parse(pipe_schedule, &kind);
        bench_pipe_print(c->name, kind, pp, chunks, virtual_stages, ranks, pipe_figs, r->tok_s,
                         single->tok_s);
    }
    if (cp > 1 && multi_rank && single && cp_figs)
        bench_cp_print(c->name, cp, ranks, cp_figs, r->tok_s,
                       &(bench_cp_run){.tok_s = single->tok_s,
                                       .elapsed = single->elapsed,
                                       .cpu = single->cpu,
                                       .activ_bytes = single->steady[FSC_MEM_ACTIV]});
    if (!strcmp(mixed_precision, "bf16")) { /* where the time went, beside both GEMM peaks */
        bench_bf16_print(&r->bf16, r->elapsed, r->bf16_peak, r->peak);
    }
    if (peaks) { /* the model's share of its own shapes' peak, by both clocks */
        const bool bf16 = !strcmp(mixed_precision, "bf16");
        const double peak = bf16 ? peaks->best : peaks->fp32;
        const double cpu_peak = bf16 ? peaks->cpu_best : peaks->cpu_fp32;
        const double cpu_gflops = r->cpu > 0 ? r->gflops * r->elapsed / r->cpu : 0;
        bench_peaks_print(peaks);
        printf("\"share_of_shape_peak\": %.3f, \"cpu_model_gflops\": %.1f, "
               "\"cpu_share_of_shape_peak\": %.3f, ",
               peak > 0 ? r->gflops / peak : 0, cpu_gflops,
               cpu_peak > 0 ? cpu_gflops / cpu_peak : 0);
    }
    /* faults: first timed step, then per later step, for each rank */
    printf("\"page_faults_first_step_by_rank\": [");
    for (int q = 0; q < fault_ranks; q++) printf("%s%.0f", q ? ", " : "", faults[2 * q]);
    printf("], \"page_faults_per_later_step_by_rank\": [");
    for (int q = 0; q < fault_ranks; q++) printf("%s%.0f", q ? ", " : "", faults[2 * q + 1]);
    printf("], ");
    printf("\"first_loss\": %.4f, \"last_loss\": %.4f, \"peak_rss_mib\": %.1f, \"peak_mem\": {",
           r->first, r->last, (double)ru.ru_maxrss / 1024.0);
    for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
        printf("%s\"%s\": %" PRId64, tag ? ", " : "", fsc_mem_tag_name((fsc_mem_tag)tag),
               r->mem[tag]);
    printf("}, \"steady_peak_mem\": {");
    for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
        printf("%s\"%s\": %" PRId64, tag ? ", " : "", fsc_mem_tag_name((fsc_mem_tag)tag),
               r->steady[tag]);
    if (stage_mem) { /* pipeline or TP ranks hold different parts: each one's steady peaks */
        printf("}, \"steady_peak_mem_by_rank\": [");
        for (int q = 0; q < ranks; q++) {
            printf("%s{", q ? ", " : "");
            for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
                printf("%s\"%s\": %" PRId64, tag ? ", " : "", fsc_mem_tag_name((fsc_mem_tag)tag),
                       stage_mem[q * FSC_MEM_TAG_COUNT + tag]);
            printf("}");
        }
        printf("]");
    } else {
        printf("}");
    }
    printf(", \"blas\": \"%s\"}\n", fsc_blas_corename());
    fflush(stdout);
}

/* Under dp or ddp, the single-process baseline at the same per-worker batch is
 * measured first in the same run (under ddp on rank 0 while the others wait). */
static int run(const bench_config *c, const char *strategy, int steps, int warmup, int threads) {
    int rank = fsc_dist_rank(), world = fsc_dist_size();
    bench_result single = {0}, r = {0};
    bool scaled = !fsc_strategy_is_single(strategy);
    const bool on_threads = fsc_strategy_takes(strategy, "threads");
    fsc_strategy_info info;
    fsc_strategy_info_get(strategy, &info);
    /* weak scaling: every worker (thread or rank) takes the reference batch */
    bench_config wide = *c;
    if (on_threads) wide.batch = c->batch * threads;
    int rc = FSC_OK;
    if (scaled && rank == 0) rc = measure(c, "single", steps, warmup, 1, &single);
    if (info.spans_ranks) {
        int all = fsc_group_barrier(fsc_group_world()); /* the others wait for the baseline */
        if (!rc) rc = all;
    }
    profiling = profile != NULL;
    if (!rc) rc = measure(&wide, strategy, steps, warmup, on_threads ? threads : 1, &r);
    profiling = false;
    int64_t *stage_mem = NULL; /* --pp: every rank's steady peaks, for rank 0 to print */
    float *pipe_figs = NULL; /* --pp: every rank's wait, span, compute, its pipeline's slowest */
    float *cp_figs = NULL;   /* --cp: every rank's ring figures (bench_cp.h) */
    float faults[2] = {(float)r.faults_first, (float)r.faults_later}, *all_faults = faults;
    if (!rc && info.spans_ranks) { /* every rank's page faults, for rank 0 to print */
        all_faults = calloc((size_t)world * 2, sizeof *all_faults);
        rc = all_faults
                 ? fsc_group_allgather(fsc_group_world(), faults, all_faults, 2, FSC_DTYPE_F32)
                 : fsc_error(FSC_ERR_NOMEM, "out of memory");
    }
    if (!rc && pp > 1 && info.spans_ranks)
        rc = bench_pipe_gather(
            (float[BENCH_PIPE_FIGS]){(float)r.pipe_wait, (float)r.pipe_span,
                                     (float)r.pipe_compute, r.pipe_slowest},
            &pipe_figs);
    if (!rc && cp > 1 && info.spans_ranks)
        rc = bench_cp_gather(&r.ring,
                             &(bench_cp_run){.tok_s = r.tok_s,
                                             .elapsed = r.elapsed,
                                             .cpu = r.cpu,
                                             .activ_bytes = r.steady[FSC_MEM_ACTIV]},
                             &cp_figs);
    if (!rc && (pp > 1 || tp > 1) && info.spans_ranks) {
        stage_mem = calloc((size_t)world * FSC_MEM_TAG_COUNT, sizeof *stage_mem);
        rc = stage_mem ? fsc_group_allgather(fsc_group_world(), r.steady, stage_mem,
                                             FSC_MEM_TAG_COUNT, FSC_DTYPE_I64)
                       : fsc_error(FSC_ERR_NOMEM, "out of memory");
    }
    /* one process: its Linears' GEMMs timed alone (on 2+ ranks the others'
     * polling would share the cores) */
    static bench_peaks peaks;
    const bool with_peaks = !rc && world == 1 && !no_shape_peak;
    if (with_peaks)
        rc = bench_peaks_measure(&wide.model, wide.batch * wide.model.seq,
                                 fsc_bf16_gemm_available(), 3, &peaks);
    if (!rc && rank == 0)
        print_result(c, strategy, world, threads, steps, &r, scaled ? &single : NULL, stage_mem,
                     pipe_figs, cp_figs, all_faults, info.spans_ranks ? world : 1,
                     with_peaks ? &peaks : NULL);
    free(stage_mem), free(pipe_figs), free(cp_figs);
    if (all_faults != faults) free(all_faults);
    return rc;
}

int main(int argc, char **argv) {
    const char *which = "all", *strategy = "single", *arch = "gpt2";
    int steps = 10, warmup = 3, threads = 1;
    bool blas = false;
    /* the values go straight to the variables above and the flags' statics */
    const tool_flag flags[] = {
        {.name = "config", .kind = ARG_STR, .ptr = &which, .meta = "NAME",
         .help = "small | medium | all (default all)"},
        {.name = "arch", .kind = ARG_STR, .ptr = &arch, .meta = "NAME",
         .help = "gpt2 | llama: the configs' family (default gpt2; llama: 2 KV heads, SwiGLU, "
                 "an untied head)"},
        {.name = "strategy", .kind = ARG_STR, .ptr = &strategy, .meta = "NAME",
         .help = "single | dp | ddp | oss | sdp | fsdp (default single)"},
        {.name = "steps", .kind = ARG_INT, .ptr = &steps, .help = "timed steps (default 10)"},
        {.name = "warmup", .kind = ARG_INT, .ptr = &warmup, .help = "untimed steps first (default 3)"},
        {.name = "threads", .kind = ARG_INT, .ptr = &threads,
         .help = "BLAS and OpenMP threads; dp: worker threads (default 1)"},
        {.name = "attention", .kind = ARG_STR, .ptr = &attention, .meta = "K",
         .help = "auto | naive | flash: the attention kernel (default auto: flash from T = 512)"},
        {.name = "mixed-precision", .kind = ARG_STR, .ptr = &mixed_precision, .meta = "P",
         .help = "fp32 | bf16 | fp16"},
        {.name = "checkpoint-activations", .kind = ARG_FLAG, .ptr = &checkpoint_activations,
         .help = "recompute each block's activations in backward"},
        {.name = "pp", .kind = ARG_INT, .ptr = &pp, .help = "pipeline stages (ddp)"},
        {.name = "chunks", .kind = ARG_INT, .ptr = &chunks, .help = "with --pp: micro-batches"},
        {.name = "grad-accum", .kind = ARG_INT, .ptr = &chunks, .help = "the same as --chunks"},
        {.name = "pipe-schedule", .kind = ARG_STR, .ptr = &pipe_schedule, .meta = "NAME",
         .help = "with --pp: gpipe | 1f1b | interleaved | zbh1 (alias zb1)"},
        {.name = "virtual", .kind = ARG_INT, .ptr = &virtual_stages,
         .help = "with --pipe-schedule interleaved: stages per rank"},
        {.name = "balance", .kind = ARG_STR, .ptr = &balance, .meta = "3,7",
         .help = "with --pp: layers per stage (a block splits at .5 and .75, as fsc-train's), or auto"},
        {.name = "profile", .kind = ARG_STR, .ptr = &profile, .meta = "FILE",
         .help = "the timed steps' spans, every rank's, as one Chrome trace, and where their "
                 "time went (stderr; needs one --config)"},
        {.name = "trace", .kind = ARG_STR, .ptr = &trace, .meta = "FILE",
         .help = "with --pp: the last step's pipeline as a Chrome trace"},
        {.name = "tp", .kind = ARG_INT, .ptr = &tp, .help = "tensor-parallel ranks per replica"},
        {.name = "cp", .kind = ARG_INT, .ptr = &cp,
         .help = "context-parallel ranks per replica (ring attention; ddp, oss, sdp, fsdp): "
                 "reports the ring's waits and activations against the one-process baseline"},
        {.name = "seq", .kind = ARG_INT, .ptr = &seq_flag,
         .help = "sequence length T instead of the config's (e.g. 8192 with --cp)"},
        {.name = "batch", .kind = ARG_INT, .ptr = &batch_flag,
         .help = "sequences per worker instead of the config's"},
        {.name = "layers", .kind = ARG_INT, .ptr = &layers_flag,
         .help = "blocks instead of the config's"},
        {.name = "sequence-parallel", .kind = ARG_FLAG, .ptr = &sequence_parallel,
         .help = "with --tp: LayerNorm and dropout on sequence shards"},
        {.name = "recompute-attention", .kind = ARG_FLAG, .ptr = &recompute_attention,
         .help = "with --tp: attention probabilities recomputed in backward"},
        {.name = "recompute-activation", .kind = ARG_FLAG, .ptr = &recompute_activation,
         .help = "with --tp: the MLP's GELU output recomputed in backward"},
        {.name = "moe-experts", .kind = ARG_INT, .ptr = &moe_experts,
         .help = "an MoE GPT: E experts per MoE MLP (ddp: spread over the ranks)"},
        {.name = "moe-every", .kind = ARG_INT, .ptr = &moe_every,
         .help = "with --moe-experts: an MoE MLP every N blocks (default 2)"},
        {.name = "moe-capacity", .kind = ARG_DOUBLE, .ptr = &moe_capacity,
         .help = "with --moe-experts: capacity factor (default 2)"},
        {.name = "moe-hidden", .kind = ARG_INT, .ptr = &moe_hidden,
         .help = "with --moe-experts: expert MLP width (0: 4 x d_model)"},
        {.name = "no-shape-peak", .kind = ARG_FLAG, .ptr = &no_shape_peak,
         .help = "one process: skip timing the model's own GEMM shapes (bf16 and fp32 peaks)"},
        {.name = "blas-info", .kind = ARG_FLAG, .ptr = &blas,
         .help = "print the BLAS kernels fsc runs here as one JSON line, and exit"},
    };
    const tool_cli cli = {
        .prog = "fsc-bench",
        .usage = "usage: fsc-bench [flags]\n"
                 "Trains the reference configurations and prints one JSON line each.\n"
                 "  dp and ddp scale weakly: each thread (dp, --threads) or rank (ddp, under "
                 "mpirun)\n  takes the reference batch; the single-process baseline is "
                 "measured in the same run.",
        .flags = flags,
        .nflags = (int)(sizeof flags / sizeof *flags)};
    int rc = tool_flags_parse(&cli, NULL, NULL, argc, argv, NULL); /* before MPI */
    if (rc == TOOL_FLAGS_DONE) return 0;
    if (rc) {
        fprintf(stderr, "fsc-bench: %s (see --help)\n", fsc_last_error());
        return 2;
    }
    const bench_config *configs = CONFIGS;
    if (!strcmp(arch, "llama")) {
        configs = LLAMA_CONFIGS;
    } else if (strcmp(arch, "gpt2")) {
        fprintf(stderr, "fsc-bench: --arch %s: expected gpt2 or llama\n", arch);
        return 2;
    }
    if (blas) return bench_blas_info(); /* a question about this machine alone: no MPI */
    if (fsc_dist_init(&argc, &argv, NULL)) {
        fprintf(stderr, "fsc-bench: %s\n", fsc_last_error());
        return 1;
    }
    if (steps < 1 || warmup < 0 || threads < 1 || pp < 1 || chunks < 1 || tp < 1 || cp < 1 ||
        seq_flag < 0 || batch_flag < 0 || layers_flag < 0) {
        fprintf(stderr, "fsc-bench: --steps must be >= 1, --warmup >= 0, --threads, --pp, --tp, "
                        "--cp and --chunks >= 1, --seq, --batch and --layers >= 1 when given\n");
        return 2;
    }
    fsc_strategy_info info;
    if (fsc_strategy_info_get(strategy, &info)) {
        fprintf(stderr, "fsc-bench: --strategy: %s\n", fsc_last_error());
        return 2;
    }
    if (cp > 1 && !info.spans_ranks) {
        fprintf(stderr, "fsc-bench: --cp %d splits each sequence over ranks: run it under mpiexec "
                        "with --strategy ddp, oss, sdp or fsdp (--strategy %s runs in one process)\n",
                cp, strategy);
        return 2;
    }
    if (profile && !strcmp(which, "all")) {
        fprintf(stderr, "fsc-bench: --profile writes one run: name it with --config\n");
        return 2;
    }
    /* stderr: stdout stays one JSON line per config */
    if (fsc_dist_rank() == 0 && fsc_blas_hint())
        fprintf(stderr, "fsc-bench: %s\n", fsc_blas_hint());
    bool any = false;
    for (size_t k = 0; k < sizeof CONFIGS / sizeof *CONFIGS; k++) {
        if (strcmp(which, "all") && strcmp(which, configs[k].name)) continue;
        any = true;
        bench_config c = configs[k];
        if (seq_flag) c.model.seq = seq_flag;
        if (batch_flag) c.batch = batch_flag;
        if (layers_flag) c.model.layers = layers_flag;
        if (run(&c, strategy, steps, warmup, threads)) {
            fprintf(stderr, "fsc-bench: %s: %s\n", configs[k].name, fsc_last_error());
            fflush(NULL);
            _exit(1); /* other ranks may be blocked in a collective: no MPI_Finalize */
        }
    }
    if (!any) {
        fprintf(stderr, "fsc-bench: --config %s: expected small, medium or all\n", which);
        return 2;
    }
    fsc_dist_finalize();
    return 0;
}
