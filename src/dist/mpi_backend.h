/* Internal to the MPI backend (backend_mpi.c, ring.c): its context and its
 * in-flight operation record.
 *
 * The one idea: an in-flight operation is either a batch of MPI requests
 * (MPI's own non-blocking collectives, or point-to-point pieces) or a ring
 * (or a small allreduce's exchanges, eager.c) whose steps are posted one at a
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
    MPI_Request *reqs;
    int nreq, cap;
    /* ring */
    ring_phase phase;
    bool then_ag; /* allreduce: reduce-scatter then allgather */
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
/* Posts n elements as pieces of at most fsc_dist_rt.max_msg (n == 0 posts nothing). */
int fsc_mpi_post_send(fsc_bop *b, MPI_Comm comm, const void *buf, int64_t n, fsc_dtype dt, int peer,
                      int tag);
int fsc_mpi_post_recv(fsc_bop *b, MPI_Comm comm, void *buf, int64_t n, fsc_dtype dt, int peer,
                      int tag);

/* ring.c: counts/displs are copied. in/out as in backend.h. */
int fsc_ring_start(mpi_ctx *c, const void *in, void *out, const int64_t *counts,
                   const int64_t *displs, fsc_dtype dt, fsc_reduce_op op, ring_phase first,
                   bool then_ag, int64_t seq, fsc_bop **out_op);
int fsc_ring_test(fsc_bop *b, bool *done);

/* eager.c: the backend's early allreduce entries (backend.h). */
int64_t fsc_eager_bytes(void *ctx, int from, int to, int64_t count, fsc_dtype dt);
int fsc_eager_start(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                    int64_t seq, fsc_bop **out);
int fsc_eager_test(fsc_bop *b, bool *done);
int fsc_eager_settle(void *ctx, fsc_bop *mine, const int64_t *sent, int64_t seq, double deadline);

#endif
