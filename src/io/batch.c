/* Batches: which token windows each (step, micro-step, rank) reads.
 *
 * The mapping is a pure function of the indices, so every parallel layout
 * (any dp, any grad_accum) sees the same global batch, and the global index
 * of a sequence can key its dropout mask. Token indices wrap modulo the
 * stream length, so any step is valid, forever.
 */
#include "fsc/io.h"

/* a*b if both are >= 0 and it fits, else -1. */
static int64_t mul_nonneg(int64_t a, int64_t b) {
    if (a < 0 || b < 0 || (b && a > INT64_MAX / b)) return -1;
    return a * b;
}

static int64_t add_nonneg(int64_t a, int64_t b) {
    if (a < 0 || b < 0 || a > INT64_MAX - b) return -1;
    return a + b;
}

/* (a * b) mod m for a, b < m < 2^63, without overflow (double-and-add). */
static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) {
    uint64_t r = 0;
    for (; b; b >>= 1) {
        if (b & 1) r = (r + a) % m;
        a = (a + a) % m;
    }
    return r;
}

int64_t fsc_batch_first_sample(int64_t step, int micro, int rank, int batch, int grad_accum,
                               int dp) {
    if (step < 0 || batch < 1 || grad_accum < 1 || dp < 1 || micro < 0 || micro >= grad_accum ||
        rank < 0 || rank >= dp)
        return -1;
    int64_t per_micro = mul_nonneg(batch, dp);          /* sequences per micro-step */
    int64_t global = mul_nonneg(per_micro, grad_accum); /* G */
    int64_t first = mul_nonneg(step, global);
    first = add_nonneg(first, mul_nonneg(micro, per_micro));
    return add_nonneg(first, mul_nonneg(rank, batch));
}

int fsc_tokens_batch(const fsc_tokens *tk, int64_t step, int micro, int rank, int batch,
                     int grad_accum, int dp, int T, int32_t *x, int32_t *y) {
    // x, y are (batch, T)
    if (!tk || !tk->data || !x || !y)
        return fsc_error(FSC_ERR_INVALID, "fsc_tokens_batch: NULL argument");
    if (T < 1 || tk->count < (int64_t)T + 1)
        return fsc_error(FSC_ERR_INVALID,
                         "token stream has %lld tokens; a sequence of T=%d needs "
                         "at least T+1",
                         (long long)tk->count, T);
    int64_t first = fsc_batch_first_sample(step, micro, rank, batch, grad_accum, dp);
    if (first < 0)
        return fsc_error(FSC_ERR_INVALID,
                         "batch indices out of range: step %lld, micro %d of %d, "
                         "rank %d of %d, batch %d",
                         (long long)step, micro, grad_accum, rank, dp, batch);
    uint64_t n = (uint64_t)tk->count;
    uint64_t seq = (uint64_t)first % n;
    for (int b = 0; b < batch; b++, seq = (seq + 1) % n) {
        uint64_t at = mulmod(seq, (uint64_t)T, n); /* (first + b) * T mod count */
        for (int t = 0; t < T; t++) {
            x[(int64_t)b * T + t] = fsc_tokens_at(tk, (int64_t)at);
            at = at + 1 == n ? 0 : at + 1;
            y[(int64_t)b * T + t] = fsc_tokens_at(tk, (int64_t)at);
        }
    }
    return FSC_OK;
}
