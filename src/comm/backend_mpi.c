/* The MPI backend: process-group data planes over MPI communicators.
 *
 * The one idea: pick, per operation, what measured fastest here and keep it
 * non-blocking so the front end can poll under the watchdog. Small
 * allreduces (F32 and integers, a power-of-two group) run by recursive
 * doubling (eager.c); larger allreduces and every reduce-scatter /
 * allgather run as rings of point-to-point steps (ring.c); allreduces by
 * either algorithm send their first step beside the desync check (eager.c);
 * the smallest allreduces of other groups, reduce, broadcast and
 * barrier use MPI's own non-blocking collectives; alltoall and send/recv are
 * point-to-point. BF16/F16 reductions always take the rings: MPI has no
 * half-precision sum, and the ring's fixed order is what makes an
 * allreduce's result bit-identical on every rank. Messages larger than INT_MAX elements are cut
 * into pieces, since MPI counts are int. Only standard MPI-3 calls (Open MPI and MPICH).
 */
#include <stdlib.h>
#include <string.h>

#include "mpi_backend.h"

MPI_Datatype fsc_mpi_dtype(fsc_dtype dt) {
    switch (dt) {
    case FSC_DTYPE_F32:
        return MPI_FLOAT;
    case FSC_DTYPE_I32:
        return MPI_INT32_T;
    case FSC_DTYPE_I64:
        return MPI_INT64_T;
    default:
        return MPI_UINT16_T; /* BF16/F16/U16: moved by MPI, summed by ring.c */
    }
}

static bool is_half(fsc_dtype dt) {
    return dt == FSC_DTYPE_BF16 || dt == FSC_DTYPE_F16;
}

/* MPI's own reductions: for F32 and integers, when the buffer is small. */
static bool use_mpi_reduction(const mpi_ctx *c, int64_t count, fsc_dtype dt) {
    if (is_half(dt)) return false;
    return (int64_t)((size_t)count * fsc_dtype_size(dt)) < fsc_dist_rt.ring_min_bytes ||
           c->size == 1;
}

static MPI_Op mpi_op(fsc_reduce_op op) {
    return op == FSC_REDUCE_MAX ? MPI_MAX : MPI_SUM;
}

int fsc_mpi_bop_new(mpi_ctx *c, bop_kind kind, fsc_bop **out) {
    fsc_bop *b = calloc(1, sizeof *b);
    if (!b) return fsc_error(FSC_ERR_NOMEM, "out of memory for an MPI operation");
    b->kind = kind;
    b->c = c;
    *out = b;
    return FSC_OK;
}

static int grow(MPI_Request **reqs, int n, int *cap, int more) {
    if (n + more <= *cap) return FSC_OK;
    int c = *cap ? *cap : 4;
    while (c < n + more) c *= 2;
    MPI_Request *r = realloc(*reqs, (size_t)c * sizeof *r);
    if (!r) return fsc_error(FSC_ERR_NOMEM, "out of memory for MPI requests");
    *reqs = r;
    *cap = c;
    return FSC_OK;
}

static int reserve(fsc_bop *b, int more) {
    return grow(&b->reqs, b->nreq, &b->cap, more);
}

static int npieces(int64_t n) {
    return (int)((n + fsc_dist_rt.max_msg - 1) / fsc_dist_rt.max_msg);
}

int fsc_mpi_post_send(fsc_bop *b, MPI_Comm comm, const void *buf, int64_t n, fsc_dtype dt, int peer,
                      int tag) {
    int rc = grow(&b->sreqs, b->nsreq, &b->scap, npieces(n));
    if (rc) return rc;
    size_t esz = fsc_dtype_size(dt);
    for (int64_t off = 0; off < n; off += fsc_dist_rt.max_msg) {
        int k = (int)(n - off < fsc_dist_rt.max_msg ? n - off : fsc_dist_rt.max_msg);
        rc = MPI_Isend((const char *)buf + (size_t)off * esz, k, fsc_mpi_dtype(dt), peer, tag, comm,
                       &b->sreqs[b->nsreq]);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Isend");
        b->nsreq++;
        fsc_dist_rt.sent_bytes += (int64_t)k * (int64_t)esz;
    }
    return FSC_OK;
}

int fsc_mpi_post_recv(fsc_bop *b, MPI_Comm comm, void *buf, int64_t n, fsc_dtype dt, int peer,
                      int tag) {
    int rc = reserve(b, npieces(n));
    if (rc) return rc;
    size_t esz = fsc_dtype_size(dt);
    for (int64_t off = 0; off < n; off += fsc_dist_rt.max_msg) {
        int k = (int)(n - off < fsc_dist_rt.max_msg ? n - off : fsc_dist_rt.max_msg);
        rc = MPI_Irecv((char *)buf + (size_t)off * esz, k, fsc_mpi_dtype(dt), peer, tag, comm,
                       &b->reqs[b->nreq]);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Irecv");
        b->nreq++;
    }
    return FSC_OK;
}

/* ---- contexts ---------------------------------------------------------------- */

static int ctx_from(MPI_Comm data, mpi_ctx **out) {
    mpi_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        MPI_Comm_free(&data);
        return fsc_error(FSC_ERR_NOMEM, "out of memory for an MPI context");
    }
    c->data = data;
    MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_dup(data, &c->p2p);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&c->data);
        free(c);
        return fsc_dist_mpi_error(rc, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(c->p2p, MPI_ERRORS_RETURN);
    MPI_Comm_rank(data, &c->rank);
    MPI_Comm_size(data, &c->size);
    *out = c;
    return FSC_OK;
}

static int mpi_world(void **out) {
    MPI_Comm data;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &data);
    if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Comm_dup(world)");
    return ctx_from(data, (mpi_ctx **)out);
}

static int mpi_self(void **out) {
    MPI_Comm data;
    int rc = MPI_Comm_dup(MPI_COMM_SELF, &data);
    if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Comm_dup(self)");
    return ctx_from(data, (mpi_ctx **)out);
}

static int mpi_split(void *parent, int color, int key, void **out) {
    *out = NULL;
    MPI_Comm data;
    int rc =
        MPI_Comm_split(((mpi_ctx *)parent)->data, color < 0 ? MPI_UNDEFINED : color, key, &data);
    if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Comm_split");
    if (data == MPI_COMM_NULL) return FSC_OK;
    return ctx_from(data, (mpi_ctx **)out);
}

static void mpi_free(void *ctx) {
    mpi_ctx *c = ctx;
    if (!c) return;
    MPI_Comm_free(&c->data);
    MPI_Comm_free(&c->p2p);
    free(c);
}

/* ---- operations ---------------------------------------------------------------- */

/* MPI's own collective, issued in pieces of at most max_msg elements. */
typedef enum { COLL_ALLREDUCE, COLL_REDUCE, COLL_BCAST } mpi_coll;

static int pieces(mpi_ctx *c, mpi_coll which, void *buf, int64_t count, fsc_dtype dt,
                  fsc_reduce_op op, int root, fsc_bop **out) {
    fsc_bop *b = NULL;
    int rc = fsc_mpi_bop_new(c, BOP_REQS, &b);
    if (rc) return rc;
    *out = b;
    rc = reserve(b, npieces(count));
    if (rc) return rc;
    size_t esz = fsc_dtype_size(dt);
    for (int64_t off = 0; off < count; off += fsc_dist_rt.max_msg) {
        int k = (int)(count - off < fsc_dist_rt.max_msg ? count - off : fsc_dist_rt.max_msg);
        char *p = (char *)buf + (size_t)off * esz;
        MPI_Request *r = &b->reqs[b->nreq];
        if (which == COLL_ALLREDUCE) {
            rc = MPI_Iallreduce(MPI_IN_PLACE, p, k, fsc_mpi_dtype(dt), mpi_op(op), c->data, r);
        } else if (which == COLL_REDUCE) {
            rc = c->rank == root
                     ? MPI_Ireduce(MPI_IN_PLACE, p, k, fsc_mpi_dtype(dt), mpi_op(op), root, c->data,
                                   r)
                     : MPI_Ireduce(p, NULL, k, fsc_mpi_dtype(dt), mpi_op(op), root, c->data, r);
        } else {
            rc = MPI_Ibcast(p, k, fsc_mpi_dtype(dt), root, c->data, r);
        }
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI non-blocking collective");
        b->nreq++;
    }
    return FSC_OK;
}

/* Chunks as equal as possible: the first count % P get one more. */
static int even_split(int P, int64_t count, int64_t **counts) {
    *counts = malloc(2 * (size_t)P * sizeof(int64_t));
    if (!*counts) return fsc_error(FSC_ERR_NOMEM, "out of memory splitting an allreduce");
    int64_t *displs = *counts + P, off = 0;
    for (int r = 0; r < P; r++) {
        (*counts)[r] = count / P + (r < count % P);
        displs[r] = off;
        off += (*counts)[r];
    }
    return FSC_OK;
}

bool fsc_mpi_allreduce_rings(const mpi_ctx *c, int64_t count, fsc_dtype dt) {
    return !use_mpi_reduction(c, count, dt);
}

int fsc_ring_allreduce(mpi_ctx *c, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                       bool sends_only, int64_t seq, fsc_bop **out) {
    int64_t *counts;
    int rc = even_split(c->size, count, &counts);
    if (rc) return rc;
    rc = fsc_ring_start(c, buf, buf, counts, counts + c->size, dt, op, RING_RS, true, sends_only,
                        seq, out);
    free(counts);
    return rc;
}

static int mpi_allreduce(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                         int64_t seq, fsc_bop **out) {
    mpi_ctx *c = ctx;
    if (use_mpi_reduction(c, count, dt))
        return pieces(c, COLL_ALLREDUCE, buf, count, dt, op, 0, out);
    return fsc_ring_allreduce(c, buf, count, dt, op, false, seq, out);
}

/* Large reduces run as a ring reduce-scatter in which only the root's chunk
 * is non-empty: with 2 ranks that is one message to the root, against a
 * polled MPI_Ireduce that moves a fraction of the bandwidth (ZeRO-2's
 * gradient buckets are this case). */
static int mpi_reduce(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op, int root,
                      int64_t seq, fsc_bop **out) {
    mpi_ctx *c = ctx;
    if (use_mpi_reduction(c, count, dt))
        return pieces(c, COLL_REDUCE, buf, count, dt, op, root, out);
    int64_t *counts = calloc(2 * (size_t)c->size, sizeof *counts); /* displs all 0 */
    if (!counts) return fsc_error(FSC_ERR_NOMEM, "out of memory starting a reduce");
    counts[root] = count;
    int rc = fsc_ring_start(c, buf, buf, counts, counts + c->size, dt, op, RING_RS, false, false,
                            seq, out);
    free(counts);
    return rc;
}

static int mpi_broadcast(void *ctx, void *buf, int64_t count, fsc_dtype dt, int root, int64_t seq,
                         fsc_bop **out) {
    (void)seq;
    return pieces(ctx, COLL_BCAST, buf, count, dt, FSC_REDUCE_SUM, root, out);
}

static int mpi_allgatherv(void *ctx, const void *in, void *out, const int64_t *counts,
                          const int64_t *displs, fsc_dtype dt, int64_t seq, fsc_bop **out_op) {
    return fsc_ring_start(ctx, in, out, counts, displs, dt, FSC_REDUCE_SUM, RING_AG, false, false,
                          seq, out_op);
}

static int mpi_reduce_scatterv(void *ctx, const void *in, void *out, const int64_t *counts,
                               const int64_t *displs, fsc_dtype dt, fsc_reduce_op op, int64_t seq,
                               fsc_bop **out_op) {
    return fsc_ring_start(ctx, in, out, counts, displs, dt, op, RING_RS, false, false, seq, out_op);
}

static int mpi_alltoall(void *ctx, const void *in, void *out, int64_t count, fsc_dtype dt,
                        int64_t seq, fsc_bop **out_op) {
    mpi_ctx *c = ctx;
    fsc_bop *b = NULL;
    int rc = fsc_mpi_bop_new(c, BOP_REQS, &b);
    if (rc) return rc;
    *out_op = b;
    size_t chunk = (size_t)count * fsc_dtype_size(dt);
    int tag = (int)(seq % FSC_CTRL_P2P_BASE);
    memmove((char *)out + (size_t)c->rank * chunk, (const char *)in + (size_t)c->rank * chunk,
            chunk);
    for (int k = 1; k < c->size && !rc; k++) {
        int to = (c->rank + k) % c->size, from = (c->rank - k + c->size) % c->size;
        rc =
            fsc_mpi_post_recv(b, c->data, (char *)out + (size_t)from * chunk, count, dt, from, tag);
        if (!rc)
            rc = fsc_mpi_post_send(b, c->data, (const char *)in + (size_t)to * chunk, count, dt, to,
                                   tag);
    }
    return rc;
}

static int mpi_barrier(void *ctx, int64_t seq, fsc_bop **out) {
    (void)seq;
    mpi_ctx *c = ctx;
    fsc_bop *b = NULL;
    int rc = fsc_mpi_bop_new(c, BOP_REQS, &b);
    if (rc) return rc;
    *out = b;
    rc = reserve(b, 1);
    if (rc) return rc;
    rc = MPI_Ibarrier(c->data, &b->reqs[0]);
    if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Ibarrier");
    b->nreq = 1;
    return FSC_OK;
}

static int mpi_send(void *ctx, const void *buf, int64_t count, fsc_dtype dt, int dst, int tag,
                    fsc_bop **out) {
    mpi_ctx *c = ctx;
    int rc = fsc_mpi_bop_new(c, BOP_REQS, out);
    return rc ? rc : fsc_mpi_post_send(*out, c->p2p, buf, count, dt, dst, tag);
}

static int mpi_recv(void *ctx, void *buf, int64_t count, fsc_dtype dt, int src, int tag,
                    fsc_bop **out) {
    mpi_ctx *c = ctx;
    int rc = fsc_mpi_bop_new(c, BOP_REQS, out);
    return rc ? rc : fsc_mpi_post_recv(*out, c->p2p, buf, count, dt, src, tag);
}

static int mpi_test(fsc_bop *b, bool *done) {
    if (b->kind == BOP_RING) return fsc_ring_test(b, done);
    if (b->kind == BOP_EAGER) return fsc_eager_test(b, done);
    int flag = 1, sflag = 1;
    if (b->nreq > 0) {
        int rc = MPI_Testall(b->nreq, b->reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Testall");
    }
    if (b->nsreq > 0) {
        int rc = MPI_Testall(b->nsreq, b->sreqs, &sflag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Testall");
    }
    *done = flag && sflag;
    return FSC_OK;
}

void fsc_mpi_bop_free(fsc_bop *b) {
    if (!b) return;
    fsc_dist_buf_put(b->tmp);
    free(b->counts);
    free(b->reqs);
    free(b->sreqs);
    free(b);
}

const fsc_backend_ops fsc_backend_mpi = {
    .name = "mpi",
    .world = mpi_world,
    .self = mpi_self,
    .split = mpi_split,
    .free = mpi_free,
    .allreduce = mpi_allreduce,
    .reduce = mpi_reduce,
    .broadcast = mpi_broadcast,
    .allgatherv = mpi_allgatherv,
    .reduce_scatterv = mpi_reduce_scatterv,
    .alltoall = mpi_alltoall,
    .barrier = mpi_barrier,
    .send = mpi_send,
    .recv = mpi_recv,
    .allreduce_early = fsc_eager_start,
    .early_settle = fsc_eager_settle,
    .early_peek = fsc_eager_peek,
    .test = mpi_test,
    .release = fsc_mpi_bop_free,
};
