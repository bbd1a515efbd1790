/* fsc dist: the distributed runtime (floor 5) — process groups over MPI,
 * collectives (blocking and non-blocking), a device mesh, and the hang
 * watchdog / desync guard.
 *
 * docs/architecture.md, decisions 7 and 8: every collective goes through a process group
 * whose backend is a table of function pointers (MPI today, NCCL tomorrow);
 * a program started without a launcher is a world of size 1; a collective
 * that a peer never joins ends with an error naming the operation, the group,
 * the sequence number and the ranks missing, never a silent hang; the library
 * never calls MPI_Abort on bad input.
 *
 * Non-blocking collectives do not progress by themselves (neither Open MPI
 * nor MPICH has a progress thread by default): call fsc_group_progress() or
 * fsc_request_test() now and then (DDP does it from its backward hooks).
 */
#ifndef FSC_DIST_H
#define FSC_DIST_H

#include "fsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes of the distributed runtime (continuing core.h's list). */
enum {
    FSC_ERR_MPI = -20,     /* the MPI library reported an error */
    FSC_ERR_TIMEOUT = -21, /* a collective did not complete in time (watchdog) */
    FSC_ERR_DESYNC = -22,  /* ranks issued different collectives */
};

/* ---- initialisation --------------------------------------------------------- */
typedef struct fsc_dist_options {
    double timeout_s;      /* watchdog: a collective not done after this fails (0: 300 s,
                              or FSC_TIMEOUT_S from the environment); 0 or [0.1, 604800] */
    bool full_check;       /* exchange every collective's full signature before it runs
                              (also on with FSC_DESYNC_CHECK=1); off: a cheap hash check */
    double init_timeout_s; /* deadline of MPI's start-up and shut-down (MPI_Init_thread
                              in fsc_dist_init, MPI_Finalize in fsc_dist_finalize); 0:
                              FSC_INIT_TIMEOUT_S, else the timeout but at least 60 s;
                              0 or [0.1, 604800] */
} fsc_dist_options;

/* Exit status of a process whose MPI start-up or shut-down passed its
 * deadline: those calls cannot be abandoned, so the runtime prints what it
 * knows (the call, and the peers lost or not there yet) and ends the process. */
#define FSC_DIST_DEADLINE_EXIT 124
/* Exit status of a process that ends because the watchdog's verdict names a
 * lost rank (a peer that died or stopped answering its heartbeat; not one
 * merely stalled): what fsc-run relaunches on, on the survivors' slots from
 * the last committed checkpoint. 69 is sysexits' EX_UNAVAILABLE. */
#define FSC_DIST_LOST_EXIT 69
/* Whether the watchdog's verdict in force names a lost rank (false without a
 * verdict or when the ranks blamed are only stalled). */
FSC_API bool fsc_dist_peer_lost(void);
/* A process's exit status for a failure rc: 0 for FSC_OK,
 * FSC_DIST_LOST_EXIT when fsc_dist_peer_lost(), else 1. */
FSC_API int fsc_dist_exit_status(int rc);

/* Initialises MPI (MPI_Init_thread, FUNNELED) unless the program already did.
 * First checks the options and the runtime's FSC_* variables (FSC_TIMEOUT_S,
 * FSC_INIT_TIMEOUT_S: seconds in [0.1, 604800]; FSC_DESYNC_CHECK,
 * FSC_HEARTBEAT_PROC: 0 or 1): FSC_ERR_INVALID naming the value and its range,
 * before anything starts.
 * argc/argv may be NULL. Idempotent: a later call only applies `opt` (if not
 * NULL), e.g. to change the timeout. opt->timeout_s > 0 wins over
 * FSC_TIMEOUT_S. Only the thread that called init may call the runtime.
 * FSC_ERR_MPI if MPI fails to start, FSC_ERR_INVALID after MPI_Finalize.
 * Starts the heartbeat thread (it never calls MPI; one UDP socket) that the
 * watchdog asks who is alive; MPI_Init_thread runs under init_timeout_s
 * (FSC_DIST_DEADLINE_EXIT past it). */
FSC_API int fsc_dist_init(int *argc, char ***argv, const fsc_dist_options *opt);
/* Finalises MPI if fsc_dist_init initialised it (under init_timeout_s, as
 * start-up is) and stops the heartbeat thread. After a timeout the
 * abandoned operations stay in flight (MPI may still write into their
 * buffers): their groups are not freed and FSC_ERR_TIMEOUT is returned, so
 * the program can exit non-zero. */
FSC_API int fsc_dist_finalize(void);
FSC_API int fsc_dist_rank(void);       /* world rank (0 without a launcher) */
FSC_API int fsc_dist_size(void);       /* world size (1 without a launcher) */
FSC_API int fsc_dist_local_rank(void); /* rank among the processes of this node */
FSC_API int fsc_dist_local_size(void); /* processes on this node (1 before init) */

/* ---- process groups ------------------------------------------------------ */
typedef struct fsc_group fsc_group;

/* The world group (owned by the runtime; do not free). NULL before init. */
FSC_API fsc_group *fsc_group_world(void);
/* The group of this process alone (owned by the runtime): what a sharded
 * component uses when it should not shard. NULL before init. */
FSC_API fsc_group *fsc_group_self(void);
/* Ranks with the same color form a group, ordered by key (then world rank).
 * Collective over `parent`. color < 0: this rank joins no group (*out = NULL).
 * The caller owns *out (fsc_group_free); name is copied (NULL: "group").
 * FSC_ERR_INVALID for a NULL out or parent, or before fsc_dist_init. A member
 * that never joins is FSC_ERR_TIMEOUT as for any collective; MPI's split
 * itself cannot be abandoned, so it runs under the heartbeat's deadline (the
 * timeout): a member lost inside it ends the process with a message and
 * FSC_DIST_DEADLINE_EXIT. */
FSC_API int fsc_group_split(fsc_group *parent, int color, int key, const char *name,
                            fsc_group **out);
/* Accepts NULL; ignores the world group. Collective (MPI_Comm_free); free a
 * group only once its requests have completed. Never pass fsc_group_self()
 * (the runtime owns it and does not guard it here). */
FSC_API void fsc_group_free(fsc_group *g);
FSC_API int fsc_group_rank(const fsc_group *g);         /* this rank in g; -1 for NULL */
FSC_API int fsc_group_size(const fsc_group *g);         /* ranks in g; 0 for NULL */
FSC_API const char *fsc_group_name(const fsc_group *g); /* owned by g; "(null)" for NULL */
/* World rank of group rank r; -1 for a NULL group or r outside it. */
FSC_API int fsc_group_world_rank(const fsc_group *g, int r);
/* Collectives issued on this group so far (the next one's sequence number);
 * -1 for NULL. */
FSC_API int64_t fsc_group_seq(const fsc_group *g);

/* ---- collectives ----------------------------------------------------------- */
/* dtypes: FSC_DTYPE_F32, BF16, F16, I32, I64 (U16 too, for data movement only).
 * BF16/F16 reductions travel as halves (half the bytes of F32) and are summed
 * like NCCL sums them: each hop widens both operands to F32, adds, and
 * rounds once to the half type, so a sum over P ranks is rounded P - 1 times
 * (|error| <= (P-1) * u * sum |x_i|, u = 2^-8 for BF16, 2^-11 for F16). An
 * allreduce's result is bit-identical on every rank. AVG is SUM divided by
 * the group size (halves: in F32, rounded once more); for I32/I64 that is
 * C's integer division (truncating toward zero).
 *
 * Every collective takes the group's next sequence number and first checks,
 * with tiny control messages, that every rank joined the same collective
 * (kind, dtype, op, count, root): a mismatch is FSC_ERR_DESYNC on every rank,
 * naming each rank's collective. A collective not complete within the timeout
 * (measured from its issue) is FSC_ERR_TIMEOUT naming the operation, the group
 * and the ranks that never joined. Before reporting, the rank asks every rank's
 * heartbeat who is alive: when some rank is lost (no answer: killed, stopped)
 * or stalled (answers, but has been outside fsc for half the timeout), the
 * message names them ("world rank 2 is lost: ...") and is the same text on
 * every survivor, each of which then fails its current and every later
 * collective with it (also after an MPI error in a transfer). Either failure leaves the group
 * unusable (later calls on it fail at once). Arguments wrong on this rank alone (NULL group or
 * buffer, negative count, bad root or op, a call before fsc_dist_init) fail before any
 * communication and take no sequence number: FSC_ERR_INVALID, or FSC_ERR_DTYPE for an unknown dtype
 * or a reduction of U16. A buffer may be NULL only where its count is 0. Buffers are the caller's,
 * borrowed for the call (or, non-blocking, until completion). */
typedef enum { FSC_REDUCE_SUM = 0, FSC_REDUCE_AVG, FSC_REDUCE_MAX } fsc_reduce_op;

typedef struct fsc_request fsc_request;

/* Blocking forms. Buffers hold `count` elements of dt; in-place where noted. */
FSC_API int fsc_group_allreduce(fsc_group *g, void *buf, int64_t count, fsc_dtype dt,
                                fsc_reduce_op op); /* in place */
FSC_API int fsc_group_reduce(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                             int root); /* in place; result on root */
/* Root's buf is copied into every other rank's buf. */
FSC_API int fsc_group_broadcast(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, int root);
/* out holds size * count elements; rank r's `in` lands at out + r*count. */
FSC_API int fsc_group_allgather(fsc_group *g, const void *in, void *out, int64_t count,
                                fsc_dtype dt);
/* Uneven: rank r contributes counts[r] elements, placed at displs[r] (elements).
 * counts and displs hold one entry per rank, each >= 0, alike on every rank. */
FSC_API int fsc_group_allgatherv(fsc_group *g, const void *in, void *out, const int64_t *counts,
                                 const int64_t *displs, fsc_dtype dt);
/* Every rank's rc in one collective: FSC_OK when all are FSC_OK; otherwise
 * every rank returns the first failing rank's status, with that rank's
 * message as "rank R of group G failed <what>: <its error>". what is a
 * phrase such as "writing the checkpoint". A group of one returns rc. */
FSC_API int fsc_group_agree(fsc_group *g, int rc, const char *what);
/* Who should print the current error (fsc_last_error) so that a job says it
 * once: after fsc_group_agree failed, every rank of the group holds the same
 * text, and this returns the world rank that failed first (the one its text
 * names), also once callers have prefixed context to the text. -1 when the
 * current error is this rank's own: print it, naming the rank. */
FSC_API int fsc_dist_error_reporter(void);
/* in holds size * count elements; rank r receives the reduction of chunk r in out. */
FSC_API int fsc_group_reduce_scatter(fsc_group *g, const void *in, void *out, int64_t count,
                                     fsc_dtype dt, fsc_reduce_op op);
/* Uneven: chunk r is counts[r] elements at displs[r] of in. */
FSC_API int fsc_group_reduce_scatterv(fsc_group *g, const void *in, void *out,
                                      const int64_t *counts, const int64_t *displs, fsc_dtype dt,
                                      fsc_reduce_op op);
/* in and out hold size * count elements: chunk r of in goes to rank r. */
FSC_API int fsc_group_alltoall(fsc_group *g, const void *in, void *out, int64_t count,
                               fsc_dtype dt);
/* Returns once every rank of g has entered it. */
FSC_API int fsc_group_barrier(fsc_group *g);
/* Point-to-point, tags in [0, 16384). Not sequence-numbered; with the full
 * check (FSC_DESYNC_CHECK=1) sender and receiver also compare count and dtype. */
FSC_API int fsc_group_send(fsc_group *g, const void *buf, int64_t count, fsc_dtype dt, int dst,
                           int tag);
/* Receives what group rank src sent to this rank with the same tag. */
FSC_API int fsc_group_recv(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, int src, int tag);

/* Non-blocking forms: same arguments, a request out. The buffers must stay
 * valid and untouched until the request completes. The caller owns *req
 * until fsc_request_test reports it done or fsc_request_wait returns (either
 * frees it). A NULL req is FSC_ERR_INVALID; on any failure *req is NULL. */
FSC_API int fsc_group_iallreduce(fsc_group *g, void *buf, int64_t count, fsc_dtype dt,
                                 fsc_reduce_op op, fsc_request **req);
/* As fsc_group_reduce: in place, the result on root. */
FSC_API int fsc_group_ireduce(fsc_group *g, void *buf, int64_t count, fsc_dtype dt,
                              fsc_reduce_op op, int root, fsc_request **req);
/* As fsc_group_broadcast. */
FSC_API int fsc_group_ibroadcast(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, int root,
                                 fsc_request **req);
/* As fsc_group_allgather. */
FSC_API int fsc_group_iallgather(fsc_group *g, const void *in, void *out, int64_t count,
                                 fsc_dtype dt, fsc_request **req);
/* As fsc_group_reduce_scatter. */
FSC_API int fsc_group_ireduce_scatter(fsc_group *g, const void *in, void *out, int64_t count,
                                      fsc_dtype dt, fsc_reduce_op op, fsc_request **req);
/* As fsc_group_send / fsc_group_recv: a pipeline posts its receives early
 * and its sends as soon as the data exists, and a rank that never answers
 * ends the wait under the watchdog like any collective. */
FSC_API int fsc_group_isend(fsc_group *g, const void *buf, int64_t count, fsc_dtype dt, int dst,
                            int tag, fsc_request **req);
/* Receives what group rank src sends with the same tag, into buf. */
FSC_API int fsc_group_irecv(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, int src, int tag,
                            fsc_request **req);
/* *done = true once complete (then the request is freed and *req set to NULL).
 * Errors (desync, timeout) are returned here or by wait. A NULL req or *req
 * counts as complete (FSC_OK, *done = true); done may be NULL. */
FSC_API int fsc_request_test(fsc_request **req, bool *done);
/* Blocks (polling, under the watchdog) until complete; frees the request and
 * sets *req to NULL. A NULL req or *req returns FSC_OK at once. */
FSC_API int fsc_request_wait(fsc_request **req);
/* Drives every outstanding request of the group a little (call between layers).
 * test and wait drive every outstanding request of every group. Accepts NULL. */
FSC_API void fsc_group_progress(fsc_group *g);

/* ---- statistics -------------------------------------------------------------- */
typedef struct fsc_group_stats {
    int64_t count[16]; /* collectives issued, by fsc_coll_kind */
    int64_t bytes;     /* payload bytes this rank handed to the data plane, in the
                          dtype they travel as (count x element size; a BF16
                          reduction counts 2 bytes per element, half of F32's),
                          counted when each collective's data phase starts */
    double wait_s;     /* seconds spent blocked in wait / blocking collectives */
} fsc_group_stats;

typedef enum {
    FSC_COLL_ALLREDUCE = 0,
    FSC_COLL_REDUCE,
    FSC_COLL_BROADCAST,
    FSC_COLL_ALLGATHER,
    FSC_COLL_REDUCE_SCATTER,
    FSC_COLL_ALLTOALL,
    FSC_COLL_BARRIER,
    FSC_COLL_SEND,
    FSC_COLL_RECV,
    FSC_COLL_KIND_COUNT
} fsc_coll_kind;

/* g's figures since creation or the last reset (all zero for NULL). */
FSC_API fsc_group_stats fsc_group_get_stats(const fsc_group *g);
FSC_API void fsc_group_reset_stats(fsc_group *g); /* zeroes them; accepts NULL */

/* ---- device mesh: dp x pp x cp x tp, tp varying fastest, then cp ------------- */
/* World rank = ((d * pp + p) * cp + c) * tp + t (over a group: the group's
 * rank), so a TP group is a run of adjacent ranks and a context-parallel
 * ring the next closest. Every technique takes its process groups from one
 * mesh built from the layout: the strategies (fsc_strategy_options.mesh),
 * the pipeline, tensor and context parallelism through them, MoE's experts
 * (the dp group) and the tools. */
typedef struct fsc_mesh fsc_mesh;

/* The layout. Zero means the default: 1, and for dp the parent's size /
 * (pp x tp x cp). cp is context parallelism (each rank of a cp group holds
 * part of every sequence, fsc/cp.h); ep (experts over a group of their own;
 * MoE's experts spread over dp today) is room for the next dimension:
 * nothing runs it yet, so ep > 1 is refused (FSC_ERR_UNSUPPORTED). */
typedef struct fsc_mesh_shape {
    int dp, pp, tp, cp, ep;
} fsc_mesh_shape;

/* Refuses sizes that do not multiply to the world size, naming the numbers
 * (FSC_ERR_INVALID, as for sizes < 1, a NULL out or a call before
 * fsc_dist_init). Collective over the world. The caller owns *out. cp is 1. */
FSC_API int fsc_mesh_new(int dp, int pp, int tp, fsc_mesh **out);
/* The mesh over the ranks of parent (NULL: the world), laid out by parent's
 * ranks as fsc_mesh_new lays out the world's. Refuses as fsc_mesh_new does,
 * and ep > 1 (see fsc_mesh_shape). Collective over parent, which must
 * outlive the mesh. The caller owns *out. */
FSC_API int fsc_mesh_new_over(fsc_group *parent, fsc_mesh_shape shape, fsc_mesh **out);
/* Frees the mesh and its groups (collective, as fsc_group_free). Accepts NULL. */
FSC_API void fsc_mesh_free(fsc_mesh *m);
/* The group the mesh lays out (the world or fsc_mesh_new_over's parent;
 * not owned by the mesh). NULL for a NULL mesh. */
FSC_API fsc_group *fsc_mesh_parent(const fsc_mesh *m);
typedef enum { FSC_MESH_DP = 0, FSC_MESH_PP, FSC_MESH_TP, FSC_MESH_CP, FSC_MESH_DIMS } fsc_mesh_dim;
/* The group of ranks that differ from this rank only along `dim` (owned by
 * the mesh: do not free it). NULL for a NULL mesh or a bad dim. */
FSC_API fsc_group *fsc_mesh_group(const fsc_mesh *m, fsc_mesh_dim dim);
FSC_API int fsc_mesh_size(const fsc_mesh *m, fsc_mesh_dim dim); /* 0 for NULL or a bad dim */
/* This rank's index along dim; -1 for NULL or a bad dim. */
FSC_API int fsc_mesh_coord(const fsc_mesh *m, fsc_mesh_dim dim);
/* The ranks of this rank's model replica: every pp and tp coordinate with
 * this rank's dp and cp coordinates, ranked p * tp + t (owned by the mesh).
 * NULL for a NULL mesh. */
FSC_API fsc_group *fsc_mesh_replica(const fsc_mesh *m);
/* The ranks that hold the same parameters as this one and see different
 * tokens: every dp and cp coordinate with this rank's pp and tp
 * coordinates, ranked d * cp + c (owned by the mesh); data-parallel
 * gradients are summed over it. The dp group when cp is 1. NULL for a NULL
 * mesh. */
FSC_API fsc_group *fsc_mesh_dp_cp(const fsc_mesh *m);
/* A group of some ranks along dim (e.g. the pipeline stages that hold one
 * shared parameter): this rank's line along dim, cut to the coordinates
 * whose bits are set in coords, ranked by coordinate; *out is NULL on a
 * rank whose own coordinate is not in coords. Collective over the line
 * (every rank of fsc_mesh_group(m, dim) calls it with the same coords).
 * The caller frees *out. FSC_ERR_UNSUPPORTED past 64 ranks along dim. */
FSC_API int fsc_mesh_subgroup(const fsc_mesh *m, fsc_mesh_dim dim, uint64_t coords,
                              const char *name, fsc_group **out);

#ifdef __cplusplus
}
#endif
#endif
