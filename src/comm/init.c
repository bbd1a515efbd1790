/* Start-up and shut-down of the distributed runtime: MPI initialisation
 * (FUNNELED, or adopting an MPI the program already started), world and node
 * ranks, the watchdog options and the world group.
 *
 * The one idea: a program without a launcher still initialises MPI (as a
 * singleton), so a single process is simply a world of size 1 and every
 * collective works unchanged. MPI's own start-up and shut-down block until
 * every peer takes part, so the heartbeat thread (heartbeat.c) starts first
 * and holds a deadline over both: a peer that never starts or never finishes
 * ends this process with a message instead of a hang.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heartbeat.h"

/* Allreduces from 4 KiB up use the ring: measured with tests/comm/bench_dist.c at
 * 2 ranks, it beats MPI_Iallreduce from 4 KiB (4 vs 7 us) to 100 MB (24 vs
 * 91 ms); below, both take about a microsecond and MPI's needs no steps.
 * Recursive doubling beats the ring up to 64 KiB; at 2 ranks (one exchange
 * in eager-sized pieces, its receives posted at issue) also at 256 KiB, 5-10%
 * in both VM speed states, and there its sums are the ring's bit for bit
 * (a + b commutes). On 4 ranks its order is not the ring's, which reduce and
 * reduce-scatter share and tests replaying a strategy by hand rely on, so
 * larger groups stay at 64 KiB. Rings up to 512 KiB send their
 * first step beside the desync check (at 512 KiB 3-5% faster than after it
 * in three runs under load; from 1 MiB level or slower: the early send
 * arrives before its receive is posted). */
fsc_dist_runtime fsc_dist_rt = {.max_msg = INT_MAX,
                                .ring_min_bytes = (int64_t)4 << 10,
                                .eager_max_bytes = (int64_t)256 << 10,
                                .eager_max_many_bytes = (int64_t)64 << 10,
                                .early_max_bytes = (int64_t)512 << 10};

int fsc_dist_mpi_error(int rc, const char *what) {
    char text[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
    text[len] = '\0';
    return fsc_error(FSC_ERR_MPI, "%s failed: %s (MPI error %d)", what, len ? text : "?", rc);
}

int fsc_dist_require_init(const char *fn) {
    if (!fsc_dist_rt.initialized)
        return fsc_error(FSC_ERR_INVALID,
                         "%s: the distributed runtime is not initialised "
                         "(call fsc_dist_init first)",
                         fn);
    return FSC_OK;
}

/* Deadline of MPI_Init_thread and MPI_Finalize: the option, FSC_INIT_TIMEOUT_S,
 * else the collective timeout (the option's or a given FSC_TIMEOUT_S, not its
 * default) but at least 60 s (a loaded machine starts slowly). The variables
 * were checked by check_options. */
static double init_deadline(const fsc_dist_options *opt) {
    double t = 0; /* FSC_INIT_TIMEOUT_S's getter: 0 when unset, the default is derived here */
    if (opt && opt->init_timeout_s > 0) return opt->init_timeout_s;
    if (!fsc_env_double("FSC_INIT_TIMEOUT_S", &t) && t > 0) return t;
    t = opt && opt->timeout_s > 0 ? opt->timeout_s : 0;
    double env = 0;
    if (t <= 0 && fsc_env_given("FSC_TIMEOUT_S") && !fsc_env_double("FSC_TIMEOUT_S", &env)) t = env;
    return t > 60 ? t : 60;
}

static void apply_options(const fsc_dist_options *opt) {
    double t = opt && opt->timeout_s > 0 ? opt->timeout_s : 0, env = 0;
    if (t <= 0 && !fsc_env_double("FSC_TIMEOUT_S", &env)) t = env; /* 300 s unless set */
    fsc_dist_rt.timeout_s = t > 0 ? t : 300.0;
    bool full = false;
    fsc_env_bool("FSC_DESYNC_CHECK", &full);
    fsc_dist_rt.full_check = (opt && opt->full_check) || full;
}

/* The options' seconds: 0 (the default) or the variables' range. */
static int check_seconds(double v, const char *field) {
    if (v == 0 || (v >= 0.1 && v <= 604800.0)) return FSC_OK;
    return fsc_error(FSC_ERR_INVALID,
                     "fsc_dist_init: options.%s = %g: expected 0 (the default) or seconds in "
                     "[0.1, 604800]",
                     field, v);
}

/* Before anything starts: a value out of range is refused, never replaced by
 * a default behind the user's back. */
static int check_options(const fsc_dist_options *opt) {
    int rc = fsc_env_check_reader("comm"); /* the environment table's rows for this floor */
    if (rc) return fsc_error_context(rc, "fsc_dist_init: ");
    if (opt && !rc) rc = check_seconds(opt->timeout_s, "timeout_s");
    if (opt && !rc) rc = check_seconds(opt->init_timeout_s, "init_timeout_s");
    return rc;
}

static int init_runtime(int *argc, char ***argv, const fsc_dist_options *opt);

/* The group `name` over a duplicate of base (its control communicator) and
 * the backend's context from make: the world's and this process's own. */
static int base_group(const char *name, MPI_Comm base, int (*make)(void **), fsc_group **out) {
    MPI_Comm ctrl;
    int rc = MPI_Comm_dup(base, &ctrl);
    if (rc != MPI_SUCCESS) {
        char what[32];
        snprintf(what, sizeof what, "MPI_Comm_dup(%s)", name);
        return fsc_dist_mpi_error(rc, what);
    }
    void *ctx = NULL;
    rc = make(&ctx);
    if (rc == FSC_OK) rc = fsc_group_create(name, ctrl, ctx, out);
    if (rc != FSC_OK) {
        if (ctx) fsc_backend_mpi.free(ctx);
        MPI_Comm_free(&ctrl);
        return fsc_error_context(rc, "fsc_dist_init: ");
    }
    return FSC_OK;
}

int fsc_dist_init(int *argc, char ***argv, const fsc_dist_options *opt) {
    int rc = check_options(opt);
    if (rc) return rc;
    if (fsc_dist_rt.initialized) {
        if (opt) apply_options(opt); /* a second call may only change the options */
        return FSC_OK;
    }
    rc = init_runtime(argc, argv, opt);
    fsc_hb_arm(0, ""); /* whatever the outcome, start-up is over */
    return rc;
}

static int init_runtime(int *argc, char ***argv, const fsc_dist_options *opt) {
    int flag = 0, rc;
    MPI_Finalized(&flag);
    if (flag) return fsc_error(FSC_ERR_INVALID, "fsc_dist_init: MPI has already been finalised");
    MPI_Initialized(&flag);
    if (fsc_hb_start() != FSC_OK) /* without it: the control plane's account of failures */
        fsc_log(FSC_LOG_WARN, "fsc_dist_init: %s", fsc_last_error());
    fsc_dist_rt.init_timeout_s = init_deadline(opt);
    if (!flag) {
        int provided = 0;
        fsc_hb_set_phase(FSC_HB_INIT);
        fsc_hb_arm(fsc_dist_rt.init_timeout_s, "MPI_Init_thread (fsc_dist_init)");
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        fsc_hb_arm(0, "");
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Init_thread");
        fsc_dist_rt.we_initialized_mpi = true;
    }
    apply_options(opt);
    fsc_hb_arm(fsc_dist_rt.init_timeout_s, "the start-up exchange of fsc_dist_init");
    rc = fsc_hb_connect();
    if (rc) fsc_log(FSC_LOG_WARN, "fsc_dist_init: %s", fsc_last_error());
    fsc_hb_set_phase(FSC_HB_RUN);
    MPI_Comm_rank(MPI_COMM_WORLD, &fsc_dist_rt.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &fsc_dist_rt.size);

    MPI_Comm node;
    rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Comm_split_type(SHARED)");
    MPI_Comm_rank(node, &fsc_dist_rt.local_rank);
    MPI_Comm_size(node, &fsc_dist_rt.local_size);
    MPI_Comm_free(&node);

    rc = base_group("world", MPI_COMM_WORLD, fsc_backend_mpi.world, &fsc_dist_rt.world);
    /* the group of this process alone: no communication to create or use */
    if (!rc) rc = base_group("self", MPI_COMM_SELF, fsc_backend_mpi.self, &fsc_dist_rt.self);
    if (rc) return rc;
    fsc_dist_rt.initialized = true;
    return FSC_OK;
}

int fsc_dist_finalize(void) {
    if (!fsc_dist_rt.initialized) return FSC_OK;
    int rc = FSC_OK;
    if (fsc_dist_rt.abandoned) {
        /* Operations abandoned after a timeout may still be written into, so
         * their buffers and communicators are left alone. */
        rc = fsc_error(FSC_ERR_TIMEOUT, "fsc_dist_finalize: collectives abandoned after a "
                                        "timeout are still in flight; the process should "
                                        "exit with a non-zero status");
    } else {
        fsc_group_destroy(fsc_dist_rt.world);
        fsc_group_destroy(fsc_dist_rt.self);
    }
    fsc_dist_buf_trim(); /* cached buffers only; any still lent out stay put */
    fsc_dist_rt.world = NULL;
    fsc_dist_rt.self = NULL;
    fsc_dist_rt.initialized = false;
    if (fsc_dist_rt.we_initialized_mpi) {
        fsc_hb_set_phase(FSC_HB_FINALIZE);
        fsc_hb_arm(fsc_dist_rt.init_timeout_s, "MPI_Finalize (fsc_dist_finalize)");
        int mrc = MPI_Finalize();
        fsc_hb_arm(0, "");
        fsc_dist_rt.we_initialized_mpi = false;
        if (mrc != MPI_SUCCESS && rc == FSC_OK) rc = fsc_dist_mpi_error(mrc, "MPI_Finalize");
    }
    fsc_hb_stop();
    return rc;
}

int fsc_dist_rank(void) {
    return fsc_dist_rt.initialized ? fsc_dist_rt.rank : 0;
}
int fsc_dist_size(void) {
    return fsc_dist_rt.initialized ? fsc_dist_rt.size : 1;
}
int fsc_dist_local_rank(void) {
    return fsc_dist_rt.initialized ? fsc_dist_rt.local_rank : 0;
}
int fsc_dist_local_size(void) {
    return fsc_dist_rt.initialized ? fsc_dist_rt.local_size : 1;
}

fsc_group *fsc_group_world(void) {
    return fsc_dist_rt.world;
}

fsc_group *fsc_group_self(void) {
    return fsc_dist_rt.self;
}
