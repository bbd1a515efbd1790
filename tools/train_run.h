/* What fsc-train adds around the training loop: the progress line and
 * metrics rows (train_progress.c), and stopping cleanly on a signal
 * (train_signals.c). */
#ifndef FSC_TOOLS_TRAIN_RUN_H
#define FSC_TOOLS_TRAIN_RUN_H

#include <stdio.h>

#include "train_common.h"

/* The exit status of a run stopped by SIGINT/SIGTERM after it saved what it
 * could (sysexits' EX_TEMPFAIL: run it again with --resume). */
#define TRAIN_EXIT_STOPPED 75

typedef struct progress {
    bool tty, quiet; /* tty: a live line is redrawn on `out` */
    FILE *out;       /* the live line's terminal (stderr or /dev/tty); else stderr */
    bool own_out;    /* out is /dev/tty, opened here */
    int log_every;
    double log_seconds;
    int64_t first, total;   /* the run's first step (0-based) and --steps */
    double tokens_per_step; /* global */
    double flops_per_token; /* model FLOPs per trained token (forward + backward) */
    double peak_flops;      /* the cores' measured sgemm peak, FLOP/s (0: no MFU) */
    double t0, last_line;   /* wall clock: start, latest plain line */
    double smooth;          /* loss, exponentially smoothed (NAN before the first) */
    bool live;              /* a live line is on the terminal */
} progress;

/* Starts the clock. A live line is redrawn every step on a terminal: stderr
 * when it is one, else, under mpirun (more than one rank, stderr a pipe to
 * the launcher), the controlling terminal (/dev/tty) if the process has one;
 * otherwise (a file, no terminal) a plain line is printed every --log-every
 * steps and at least every --log-seconds seconds. MFU is against peak_flops,
 * the sgemm FLOP/s of all the run's cores (0: left out). */
void progress_start(progress *p, const train_options *o, int64_t first_step, double tokens_per_step,
                    double peak_flops);
/* The run header: one line with the model, layout, batch, optimizer,
 * schedule, data and seed (not under --quiet). */
void progress_header(progress *p, const train_options *o, int ranks);
/* After step `step` (1-based): the line, with val loss when not NAN. */
void progress_step(progress *p, int64_t step, const fsc_step_result *r, double val_loss);
/* A line of its own (clears the live line first; on its terminal when there
 * is one, so that it lands between redraws); no newline needed. */
void progress_note(progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends the live line and closes the terminal progress_start opened. */
void progress_end(progress *p);
/* "GPT L4 C256 H4 T128 V256" or "LLaMA L4 C256 H8 KV2 T128 V256": the
 * model's family and shape, as the header and the summary name it. */
const char *progress_model_name(const fsc_gpt_config *m, char *buf, size_t n);
/* Seconds since progress_start. */
double progress_elapsed(const progress *p);
/* One metrics row: step, loss, lr, val_loss (when not NAN), grad_norm,
 * tokens/s, MFU, this rank's peak memory (MiB), step time, wall-clock time
 * (Unix seconds) and time elapsed. */
void progress_metrics(const progress *p, FILE *f, int64_t step, const fsc_step_result *r,
                      double tok_s, double val_loss);
/* The same row as CSV (--metrics-csv), in the columns of
 * PROGRESS_CSV_HEADER; a cell is empty where the JSON row has no member
 * (val_loss between evaluations, loss_scale without fp16, AdaScale's
 * columns without it) and for a null grad_norm. */
#define PROGRESS_CSV_HEADER                                                                        \
    "step,loss,lr,val_loss,grad_norm,tokens_per_s,mfu,peak_mib,step_ms,time,elapsed_s,"            \
    "loss_scale,skipped,gain,base_lr,progress"
void progress_metrics_csv(const progress *p, FILE *f, int64_t step, const fsc_step_result *r,
                          double tok_s, double val_loss);

/* Catches SIGINT and SIGTERM: the first asks for a stop after the current
 * step, a second one ends the process at once. */
void train_signals_install(void);
/* Collective over the world, once per step: *sig gets the signal any rank
 * received (0: none), the same on every rank. */
int train_signals_agree(int *sig);

#endif
