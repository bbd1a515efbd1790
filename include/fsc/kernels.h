/* fsc kernels: the math of floor 2, as plain functions on float arrays.
 *
 * Argument order follows llm.c: outputs, then what forward keeps for backward,
 * then inputs and weights, then sizes. Backward kernels WRITE the input
 * gradient (dinp = ...) and ACCUMULATE parameter gradients (dweight += ...),
 * so gradient accumulation over micro-batches falls out (DESIGN.md decision 3).
 * Every matmul goes through CBLAS (OpenBLAS, loaded by fsc_blas_init).
 *
 * Kernels check nothing and return nothing: sizes, non-overlapping buffers of
 * the stated shapes, and non-NULL pointers (except where NULL is allowed) are
 * the caller's contract; the modules of fsc/nn.h check before they call. All
 * buffers are borrowed. A kernel that needs BLAS before fsc_blas_init
 * succeeded loads it then, and aborts the process if none can be loaded: call
 * fsc_blas_init first to get FSC_ERR_NOT_FOUND instead.
 */
#ifndef FSC_KERNELS_H
#define FSC_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- BLAS ------------------------------------------------------------------ */
/* Loads OpenBLAS. Debian's OpenBLAS may mis-detect recent Xeons and fall back to
 * SSE3 kernels (4-5x slower); unless the user set OPENBLAS_CORETYPE, fsc sets it
 * from the CPU's features before the library loads. `threads` is the BLAS thread
 * count (0: keep OPENBLAS_NUM_THREADS or 1). Idempotent; called lazily by the
 * kernels. Returns FSC_ERR_NOT_FOUND if no OpenBLAS can be loaded. */
FSC_API int fsc_blas_init(int threads);
/* The kernel family OpenBLAS runs ("SkylakeX", "Haswell", ...), after init. */
FSC_API const char *fsc_blas_corename(void);
/* One line for start-up logs: library, kernels, threads, and whether fsc chose them. */
FSC_API const char *fsc_blas_describe(void);
/* One line for start-up logs when the user's OPENBLAS_CORETYPE names older, slower
 * kernels than this CPU supports ("OPENBLAS_CORETYPE=Haswell is set; this CPU
 * supports SkylakeX kernels (...): unset it or set OPENBLAS_CORETYPE=SkylakeX"),
 * else NULL. fsc still obeys the user; this only says what the choice costs. */
FSC_API const char *fsc_blas_hint(void);
FSC_API void fsc_blas_set_threads(int threads); /* threads < 1 means 1 */

/* Row-major C = alpha * op(A) @ op(B) + beta * C, with op = transpose when t* is true. */
FSC_API void fsc_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
/* Measures sgemm GFLOP/s at the current BLAS thread count on an n x n x n
 * product: the best of reps timed runs; 0 if its FSC_MEM_WORK buffers cannot
 * be allocated. */
FSC_API double fsc_sgemm_peak_gflops(int n, int reps);

/* ---- matmul (Linear) ------------------------------------------------------- */
/* Weight layouts: torch nn.Linear keeps weight as (OC, C); Hugging Face GPT-2's
 * Conv1D keeps it as (C, OC). Both are supported without copies. */
typedef enum { FSC_WEIGHT_OUT_IN = 0, FSC_WEIGHT_IN_OUT = 1 } fsc_weight_layout;

/* out is (N,OC); inp is (N,C); weight (OC,C) or (C,OC); bias (OC) or NULL. */
FSC_API void fsc_matmul_forward(float *out, const float *inp, const float *weight,
                                const float *bias, int N, int C, int OC, fsc_weight_layout layout);
/* dinp (N,C) written; dweight, dbias accumulated; each of the three is skipped if NULL. */
FSC_API void fsc_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 fsc_weight_layout layout);

/* ---- layernorm ------------------------------------------------------------- */
/* out, inp are (N,C); mean, rstd are (N) and kept for backward. */
FSC_API void fsc_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int N, int C, float eps);
/* dinp (N,C) written; dweight, dbias (C) accumulated. */
FSC_API void fsc_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int N, int C);

/* ---- activations --------------------------------------------------------- */
/* GELU, tanh approximation (GPT-2). Element-wise: out may equal inp. */
FSC_API void fsc_gelu_forward(float *out, const float *inp, int64_t n);
/* dinp = dout * gelu'(inp), written (not accumulated). */
FSC_API void fsc_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
FSC_API void fsc_relu_forward(float *out, const float *inp, int64_t n); /* out = max(inp, 0) */
/* dinp = inp > 0 ? dout : 0, written (not accumulated). */
FSC_API void fsc_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n);

/* ---- element-wise ---------------------------------------------------------- */
FSC_API void fsc_add(float *out, const float *a, const float *b, int64_t n); /* out = a + b */
FSC_API void fsc_add_inplace(float *acc, const float *x, int64_t n);         /* acc += x */
FSC_API void fsc_scale(float *x, float s, int64_t n);                        /* x *= s */
/* Dropout with a counter-based mask: element e of row r keeps with prob 1-p, keyed by
 * (key, row_id[r], e), where row_id is the row's global sample index
 * (first_row + r); kept elements are scaled by 1/(1-p). p must be in [0, 1). */
FSC_API void fsc_dropout_forward(float *out, const float *inp, float p, uint64_t key,
                                 int64_t first_row, int64_t rows, int64_t row_len);
/* The same mask and scale applied to dout: same p, key and rows as forward. */
FSC_API void fsc_dropout_backward(float *dinp, const float *dout, float p, uint64_t key,
                                  int64_t first_row, int64_t rows, int64_t row_len);
/* Dropout on a slice of every row, for tensors sharded along a row (sequence
 * parallelism): memory holds `rows` runs of len elements, run r being elements
 * [e0, e0+len) of global row first_row + r. Each element gets exactly the
 * mask and scale fsc_dropout_forward gives it in the whole row, so forward
 * and backward are this one call. out may equal inp. */
FSC_API void fsc_dropout_slice(float *out, const float *inp, float p, uint64_t key,
                               int64_t first_row, int64_t rows, int64_t e0, int64_t len);

/* ---- softmax and attention ------------------------------------------------- */
/* Row-wise softmax over (N,V). */
FSC_API void fsc_softmax_forward(float *out, const float *inp, int N, int V);
/* Causal multi-head self-attention on a fused qkv.
 * qkv is (B,T,3C) laid out [q | k | v]; out is (B,T,C); att is (B,NH,T,T), the
 * softmax probabilities kept for backward (upper triangle left unwritten). */
FSC_API void fsc_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                   int NH);
/* dqkv (B,T,3C) written. Takes T*T floats of FSC_MEM_WORK scratch per thread
 * for the call; if that allocation fails, dqkv is zeroed and the error logged. */
FSC_API void fsc_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                    const float *att, int B, int T, int C, int NH);

/* ---- embedding ------------------------------------------------------------- */
/* out is (B,T,C) = wte[tokens] + wpe[position]; tokens (B,T) int32. wpe may be NULL. */
FSC_API void fsc_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                                 const float *wpe, int B, int T, int C);
/* Accumulates into dwte (V,C) and dwpe (T,C) (dwpe may be NULL). */
FSC_API void fsc_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                  const int32_t *tokens, int B, int T, int C);

/* ---- fused softmax + cross-entropy ----------------------------------------- */
/* logits (N,V); targets (N). Writes per-row loss (0 for ignored rows) and, in
 * place of logits, the gradient (softmax - onehot) * grad_scale (0 rows for ignored
 * targets). Returns the number of non-ignored rows. Sets *bad_target to the first
 * out-of-range target index (or -1). */
FSC_API int64_t fsc_crossentropy_fused(float *losses, float *logits, const int32_t *targets, int N,
                                       int V, int ignore_index, float grad_scale,
                                       int64_t *bad_target);

/* ---- reductions ------------------------------------------------------------ */
/* Sum of squares (for gradient norms): float partial sums over blocks of 4096
 * elements, added in double. */
FSC_API double fsc_sumsq(const float *x, int64_t n);
/* max |x[i]|; 0 for n = 0. NaN elements are skipped (fsc_grad_max_abs reports them). */
FSC_API float fsc_absmax(const float *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
