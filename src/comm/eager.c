/* Allreduces whose first messages travel beside the desync check (MPI
 * backend).
 *
 * The one idea: waiting a whole round trip for the watchdog's announcements
 * before moving any data made fsc slower than MPI_Allreduce wherever an
 * allreduce costs a few message latencies (4 KiB to a few MiB). So the
 * first step's sends leave at issue, in the same instant as the
 * announcements (they only read the caller's buffer). A receive must never
 * meet a message of another size (Open MPI 4.1's shared-memory transport was
 * seen to crash after truncating a rendezvous-sized one), so an unsigned
 * operation posts its receives, into scratch, only once the front end has
 * every rank's signature and they agree; small pieces wait meanwhile as
 * MPI's unexpected messages (copied twice), large ones as a rendezvous
 * request. A signed one (below) posts them at issue. Two algorithms start
 * this way:
 *   - recursive doubling (P a power of two, up to eager_max_bytes): at step
 *     s rank r swaps its partial sum with rank r ^ 2^s, so P = 2 is one
 *     exchange, as MPI's own; both partners add (lower rank's, higher
 *     rank's), so every rank ends bit-identical;
 *   - the ring (ring.c, up to early_max_bytes): its first reduce-scatter
 *     step (chunk r-1 to the right neighbour) writes only scratch.
 *
 * On a group of two the first message also carries the desync check, so
 * each rank sends its peer one message instead of two: its tag holds the
 * sequence number (mod SEQ_WINDOW) and a hash of the whole signature
 * (signed_tag), and fsc_eager_peek reads the tag and size of the peer's
 * first message with MPI_Iprobe, before anything is received. The same tag
 * and size mean the same collective; anything else, and the front end sends
 * its announcement after all and names both sides once the peer's arrives.
 * Recursive doubling's receives are posted at issue under the signed tag,
 * which only a message of the same signature carries, hence of the same
 * size. The residual risk: two signatures whose hashes collide (hash_bits(),
 * 18 under Open MPI: once in 2^18) match each other's receives, and a
 * larger colliding message is truncated; the full check (unsigned) has
 * none. The peek then reads the first receive's status instead.
 *
 * When the check fails, the messages already sent must still be received,
 * or they would sit in MPI forever: each rank learns from a peer's
 * announcement exactly what that peer sent it early and under which tag
 * (plan_of and tag_of are pure functions of it), receives it at its own
 * size and drops it. Receives posted at issue are cancelled first; those
 * that completed took the peer's first pieces, which are not drained again.
 */
#include <limits.h>
#include <stdlib.h>

#include "mpi_backend.h"

static bool rd_eligible(const mpi_ctx *c, int64_t count, fsc_dtype dt) {
    int64_t bytes = count * (int64_t)fsc_dtype_size(dt);
    bool pow2 = c->size > 1 && (c->size & (c->size - 1)) == 0;
    /* halves stay on the ring, whose per-hop rounding the tests pin down */
    bool wide = dt == FSC_DTYPE_F32 || dt == FSC_DTYPE_I32 || dt == FSC_DTYPE_I64;
    int64_t max = c->size == 2 ? fsc_dist_rt.eager_max_bytes : fsc_dist_rt.eager_max_many_bytes;
    return pow2 && wide && count > 0 && bytes <= max && bytes <= INT_MAX;
}

static bool ring_early(const mpi_ctx *c, int64_t count, fsc_dtype dt) {
    return c->size > 1 && count > 0 && fsc_mpi_allreduce_rings(c, count, dt) &&
           count * (int64_t)fsc_dtype_size(dt) <= fsc_dist_rt.early_max_bytes;
}

/* Signed tags lie above the plain ones (seq mod FSC_CTRL_P2P_BASE): the
 * sequence number mod SEQ_WINDOW, then hash_bits() bits of the signature's
 * hash. A peer's head message of another window slot belongs to another
 * collective still in flight, so SEQ_WINDOW bounds how many may be. */
#define SEQ_WINDOW 4096

/* Bits of hash the tag space holds (MPI guarantees tags up to 32767 only;
 * Open MPI and MPICH give 2^31 - 1 or less): 0 below 16, then nothing is
 * signed. */
static int hash_bits(void) {
    static int bits = -1;
    if (bits < 0) {
        int *ub = NULL, flag = 0;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
        int64_t room = flag && ub ? ((int64_t)*ub + 1 - FSC_CTRL_P2P_BASE) / SEQ_WINDOW : 0;
        bits = 0;
        while (bits < 30 && ((int64_t)2 << bits) <= room) bits++;
        if (bits < 16) bits = 0;
    }
    return bits;
}

static int signed_tag(int64_t seq, int64_t sig) {
    int b = hash_bits();
    return FSC_CTRL_P2P_BASE + (int)((seq % SEQ_WINDOW) << b) + (int)(sig & ((1 << b) - 1));
}

/* Whether an allreduce's first message carries its signature: two ranks, a
 * signature given, room in the tags, and a first message each way (the
 * ring's chunk 1 of a count of 1 is empty). */
static bool signs(const mpi_ctx *c, int64_t count, fsc_dtype dt, int64_t sig) {
    return c->size == 2 && sig >= 0 && hash_bits() > 0 &&
           (rd_eligible(c, count, dt) || (ring_early(c, count, dt) && count >= 2));
}

static int tag_of(const mpi_ctx *c, int64_t count, fsc_dtype dt, int64_t seq, int64_t sig) {
    return signs(c, count, dt, sig) ? signed_tag(seq, sig) : (int)(seq % FSC_CTRL_P2P_BASE);
}

/* Messages go in pieces small enough for the shared-memory transport's eager
 * protocol (Open MPI's vader: 4 KiB with headers): a larger one waits for a
 * rendezvous acknowledgement, a round trip of its own (measured: a 4 KiB
 * allreduce in one message took 5.3 us, in two pieces ~3, MPI_Allreduce 2.9). */
#define PIECE 4000
/* Up to here pieces win (2 ranks, slow VM state, fastest of 41 rounds: 64 KiB
 * in 17 pieces 16.3-16.6 us, in one message 20.1-20.8, MPI_Allreduce
 * 18.9-19.1; 1 MiB in pieces lost to the ring, 221-227 us against 182-188);
 * above, one message (recursive doubling is forced this far only by tests and
 * benchmarks). */
#define PIECES_MAX (256 << 10)

/* What rank `from` sends rank `to` at issue of an allreduce of count x dt:
 * n pieces of `elems` elements of `type` (the last one `last`). */
typedef struct plan {
    int n;
    int64_t elems, last;
    MPI_Datatype type;
    size_t esz;
} plan;

/* Every step of recursive doubling sends the whole partial sum so. */
static plan rd_pieces(int64_t bytes) {
    plan p = {.type = MPI_BYTE, .esz = 1};
    p.elems = bytes <= PIECES_MAX ? PIECE : bytes;
    p.n = (int)((bytes + p.elems - 1) / p.elems);
    p.last = bytes - (int64_t)(p.n - 1) * p.elems;
    return p;
}

static plan plan_of(const mpi_ctx *c, int from, int to, int64_t count, fsc_dtype dt) {
    plan p = {.n = 0, .type = MPI_BYTE, .esz = 1};
    int P = c->size;
    if (count <= 0 || from == to) return p;
    if (rd_eligible(c, count, dt)) {
        if ((from ^ 1) == to) p = rd_pieces(count * (int64_t)fsc_dtype_size(dt));
    } else if (ring_early(c, count, dt)) {
        if ((from + 1) % P != to) return p;
        int cs = (from - 1 + P) % P; /* ring.c's step 0 chunk, of even_split's sizes */
        int64_t chunk = count / P + (cs < count % P);
        if (chunk == 0) return p;
        p.type = fsc_mpi_dtype(dt);
        p.esz = fsc_dtype_size(dt);
        p.elems = fsc_dist_rt.max_msg;
        p.n = (int)((chunk + p.elems - 1) / p.elems);
        p.last = chunk - (int64_t)(p.n - 1) * p.elems;
    }
    return p;
}

static int post_recvs(fsc_bop *b) {
    int partner = b->c->rank ^ (1 << b->step);
    plan p = rd_pieces(b->tmp_elems * (int64_t)b->esz);
    b->nreq = 0;
    b->recv_posted = true;
    for (int k = 0; k < p.n; k++, b->nreq++) {
        int len = (int)(k + 1 < p.n ? p.elems : p.last);
        int rc = MPI_Irecv(b->tmp + (size_t)k * (size_t)p.elems, len, MPI_BYTE, partner, b->tag,
                           b->c->data, &b->reqs[b->nreq]);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Irecv(allreduce step)");
    }
    return FSC_OK;
}

static int post_sends(fsc_bop *b) {
    int partner = b->c->rank ^ (1 << b->step);
    plan p = rd_pieces(b->tmp_elems * (int64_t)b->esz);
    b->nsreq = 0;
    for (int k = 0; k < p.n; k++, b->nsreq++) {
        int len = (int)(k + 1 < p.n ? p.elems : p.last);
        int rc = MPI_Isend(b->out + (size_t)k * (size_t)p.elems, len, MPI_BYTE, partner, b->tag,
                           b->c->data, &b->sreqs[b->nsreq]);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Isend(allreduce step)");
    }
    fsc_dist_rt.sent_bytes += b->tmp_elems * (int64_t)b->esz;
    return FSC_OK;
}

static int rd_start(mpi_ctx *c, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op, int tag,
                    fsc_bop **out) {
    fsc_bop *b = NULL;
    int rc = fsc_mpi_bop_new(c, BOP_EAGER, &b);
    if (rc) return rc;
    b->esz = fsc_dtype_size(dt);
    b->cap = b->scap = rd_pieces(count * (int64_t)b->esz).n;
    b->reqs = malloc((size_t)b->cap * sizeof *b->reqs);
    b->sreqs = malloc((size_t)b->scap * sizeof *b->sreqs);
    b->tmp = fsc_dist_buf_get((size_t)count * b->esz);
    if (!b->reqs || !b->sreqs || !b->tmp) {
        fsc_mpi_bop_free(b);
        return fsc_error(FSC_ERR_NOMEM, "out of memory starting an allreduce of %lld elements",
                         (long long)count);
    }
    b->out = buf;
    b->tmp_elems = count;
    b->dt = dt;
    b->op = op;
    b->tag = tag;
    *out = b; /* from here on, posted messages are the front end's to settle */
    /* Signed: only this signature's pieces match, so they land in scratch
     * straight away rather than as unexpected messages. Unsigned: once the
     * check passed (fsc_eager_test). */
    if (tag >= FSC_CTRL_P2P_BASE && (rc = post_recvs(b)) != FSC_OK) return rc;
    return post_sends(b);
}

/* The ring over even chunks (backend_mpi.c's split), its first step's sends only. */
static int ring_start(mpi_ctx *c, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op, int tag,
                      fsc_bop **out) {
    int P = c->size;
    int64_t *counts = malloc(2 * (size_t)P * sizeof *counts), off = 0;
    if (!counts) return fsc_error(FSC_ERR_NOMEM, "out of memory splitting an allreduce");
    for (int r = 0; r < P; r++) {
        counts[r] = count / P + (r < count % P);
        counts[P + r] = off;
        off += counts[r];
    }
    int rc = fsc_ring_start_tagged(c, buf, buf, counts, counts + P, dt, op, RING_RS, true, true,
                                   tag, out);
    free(counts);
    return rc;
}

int fsc_eager_start(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                    int64_t seq, int64_t sig, fsc_bop **out) {
    mpi_ctx *c = ctx;
    *out = NULL;
    int tag = tag_of(c, count, dt, seq, sig);
    if (rd_eligible(c, count, dt)) return rd_start(c, buf, count, dt, op, tag, out);
    if (ring_early(c, count, dt)) return ring_start(c, buf, count, dt, op, tag, out);
    return FSC_OK;
}

/* The peer's first message: received already by a receive posted at issue
 * (then it carried this signature, barring a hash collision, which its size
 * may still show), or probed, not received: its tag and size are this
 * collective's, another's, or it has not come. An ordinary tag or another
 * window slot at the head is an earlier collective's message that its own
 * receive will take first. */
int fsc_eager_peek(fsc_bop *b, fsc_early_peek *out) {
    *out = FSC_EARLY_UNSIGNED;
    if (!b || b->tag < FSC_CTRL_P2P_BASE) return FSC_OK;
    *out = FSC_EARLY_WAIT;
    int peer = 1 - b->c->rank, flag = 0, bytes = 0;
    int64_t count = b->kind == BOP_EAGER ? b->tmp_elems : b->counts[0] + b->counts[1];
    plan p = plan_of(b->c, peer, b->c->rank, count, b->dt);
    int64_t first = (p.n > 1 ? p.elems : p.last) * (int64_t)p.esz;
    MPI_Status st = {.MPI_ERROR = MPI_SUCCESS}; /* where get_status leaves it as it was */
    int rc;
    if (b->kind == BOP_EAGER && b->recv_posted && b->nreq > 0) {
        /* get_status leaves the request to fsc_eager_test (and drives progress) */
        rc = MPI_Request_get_status(b->reqs[0], &flag, &st);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Request_get_status(allreduce)");
        if (flag) {
            MPI_Get_count(&st, MPI_BYTE, &bytes);
            *out = st.MPI_ERROR == MPI_SUCCESS && bytes == first ? FSC_EARLY_SAME : FSC_EARLY_OTHER;
            return FSC_OK;
        }
    }
    rc = MPI_Iprobe(peer, MPI_ANY_TAG, b->c->data, &flag, &st);
    if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Iprobe(allreduce signature)");
    int shift = hash_bits();
    if (!flag || st.MPI_TAG < FSC_CTRL_P2P_BASE ||
        (st.MPI_TAG - FSC_CTRL_P2P_BASE) >> shift != (b->tag - FSC_CTRL_P2P_BASE) >> shift)
        return FSC_OK;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    *out = st.MPI_TAG == b->tag && bytes == first ? FSC_EARLY_SAME : FSC_EARLY_OTHER;
    return FSC_OK;
}

/* Called only once the desync check has passed. The sum goes into the buffer
 * the step's send reads, so it waits for both. */
int fsc_eager_test(fsc_bop *b, bool *done) {
    *done = false;
    for (;;) {
        int flag = 0, sflag = 0, rc;
        if (!b->recv_posted && (rc = post_recvs(b)) != FSC_OK) return rc;
        rc = MPI_Testall(b->nreq, b->reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc == MPI_SUCCESS) rc = MPI_Testall(b->nsreq, b->sreqs, &sflag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Testall(allreduce step)");
        if (!flag || !sflag) return FSC_OK;
        b->nreq = b->nsreq = 0;
        bool low = b->c->rank < (b->c->rank ^ (1 << b->step));
        fsc_dist_accumulate(b->out, low ? b->out : b->tmp, low ? b->tmp : b->out, b->tmp_elems,
                            b->dt, b->op);
        if ((1 << ++b->step) >= b->c->size) break;
        rc = post_recvs(b);
        if (!rc) rc = post_sends(b);
        if (rc) return rc;
    }
    *done = true;
    return FSC_OK;
}

/* Drives r to completion, whatever its outcome. */
static bool settled(MPI_Request *r) {
    if (*r == MPI_REQUEST_NULL) return true;
    int flag = 0;
    if (MPI_Test(r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 1; /* an error ends it too */
    if (flag) *r = MPI_REQUEST_NULL;
    return flag != 0;
}

/* Cancels the receives b posted at issue and settles them; *took: how many
 * completed instead. Those took the peer's first *took pieces under b->tag
 * (a collision aside, pieces of this very signature): MPI matches in order,
 * and cancelling from the last keeps the receives still posted the first
 * ones, so piece k can only have met receive k, of its size. */
static int cancel_recvs(fsc_bop *b, double deadline, int *took) {
    *took = 0;
    for (int i = b->nreq - 1; i >= 0; i--)
        if (b->reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&b->reqs[i]);
    for (int left = b->nreq; left > 0;) {
        left = 0;
        for (int i = 0; i < b->nreq; i++) {
            if (b->reqs[i] == MPI_REQUEST_NULL) continue;
            int flag = 0, cancelled = 0;
            MPI_Status st;
            if (MPI_Test(&b->reqs[i], &flag, &st) != MPI_SUCCESS)
                flag = 1; /* failed, so matched: it took a piece */
            else if (flag)
                MPI_Test_cancelled(&st, &cancelled);
            if (flag) {
                b->reqs[i] = MPI_REQUEST_NULL;
                *took += !cancelled;
            }
            left += !flag;
        }
        if (left && fsc_now() > deadline)
            return fsc_error(FSC_ERR_TIMEOUT,
                             "the early receives of a desynced allreduce on rank %d could not be "
                             "cancelled in time",
                             b->c->rank); /* left in flight: the caller abandons them */
    }
    b->nreq = 0;
    return FSC_OK;
}

/* Every piece the peers sent this rank early, received at its own size into
 * one scratch block, but for the first `took` pieces under `tag` from the
 * partner (cancel_recvs). */
typedef struct drain {
    MPI_Request *req;
    int n;
    char *block;
    int took, tag;
} drain;

static int post_drains(mpi_ctx *c, const int64_t *count, const fsc_dtype *dt, const int64_t *sig,
                       int64_t seq, drain *d) {
    size_t bytes = 0;
    int n = 0;
    for (int q = 0; q < c->size; q++) {
        plan p = count[q] < 0 ? (plan){0} : plan_of(c, q, c->rank, count[q], dt[q]);
        for (int k = 0; k < p.n; k++, n++)
            bytes += (size_t)(k + 1 < p.n ? p.elems : p.last) * p.esz;
    }
    d->req = malloc((size_t)(n ? n : 1) * sizeof *d->req);
    d->block = malloc(bytes ? bytes : 1);
    if (!d->req || !d->block)
        return fsc_error(FSC_ERR_NOMEM, "out of memory settling a desynced allreduce");
    char *at = d->block;
    for (int q = 0; q < c->size; q++) {
        plan p = count[q] < 0 ? (plan){0} : plan_of(c, q, c->rank, count[q], dt[q]);
        int tag = p.n ? tag_of(c, count[q], dt[q], seq, sig[q]) : 0;
        int from = q == (c->rank ^ 1) && tag == d->tag ? d->took : 0;
        for (int k = 0; k < p.n; k++) {
            int64_t len = k + 1 < p.n ? p.elems : p.last;
            if (k < from) {
                at += (size_t)len * p.esz;
                continue;
            }
            int rc = MPI_Irecv(at, (int)len, p.type, q, tag, c->data, &d->req[d->n]);
            if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Irecv(drain)");
            d->n++;
            at += (size_t)len * p.esz;
        }
    }
    return FSC_OK;
}

int fsc_eager_settle(void *ctx, fsc_bop *mine, const int64_t *count, const fsc_dtype *dt,
                     const int64_t *sig, int64_t seq, double deadline) {
    mpi_ctx *c = ctx;
    drain d = {.tag = -1};
    if (mine) {
        d.tag = mine->tag;
        int rc = cancel_recvs(mine, deadline, &d.took);
        if (rc) return rc;
    }
    int rc = post_drains(c, count, dt, sig, seq, &d);
    bool done = false;
    while (!done) { /* what was posted is settled even when posting failed part way */
        done = true;
        for (int i = 0; i < d.n; i++) done = settled(&d.req[i]) && done;
        for (int i = 0; mine && i < mine->nsreq; i++) done = settled(&mine->sreqs[i]) && done;
        if (!done && fsc_now() > deadline)
            return fsc_error(FSC_ERR_TIMEOUT,
                             "the early messages of a desynced allreduce on rank %d were not "
                             "delivered in time",
                             c->rank); /* left in flight: the caller abandons them */
    }
    free(d.req);
    free(d.block);
    if (mine) fsc_mpi_bop_free(mine); /* its receives are settled: nothing of it is in flight */
    return rc;
}
