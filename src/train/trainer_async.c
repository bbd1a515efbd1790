/* Asynchronous checkpoints of a trainer (fsc_trainer_config.async_save): the
 * save's files are captured in memory at the save step (trainer_checkpoint.c),
 * a background thread writes them while training goes on, and the
 * checkpoint is committed only after every rank reported its part written.
 *
 * The one idea: the background thread makes no MPI call; every agreement
 * runs on the main thread, at a step boundary every rank reaches alike. While
 * a save is in flight each step starts with one 4-byte all-reduce ("is any
 * rank still writing?"); when none is, the ranks agree on the outcome (a
 * failure names the rank and the file), gather the runs' checksums, and the
 * roots' threads verify, rename and commit (checkpoint.c: state.json, fsync,
 * rename, `latest`); a last agreement at a later boundary reports the commit.
 * A save point or the end waits for the one in flight: saves never overlap.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "io/ckpt_stage.h"
#include "io/io_internal.h"
#include "trainer_internal.h"

enum { IDLE, WRITING, COMMITTING };

struct trainer_async {
    ckpt_stage *stage;
    ckpt_stage *spare;  /* the last save's stage, recycled: its buffers serve the next */
    fsc_ckpt_writer *w; /* the root's checkpoint, until committed or aborted */
    int phase, rank;
    pthread_t th;
    bool running; /* th started and not joined */
    atomic_int done;
    int rc, polls;  /* polls: the step boundaries' all-reduces while in flight */
    char msg[1024]; /* the thread's error (errors are per thread) */
    char name[64];  /* "checkpoint step-000010" */
};

int trainer_async_begin(fsc_trainer *t) {
    if (!t->cfg.async_save) return FSC_OK;
    const char *why = t->cfg.strategy.tp.size > 1 ? "tensor parallelism writes its slices in place"
                      : !ckpt_stage_threads_ok()  ? "MPI was not initialised with a thread level "
                                                    "of at least MPI_THREAD_FUNNELED"
                                                  : NULL;
    if (why) {
        if (fsc_group_rank(fsc_strategy_all(t->s)) == 0)
            fsc_log(FSC_LOG_WARN, "async save: %s; checkpoints are saved synchronously", why);
        t->cfg.async_save = false;
        return FSC_OK;
    }
    t->async = calloc(1, sizeof *t->async);
    if (!t->async) return fsc_error(FSC_ERR_NOMEM, "trainer: out of memory");
    t->async->rank = fsc_dist_rank();
    return FSC_OK;
}

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *run(void *arg) {
    trainer_async *a = arg;
    fsc_io_busy_quiet(); /* the main thread's scope speaks for the rank */
    /* what the thread costs the step beside it: its CPU time, against the wall */
    const double t0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_THREAD_CPUTIME_ID);
    int rc = a->phase == WRITING ? ckpt_stage_write(a->stage, a->rank)
                                 : ckpt_stage_finish(a->stage, a->w);
    if (a->phase == COMMITTING && a->w) {
        if (rc)
            fsc_ckpt_abort(a->w);
        else
            rc = fsc_ckpt_commit(a->w);
        a->w = NULL;
    }
    if (rc) snprintf(a->msg, sizeof a->msg, "%s", fsc_last_error());
    fsc_log(FSC_LOG_DEBUG, "async save: rank %d: %s of %s: %.3f s, %.3f s of CPU", a->rank,
            a->phase == WRITING ? "writing" : "committing", a->name, seconds(CLOCK_MONOTONIC) - t0,
            seconds(CLOCK_THREAD_CPUTIME_ID) - c0);
    a->rc = rc;
    atomic_store(&a->done, 1);
    return NULL;
}

static void start(trainer_async *a, int phase) {
    a->phase = phase, a->rc = FSC_OK;
    atomic_store(&a->done, 0);
    a->running = pthread_create(&a->th, NULL, run, a) == 0;
    if (!a->running) {
        fsc_log(FSC_LOG_WARN, "async save: cannot start a thread; writing %s now", a->name);
        run(a);
    }
}

static void join(trainer_async *a) {
    if (a->running) pthread_join(a->th, NULL);
    a->running = false;
}

/* Drops the save in flight: temporaries removed, `latest` untouched; its
 * stage kept, empty, with its buffers for the next save. */
static void discard(trainer_async *a) {
    join(a);
    ckpt_stage_recycle(a->stage);
    if (a->spare)
        ckpt_stage_free(a->stage);
    else
        a->spare = a->stage;
    fsc_ckpt_abort(a->w);
    a->stage = NULL, a->w = NULL, a->phase = IDLE, a->polls = 0;
}

int trainer_async_start(fsc_trainer *t, fsc_ckpt_writer *w, ckpt_stage *stage, int rc) {
    trainer_async *a = t->async;
    a->stage = stage, a->w = w;
    snprintf(a->name, sizeof a->name, "checkpoint step-%06lld", (long long)t->step);
    if (rc) {
        discard(a);
        return rc;
    }
    fsc_log(FSC_LOG_DEBUG, "async save: %s staged, %zu bytes on rank %d", a->name,
            ckpt_stage_bytes(stage), a->rank);
    start(a, WRITING);
    return FSC_OK;
}

bool trainer_async_busy(const fsc_trainer *t) {
    return t->async && t->async->phase != IDLE;
}

int trainer_async_poll(fsc_trainer *t, bool wait) {
    trainer_async *a = t->async;
    if (!a || a->phase == IDLE) return FSC_OK;
    fsc_group *all = fsc_strategy_all(t->s);
    char what[128];
    if (wait && !atomic_load(&a->done))
        fsc_log(FSC_LOG_DEBUG, "async save: rank %d waits for %s (still being written)", a->rank,
                a->name);
    for (;;) {
        if (wait && a->running) { /* a slow disk here is busy in fsc, not stalled */
            snprintf(what, sizeof what, "waiting for the background write of %s", a->name);
            const bool busy = fsc_io_busy_begin(what) == FSC_OK;
            join(a);
            if (busy) fsc_io_busy_end();
        }
        int32_t pending = !atomic_load(&a->done);
        a->polls++;
        if (fsc_group_size(all) > 1) {
            int rc = fsc_group_allreduce(all, &pending, 1, FSC_DTYPE_I32, FSC_REDUCE_MAX);
            if (rc) {
                discard(a);
                return rc;
            }
        }
        if (pending && !wait) return FSC_OK;
        if (pending) continue;
        join(a);
        int rc = a->rc ? fsc_error(a->rc, "%s", a->msg) : FSC_OK;
        if (a->phase == WRITING) {
            snprintf(what, sizeof what, "writing %s in the background", a->name);
            rc = fsc_group_agree(all, rc, what);
            if (!rc) rc = ckpt_stage_gather(a->stage);
            if (rc) {
                discard(a);
                return rc;
            }
            start(a, COMMITTING);
            if (!wait) return FSC_OK;
            continue;
        }
        snprintf(what, sizeof what, "committing %s in the background", a->name);
        rc = fsc_group_agree(all, rc, what);
        if (!rc)
            fsc_log(FSC_LOG_DEBUG, "async save: rank %d: %s committed (%d step polls)", a->rank,
                    a->name, a->polls);
        discard(a); /* the thread is joined and w consumed: recycles the stage */
        return rc;
    }
}

ckpt_stage *trainer_async_stage(fsc_trainer *t) {
    trainer_async *a = t->async;
    ckpt_stage *s = a->spare;
    a->spare = NULL;
    return s ? s : ckpt_stage_new();
}

void trainer_async_free(fsc_trainer *t) {
    if (!t->async) return;
    if (t->async->phase != IDLE)
        fsc_log(FSC_LOG_WARN,
                "async save: %s abandoned (the trainer was freed before it was "
                "committed; fsc_trainer_checkpoint_wait commits it)",
                t->async->name);
    discard(t->async);
    ckpt_stage_free(t->async->spare);
    free(t->async);
    t->async = NULL;
}
