/* fsc-train's progress: one live line on a terminal, plain lines elsewhere
 * (every --log-every steps, and at least every --log-seconds so that a run
 * under mpirun, whose stderr is a pipe, is never silent for long), and the
 * metrics rows with wall-clock time. Elapsed time and ETA count only this
 * run's steps, so a resumed run estimates from its own speed. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <time.h>

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

void progress_start(progress *p, const train_options *o, int64_t first_step, double tokens_per_step,
                    bool tty) {
    *p = (progress){.tty = tty,
                    .quiet = o->quiet,
                    .log_every = o->log_every > 0 ? o->log_every : 1,
                    .log_seconds = o->log_seconds,
                    .first = first_step,
                    .total = o->steps,
                    .tokens_per_step = tokens_per_step,
                    .t0 = fsc_now(),
                    .smooth = NAN};
    p->last_line = p->t0;
}

double progress_elapsed(const progress *p) {
    return fsc_now() - p->t0;
}

void progress_step(progress *p, int64_t step, const fsc_step_result *r, double val_loss) {
    if (isfinite(r->loss)) p->smooth = isnan(p->smooth) ? r->loss : 0.9 * p->smooth + 0.1 * r->loss;
    if (p->quiet) return;
    const double now = fsc_now(), elapsed = now - p->t0;
    const bool due = step % p->log_every == 0 || step == p->first + 1 || step == p->total ||
                     (p->log_seconds > 0 && now - p->last_line >= p->log_seconds);
    if (!p->tty && !due) return;
    const int64_t done = step - p->first;
    char el[32], eta[32], vl[32] = "";
    hms(elapsed, el, sizeof el);
    hms(done > 0 ? elapsed / (double)done * (double)(p->total - step) : NAN, eta, sizeof eta);
    if (!isnan(val_loss)) snprintf(vl, sizeof vl, "  val %.4f", val_loss);
    const double tok_s = r->seconds > 0 ? p->tokens_per_step / r->seconds : 0;
    fprintf(stderr,
            "%sstep %" PRId64 "/%" PRId64 "  loss %.4f (avg %.4f)%s  lr %.2e  |g| %.3f  %.0f tok/s"
            "  %s elapsed, ETA %s%s",
            p->tty ? "\r\033[K" : "", step, p->total, r->loss, p->smooth, vl, r->lr, r->grad_norm,
            tok_s, el, eta, p->tty ? " " : "\n");
    p->live = p->tty;
    if (!p->tty) p->last_line = now;
}

void progress_note(progress *p, const char *fmt, ...) {
    if (p->live) fprintf(stderr, "\r\033[K");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    p->live = false;
}

void progress_end(progress *p) {
    if (p->live) fprintf(stderr, "\n");
    p->live = false;
}

void progress_metrics(const progress *p, FILE *f, int64_t step, const fsc_step_result *r,
                      double tok_s, double val_loss) {
    fprintf(f, "{\"step\": %" PRId64 ", \"loss\": %.6f, \"lr\": %.6g, ", step, r->loss, r->lr);
    if (!isnan(val_loss)) fprintf(f, "\"val_loss\": %.6f, ", val_loss);
    if (isfinite(r->grad_norm)) /* JSON has no inf: a skipped fp16 step has none */
        fprintf(f, "\"grad_norm\": %.6g, ", r->grad_norm);
    else
        fprintf(f, "\"grad_norm\": null, ");
    fprintf(f, "\"tokens_per_s\": %.1f, \"step_ms\": %.2f, \"time\": %.3f, \"elapsed_s\": %.3f, ",
            tok_s, 1e3 * r->seconds, wall_clock(), progress_elapsed(p));
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
