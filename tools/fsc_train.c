/* fsc-train: trains a GPT on token data and reports what it did.
 *
 * Progress goes to stderr (a live line on a terminal, a line every
 * --log-every steps otherwise); --metrics gets one JSON object per step; the
 * closing summary gives throughput, model FLOP/s against the sgemm peak
 * measured in the same process, and peak memory by tag. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "train_common.h"

static const char *USAGE =
    "Trains a GPT-2 style model (single process). Data order: step s uses sequences\n"
    "s*G .. s*G+G-1 (G = batch * grad-accum); sequence i is tokens [i*T, i*T+T] (wrapping).";

static void write_metrics(FILE *f, int64_t step, const step_result *r, double tok_s) {
    fprintf(f,
            "{\"step\": %" PRId64 ", \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, "
            "\"tokens_per_s\": %.1f, \"step_ms\": %.2f, \"mem\": {",
            step, r->loss, r->lr, r->grad_norm, tok_s, 1e3 * r->seconds);
    print_mem_json(f, false);
    fprintf(f, "}}\n");
    fflush(f);
}

static void summary(const trainer *t, double first_loss, double last_loss, double seconds,
                    int64_t steps, double peak_gflops) {
    const train_options *o = &t->opt;
    double tokens = (double)steps * o->batch * o->grad_accum * o->model.seq;
    double tok_s = seconds > 0 ? tokens / seconds : 0;
    double gflops = tok_s * fsc_gpt_flops_per_token(&o->model, o->model.seq) / 1e9;
    fprintf(stderr, "\n== fsc-train summary ==\n");
    fprintf(stderr, "model      GPT L%d C%d H%d T%d V%d, %.2fM parameters\n", o->model.layers,
            o->model.d_model, o->model.heads, o->model.seq, o->model.vocab,
            (double)fsc_gpt_num_params(&o->model) / 1e6);
    fprintf(stderr, "loss       %.4f -> %.4f over %" PRId64 " steps (%.1f s)\n", first_loss,
            last_loss, steps, seconds);
    fprintf(stderr,
            "throughput %.0f tokens/s, %.1f model GFLOP/s = %.0f%% of the %.1f GFLOP/s "
            "sgemm peak (x%d thread%s)\n",
            tok_s, gflops, peak_gflops > 0 ? 100 * gflops / (peak_gflops * o->threads) : 0,
            peak_gflops, o->threads, o->threads > 1 ? "s" : "");
    fprintf(stderr, "peak memory");
    for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
        fprintf(stderr, " %s %.1f MiB%s", fsc_mem_tag_name((fsc_mem_tag)tag),
                (double)fsc_mem_peak((fsc_mem_tag)tag) / 1048576.0,
                tag + 1 < FSC_MEM_TAG_COUNT ? "," : "");
    fprintf(stderr, "; total %.1f MiB\n", (double)fsc_mem_peak_total() / 1048576.0);
}

int main(int argc, char **argv) {
    train_options o;
    train_options_default(&o);
    int rc = train_options_parse(&o, argc, argv, "fsc-train", USAGE);
    if (rc == 1) return 0;
    if (rc) {
        fprintf(stderr, "fsc-train: %s\n", fsc_last_error());
        return 2;
    }
    trainer t;
    if ((rc = trainer_init(&t, &o))) {
        fprintf(stderr, "fsc-train: %s\n", fsc_last_error());
        trainer_free(&t);
        return 1;
    }
    FILE *metrics = NULL;
    if (o.metrics && !(metrics = fopen(o.metrics, "w"))) {
        fprintf(stderr, "fsc-train: --metrics %s: cannot open for writing\n", o.metrics);
        trainer_free(&t);
        return 1;
    }
    if (!o.quiet) fprintf(stderr, "fsc-train: %s\n", fsc_blas_describe());
    double peak = fsc_sgemm_peak_gflops(1024, 3) / o.threads;
    bool tty = isatty(STDERR_FILENO);
    double first_loss = NAN, last_loss = NAN, t0 = fsc_now();
    int64_t steps = 0;
    double tokens_per_step = (double)o.batch * o.grad_accum * o.model.seq;
    for (int64_t s = 0; s < o.steps; s++) {
        step_result r;
        if ((rc = trainer_step(&t, &r))) {
            fprintf(stderr, "\nfsc-train: %s\n", fsc_last_error());
            break;
        }
        steps++;
        if (s == 0) first_loss = r.loss;
        last_loss = r.loss;
        double tok_s = tokens_per_step / r.seconds;
        if (metrics) write_metrics(metrics, s + 1, &r, tok_s);
        if (o.quiet) continue;
        if (tty)
            fprintf(stderr,
                    "\rstep %" PRId64 "/%" PRId64 "  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s ",
                    s + 1, o.steps, r.loss, r.lr, r.grad_norm, tok_s);
        else if ((s + 1) % (o.log_every > 0 ? o.log_every : 1) == 0 || s == 0 || s + 1 == o.steps)
            fprintf(stderr,
                    "step %" PRId64 "/%" PRId64 "  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s\n",
                    s + 1, o.steps, r.loss, r.lr, r.grad_norm, tok_s);
    }
    double seconds = fsc_now() - t0;
    if (metrics) fclose(metrics);
    if (!rc && o.save && trainer_save(&t, o.save)) {
        fprintf(stderr, "fsc-train: --save %s: %s\n", o.save, fsc_last_error());
        rc = FSC_ERR_IO;
    }
    if (!o.quiet && steps) summary(&t, first_loss, last_loss, seconds, steps, peak);
    if (!rc && o.save && !o.quiet) fprintf(stderr, "saved %s\n", o.save);
    trainer_free(&t);
    return rc ? 1 : 0;
}
