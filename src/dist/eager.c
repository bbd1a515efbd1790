/* Small allreduces that travel beside the desync check (MPI backend).
 *
 * The one idea: a small allreduce costs one message latency, so waiting a
 * whole round trip for the watchdog's announcements before moving the data
 * made fsc 20% slower than MPI_Allreduce at 4 KiB. Here the first data
 * messages leave at issue, in the same instant as the announcements, into a
 * scratch buffer; the caller's buffer is touched only once the front end has
 * every rank's signature and they agree. The algorithm is recursive
 * doubling (P a power of two): at step s rank r swaps its partial sum with
 * rank r ^ 2^s, so P = 2 is one exchange, as MPI's own. Both partners add
 * (lower rank's, higher rank's), so every rank ends bit-identical.
 *
 * When the check fails, the messages already sent must still be received,
 * or they would sit in MPI forever: each rank learns from a peer's
 * announcement whether that peer sent it an early message, and how large
 * (fsc_eager_bytes is a pure function of it), and settles: receives and
 * drops what was sent, cancels receives nothing will match.
 */
#include <limits.h>
#include <stdlib.h>

#include "mpi_backend.h"

static bool eligible(const mpi_ctx *c, int64_t count, fsc_dtype dt) {
    int64_t bytes = count * (int64_t)fsc_dtype_size(dt);
    bool pow2 = c->size > 1 && (c->size & (c->size - 1)) == 0;
    /* halves stay on the ring, whose per-hop rounding the tests pin down */
    bool wide = dt == FSC_DTYPE_F32 || dt == FSC_DTYPE_I32 || dt == FSC_DTYPE_I64;
    return pow2 && wide && count > 0 && bytes <= fsc_dist_rt.eager_max_bytes && bytes <= INT_MAX;
}

int64_t fsc_eager_bytes(void *ctx, int from, int to, int64_t count, fsc_dtype dt) {
    mpi_ctx *c = ctx;
    if ((from ^ 1) != to || !eligible(c, count, dt)) return 0;
    return count * (int64_t)fsc_dtype_size(dt);
}

/* Messages go in pieces small enough for the shared-memory transport's eager
 * protocol (Open MPI's vader: 4 KiB with headers): a larger one waits for a
 * rendezvous acknowledgement, a round trip of its own (measured: a 4 KiB
 * allreduce in one message took 5.3 us, in two pieces ~3, MPI_Allreduce 2.9). */
#define PIECE 4000
/* Above this the pieces' overhead outweighs the acknowledgement: one message. */
#define PIECES_MAX (16 << 10)

static int npieces(int64_t bytes) {
    return bytes <= PIECES_MAX ? (int)((bytes + PIECE - 1) / PIECE) : 1;
}

static int piece_len(int64_t bytes, int k) {
    if (bytes > PIECES_MAX) return (int)bytes;
    int64_t left = bytes - (int64_t)k * PIECE;
    return (int)(left < PIECE ? left : PIECE);
}

static int post_step(fsc_bop *b) {
    int partner = b->c->rank ^ (1 << b->step);
    int64_t bytes = b->tmp_elems * (int64_t)b->esz;
    int n = npieces(bytes), rc;
    b->nreq = 0;
    for (int k = 0; k < n; k++, b->nreq++) {
        rc = MPI_Irecv(b->tmp + (size_t)k * PIECE, piece_len(bytes, k), MPI_BYTE, partner, b->tag,
                       b->c->data, &b->reqs[b->nreq]);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Irecv(allreduce step)");
    }
    for (int k = 0; k < n; k++, b->nreq++) {
        rc = MPI_Isend(b->out + (size_t)k * PIECE, piece_len(bytes, k), MPI_BYTE, partner, b->tag,
                       b->c->data, &b->reqs[b->nreq]);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Isend(allreduce step)");
    }
    fsc_dist_rt.sent_bytes += bytes;
    return FSC_OK;
}

int fsc_eager_start(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                    int64_t seq, fsc_bop **out) {
    mpi_ctx *c = ctx;
    *out = NULL;
    if (!eligible(c, count, dt)) return FSC_OK;
    fsc_bop *b = NULL;
    int rc = fsc_mpi_bop_new(c, BOP_EAGER, &b);
    if (rc) return rc;
    b->esz = fsc_dtype_size(dt);
    b->cap = 2 * npieces(count * (int64_t)b->esz);
    b->reqs = malloc((size_t)b->cap * sizeof *b->reqs);
    b->tmp = fsc_dist_buf_get((size_t)count * b->esz);
    if (!b->reqs || !b->tmp) {
        fsc_dist_buf_put(b->tmp);
        free(b->reqs);
        free(b);
        return fsc_error(FSC_ERR_NOMEM, "out of memory starting an allreduce of %lld elements",
                         (long long)count);
    }
    b->out = buf;
    b->tmp_elems = count;
    b->dt = dt;
    b->op = op;
    b->tag = (int)(seq % FSC_CTRL_P2P_BASE);
    *out = b; /* from here on, posted messages are the front end's to settle */
    return post_step(b);
}

/* Called only once the desync check has passed. */
int fsc_eager_test(fsc_bop *b, bool *done) {
    *done = false;
    for (;;) {
        int flag = 0;
        int rc = MPI_Testall(b->nreq, b->reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Testall(allreduce step)");
        if (!flag) return FSC_OK;
        b->nreq = 0;
        bool low = b->c->rank < (b->c->rank ^ (1 << b->step));
        fsc_dist_accumulate(b->out, low ? b->out : b->tmp, low ? b->tmp : b->out, b->tmp_elems,
                            b->dt, b->op);
        if ((1 << ++b->step) >= b->c->size) break;
        rc = post_step(b);
        if (rc) return rc;
    }
    *done = true;
    return FSC_OK;
}

/* Tests one request to completion, whatever its outcome (a receive of a
 * peer's differently sized piece ends in a truncation error: it is dropped
 * all the same). */
static bool settled(MPI_Request *r) {
    if (*r == MPI_REQUEST_NULL) return true;
    int flag = 0;
    if (MPI_Test(r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 1;
    if (flag) *r = MPI_REQUEST_NULL;
    return flag != 0;
}

/* The partner's k-th piece matches this rank's k-th posted receive (MPI keeps
 * a sender's order): receives beyond its pieces are cancelled, pieces beyond
 * the receives are drained into scratch. */
int fsc_eager_settle(void *ctx, fsc_bop *mine, const int64_t *sent, int64_t seq, double deadline) {
    mpi_ctx *c = ctx;
    int partner = c->rank ^ 1; /* the only rank that sends this one anything early */
    int64_t theirs = partner < c->size ? sent[partner] : 0;
    int nthem = theirs > 0 ? npieces(theirs) : 0;
    int nrecv = mine ? mine->nreq / 2 : 0, ndrain = nthem > nrecv ? nthem - nrecv : 0;
    int nreq = (mine ? mine->nreq : 0) + ndrain, tag = (int)(seq % FSC_CTRL_P2P_BASE);
    MPI_Request *req = malloc((size_t)(nreq ? nreq : 1) * sizeof *req);
    char *drop = ndrain ? malloc((size_t)ndrain * (size_t)piece_len(theirs, 0)) : NULL;
    if (!req || (ndrain && !drop)) {
        free(req);
        free(drop);
        return fsc_error(FSC_ERR_NOMEM, "out of memory settling a desynced allreduce");
    }
    int k = 0;
    for (int i = 0; mine && i < mine->nreq; i++) {
        req[k] = mine->reqs[i];
        if (i >= nthem && i < nrecv) MPI_Cancel(&req[k]); /* a receive nothing will match */
        k++;
    }
    for (int i = 0; i < ndrain; i++, k++) {
        int len = piece_len(theirs, 0);
        int rc = MPI_Irecv(drop + (size_t)i * (size_t)len, len, MPI_BYTE, partner, tag, c->data,
                           &req[k]);
        if (rc != MPI_SUCCESS) {
            nreq = k; /* what was posted is still settled below */
            fsc_dist_mpi_error(rc, "MPI_Irecv(drain)");
            break;
        }
    }
    bool done = false;
    while (!done) {
        done = true;
        for (int i = 0; i < nreq; i++) done = settled(&req[i]) && done;
        if (!done && fsc_now() > deadline)
            return fsc_error(FSC_ERR_TIMEOUT,
                             "the early messages of a desynced allreduce on "
                             "rank %d were not delivered in time",
                             c->rank); /* left in flight: the caller abandons them */
    }
    free(req);
    free(drop);
    if (mine) {
        fsc_dist_buf_put(mine->tmp);
        free(mine->reqs);
        free(mine);
    }
    return FSC_OK;
}
