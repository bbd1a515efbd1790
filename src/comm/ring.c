/* Ring reduce-scatter and allgather over point-to-point messages, driven one
 * step at a time by test calls (so they also serve as non-blocking
 * collectives that progress whenever the caller polls).
 *
 * The one idea: at step s rank r sends chunk (r-s-1) to its right neighbour
 * and receives chunk (r-s-2) from its left, adding its own input to what
 * arrives; after P-1 steps it holds the full reduction of chunk r. The
 * allgather ring then passes finished chunks round the same way. Every rank
 * moves (P-1)/P of the data each way, the bandwidth optimum; measured here
 * 2-3x faster than MPI_Reduce_scatter_block and faster than MPI_Allreduce
 * for large buffers (tests/comm/bench_dist.c). BF16/F16 chunks travel as halves;
 * each step adds in F32 and rounds once (fsc_dist_accumulate), and the
 * allgather passes the finished bits on, so every rank ends identical.
 *
 * Overlap, as far as the dependencies allow: a step's sum needs only its
 * receives, and the next step's send reads what that sum just wrote, so it
 * leaves at once, while this rank's previous sends may still be draining;
 * only the next receives wait for those sends, since they may land in the
 * buffer a send still reads (at 2 ranks the allgather receives into the
 * chunk the reduce-scatter sent from).
 */
#include <stdlib.h>
#include <string.h>

#include "mpi_backend.h"

static int mod(int a, int p) {
    return ((a % p) + p) % p;
}

static char *tmp_chunk(fsc_bop *b, int s) {
    return b->tmp + (size_t)(s & 1) * (size_t)b->tmp_elems * b->esz;
}

/* The current step's receive from the left neighbour. */
static int post_recv(fsc_bop *b) {
    int P = b->c->size, me = b->c->rank, s = b->step;
    b->recv_posted = true;
    if (b->phase == RING_RS) {
        int cr = mod(me - s - 2, P);
        return fsc_mpi_post_recv(b, b->c->data, tmp_chunk(b, s), b->counts[cr], b->dt,
                                 mod(me - 1, P), b->tag);
    }
    int cr = mod(me - s - 1, P);
    return fsc_mpi_post_recv(b, b->c->data, b->out + (size_t)b->displs[cr] * b->esz, b->counts[cr],
                             b->dt, mod(me - 1, P), b->tag);
}

/* The current step's send to the right neighbour. */
static int post_send(fsc_bop *b) {
    int P = b->c->size, me = b->c->rank, s = b->step;
    if (b->phase == RING_RS) {
        int cs = mod(me - s - 1, P);
        const void *src = s == 0 ? b->in + (size_t)b->displs[cs] * b->esz : tmp_chunk(b, s - 1);
        return fsc_mpi_post_send(b, b->c->data, src, b->counts[cs], b->dt, mod(me + 1, P), b->tag);
    }
    int cs = mod(me - s, P);
    return fsc_mpi_post_send(b, b->c->data, b->out + (size_t)b->displs[cs] * b->esz, b->counts[cs],
                             b->dt, mod(me + 1, P), b->tag);
}

/* The step's receives have arrived: reduce (RS), then move to the next step
 * or phase. Returns true when there is a next step to post. */
static bool finish_step(fsc_bop *b) {
    int P = b->c->size, me = b->c->rank, s = b->step;
    if (b->phase == RING_RS) {
        int cr = mod(me - s - 2, P);
        char *dst = s == P - 2 ? (b->then_ag ? b->out + (size_t)b->displs[me] * b->esz : b->out)
                               : tmp_chunk(b, s);
        fsc_dist_accumulate(dst, tmp_chunk(b, s), b->in + (size_t)b->displs[cr] * b->esz,
                            b->counts[cr], b->dt, b->op);
    }
    if (++b->step < P - 1) return true;
    b->step = 0;
    if (b->phase == RING_RS && b->then_ag) {
        b->phase = RING_AG;
        return true;
    }
    b->phase = RING_DONE;
    return false;
}

int fsc_ring_start(mpi_ctx *c, const void *in, void *out, const int64_t *counts,
                   const int64_t *displs, fsc_dtype dt, fsc_reduce_op op, ring_phase first,
                   bool then_ag, bool sends_only, int64_t seq, fsc_bop **out_op) {
    return fsc_ring_start_tagged(c, in, out, counts, displs, dt, op, first, then_ag, sends_only,
                                 (int)(seq % FSC_CTRL_P2P_BASE), out_op);
}

int fsc_ring_start_tagged(mpi_ctx *c, const void *in, void *out, const int64_t *counts,
                          const int64_t *displs, fsc_dtype dt, fsc_reduce_op op, ring_phase first,
                          bool then_ag, bool sends_only, int tag, fsc_bop **out_op) {
    *out_op = NULL;
    int P = c->size, me = c->rank;
    fsc_bop *b = NULL;
    int rc = fsc_mpi_bop_new(c, BOP_RING, &b);
    if (rc) return rc;
    b->counts = malloc(2 * (size_t)P * sizeof(int64_t));
    if (!b->counts) {
        free(b);
        return fsc_error(FSC_ERR_NOMEM, "out of memory starting a ring");
    }
    b->displs = b->counts + P;
    memcpy(b->counts, counts, (size_t)P * sizeof(int64_t));
    memcpy(b->displs, displs, (size_t)P * sizeof(int64_t));
    b->in = in;
    b->out = out;
    b->dt = dt;
    b->op = op;
    b->esz = fsc_dtype_size(dt);
    b->mt = fsc_mpi_dtype(dt);
    b->phase = first;
    b->then_ag = then_ag;
    b->tag = tag;
    if (first == RING_AG && in != b->out + (size_t)displs[me] * b->esz)
        memmove(b->out + (size_t)displs[me] * b->esz, in, (size_t)counts[me] * b->esz);
    if (P == 1) {
        /* nothing to exchange: reduce-scatter of one rank is a copy */
        if (first == RING_RS && !then_ag && out != in)
            memmove(out, b->in + (size_t)displs[0] * b->esz, (size_t)counts[0] * b->esz);
        b->phase = RING_DONE;
        *out_op = b;
        return FSC_OK;
    }
    if (first == RING_RS) {
        for (int r = 0; r < P; r++)
            if (counts[r] > b->tmp_elems) b->tmp_elems = counts[r];
        b->tmp = fsc_dist_buf_get(2 * (size_t)b->tmp_elems * b->esz);
        if (!b->tmp) {
            free(b->counts);
            free(b);
            return fsc_error_context(FSC_ERR_NOMEM, "ring scratch: ");
        }
    }
    *out_op = b;
    rc = sends_only ? FSC_OK : post_recv(b);
    return rc ? rc : post_send(b);
}

/* Tests the first n of *total requests; once all n have completed, drops them
 * (the rest move to the front) and sets *flag. */
static int all_done(MPI_Request *reqs, int n, int *total, bool *flag) {
    int f = 1;
    if (n > 0) {
        int rc = MPI_Testall(n, reqs, &f, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Testall(ring step)");
    }
    if (f && n > 0) {
        memmove(reqs, reqs + n, (size_t)(*total - n) * sizeof *reqs);
        *total -= n;
    }
    *flag = f != 0;
    return FSC_OK;
}

int fsc_ring_test(fsc_bop *b, bool *done) {
    *done = false;
    bool flag;
    int rc;
    while (b->phase != RING_DONE) {
        if (!b->recv_posted) { /* its buffer may be what an earlier step's send reads */
            rc = all_done(b->sreqs, b->nold, &b->nsreq, &flag);
            if (rc || !flag) return rc;
            b->nold = 0;
            rc = post_recv(b);
            if (rc) return rc;
        }
        rc = all_done(b->reqs, b->nreq, &b->nreq, &flag);
        if (rc || !flag) return rc;
        b->recv_posted = false;
        if (finish_step(b)) {
            b->nold = b->nsreq; /* not this step's: it needs the neighbour's next receive */
            rc = post_send(b);
            if (rc) return rc;
        }
    }
    rc = all_done(b->sreqs, b->nsreq, &b->nsreq, &flag); /* the caller may reuse buffers now */
    if (rc || !flag) return rc;
    *done = true;
    return FSC_OK;
}
