/* fsc profiler: nested spans of one thread, totalled by category and by op,
 * and written as Chrome trace events (fsc-train/fsc-bench --profile).
 *
 * Part of floor 1 (core), so every floor can mark its work. Off, a span
 * costs one test of fsc_prof_enabled, which the FSC_PROF_* macros make
 * before calling anything. On, spans are recorded only on the thread that
 * called fsc_prof_start and only outside OpenMP parallel regions: a kernel
 * that runs its loop (or its per-head GEMMs) in a parallel region is one
 * span, and the totals never count the same second twice. A span's self
 * time (its length less its children's) goes to its category; the self
 * times inside the step spans add up to the steps' time exactly, the
 * step's own and the modules' own code being "other".
 */
#ifndef FSC_PROFILE_H
#define FSC_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fsc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsc_prof_cat {
    FSC_PROF_OTHER = 0,   /* structure: micro-batches, modules' own code */
    FSC_PROF_STEP,        /* one optimizer step (its own time is "other" in the summary) */
    FSC_PROF_GEMM_BF16,   /* GEMMs that ran in bf16 (oneDNN) */
    FSC_PROF_GEMM_F32,    /* GEMMs that ran in fp32 (sgemm) */
    FSC_PROF_ATTENTION,   /* attention modules' own work: softmax, masks, head GEMMs */
    FSC_PROF_ELEMENTWISE, /* norms, activations, dropout, embeddings */
    FSC_PROF_LOSS,        /* softmax + cross-entropy */
    FSC_PROF_OPTIM,       /* optimizer step, clipping */
    FSC_PROF_COMM,        /* collectives once every peer is in: data moving */
    FSC_PROF_COMM_WAIT,   /* collectives before every peer is in */
    FSC_PROF_DATA,        /* loading a batch */
    FSC_PROF_CKPT,        /* checkpoint and weights I/O */
    FSC_PROF_CAT_COUNT
} fsc_prof_cat;

/* Nonzero while recording. Read it through the FSC_PROF_* macros; set it
 * only through fsc_prof_start and fsc_prof_stop. */
FSC_API extern int fsc_prof_enabled;

/* Starts recording on the calling thread, forgetting any earlier record.
 * Returns FSC_ERR_NOMEM when the first buffers cannot be had. */
FSC_API int fsc_prof_start(void);
/* Stops recording; spans still open are closed now. The record stays for
 * the readers below until the next fsc_prof_start or fsc_prof_free. */
FSC_API void fsc_prof_stop(void);
/* Frees the record. Safe to call when nothing was recorded. */
FSC_API void fsc_prof_free(void);

/* Opens a span. name groups spans into ops in the summary (say "sgemm
 * 1024x512x512 NN", "LayerNorm forward"); detail names the instance in the
 * trace (a module's path) and keys the memory rows; either is copied, and
 * detail may be NULL. Call only when fsc_prof_enabled (the macros do).
 * More than FSC_PROF_MAX_DEPTH open spans: the deeper ones are not kept. */
FSC_API void fsc_prof_begin(fsc_prof_cat cat, const char *name, const char *detail);
/* fsc_prof_begin with a printf-formatted name and no detail. */
FSC_API void fsc_prof_beginf(fsc_prof_cat cat, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A GEMM's span, named by its precision and shape ("sgemm 1024x512x768 NT":
 * M x N x K, A and B transposed or not); close it with its 2MNK flops. */
FSC_API void fsc_prof_gemm_begin(fsc_prof_cat cat, bool ta, bool tb, int M, int N, int K);
/* As fsc_prof_begin, remembering arena bytes in use (mem_before) for
 * fsc_prof_end_mem. */
FSC_API void fsc_prof_begin_mem(fsc_prof_cat cat, const char *name, const char *detail,
                                int64_t mem_before);
/* Closes the innermost open span. flops and bytes (0: not known) give the
 * op's achieved GFLOP/s and GB/s in the summary. */
FSC_API void fsc_prof_end(double flops, double bytes);
/* Closes a span opened by fsc_prof_begin_mem, as fsc_prof_end(0, bytes):
 * mem_after - mem_before is added to its detail's row, slot 0 (forward) or
 * 1 (backward), and mem_after is written to the trace as the "arena bytes"
 * counter. */
FSC_API void fsc_prof_end_mem(int64_t mem_after, int slot, double bytes);

#define FSC_PROF_MAX_DEPTH 64

#define FSC_PROF_BEGIN(cat, name)                                                                  \
    do {                                                                                           \
        if (__builtin_expect(fsc_prof_enabled, 0)) fsc_prof_begin(cat, name, NULL);                \
    } while (0)
#define FSC_PROF_END()                                                                             \
    do {                                                                                           \
        if (__builtin_expect(fsc_prof_enabled, 0)) fsc_prof_end(0, 0);                             \
    } while (0)

/* ---- what was recorded ------------------------------------------------------ */

typedef struct fsc_prof_totals {
    int64_t steps;                        /* step spans closed */
    double step_s;                        /* their total length */
    double cat_s[FSC_PROF_CAT_COUNT];     /* self time inside step spans, by category */
    double outside_s[FSC_PROF_CAT_COUNT]; /* self time of spans outside any step */
    int64_t events, dropped; /* trace events kept; spans beyond the buffer, totalled only */
} fsc_prof_totals;
/* The totals so far (zeroes when nothing was recorded). */
FSC_API fsc_prof_totals fsc_prof_get_totals(void);

typedef struct fsc_prof_op {
    const char *name; /* valid until the next fsc_prof_start or fsc_prof_free */
    fsc_prof_cat cat;
    int64_t calls;
    double self_s, total_s; /* total: with the children */
    double flops, bytes;    /* summed over calls; 0 when not given */
} fsc_prof_op;
/* Every op seen, in first-seen order; *out stays valid as the names do. */
FSC_API int fsc_prof_get_ops(const fsc_prof_op **out);

typedef struct fsc_prof_mem_row {
    const char *module; /* the detail given to fsc_prof_begin_mem */
    int64_t calls[2];   /* forward, backward */
    int64_t bytes[2];   /* arena bytes added, summed over the calls */
} fsc_prof_mem_row;
/* Every memory row, in first-seen order. */
FSC_API int fsc_prof_get_mem(const fsc_prof_mem_row **out);

/* Name of a category as the summary and the trace's "cat" write it. */
FSC_API const char *fsc_prof_cat_name(fsc_prof_cat cat);

/* Writes the kept events as Chrome trace event objects, separated by
 * commas (no enclosing brackets: the caller merges ranks), with pid as the
 * process id and times in microseconds since fsc_prof_start. Returns the
 * number of objects written, or FSC_ERR_IO. */
FSC_API int64_t fsc_prof_write_events(FILE *f, int pid);

#ifdef __cplusplus
}
#endif

#endif
