/* fsc kernels: the math of floor 2, as plain functions on float arrays.
 *
 * Argument order follows llm.c: outputs, then what forward keeps for backward,
 * then inputs and weights, then sizes. Backward kernels WRITE the input
 * gradient (dinp = ...) and ACCUMULATE parameter gradients (dweight += ...),
 * so gradient accumulation over micro-batches falls out (DESIGN.md decision 3).
 * Every matmul goes through CBLAS (OpenBLAS, loaded by fsc_blas_init).
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
FSC_API void fsc_blas_set_threads(int threads);

/* Row-major C = alpha * op(A) @ op(B) + beta * C, with op = transpose when t* is true. */
FSC_API void fsc_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
/* Measures single-thread-per-BLAS sgemm GFLOP/s on an n x n x n product (min of reps). */
FSC_API double fsc_sgemm_peak_gflops(int n, int reps);

/* ---- matmul (Linear) ------------------------------------------------------- */
/* Weight layouts: torch nn.Linear keeps weight as (OC, C); Hugging Face GPT-2's
 * Conv1D keeps it as (C, OC). Both are supported without copies. */
typedef enum { FSC_WEIGHT_OUT_IN = 0, FSC_WEIGHT_IN_OUT = 1 } fsc_weight_layout;

/* out is (N,OC); inp is (N,C); weight (OC,C) or (C,OC); bias (OC) or NULL. */
FSC_API void fsc_matmul_forward(float *out, const float *inp, const float *weight,
                                const float *bias, int N, int C, int OC, fsc_weight_layout layout);
/* dinp (N,C) written, or skipped if NULL; dweight, dbias accumulated (dbias may be NULL). */
FSC_API void fsc_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 fsc_weight_layout layout);

/* ---- layernorm ------------------------------------------------------------- */
/* out, inp are (N,C); mean, rstd are (N) and kept for backward. */
FSC_API void fsc_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int N, int C, float eps);
FSC_API void fsc_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int N, int C);

/* ---- activations --------------------------------------------------------- */
/* GELU, tanh approximation (GPT-2). */
FSC_API void fsc_gelu_forward(float *out, const float *inp, int64_t n);
FSC_API void fsc_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
FSC_API void fsc_relu_forward(float *out, const float *inp, int64_t n);
FSC_API void fsc_relu_backward(float *dinp, const float *inp, const float *dout, int64_t n);

/* ---- element-wise ---------------------------------------------------------- */
FSC_API void fsc_add(float *out, const float *a, const float *b, int64_t n); /* out = a + b */
FSC_API void fsc_add_inplace(float *acc, const float *x, int64_t n);         /* acc += x */
FSC_API void fsc_scale(float *x, float s, int64_t n);                        /* x *= s */
/* Dropout with a counter-based mask: element e of row r keeps with prob 1-p, keyed by
 * (key, row_id[r], e), where row_id is the row's global sample index. */
FSC_API void fsc_dropout_forward(float *out, const float *inp, float p, uint64_t key,
                                 int64_t first_row, int64_t rows, int64_t row_len);
FSC_API void fsc_dropout_backward(float *dinp, const float *dout, float p, uint64_t key,
                                  int64_t first_row, int64_t rows, int64_t row_len);

/* ---- softmax and attention ------------------------------------------------- */
/* Row-wise softmax over (N,V). */
FSC_API void fsc_softmax_forward(float *out, const float *inp, int N, int V);
/* Causal multi-head self-attention on a fused qkv.
 * qkv is (B,T,3C) laid out [q | k | v]; out is (B,T,C); att is (B,NH,T,T), the
 * softmax probabilities kept for backward (upper triangle left unwritten). */
FSC_API void fsc_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                   int NH);
/* dqkv (B,T,3C) written; scratch needs (T*T + T*hs) floats per thread. */
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
/* Sum of squares in double (for gradient norms). */
FSC_API double fsc_sumsq(const float *x, int64_t n);
FSC_API float fsc_absmax(const float *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
