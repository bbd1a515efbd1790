/* The data-plane backend of a process group: a table of function pointers
 * (docs/architecture.md, decision 7; ggml-backend's shape). MPI fills it today; a NCCL
 * backend would fill the same table tomorrow.
 *
 * The one idea: every entry *starts* an operation and hands back an opaque
 * in-flight handle that `test` drives and reports finished. The front end
 * (collectives.c) then owns every wait: it polls under the watchdog, so no
 * backend call can block forever. A backend with only blocking primitives
 * may run an operation to completion inside its start entry.
 *
 * The front end has already validated arguments and run the desync check,
 * and turned AVG into SUM, so reduction entries see F32, BF16, F16, I32 or
 * I64 with FSC_REDUCE_SUM or FSC_REDUCE_MAX; data-movement entries see any
 * dtype (only its size matters). BF16/F16 must travel as halves (that is
 * the point of a half-precision reduction: half the bytes of F32); each hop
 * widens to F32, adds and rounds once to the half type, as NCCL does, and an
 * allreduce leaves bit-identical results on every rank (fsc_dist_accumulate
 * does the arithmetic). Counts are int64: a backend
 * splits messages itself when its transport counts in int. `seq` is the
 * collective's sequence number on the group, for tagging point-to-point
 * traffic of concurrent operations apart. Optional entries may be NULL (the
 * front end then answers FSC_ERR_UNSUPPORTED).
 */
#ifndef FSC_DIST_BACKEND_H
#define FSC_DIST_BACKEND_H

#include "fsc/dist.h"

typedef struct fsc_bop fsc_bop; /* an in-flight operation, defined by each backend */

/* What an early operation learned of its peer's signature (early_peek):
 * UNSIGNED, it carries none (the announcements go as usual); WAIT, nothing
 * from the peer yet; SAME, the peer's first message carries this rank's
 * signature, and its size; OTHER, it carries another. */
typedef enum {
    FSC_EARLY_UNSIGNED = 0,
    FSC_EARLY_WAIT,
    FSC_EARLY_SAME,
    FSC_EARLY_OTHER
} fsc_early_peek;

typedef struct fsc_backend_ops {
    const char *name;
    /* Context lifetime. world: a context spanning every process; self: this
     * process alone (no communication to create it). split: collective over
     * `parent`, same color/key rules as fsc_group_split; color < 0 gives
     * *out = NULL. */
    int (*world)(void **out);
    int (*self)(void **out);
    int (*split)(void *parent, int color, int key, void **out);
    void (*free)(void *ctx);

    int (*allreduce)(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                     int64_t seq, fsc_bop **out);
    int (*reduce)(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op, int root,
                  int64_t seq, fsc_bop **out);
    int (*broadcast)(void *ctx, void *buf, int64_t count, fsc_dtype dt, int root, int64_t seq,
                     fsc_bop **out);
    /* counts/displs: one entry per rank, in elements; in may equal out + displs[rank]. */
    int (*allgatherv)(void *ctx, const void *in, void *out, const int64_t *counts,
                      const int64_t *displs, fsc_dtype dt, int64_t seq, fsc_bop **out_op);
    /* in may be out's own chunk only through allreduce; here in and out are distinct. */
    int (*reduce_scatterv)(void *ctx, const void *in, void *out, const int64_t *counts,
                           const int64_t *displs, fsc_dtype dt, fsc_reduce_op op, int64_t seq,
                           fsc_bop **out_op);
    int (*alltoall)(void *ctx, const void *in, void *out, int64_t count, fsc_dtype dt, int64_t seq,
                    fsc_bop **out_op);
    int (*barrier)(void *ctx, int64_t seq, fsc_bop **out);
    int (*send)(void *ctx, const void *buf, int64_t count, fsc_dtype dt, int dst, int tag,
                fsc_bop **out);
    int (*recv)(void *ctx, void *buf, int64_t count, fsc_dtype dt, int src, int tag, fsc_bop **out);

    /* Optional, both or none: allreduces whose first messages move beside
     * the desync check instead of after it. allreduce_early posts this rank's
     * first messages at issue, before the check, and sets *out (NULL when it
     * sends none: the front end then starts `allreduce` as usual); it must
     * not write `buf` until `test` is called, which the front end does only
     * once every signature agreed. What rank q sends rank r early must be a
     * pure function of q's (count, dt, sig), seq and the group, equal on
     * every rank.
     * When the check fails instead, early_settle completes what was posted:
     * count[q], dt[q] are rank q's announced allreduce (count[q] < 0: q
     * announced another kind and sent nothing early; count[rank] is this
     * rank's own); everything q sent this rank is received and dropped, and
     * `mine` (may be NULL) is completed and freed. It polls until `deadline`
     * (fsc_now), then returns FSC_ERR_TIMEOUT with the messages left in
     * flight.
     * `sig` (>= 0, or -1 for none) is a hash of the rank's whole signature;
     * sig[q] in early_settle is rank q's. A backend may carry it in the first
     * message (the MPI backend does, in the tag, on two-rank groups), and
     * then early_peek tells the front end, which sends that peer no
     * announcement of its own (and sends it after all on OTHER, or when the
     * peer's announcement arrives), whether the peer's first message carries
     * the same signature. Only an operation with a single peer is signed.
     * Optional (NULL: every early operation is unsigned). */
    int (*allreduce_early)(void *ctx, void *buf, int64_t count, fsc_dtype dt, fsc_reduce_op op,
                           int64_t seq, int64_t sig, fsc_bop **out);
    int (*early_settle)(void *ctx, fsc_bop *mine, const int64_t *count, const fsc_dtype *dt,
                        const int64_t *sig, int64_t seq, double deadline);
    int (*early_peek)(fsc_bop *op, fsc_early_peek *out);

    /* Drives `op` as far as it can go without blocking; *done once finished. */
    int (*test)(fsc_bop *op, bool *done);
    /* Frees a finished operation. Never called on an unfinished one: those are
     * abandoned after a timeout (their buffers may still be written). */
    void (*release)(fsc_bop *op);
} fsc_backend_ops;

/* The MPI backend (backend_mpi.c). */
extern const fsc_backend_ops fsc_backend_mpi;

#endif
