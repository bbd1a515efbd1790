/* The public collectives: argument checks, then a request (blocking forms
 * wait on it at once), plus the start and finish of each data phase.
 *
 * The one idea: the front end turns every call into something the backend
 * understands with the fewest kinds: AVG is a SUM followed by a division
 * (integer division, truncating, for I32/I64; for BF16/F16 in F32, rounded
 * once), and even allgather / reduce-scatter are the uneven ones with equal
 * counts. BF16/F16 reductions go to the backend as they are: they travel as
 * halves (half the bytes of F32) and every hop adds in F32 and rounds once
 * (elementwise.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/kernels.h"
#include "heartbeat.h"

static int check_common(fsc_group *g, int64_t count, const char *fn) {
    int rc = fsc_dist_require_init(fn);
    if (rc) return rc;
    if (!g) return fsc_error(FSC_ERR_INVALID, "%s: group is NULL", fn);
    if (count < 0)
        return fsc_error(FSC_ERR_INVALID, "%s: count %lld is negative", fn, (long long)count);
    return FSC_OK;
}

static int check_dtype(fsc_dtype dt, bool reduction, const char *fn) {
    if ((unsigned)dt >= FSC_DTYPE_COUNT)
        return fsc_error(FSC_ERR_DTYPE, "%s: unknown dtype %d", fn, (int)dt);
    if (reduction && dt == FSC_DTYPE_U16)
        return fsc_error(FSC_ERR_DTYPE,
                         "%s: dtype U16 cannot be reduced (F32, BF16, F16, I32 or "
                         "I64)",
                         fn);
    return FSC_OK;
}

static int check_op(fsc_reduce_op op, const char *fn) {
    if ((unsigned)op > FSC_REDUCE_MAX)
        return fsc_error(FSC_ERR_INVALID, "%s: unknown reduce op %d (sum, avg or max)", fn,
                         (int)op);
    return FSC_OK;
}

static int check_rank(const fsc_group *g, int r, const char *what, const char *fn) {
    if (r < 0 || r >= g->size)
        return fsc_error(FSC_ERR_INVALID, "%s: %s %d is outside group %s of %d ranks", fn, what, r,
                         g->name, g->size);
    return FSC_OK;
}

static int check_buf(const void *p, int64_t count, const char *what, const char *fn) {
    if (!p && count > 0) return fsc_error(FSC_ERR_INVALID, "%s: %s is NULL", fn, what);
    return FSC_OK;
}

/* counts/displs: every entry >= 0; returns the total and the extent. */
static int check_layout(const fsc_group *g, const int64_t *counts, const int64_t *displs,
                        int64_t *total, int64_t *extent, const char *fn) {
    if (!counts || !displs) return fsc_error(FSC_ERR_INVALID, "%s: counts or displs is NULL", fn);
    *total = *extent = 0;
    for (int r = 0; r < g->size; r++) {
        if (counts[r] < 0 || displs[r] < 0)
            return fsc_error(FSC_ERR_INVALID,
                             "%s: counts[%d] = %lld, displs[%d] = %lld (must be >= 0)", fn, r,
                             (long long)counts[r], r, (long long)displs[r]);
        *total += counts[r];
        if (counts[r] && displs[r] + counts[r] > *extent) *extent = displs[r] + counts[r];
    }
    return FSC_OK;
}

/* Blocking forms run the request at once; non-blocking ones hand it out. */
static int submit(fsc_group *g, const fsc_coll_args *a, fsc_request **req, const char *fn) {
    int rc;
    if (req) {
        *req = NULL;
        rc = fsc_request_issue(g, a, req);
    } else {
        rc = fsc_request_run(g, a);
    }
    return rc ? fsc_error_context(rc, "%s: ", fn) : FSC_OK;
}

/* ---- allreduce / reduce / broadcast --------------------------------------------------- */

/* Allreduce, reduce and broadcast: one buffer, in place. A non-blocking call
 * (req_out) needs req; a reduction checks its op over an arithmetic dtype, a
 * rooted call its root. */
static int in_place(fsc_group *g, fsc_coll_args a, bool req_out, fsc_request **req,
                    const char *fn) {
    if (req_out && !req) return fsc_error(FSC_ERR_INVALID, "%s: req is NULL", fn);
    const bool reduces = a.kind != FSC_COLL_BROADCAST, rooted = a.kind != FSC_COLL_ALLREDUCE;
    int rc = check_common(g, a.count, fn);
    if (!rc) rc = check_dtype(a.dt, reduces, fn);
    if (!rc && reduces) rc = check_op(a.op, fn);
    if (!rc && rooted) rc = check_rank(g, a.root, "root", fn);
    if (!rc) rc = check_buf(a.buf, a.count, "buf", fn);
    return rc ? rc : submit(g, &a, req, fn);
}

/* The collective each pair below describes, from its parameters. */
#define ALLREDUCE_ARGS                                                                             \
    ((fsc_coll_args){.kind = FSC_COLL_ALLREDUCE, .buf = buf, .count = count, .dt = dt, .op = op})
#define REDUCE_ARGS                                                                                \
    ((fsc_coll_args){                                                                              \
        .kind = FSC_COLL_REDUCE, .buf = buf, .count = count, .dt = dt, .op = op, .root = root})
#define BROADCAST_ARGS                                                                             \
    ((fsc_coll_args){                                                                              \
        .kind = FSC_COLL_BROADCAST, .buf = buf, .count = count, .dt = dt, .root = root})

int fsc_group_allreduce(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op) {
    return in_place(g, ALLREDUCE_ARGS, false, NULL, "fsc_group_allreduce");
}

int fsc_group_iallreduce(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                         fsc_request **req) {
    return in_place(g, ALLREDUCE_ARGS, true, req, "fsc_group_iallreduce");
}

int fsc_group_reduce(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                     int root) {
    return in_place(g, REDUCE_ARGS, false, NULL, "fsc_group_reduce");
}

int fsc_group_ireduce(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                      int root, fsc_request **req) {
    return in_place(g, REDUCE_ARGS, true, req, "fsc_group_ireduce");
}

/* A broadcast or gather may be writing parameters (DDP's start, OSS's and
 * ZeRO's updated shards): the weights version moves after a blocking one and
 * at the start of a non-blocking one (its data lands at the wait, before any
 * GEMM of the step that reads it; the trainer moves the version before each
 * step too). */
int fsc_group_broadcast(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, int root) {
    int rc = in_place(g, BROADCAST_ARGS, false, NULL, "fsc_group_broadcast");
    fsc_weights_changed();
    return rc;
}

int fsc_group_ibroadcast(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, int root,
                         fsc_request **req) {
    fsc_weights_changed();
    return in_place(g, BROADCAST_ARGS, true, req, "fsc_group_ibroadcast");
}

/* ---- allgather / reduce-scatter (even and uneven) -------------------------------------- */

/* Equal chunks: counts all `count`, chunk r at r*count. */
static int even_layout(const fsc_group *g, int64_t count, int64_t **layout, const char *fn) {
    *layout = NULL;
    if (!g) return FSC_OK; /* reported by the checks that follow */
    if (count < 0)
        return fsc_error(FSC_ERR_INVALID, "%s: count %lld is negative", fn, (long long)count);
    *layout = malloc(2 * (size_t)g->size * sizeof(int64_t));
    if (!*layout) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", fn);
    for (int r = 0; r < g->size; r++) {
        (*layout)[r] = count;
        (*layout)[g->size + r] = (int64_t)r * count;
    }
    return FSC_OK;
}

/* Allgather and reduce-scatter over a layout of chunks (rank r's: counts[r]
 * elements at displs[r]): the whole layout is out for an allgather and in
 * for a reduce-scatter, this rank's chunk the other; a reduce-scatter checks
 * its op over an arithmetic dtype. */
static int chunked(fsc_group *g, fsc_coll_args a, fsc_request **req, const char *fn) {
    const bool reduces = a.kind == FSC_COLL_REDUCE_SCATTER;
    int rc = check_common(g, 0, fn);
    if (!rc) rc = check_dtype(a.dt, reduces, fn);
    if (!rc && reduces) rc = check_op(a.op, fn);
    int64_t total = 0, extent = 0;
    if (!rc) rc = check_layout(g, a.counts, a.displs, &total, &extent, fn);
    if (!rc) rc = check_buf(a.in, reduces ? extent : a.counts[g->rank], "in", fn);
    if (!rc) rc = check_buf(a.out, reduces ? a.counts[g->rank] : extent, "out", fn);
    if (rc) return rc;
    a.count = total;
    return submit(g, &a, req, fn);
}

/* The same in equal chunks of count elements; a non-blocking call (req_out)
 * needs req. */
static int even(fsc_group *g, fsc_coll_args a, int64_t count, bool req_out, fsc_request **req,
                const char *fn) {
    if (req_out && !req) return fsc_error(FSC_ERR_INVALID, "%s: req is NULL", fn);
    int rc = fsc_dist_require_init(fn);
    if (rc) return rc;
    if (!g) return fsc_error(FSC_ERR_INVALID, "%s: group is NULL", fn);
    int64_t *layout;
    rc = even_layout(g, count, &layout, fn);
    if (rc) return rc;
    a.counts = layout, a.displs = layout + g->size;
    rc = chunked(g, a, req, fn);
    free(layout);
    return rc;
}

int fsc_group_allgatherv(fsc_group *g, const void *in, void *out, const int64_t *counts,
                         const int64_t *displs, fsc_dtype dt) {
    fsc_coll_args a = {.kind = FSC_COLL_ALLGATHER,
                       .in = in,
                       .out = out,
                       .counts = (int64_t *)counts,
                       .displs = (int64_t *)displs,
                       .dt = dt};
    int rc = chunked(g, a, NULL, "fsc_group_allgatherv");
    fsc_weights_changed(); /* as a broadcast, above */
    return rc;
}

int fsc_group_allgather(fsc_group *g, const void *in, void *out, int64_t count, fsc_dtype dt) {
    fsc_coll_args a = {.kind = FSC_COLL_ALLGATHER, .in = in, .out = out, .dt = dt};
    int rc = even(g, a, count, false, NULL, "fsc_group_allgather");
    fsc_weights_changed();
    return rc;
}

int fsc_group_iallgather(fsc_group *g, const void *in, void *out, int64_t count, fsc_dtype dt,
                         fsc_request **req) {
    fsc_coll_args a = {.kind = FSC_COLL_ALLGATHER, .in = in, .out = out, .dt = dt};
    fsc_weights_changed();
    return even(g, a, count, true, req, "fsc_group_iallgather");
}

int fsc_group_reduce_scatterv(fsc_group *g, const void *in, void *out, const int64_t *counts,
                              const int64_t *displs, fsc_dtype dt, fsc_reduce_op op) {
    fsc_coll_args a = {.kind = FSC_COLL_REDUCE_SCATTER,
                       .in = in,
                       .out = out,
                       .counts = (int64_t *)counts,
                       .displs = (int64_t *)displs,
                       .dt = dt,
                       .op = op};
    return chunked(g, a, NULL, "fsc_group_reduce_scatterv");
}

int fsc_group_reduce_scatter(fsc_group *g, const void *in, void *out, int64_t count, fsc_dtype dt,
                             fsc_reduce_op op) {
    fsc_coll_args a = {.kind = FSC_COLL_REDUCE_SCATTER, .in = in, .out = out, .dt = dt, .op = op};
    return even(g, a, count, false, NULL, "fsc_group_reduce_scatter");
}

int fsc_group_ireduce_scatter(fsc_group *g, const void *in, void *out, int64_t count, fsc_dtype dt,
                              fsc_reduce_op op, fsc_request **req) {
    fsc_coll_args a = {.kind = FSC_COLL_REDUCE_SCATTER, .in = in, .out = out, .dt = dt, .op = op};
    return even(g, a, count, true, req, "fsc_group_ireduce_scatter");
}

/* ---- alltoall / barrier / send / recv ---------------------------------------------------- */

int fsc_group_alltoall(fsc_group *g, const void *in, void *out, int64_t count, fsc_dtype dt) {
    const char *fn = "fsc_group_alltoall";
    int rc = check_common(g, count, fn);
    if (!rc) rc = check_dtype(dt, false, fn);
    if (!rc) rc = check_buf(in, count, "in", fn);
    if (!rc) rc = check_buf(out, count, "out", fn);
    if (rc) return rc;
    fsc_coll_args a = {.kind = FSC_COLL_ALLTOALL, .in = in, .out = out, .count = count, .dt = dt};
    return submit(g, &a, NULL, fn);
}

int fsc_group_barrier(fsc_group *g) {
    int rc = check_common(g, 0, "fsc_group_barrier");
    if (rc) return rc;
    fsc_coll_args a = {.kind = FSC_COLL_BARRIER};
    return submit(g, &a, NULL, "fsc_group_barrier");
}

static int p2p(fsc_group *g, int kind, void *buf, int64_t count, fsc_dtype dt, int peer, int tag,
               fsc_request **req, const char *fn) {
    if (req) *req = NULL; /* on any failure */
    int rc = check_common(g, count, fn);
    if (!rc) rc = check_dtype(dt, false, fn);
    if (!rc) rc = check_rank(g, peer, kind == FSC_COLL_SEND ? "dst" : "src", fn);
    if (!rc) rc = check_buf(buf, count, "buf", fn);
    if (rc) return rc;
    if (tag < 0 || tag >= FSC_CTRL_P2P_BASE)
        return fsc_error(FSC_ERR_INVALID, "%s: tag %d is outside [0, %d)", fn, tag,
                         FSC_CTRL_P2P_BASE);
    fsc_coll_args a = {
        .kind = kind, .buf = buf, .count = count, .dt = dt, .root = peer, .tag = tag};
    return submit(g, &a, req, fn);
}

int fsc_group_send(fsc_group *g, const void *buf, int64_t count, fsc_dtype dt, int dst, int tag) {
    return p2p(g, FSC_COLL_SEND, (void *)buf, count, dt, dst, tag, NULL, "fsc_group_send");
}

int fsc_group_recv(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, int src, int tag) {
    return p2p(g, FSC_COLL_RECV, buf, count, dt, src, tag, NULL, "fsc_group_recv");
}

int fsc_group_isend(fsc_group *g, const void *buf, int64_t count, fsc_dtype dt, int dst, int tag,
                    fsc_request **req) {
    if (!req) return fsc_error(FSC_ERR_INVALID, "fsc_group_isend: req is NULL");
    return p2p(g, FSC_COLL_SEND, (void *)buf, count, dt, dst, tag, req, "fsc_group_isend");
}

int fsc_group_irecv(fsc_group *g, void *buf, int64_t count, fsc_dtype dt, int src, int tag,
                    fsc_request **req) {
    if (!req) return fsc_error(FSC_ERR_INVALID, "fsc_group_irecv: req is NULL");
    return p2p(g, FSC_COLL_RECV, buf, count, dt, src, tag, req, "fsc_group_irecv");
}

/* ---- data phase --------------------------------------------------------------------------- */

static fsc_reduce_op wire_op(fsc_reduce_op op) {
    return op == FSC_REDUCE_MAX ? FSC_REDUCE_MAX : FSC_REDUCE_SUM;
}

static int unsupported(const fsc_group *g, int kind) {
    return fsc_error(FSC_ERR_UNSUPPORTED, "the %s backend of group %s has no %s", g->be->name,
                     g->name, fsc_coll_kind_name(kind));
}

/* MPI has no non-blocking split: the control exchange has proved that every
 * member joined, and the blocking calls below run under the heartbeat's
 * deadline (a member lost between the two ends this process with a message,
 * FSC_DIST_DEADLINE_EXIT, rather than a hang). */
static int split_blocking(fsc_request *r);

static int start_split(fsc_request *r) {
    char what[64];
    snprintf(what, sizeof what, "MPI_Comm_split of group %.32s", r->g->name);
    fsc_hb_arm(fsc_dist_rt.timeout_s, what);
    int rc = split_blocking(r);
    fsc_hb_arm(0, "");
    return rc;
}

static int split_blocking(fsc_request *r) {
    fsc_group *g = r->g;
    fsc_coll_args *a = &r->a;
    fsc_group **out = a->out;
    MPI_Comm ctrl;
    int rc = MPI_Comm_split(g->ctrl, a->root < 0 ? MPI_UNDEFINED : a->root, a->tag, &ctrl);
    if (rc != MPI_SUCCESS) return fsc_dist_mpi_error(rc, "MPI_Comm_split");
    void *ctx = NULL;
    rc = g->be->split(g->be_ctx, a->root, a->tag, &ctx);
    if (rc) {
        if (ctrl != MPI_COMM_NULL) MPI_Comm_free(&ctrl);
        return rc;
    }
    if (ctrl == MPI_COMM_NULL) return FSC_OK;
    rc = fsc_group_create(a->in, ctrl, ctx, out);
    if (rc) {
        g->be->free(ctx);
        MPI_Comm_free(&ctrl);
    }
    return rc;
}

/* Statistics: payload bytes handed to the data plane, in the dtype they
 * travel as (what the backend is given, not what the caller holds). */
static void count_bytes(fsc_group *g, int64_t count, fsc_dtype dt) {
    g->stats.bytes += count * (int64_t)fsc_dtype_size(dt);
}

int fsc_coll_start(fsc_request *r) {
    fsc_group *g = r->g;
    const fsc_backend_ops *be = g->be;
    fsc_coll_args *a = &r->a;
    switch (a->kind) {
    case FSC_KIND_SPLIT:
        return start_split(r);
    case FSC_COLL_ALLREDUCE:
        if (!be->allreduce) return unsupported(g, a->kind);
        count_bytes(g, a->count, a->dt);
        if (r->bop) return FSC_OK; /* posted early, at issue (request.c) */
        return be->allreduce(g->be_ctx, a->buf, a->count, a->dt, wire_op(a->op), r->seq, &r->bop);
    case FSC_COLL_REDUCE:
        if (!be->reduce) return unsupported(g, a->kind);
        count_bytes(g, a->count, a->dt);
        return be->reduce(g->be_ctx, a->buf, a->count, a->dt, wire_op(a->op), a->root, r->seq,
                          &r->bop);
    case FSC_COLL_BROADCAST:
        if (!be->broadcast) return unsupported(g, a->kind);
        count_bytes(g, a->count, a->dt);
        return be->broadcast(g->be_ctx, a->buf, a->count, a->dt, a->root, r->seq, &r->bop);
    case FSC_COLL_ALLGATHER:
        if (!be->allgatherv) return unsupported(g, a->kind);
        count_bytes(g, a->count, a->dt);
        return be->allgatherv(g->be_ctx, a->in, a->out, a->counts, a->displs, a->dt, r->seq,
                              &r->bop);
    case FSC_COLL_REDUCE_SCATTER:
        if (!be->reduce_scatterv) return unsupported(g, a->kind);
        count_bytes(g, a->count, a->dt);
        return be->reduce_scatterv(g->be_ctx, a->in, a->out, a->counts, a->displs, a->dt,
                                   wire_op(a->op), r->seq, &r->bop);
    case FSC_COLL_ALLTOALL:
        if (!be->alltoall) return unsupported(g, a->kind);
        count_bytes(g, a->count * g->size, a->dt);
        return be->alltoall(g->be_ctx, a->in, a->out, a->count, a->dt, r->seq, &r->bop);
    case FSC_COLL_BARRIER:
        return be->barrier ? be->barrier(g->be_ctx, r->seq, &r->bop) : unsupported(g, a->kind);
    case FSC_COLL_SEND:
        if (!be->send) return unsupported(g, a->kind);
        count_bytes(g, a->count, a->dt);
        return be->send(g->be_ctx, a->buf, a->count, a->dt, a->root, a->tag, &r->bop);
    case FSC_COLL_RECV:
        if (!be->recv) return unsupported(g, a->kind);
        count_bytes(g, a->count, a->dt);
        return be->recv(g->be_ctx, a->buf, a->count, a->dt, a->root, a->tag, &r->bop);
    default:
        return fsc_error(FSC_ERR_INTERNAL, "unknown collective kind %d", a->kind);
    }
}

/* AVG's division, on the result only (the root's, for reduce). */
int fsc_coll_finish(fsc_request *r) {
    fsc_group *g = r->g;
    fsc_coll_args *a = &r->a;
    if (a->op != FSC_REDUCE_AVG) return FSC_OK;
    if (a->kind == FSC_COLL_ALLREDUCE || (a->kind == FSC_COLL_REDUCE && g->rank == a->root))
        fsc_dist_divide(a->buf, a->count, a->dt, g->size);
    else if (a->kind == FSC_COLL_REDUCE_SCATTER)
        fsc_dist_divide(a->out, a->counts[g->rank], a->dt, g->size);
    return FSC_OK;
}

void fsc_coll_release(fsc_request *r) {
    if (r->bop && r->early) /* posted before a check that never finished: MPI may still use it */
        fsc_dist_rt.abandoned = true;
    else if (r->bop)
        r->g->be->release(r->bop);
    r->bop = NULL;
    r->early = false;
}

/* ---- small allreduces beside the check ------------------------------------------------- */

/* The signature's hash a backend may carry in place of the announcement; the
 * full check (FSC_DESYNC_CHECK=1) compares whole signatures, so none. */
static int64_t sig_hash(const int64_t *sig) {
    return fsc_dist_rt.full_check ? -1 : fsc_wd_sig_hash(sig);
}

int fsc_coll_start_early(fsc_request *r) {
    fsc_group *g = r->g;
    const fsc_backend_ops *be = g->be;
    if (r->a.kind != FSC_COLL_ALLREDUCE || !r->checked || !be->allreduce_early) return FSC_OK;
    int rc = be->allreduce_early(g->be_ctx, r->a.buf, r->a.count, r->a.dt, wire_op(r->a.op), r->seq,
                                 sig_hash(r->sig), &r->bop);
    r->early = r->bop != NULL;
    fsc_early_peek v = FSC_EARLY_UNSIGNED;
    if (!rc && r->bop && be->early_peek) rc = be->early_peek(r->bop, &v);
    r->signed_early = v != FSC_EARLY_UNSIGNED;
    return rc;
}

int fsc_coll_settle_early(fsc_request *r) {
    fsc_group *g = r->g;
    const fsc_backend_ops *be = g->be;
    if (!be->early_settle || !r->inbox || !r->peers) return FSC_OK;
    if (r->a.kind == FSC_COLL_SEND || r->a.kind == FSC_COLL_RECV) return FSC_OK; /* one peer */
    int64_t *count = malloc(2 * (size_t)g->size * sizeof *count), *sig = count + g->size;
    fsc_dtype *dt = malloc((size_t)g->size * sizeof *dt);
    if (!count || !dt) {
        free(count);
        free(dt);
        return fsc_error(FSC_ERR_NOMEM, "out of memory settling a desynced collective");
    }
    bool mine_ar = r->a.kind == FSC_COLL_ALLREDUCE;
    count[g->rank] = mine_ar ? r->a.count : -1;
    dt[g->rank] = r->a.dt;
    sig[g->rank] = sig_hash(r->sig);
    for (int i = 0; i < g->size - 1; i++) { /* every peer announced: the check completed */
        const int64_t *s = r->inbox + (size_t)i * SIG_WORDS;
        bool ar = s[SIG_KIND] == FSC_COLL_ALLREDUCE && s[SIG_DTYPE] >= 0 &&
                  s[SIG_DTYPE] < FSC_DTYPE_COUNT && s[SIG_COUNT] >= 0;
        count[r->peers[i]] = ar ? s[SIG_COUNT] : -1;
        dt[r->peers[i]] = ar ? (fsc_dtype)s[SIG_DTYPE] : FSC_DTYPE_F32;
        sig[r->peers[i]] = sig_hash(s); /* the tag its early messages went under */
    }
    fsc_bop *mine = r->early ? r->bop : NULL;
    if (mine) r->bop = NULL;
    r->early = false;
    int rc = be->early_settle(g->be_ctx, mine, count, dt, sig, r->seq,
                              r->t_start + fsc_dist_rt.timeout_s);
    free(count);
    free(dt);
    if (rc == FSC_ERR_TIMEOUT) { /* left in flight: keep the group's communicators */
        g->broken = FSC_ERR_TIMEOUT;
        fsc_dist_rt.abandoned = true;
    }
    return rc;
}
