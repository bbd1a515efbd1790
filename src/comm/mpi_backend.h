/* Internal to the MPI backend (backend_mpi.c, ring.c): its context and its
 * in-flight operation record.
 *
 * The one idea: an in-flight operation is either a batch of MPI requests
 * (MPI's own non-blocking collectives, or point-to-point pieces) or a ring
 * (or recursive doubling's exchanges, eager.c) whose steps are posted one at a
 * time as `test` finds the previous one done.
 */
#ifndef FSC_DIST_MPI_BACKEND_H
#define FSC_DIST_MPI_BACKEND_H

#include "dist_internal.h"

typedef struct mpi_ctx {
    MPI_Comm data; /* collectives and the rings' point-to-point steps */
    MPI_Comm p2p;  /* the user's send/recv, so user tags never meet ring tags */
    int rank, size;
} mpi_ctx;

typedef enum { BOP_REQS = 0, BOP_RING, BOP_EAGER } bop_kind;
typedef enum { RING_RS = 0, RING_AG, RING_DONE } ring_phase;

struct fsc_bop {
    bop_kind kind;
    mpi_ctx *c;
    MPI_Request *reqs; /* receives and MPI's own collectives */
    int nreq, cap;
    MPI_Request *sreqs; /* sends: a ring's next step may start before they end */
    int nsreq, scap;
    int nold; /* ring: the first nold sends are earlier steps' */
    /* ring */
    ring_phase phase;
    bool then_ag;     /* allreduce: reduce-scatter then allgather */
    bool recv_posted; /* the current step's receives are posted */
    int step, tag;
    const char *in;
    char *out;
    int64_t *counts, *displs; /* [size], owned */
    fsc_dtype dt;
    fsc_reduce_op op;
    size_t esz;
    MPI_Datatype mt;
    char *tmp; /* two scratch chunks of the largest count, from the pool */
    int64_t tmp_elems;
};

MPI_Datatype fsc_mpi_dtype(fsc_dtype dt);
int fsc_mpi_bop_new(mpi_ctx *c, bop_kind kind, fsc_bop **out);
/* Frees b, its requests (completed or abandoned by then) and its scratch. */
void fsc_mpi_bop_free(fsc_bop *b);
/* Whether an allreduce of count x dt runs as a ring (else MPI_Iallreduce). */
bool fsc_mpi_allreduce_rings(const mpi_ctx *c, int64_t count, fsc_dtype dt);
/* An allreduce as a ring over even chunks; sends_only: as fsc_ring_start. */
int fsc_ring_allreduce(mpi_ctx *c, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                       bool sends_only, int64_t seq, fsc_bop **out);
/* Posts n elements as pieces of at most fsc_dist_rt.max_msg (n == 0 posts
 * nothing): sends into b->sreqs, receives into b->reqs. */
int fsc_mpi_post_send(fsc_bop *b, MPI_Comm comm, const void *buf, int64_t n, fsc_dtype dt, int peer,
                      int tag);
int fsc_mpi_post_recv(fsc_bop *b, MPI_Comm comm, void *buf, int64_t n, fsc_dtype dt, int peer,
                      int tag);

/* ring.c: counts/displs are copied. in/out as in backend.h. sends_only:
 * post the first step's sends only (its receives at the first test), so
 * that nothing is received before the desync check passed (eager.c). */
int fsc_ring_start(mpi_ctx *c, const void *in, void *out, const int64_t *counts,
                   const int64_t *displs, fsc_dtype dt, fsc_reduce_op op, ring_phase first,
                   bool then_ag, bool sends_only, int64_t seq, fsc_bop **out_op);
/* The same with every message under `tag` (seq's plain tag, or eager.c's
 * signed one). */
int fsc_ring_start_tagged(mpi_ctx *c, const void *in, void *out, const int64_t *counts,
                          const int64_t *displs, fsc_dtype dt, fsc_reduce_op op, ring_phase first,
                          bool then_ag, bool sends_only, int tag, fsc_bop **out_op);
int fsc_ring_test(fsc_bop *b, bool *done);

/* eager.c: the backend's early allreduce entries (backend.h). */
int fsc_eager_start(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                    int64_t seq, int64_t sig, fsc_bop **out);
int fsc_eager_test(fsc_bop *b, bool *done);
int fsc_eager_settle(void *ctx, fsc_bop *mine, const int64_t *count, const fsc_dtype *dt,
                     const int64_t *sig, int64_t seq, double deadline);
int fsc_eager_peek(fsc_bop *b, fsc_early_peek *out);

#endif
