/* fsc-train's progress: a run header, then one live line on a terminal and
 * plain lines elsewhere (every --log-every steps, and at least every
 * --log-seconds so that a run whose stderr is a file is never silent for
 * long), and the metrics rows with wall-clock time. Under mpirun stderr is a
 * pipe to the launcher, so rank 0 draws the live line on its controlling
 * terminal (/dev/tty) when it has one. Elapsed time and ETA count only this
 * run's steps, so a resumed run estimates from its own speed. MFU is model
 * FLOPs per second over the sgemm peak measured at start; memory is this
 * rank's peak from the tagged allocator. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, fdopen */
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train_run.h"

static double wall_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 75 s -> "1:15", 4000 s -> "1:06:40". */
static void hms(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e8) {
        snprintf(buf, n, "?");
        return;
    }
    long t = lround(s);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* The terminal for the live line: stderr when it is one; under a launcher
 * (more than one rank) whose stderr is a pipe or socket (the launcher
 * forwarding it), the controlling terminal if this process has one
 * (opening /dev/tty fails without); else NULL. A single process whose
 * stderr the user piped keeps plain lines in the pipe. */
static FILE *live_terminal(bool *own) {
    *own = false;
    if (isatty(STDERR_FILENO)) return stderr;
    struct stat st;
    if (fsc_dist_size() < 2 || fstat(STDERR_FILENO, &st) ||
        !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
        return NULL;
    int fd = open("/dev/tty", O_WRONLY | O_NOCTTY | O_CLOEXEC);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    setvbuf(f, NULL, _IOLBF, 0);
    *own = true;
    return f;
}

void progress_start(progress *p, const train_options *o, int64_t first_step, double tokens_per_step,
                    double peak_flops) {
    *p = (progress){.quiet = o->quiet,
                    .out = stderr,
                    .log_every = o->log_every > 0 ? o->log_every : 1,
                    .log_seconds = o->log_seconds,
                    .first = first_step,
                    .total = o->steps,
                    .tokens_per_step = tokens_per_step,
                    .flops_per_token = fsc_gpt_flops_per_token(&o->model, o->model.seq),
                    .peak_flops = peak_flops,
                    .t0 = fsc_now(),
                    .smooth = NAN};
    p->last_line = p->t0;
    FILE *term = o->quiet || !strcmp(o->progress, "plain") ? NULL : live_terminal(&p->own_out);
    if (term) p->out = term, p->tty = true;
}

void progress_header(progress *p, const train_options *o, int ranks) {
    if (p->quiet) return;
    const fsc_gpt_config *m = &o->model;
    char extra[160] = "";
    size_t n = 0;
    const bool defaulted = ranks > 1 && !train_flag_given(o, "strategy") && !o->resume;
    if (o->pp > 1) n += (size_t)snprintf(extra + n, sizeof extra - n, ", pp %d", o->pp);
    if (o->tp > 1) n += (size_t)snprintf(extra + n, sizeof extra - n, ", tp %d", o->tp);
    if (strcmp(o->mixed_precision, "fp32"))
        n += (size_t)snprintf(extra + n, sizeof extra - n, ", %s", o->mixed_precision);
    if (o->checkpoint_activations)
        snprintf(extra + n, sizeof extra - n, ", activations recomputed");
    char name[96];
    fprintf(stderr,
            "fsc-train: %s (%.2fM parameters) | %s%s on %d rank%s%s | "
            "%.0f tokens/step (batch %d x grad-accum %d) | %s lr %g, %s, warmup %" PRId64
            " | %" PRId64 " steps | data %s | seed %" PRIu64 "\n",
            progress_model_name(m, name, sizeof name), (double)fsc_gpt_num_params(m) / 1e6,
            o->strategy, defaulted ? " (the default with more than one rank)" : "", ranks,
            ranks > 1 ? "s" : "", extra, p->tokens_per_step, o->batch, o->grad_accum, o->optimizer,
            o->lr, o->schedule, o->warmup, o->steps, o->data, o->seed);
}

const char *progress_model_name(const fsc_gpt_config *m, char *buf, size_t n) {
    if (m->arch == FSC_ARCH_LLAMA)
        snprintf(buf, n, "LLaMA L%d C%d H%d KV%d T%d V%d", m->layers, m->d_model, m->heads,
                 m->kv_heads > 0 ? m->kv_heads : m->heads, m->seq, m->vocab);
    else
        snprintf(buf, n, "GPT L%d C%d H%d T%d V%d", m->layers, m->d_model, m->heads, m->seq,
                 m->vocab);
    return buf;
}

double progress_elapsed(const progress *p) {
    return fsc_now() - p->t0;
}

/* This rank's peak of all tags, MiB. */
static double peak_mib(void) {
    return (double)fsc_mem_peak_total() / 1048576.0;
}

void progress_step(progress *p, int64_t step, const fsc_step_result *r, double val_loss) {
    if (isfinite(r->loss)) p->smooth = isnan(p->smooth) ? r->loss : 0.9 * p->smooth + 0.1 * r->loss;
    if (p->quiet) return;
    const double now = fsc_now(), elapsed = now - p->t0;
    const bool due = step % p->log_every == 0 || step == p->first + 1 || step == p->total ||
                     (p->log_seconds > 0 && now - p->last_line >= p->log_seconds);
    if (!p->tty && !due) return;
    const int64_t done = step - p->first;
    char el[32], eta[32], vl[32] = "", mfu[32] = "";
    hms(elapsed, el, sizeof el);
    hms(done > 0 ? elapsed / (double)done * (double)(p->total - step) : NAN, eta, sizeof eta);
    if (!isnan(val_loss)) snprintf(vl, sizeof vl, "  val %.4f", val_loss);
    const double tok_s = r->seconds > 0 ? p->tokens_per_step / r->seconds : 0;
    if (p->peak_flops > 0)
        snprintf(mfu, sizeof mfu, "  MFU %.1f%%", 100 * tok_s * p->flops_per_token / p->peak_flops);
    fprintf(p->out,
            "%sstep %" PRId64 "/%" PRId64 "  loss %.4f (avg %.4f)%s  lr %.2e  |g| %.3f  %.0f tok/s"
            "%s  mem %.1f MiB  %s elapsed, ETA %s%s",
            p->tty ? "\r\033[K" : "", step, p->total, r->loss, p->smooth, vl, r->lr, r->grad_norm,
            tok_s, mfu, peak_mib(), el, eta, p->tty ? " " : "\n");
    fflush(p->out);
    p->live = p->tty;
    if (!p->tty) p->last_line = now;
}

void progress_note(progress *p, const char *fmt, ...) {
    if (p->live) fprintf(p->out, "\r\033[K");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->out, fmt, ap);
    va_end(ap);
    fprintf(p->out, "\n");
    fflush(p->out);
    p->live = false;
}

void progress_end(progress *p) {
    if (p->live) fprintf(p->out, "\n");
    p->live = false;
    if (p->own_out) fclose(p->out);
    p->out = stderr, p->own_out = false, p->tty = false;
}

void progress_metrics(const progress *p, FILE *f, int64_t step, const fsc_step_result *r,
                      double tok_s, double val_loss) {
    fprintf(f, "{\"step\": %" PRId64 ", \"loss\": %.6f, \"lr\": %.6g, ", step, r->loss, r->lr);
    if (!isnan(val_loss)) fprintf(f, "\"val_loss\": %.6f, ", val_loss);
    if (isfinite(r->grad_norm)) /* JSON has no inf: a skipped fp16 step has none */
        fprintf(f, "\"grad_norm\": %.6g, ", r->grad_norm);
    else
        fprintf(f, "\"grad_norm\": null, ");
    fprintf(f, "\"tokens_per_s\": %.1f, ", tok_s);
    if (p->peak_flops > 0)
        fprintf(f, "\"mfu\": %.5f, ", tok_s * p->flops_per_token / p->peak_flops);
    fprintf(f, "\"peak_mib\": %.2f, \"step_ms\": %.2f, \"time\": %.3f, \"elapsed_s\": %.3f, ",
            peak_mib(), 1e3 * r->seconds, wall_clock(), progress_elapsed(p));
    if (r->loss_scale > 0)
        fprintf(f, "\"loss_scale\": %.9g, \"skipped\": %s, ", r->loss_scale,
                r->skipped ? "true" : "false");
    if (r->gain != 1 || r->progress != (double)step) /* AdaScale */
        fprintf(f, "\"gain\": %.6g, \"base_lr\": %.6g, \"progress\": %.4f, ", r->gain, r->base_lr,
                r->progress);
    fprintf(f, "\"mem\": {");
    print_mem_json(f, false);
    fprintf(f, "}}\n");
    fflush(f);
}

void progress_metrics_csv(const progress *p, FILE *f, int64_t step, const fsc_step_result *r,
                          double tok_s, double val_loss) {
    fprintf(f, "%" PRId64 ",%.6f,%.6g,", step, r->loss, r->lr);
    if (!isnan(val_loss)) fprintf(f, "%.6f", val_loss);
    fputc(',', f);
    if (isfinite(r->grad_norm)) fprintf(f, "%.6g", r->grad_norm);
    fprintf(f, ",%.1f,", tok_s);
    if (p->peak_flops > 0) fprintf(f, "%.5f", tok_s * p->flops_per_token / p->peak_flops);
    fprintf(f, ",%.2f,%.2f,%.3f,%.3f,", peak_mib(), 1e3 * r->seconds, wall_clock(),
            progress_elapsed(p));
    if (r->loss_scale > 0)
        fprintf(f, "%.9g,%d", r->loss_scale, r->skipped ? 1 : 0);
    else
        fputc(',', f);
    if (r->gain != 1 || r->progress != (double)step)
        fprintf(f, ",%.6g,%.6g,%.4f\n", r->gain, r->base_lr, r->progress);
    else
        fputs(",,,\n", f);
    fflush(f);
}
