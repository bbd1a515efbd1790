/* Internal state of the distributed runtime shared by the files of src/comm: the
 * runtime record, the process group, the request and the watchdog's control
 * plane.
 *
 * The one idea: every collective, blocking or not, is a request that moves
 * through two phases. CONTROL: the rank announces (seq, signature) to every
 * peer on the group's control communicator and waits, under the watchdog,
 * for theirs; that proves every peer joined and issued the same collective
 * (the desync check), or names who did not. DATA: the backend operation runs,
 * polled under the same deadline. Blocking calls are a request plus a wait.
 * An allreduce's first data messages leave with the announcement
 * (eager.c), so it pays no round trip for the check; its buffer is written
 * only once the check passed. On a group of two the first data message
 * carries the signature itself (a hash of it, in the tag) and replaces the
 * announcement: one message each way, as MPI's own allreduce sends; the
 * announcement follows only when the peer's message differs or the peer
 * announced (a desync), so both sides can still name both collectives.
 */
#ifndef FSC_DIST_INTERNAL_H
#define FSC_DIST_INTERNAL_H

#include <mpi.h>

#include "fsc/dist.h"
#include "backend.h"

/* Control-plane tags: collectives use [0, CTRL_P2P_BASE), point-to-point
 * checks (full check only) use [CTRL_P2P_BASE, 2*CTRL_P2P_BASE). */
#define FSC_CTRL_P2P_BASE 16384
/* Internal collective kind for fsc_group_split (not counted in stats). */
#define FSC_KIND_SPLIT ((int)FSC_COLL_KIND_COUNT)
/* Words of a signature announcement: seq, kind, dtype, op, count, root, vhash. */
enum { SIG_SEQ = 0, SIG_KIND, SIG_DTYPE, SIG_OP, SIG_COUNT, SIG_ROOT, SIG_VHASH, SIG_WORDS };

typedef struct fsc_dist_runtime {
    bool initialized;
    bool we_initialized_mpi;
    bool abandoned; /* a timed-out operation is still in flight somewhere */
    int rank, size, local_rank, local_size;
    double timeout_s;
    double init_timeout_s; /* deadline of MPI_Init_thread and MPI_Finalize */
    bool full_check;
    int64_t max_msg;              /* largest message in elements (INT_MAX; lowered by tests) */
    int64_t ring_min_bytes;       /* allreduces this large use the ring (benchmarks move it) */
    int64_t eager_max_bytes;      /* allreduces up to this large run by recursive doubling on
                                     a group of two (eager.c) */
    int64_t eager_max_many_bytes; /* ... and on a larger power-of-two group */
    int64_t early_max_bytes;      /* ring allreduces up to this large send their first step
                                     beside the desync check (eager.c). Benchmarks and tests
                                     move all three thresholds, on every rank alike */
    int64_t sent_bytes;           /* bytes posted in point-to-point sends (rings, alltoall, send):
                                     what really went on the wire, for tests */
    int64_t announcements;        /* signature announcements sent (one per peer), for tests */
    fsc_group *world;
    fsc_group *self;                          /* this process alone */
    fsc_request *pending_head, *pending_tail; /* every outstanding request, issue order */
} fsc_dist_runtime;

extern fsc_dist_runtime fsc_dist_rt;

struct fsc_group {
    char name[48];
    int rank, size;
    int *world_ranks; /* [size] */
    MPI_Comm ctrl;    /* control plane (always MPI): announcements, split */
    const fsc_backend_ops *be;
    void *be_ctx;      /* data plane */
    int64_t seq;       /* next collective's sequence number */
    int64_t next_data; /* data phases start in seq order: the next to start */
    int64_t *last_seq; /* [size] latest announcement seen from each rank (-1: none) */
    int *last_kind;    /* [size] its kind */
    int broken;        /* 0, or FSC_ERR_DESYNC / FSC_ERR_TIMEOUT once the group is unusable */
    char broken_msg[160];
    fsc_group_stats stats;
};

typedef enum { REQ_CONTROL = 0, REQ_READY, REQ_DATA, REQ_DONE, REQ_FAILED } fsc_req_phase;

/* Everything needed to start the data phase later (the call's arguments). */
typedef struct fsc_coll_args {
    int kind; /* fsc_coll_kind or FSC_KIND_SPLIT */
    void *buf;
    const void *in;
    void *out;
    int64_t count;
    int64_t *counts, *displs; /* [size], owned copies (v variants) */
    fsc_dtype dt;
    fsc_reduce_op op;
    int root; /* root, or peer for send/recv */
    int tag;
} fsc_coll_args;

struct fsc_request {
    fsc_group *g;
    fsc_coll_args a;
    int64_t seq; /* -1 for point-to-point */
    double t_start;
    fsc_req_phase phase;
    int status;
    char *errmsg;      /* the failure's message, replayed by test/wait */
    bool checked;      /* takes part in the control exchange */
    bool early;        /* bop was posted before the check and has not finished (eager.c) */
    bool signed_early; /* bop's first message carries the signature to the one peer, which
                          gets no announcement unless the check fails (watchdog.c) */
    bool announced;    /* this rank's announcements are posted */
    bool listening;    /* the receives for the peers' announcements are posted */
    /* control phase */
    int64_t sig[SIG_WORDS];
    int64_t *inbox;    /* [npeers][SIG_WORDS] */
    int *peers;        /* [npeers] group ranks */
    MPI_Request *ctrl; /* [2*npeers]: receives then sends */
    int npeers;
    /* data phase */
    fsc_bop *bop;
    fsc_request *prev, *next; /* in fsc_dist_rt's pending list */
};

/* init.c */
int fsc_dist_mpi_error(int rc, const char *what);
int fsc_dist_require_init(const char *fn);

/* group.c */
int fsc_group_create(const char *name, MPI_Comm ctrl, void *be_ctx, fsc_group **out);
void fsc_group_destroy(fsc_group *g);
const char *fsc_coll_kind_name(int kind);

/* watchdog.c: signatures, control exchange, desync and timeout messages */
void fsc_wd_signature(fsc_request *r);
int64_t fsc_wd_sig_hash(const int64_t *sig); /* of SIG_WORDS words: >= 0 */
int fsc_wd_begin(fsc_request *r);
int fsc_wd_test(fsc_request *r, bool *done);
int fsc_wd_timeout(fsc_request *r); /* also when a peer's verdict arrives first */
/* Some live rank of r's group is on file work (a slow disk, FSC_IO_TIMEOUT_S
 * bounds it on that rank): the wait goes on rather than time out. Probes. */
bool fsc_wd_peer_busy(const fsc_request *r);
/* A failed transfer (FSC_ERR_MPI): the heartbeat's verdict when some rank is
 * lost or stalled (FSC_ERR_TIMEOUT, the group unusable), else rc unchanged. */
int fsc_wd_peer_failure(fsc_request *r, int rc);
void fsc_wd_describe(const fsc_request *r, char *buf, size_t n);

/* request.c: lifecycle, progress, waits */
int fsc_request_issue(fsc_group *g, const fsc_coll_args *a, fsc_request **out);
int fsc_request_run(fsc_group *g, const fsc_coll_args *a); /* issue + wait */
int fsc_request_step(fsc_request *r);                      /* drive once */
void fsc_request_abandon(fsc_request *r);

/* collectives.c: starting and finishing the data phase */
int fsc_coll_start(fsc_request *r);
int fsc_coll_finish(fsc_request *r);
void fsc_coll_release(fsc_request *r);
/* Allreduces beside the desync check (backend.h's early entries): post
 * the first messages at issue (sets r->bop and r->early when the backend
 * does), and after a failed check or a group broken before the data phase,
 * complete every early message this rank sent or was sent (needs every
 * peer's announcement in r->inbox). */
int fsc_coll_start_early(fsc_request *r);
int fsc_coll_settle_early(fsc_request *r);

/* pool.c: a few cached FSC_MEM_COMM buffers (ring scratch), so large
 * collectives do not fault fresh pages in on every call */
void *fsc_dist_buf_get(size_t bytes);
void fsc_dist_buf_put(void *p);
void fsc_dist_buf_trim(void);

/* elementwise.c: local math of the reductions. BF16/F16 (dt of to/from_f32:
 * one of the two) convert bit for bit as core's fsc_*_to_* do, inlined. */
void fsc_dist_to_f32(float *dst, const void *src, int64_t n, fsc_dtype dt);
void fsc_dist_from_f32(void *dst, const float *src, int64_t n, fsc_dtype dt);
/* dst = a op b (SUM or MAX); dst may alias either. BF16/F16 sums add in F32
 * and round once. */
void fsc_dist_accumulate(void *dst, const void *a, const void *b, int64_t n, fsc_dtype dt,
                         fsc_reduce_op op);
/* buf /= by (BF16/F16 in F32, rounded once; integers truncating). */
void fsc_dist_divide(void *buf, int64_t n, fsc_dtype dt, int64_t by);

#endif
