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
    bool tty, quiet;
    int log_every;
    double log_seconds;
    int64_t first, total;   /* the run's first step (0-based) and --steps */
    double tokens_per_step; /* global */
    double t0, last_line;   /* wall clock: start, latest plain line */
    double smooth;          /* loss, exponentially smoothed (NAN before the first) */
    bool live;              /* a live line is on the terminal */
} progress;

/* Starts the clock. On a terminal (tty) one live line is redrawn every
 * step; elsewhere (a pipe under mpirun, a file) a line is printed every
 * --log-every steps and at least every --log-seconds seconds. */
void progress_start(progress *p, const train_options *o, int64_t first_step, double tokens_per_step,
                    bool tty);
/* After step `step` (1-based): the line, with val loss when not NAN. */
void progress_step(progress *p, int64_t step, const fsc_step_result *r, double val_loss);
/* A line of its own (clears the live line first); no newline needed. */
void progress_note(progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends the live line. */
void progress_end(progress *p);
/* Seconds since progress_start. */
double progress_elapsed(const progress *p);
/* One metrics row: step, loss, lr, val_loss (when not NAN), grad_norm,
 * tokens/s, step time, wall-clock time (Unix seconds) and time elapsed. */
void progress_metrics(const progress *p, FILE *f, int64_t step, const fsc_step_result *r,
                      double tok_s, double val_loss);

/* Catches SIGINT and SIGTERM: the first asks for a stop after the current
 * step, a second one ends the process at once. */
void train_signals_install(void);
/* Collective over the world, once per step: *sig gets the signal any rank
 * received (0: none), the same on every rank. */
int train_signals_agree(int *sig);

#endif
