/* fsc kernels: the math of floor 2, as plain functions on float arrays.
 *
 * Argument order follows llm.c: outputs, then what forward keeps for backward,
 * then inputs and weights, then sizes. Backward kernels WRITE the input
 * gradient (dinp = ...) and ACCUMULATE parameter gradients (dweight += ...),
 * so gradient accumulation over micro-batches falls out (docs/architecture.md, decision 3).
 * Every matmul goes through CBLAS (OpenBLAS, loaded by fsc_blas_init), or,
 * when a caller asks for bf16 (FSC_GEMM_BF16), through oneDNN's bf16 matmul
 * where that is measured faster (loaded at run time; see fsc_gemm).
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

/* ---- bf16 GEMM (autocast) --------------------------------------------------- */
/* The precision a GEMM's inputs are taken at. Accumulation is always fp32. */
typedef enum {
    FSC_GEMM_F32 = 0, /* fsc_sgemm, bit for bit */
    FSC_GEMM_BF16,    /* A and B rounded to bf16 (nearest even), where measured faster */
} fsc_gemm_prec;

/* fsc_sgemm's contract, at precision prec. FSC_GEMM_BF16: A and B are
 * rounded to bf16 and multiplied by oneDNN's matmul with fp32 accumulation
 * (alpha and beta applied in fp32) when that path is chosen for this shape
 * (ta, tb, M, N, K, and ldc when alpha = 1 and beta = 0), else the call is
 * fsc_sgemm on the unrounded inputs. The choice is made on the shape's first
 * call, under the mode (fsc_bf16_gemm_set_mode, else FSC_BF16_GEMM): off:
 * always sgemm; on: oneDNN whenever it is loaded and accepts the shape;
 * auto (default): oneDNN only on a CPU with avx512_bf16 or amx_bf16, and
 * for a shape only if timing both on that first call finds it faster.
 * Thread-safe; each thread keeps its packed bf16 operands in FSC_MEM_WORK
 * buffers, grown to the largest GEMM it ran, for reuse. */
FSC_API void fsc_gemm(fsc_gemm_prec prec, bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc);

typedef enum {
    FSC_BF16_GEMM_AUTO = 0, /* measured per shape on a CPU with native bf16 */
    FSC_BF16_GEMM_ON,       /* oneDNN wherever it runs (emulated bf16 included) */
    FSC_BF16_GEMM_OFF,      /* sgemm always: FSC_GEMM_BF16 computes as FSC_GEMM_F32 */
} fsc_bf16_gemm_mode;
/* The mode: what fsc_bf16_gemm_set_mode set, else FSC_BF16_GEMM from the
 * environment (off | on | auto, read once; other values log a warning and
 * mean auto), else auto. */
FSC_API fsc_bf16_gemm_mode fsc_bf16_gemm_get_mode(void);
/* Sets the mode for later calls. Shapes keep their primitives and
 * measurements, so switching back and forth costs nothing. */
FSC_API void fsc_bf16_gemm_set_mode(fsc_bf16_gemm_mode mode);
/* Loads oneDNN (libdnnl.so.3 or .so.2) if it is not yet: FSC_OK, or
 * FSC_ERR_NOT_FOUND saying what is missing. fsc_gemm never needs this call
 * (it loads lazily and falls back to sgemm); tools call it under bf16 so
 * that fsc_blas_describe names the library in their start-up line. */
FSC_API int fsc_bf16_gemm_init(void);
/* fsc_bf16_gemm_init() == FSC_OK: oneDNN is there to run bf16 GEMMs. */
FSC_API bool fsc_bf16_gemm_available(void);
/* Whether FSC_GEMM_BF16 work is to run on oneDNN at all here: the mode is
 * on, or auto on a CPU with native bf16, and oneDNN loads. (Per-shape
 * measurement, under auto, is fsc_gemm_bf16's own business.) Under bf16
 * autocast, the layers store activations that feed bf16 GEMMs in bf16 when
 * this holds. */
FSC_API bool fsc_bf16_gemm_wanted(void);
/* One line: which path FSC_GEMM_BF16 calls take and why ("bf16 GEMM:
 * oneDNN 2.6.3 (libdnnl.so.2) where measured faster than sgemm (auto; CPU
 * has native bf16): 9 shapes bf16, 4 sgemm, 0 not yet measured"). Also the
 * tail of fsc_blas_describe. Static per-thread storage. */
FSC_API const char *fsc_bf16_gemm_describe(void);

/* Counters of the FSC_GEMM_BF16 calls since the last reset: those that ran
 * in bf16 (oneDNN) and those that fell back to sgemm, with their wall time
 * (packing and alpha/beta included) and their 2*M*N*K flops. Attention's
 * batched bf16 primitives count one call per run, all heads' flops. */
typedef struct fsc_bf16_gemm_stats {
    int64_t calls_bf16, calls_f32;
    double seconds_bf16, seconds_f32;
    double flops_bf16, flops_f32;
} fsc_bf16_gemm_stats;
/* A snapshot of the counters (process-wide, all threads). */
FSC_API fsc_bf16_gemm_stats fsc_bf16_gemm_get_stats(void);
FSC_API void fsc_bf16_gemm_reset_stats(void); /* zeroes the counters */
/* Measures oneDNN's bf16 matmul GFLOP/s (inputs already bf16, fp32 out) at
 * the BLAS thread count on an n x n x n product: the best of reps timed
 * runs; 0 if oneDNN is absent, refuses the shape, or memory is short. */
FSC_API double fsc_bf16_gemm_peak_gflops(int n, int reps);
/* One GEMM shape's measured throughput (fsc_gemm_shape_peak). */
typedef struct fsc_gemm_peak {
    double gflops;     /* best of the timed runs, by the wall clock */
    double cpu_gflops; /* best of the timed runs, per second of this process's CPU time */
    const char *impl;  /* oneDNN's kernel ("brg:avx512_core_bf16"), or "sgemm"; static */
} fsc_gemm_peak;
/* Times C(M,N) = op(A) op(B) (C += when acc) as fsc_gemm runs it at prec, at
 * the BLAS thread count, with A and B already in that precision (bf16 on
 * oneDNN: the rounding is not the GEMM's cost), dense (lda K, or M when ta;
 * ldb N, or K when tb; ldc N): one warm-up, then the best of reps runs.
 * FSC_ERR_INVALID for sizes < 1 or reps < 1; FSC_ERR_NOT_FOUND when prec is
 * FSC_GEMM_BF16 and oneDNN is absent or refuses the shape; FSC_ERR_NOMEM. */
FSC_API int fsc_gemm_shape_peak(fsc_gemm_prec prec, bool ta, bool tb, int M, int N, int K,
                                bool acc, int reps, fsc_gemm_peak *out);
/* dst[i] = src[i] rounded to bf16 (nearest even, as fsc_f32_to_bf16) and
 * widened back: the values a bf16 GEMM multiplies. dst may equal src. */
FSC_API void fsc_round_bf16(float *dst, const float *src, int64_t n);
/* dst[i] = fsc_f32_to_bf16(src[i]), bit for bit, vectorised. */
FSC_API void fsc_narrow_bf16(uint16_t *dst, const float *src, int64_t n);
/* This thread's fp32 buffer of at least n floats for a result about to be
 * narrowed to bf16 (a Linear's or attention's output kept in bf16): kept
 * and grown between calls, so no call pays fresh pages; valid until this
 * thread's next call. Never handed to the bf16 GEMMs' own workspace users.
 * NULL if out of memory. */
FSC_API float *fsc_bf16_narrow_scratch(int64_t n);
/* dst[i] = src[i] widened to fp32 (exact). */
FSC_API void fsc_widen_bf16(float *dst, const uint16_t *src, int64_t n);

/* ---- bf16 views of fp32 arrays ------------------------------------------------ */
#define FSC_BF16_VIEWS_MAX 64 /* views registered at once */
/* Says that bf16[0, n) holds fp32[0, n) rounded as fsc_f32_to_bf16 rounds,
 * so that the bf16 GEMMs of fsc_matmul_forward_prec/backward_prec take a
 * weight lying in fp32[0, n) from bf16 instead of rounding it again (FSDP
 * registers the parameters it gathered in bf16). Both arrays are borrowed:
 * the caller keeps them alive and unchanged, and calls
 * fsc_bf16_view_remove(fp32) before either changes or goes; a view left in
 * place while fp32 changes serves stale weights. FSC_ERR_INVALID for a NULL
 * array, n <= 0 or a range overlapping one registered; FSC_ERR_NOMEM when
 * FSC_BF16_VIEWS_MAX are registered. Thread-safe. */
FSC_API int fsc_bf16_view_add(const float *fp32, const uint16_t *bf16, int64_t n);
/* Removes the view registered at fp32 (its first element); none: no-op. */
FSC_API void fsc_bf16_view_remove(const float *fp32);
/* The bf16 rounding of p[0, n) if a registered view holds all of it, else NULL. */
FSC_API const uint16_t *fsc_bf16_view_find(const float *p, int64_t n);

/* ---- bf16 weights, rounded once per weights version ------------------------- */
/* Bumps the weights version: every writer of parameters calls it after
 * writing (fsc_optim_step, weights and state loads, broadcasts, the trainer
 * before each step), so that no bf16 copy made before the write is served
 * after it. Thread-safe, lock-free. */
FSC_API void fsc_weights_changed(void);
/* The current weights version (starts at 1, only grows). */
FSC_API uint64_t fsc_weights_version(void);
/* Turns the bf16 weight cache on or off (off by default; off frees every
 * copy). On, fsc_matmul_forward_prec/backward_prec at FSC_GEMM_BF16 take a
 * weight's bf16 rounding from a copy made at the current weights version
 * instead of rounding it per call: the caller then promises that every
 * write to a weight is followed by fsc_weights_changed before the next GEMM
 * reads it. The copies are FSC_MEM_WORK, 2 bytes per weight element. */
FSC_API void fsc_bf16_weight_cache_set(bool on);
FSC_API bool fsc_bf16_weight_cache_on(void); /* whether the cache is on */
/* w[0, n) in bf16 as the GEMMs take it: a registered view
 * (fsc_bf16_view_find), else, with the cache on, its copy at the current
 * weights version (rounded now if older or new), else NULL (the GEMM rounds
 * it itself). The copy stays valid until the version changes. */
FSC_API const uint16_t *fsc_bf16_weight_find(const float *w, int64_t n);

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
/* fsc_matmul_forward with its GEMM at precision prec (bias added in fp32).
 * Under FSC_GEMM_BF16 a weight with a bf16 view (fsc_bf16_view_find) is
 * read from it; the products are the same, without rounding it again. */
FSC_API void fsc_matmul_forward_prec(float *out, const float *inp, const float *weight,
                                     const float *bias, int N, int C, int OC,
                                     fsc_weight_layout layout, fsc_gemm_prec prec);
/* fsc_matmul_backward with both GEMMs (dinp, dweight) at precision prec:
 * under FSC_GEMM_BF16, dout, inp and weight are rounded to bf16 as GEMM
 * inputs (dout once for both GEMMs, the weight not at all where it has a
 * bf16 view); dweight accumulates in fp32; dbias is an fp32 sum. */
FSC_API void fsc_matmul_backward_prec(float *dinp, float *dweight, float *dbias, const float *dout,
                                      const float *inp, const float *weight, int N, int C, int OC,
                                      fsc_weight_layout layout, fsc_gemm_prec prec);

/* ---- activations stored in bf16 (autocast's producers) ------------------------ */
/* fsc_matmul_forward_prec at FSC_GEMM_BF16 for an input its producer
 * stored in bf16 (inph, (N,C)): the same product and bias as for its fp32
 * original. FSC_ERR_NOMEM when the per-thread fp32 workspace (FSC_MEM_WORK)
 * cannot be had. */
FSC_API int fsc_matmul_forward_bf16_act(float *out, const uint16_t *inph, const float *weight,
                                        const float *bias, int N, int C, int OC,
                                        fsc_weight_layout layout);
/* fsc_matmul_backward_prec at FSC_GEMM_BF16 for the input a forward read in
 * bf16 (inph, (N,C)): dinp (may be NULL) written, dweight and dbias (may be
 * NULL) accumulated, all fp32. FSC_ERR_NOMEM as above. */
FSC_API int fsc_matmul_backward_bf16_act(float *dinp, float *dweight, float *dbias,
                                         const float *dout, const uint16_t *inph,
                                         const float *weight, int N, int C, int OC,
                                         fsc_weight_layout layout);
/* fsc_matmul_forward_prec at FSC_GEMM_BF16, no bias, with out (N,OC) written
 * in bf16, each fp32 result rounded once: the LM head's logits under bf16
 * autocast. The rows go a block at a time through a per-thread fp32
 * workspace (FSC_MEM_WORK), never the whole product. FSC_ERR_NOMEM. */
FSC_API int fsc_matmul_forward_bf16_out(uint16_t *out, const float *inp, const float *weight,
                                        int N, int C, int OC, fsc_weight_layout layout);
/* fsc_matmul_backward_prec at FSC_GEMM_BF16, no bias, for a gradient held in
 * bf16 (douth (N,OC), the loss's gradient of bf16 logits), multiplied as is:
 * dinp (may be NULL) written, dweight (may be NULL) accumulated in fp32,
 * by blocks of rows as above. FSC_ERR_NOMEM. */
FSC_API int fsc_matmul_backward_bf16_dout(float *dinp, float *dweight, const uint16_t *douth,
                                          const float *inp, const float *weight, int N, int C,
                                          int OC, fsc_weight_layout layout);
/* fsc_gelu_forward with its output rounded once to bf16. */
FSC_API void fsc_gelu_forward_bf16(uint16_t *out, const float *inp, int64_t n);
/* fsc_gelu_forward of an input stored in bf16 (c_fc's output under bf16
 * autocast), evaluated at its exact widening; out in fp32. */
FSC_API void fsc_gelu_forward_bf16_in(float *out, const uint16_t *inp, int64_t n);
/* fsc_gelu_forward_bf16_in with its output rounded once to bf16. */
FSC_API void fsc_gelu_forward_bf16_io(uint16_t *out, const uint16_t *inp, int64_t n);
/* fsc_gelu_backward with the derivative taken at inp's exact widening, the
 * value fsc_gelu_forward_bf16_in evaluated. */
FSC_API void fsc_gelu_backward_bf16_in(float *dinp, const uint16_t *inp, const float *dout,
                                       int64_t n);
/* fsc_swiglu_forward with its output rounded once to bf16. */
FSC_API void fsc_swiglu_forward_bf16(uint16_t *out, const float *gate, const float *up, int64_t n);
/* SwiGLU's product of gate and up stored in bf16 (gate_proj's and
 * up_proj's outputs under bf16 autocast), at their exact widenings; out in
 * fp32. */
FSC_API void fsc_swiglu_forward_bf16_in(float *out, const uint16_t *gate, const uint16_t *up,
                                        int64_t n);
/* fsc_swiglu_forward_bf16_in with its output rounded once to bf16. */
FSC_API void fsc_swiglu_forward_bf16_io(uint16_t *out, const uint16_t *gate, const uint16_t *up,
                                        int64_t n);
/* fsc_swiglu_backward at the exact widenings of gate and up stored in bf16
 * (dup may equal dout). */
FSC_API void fsc_swiglu_backward_bf16_in(float *dgate, float *dup, const float *dout,
                                         const uint16_t *gate, const uint16_t *up, int64_t n);
/* fsc_layernorm_forward with its output rounded once to bf16. */
FSC_API void fsc_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const float *inp,
                                        const float *weight, const float *bias, int N, int C,
                                        float eps);

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
/* Row t of a causal softmax in place: row[0, t] becomes its softmax, and
 * row(t, ncols) zeros. The attention kernels' own softmax (its exp and its
 * 1/sum), for code that must give their results, such as the KV cache. */
FSC_API void fsc_softmax_causal_row(float *row, int t, int ncols);
/* Causal multi-head self-attention on a fused qkv.
 * qkv is (B,T,3C) laid out [q | k | v]; out is (B,T,C); att is (B,NH,T,T), the
 * softmax probabilities kept for backward (upper triangle left unwritten). */
FSC_API void fsc_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                   int NH);
/* dqkv (B,T,3C) written. Takes T*T floats of FSC_MEM_WORK scratch per thread
 * for the call; if that allocation fails, dqkv is zeroed and the error logged. */
FSC_API void fsc_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                    const float *att, int B, int T, int C, int NH);
/* fsc_attention_forward with its GEMMs (q k^T, att v) at precision prec; the
 * softmax and its statistics stay fp32, and att keeps fp32 probabilities.
 * At FSC_GEMM_BF16, where the bf16 GEMM mode sends work to oneDNN, the
 * GEMMs run batched over all B x NH heads on operands rounded once per
 * call (this thread's bf16 copies of qkv, att and, backward, dout and an
 * fp32 (B,NH,T,T) for the score gradients: FSC_MEM_WORK, kept for reuse);
 * otherwise per head, through fsc_gemm. */
FSC_API void fsc_attention_forward_prec(float *out, float *att, const float *qkv, int B, int T,
                                        int C, int NH, fsc_gemm_prec prec);
/* fsc_attention_backward with its four GEMMs at precision prec. */
FSC_API void fsc_attention_backward_prec(float *dqkv, const float *dout, const float *qkv,
                                         const float *att, int B, int T, int C, int NH,
                                         fsc_gemm_prec prec);
/* Attention on operands stored in bf16 under bf16 autocast: qkvh (B,T,3C)
 * as c_attn wrote it in bf16, the probabilities kept in bf16 in atth
 * (B,NH,T,T; entries right of a query block's last key are not written).
 * The forward computes bit for bit what fsc_attention_forward_prec at
 * FSC_GEMM_BF16 computes on qkvh's widening (out, fp32) and stores its
 * probabilities rounded to bf16; the backward (dqkv written, fp32) what
 * fsc_attention_backward_prec at FSC_GEMM_BF16 computes on the widenings
 * of qkvh and atth. Runs the batched bf16 GEMMs where
 * fsc_attention_bf16_act_ready, else (or when memory is short) the
 * per-head path on fp32 widenings in FSC_MEM_WORK. FSC_ERR_NOMEM when
 * neither can have its workspace. */
FSC_API int fsc_attention_forward_bf16_act(float *out, uint16_t *atth, const uint16_t *qkvh, int B,
                                           int T, int C, int NH);
/* Its backward: dqkv (fp32) from dout and what the forward kept in bf16. */
FSC_API int fsc_attention_backward_bf16_act(float *dqkv, const float *dout, const uint16_t *qkvh,
                                            const uint16_t *atth, int B, int T, int C, int NH);
/* Whether the batched bf16 attention runs for (B,T,C,NH) here (bf16 GEMMs
 * wanted, oneDNN made its primitives): where it does, storing q/k/v and the
 * probabilities in bf16 costs no extra rounding in forward. */
FSC_API bool fsc_attention_bf16_act_ready(int B, int T, int C, int NH);

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
/* fsc_crossentropy_fused on logits stored in bf16 (the LM head's under bf16
 * autocast): softmax and log-sum-exp in fp32 at their exact widenings, the
 * gradient written in their place rounded once to bf16. */
FSC_API int64_t fsc_crossentropy_fused_bf16(float *losses, uint16_t *logits,
                                            const int32_t *targets, int N, int V,
                                            int ignore_index, float grad_scale,
                                            int64_t *bad_target);

/* ---- reductions ------------------------------------------------------------ */
/* Sum of squares (for gradient norms): float partial sums over blocks of 4096
 * elements, added in double. */
FSC_API double fsc_sumsq(const float *x, int64_t n);
/* max |x[i]|; 0 for n = 0. NaN elements are skipped (fsc_grad_max_abs reports them). */
FSC_API float fsc_absmax(const float *x, int64_t n);

/* ---- LLaMA layers: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention */
/* RMSNorm: out = inp / sqrt(mean(inp^2) + eps) * weight, per row.
 * out, inp are (N,C); weight is (C); rstd (N) receives each row's 1/rms
 * for backward. */
FSC_API void fsc_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                 int N, int C, float eps);
/* dinp (N,C) written; dweight (C) accumulated; rstd is forward's. */
FSC_API void fsc_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const float *rstd, int N, int C);

/* LLaMA-3.1's frequency scaling of rotary embeddings (Hugging Face's
 * rope_scaling with rope_type "llama3"). factor <= 0 (a zeroed struct) means
 * none. Otherwise: factor > 0, 0 < low_freq_factor < high_freq_factor and
 * original_max_position_embeddings > 0 (the modules check; the kernel
 * trusts). */
typedef struct fsc_rope_scaling {
    float factor;
    float low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
} fsc_rope_scaling;
/* inv_freq (hd/2) = theta^(-2i/hd) in fp32 as Hugging Face computes it, then
 * scaled as LLaMA-3.1 does when scaling is non-NULL with factor > 0:
 * wavelengths 2 pi / f above original / low_freq_factor are divided by
 * factor, those below original / high_freq_factor kept, and the band between
 * blended with weight s = (original / wavelength - low) / (high - low):
 * (1 - s) f / factor + s f. hd even, theta > 0. */
FSC_API void fsc_rope_inv_freq(float *inv_freq, int hd, float theta,
                               const fsc_rope_scaling *scaling);
/* cos_t, sin_t (T, hd/2): row t holds cos and sin of (float)(pos0 + t) *
 * inv_freq[i] (positions start at pos0: a KV cache's length, or a sequence
 * shard's first position). */
FSC_API void fsc_rope_table(float *cos_t, float *sin_t, const float *inv_freq, int T, int hd,
                            int pos0);
/* Rotate-half rotary embedding of every head of inp (B,T,H,hd) at its row's
 * position: with c, s from row t of the tables, element i and i + hd/2 of a
 * head become x_i c_i - x_{i+hd/2} s_i and x_{i+hd/2} c_i + x_i s_i. out
 * may equal inp. */
FSC_API void fsc_rope_forward(float *out, const float *inp, const float *cos_t, const float *sin_t,
                              int B, int T, int H, int hd);
/* dinp (B,T,H,hd) written: dout turned back by the same angles (the
 * transposed rotation). dinp may equal dout. */
FSC_API void fsc_rope_backward(float *dinp, const float *dout, const float *cos_t,
                               const float *sin_t, int B, int T, int H, int hd);

/* SwiGLU's product: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)),
 * element-wise over n; out may equal gate or up. */
FSC_API void fsc_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
/* dgate = dout * up * silu'(gate), dup = dout * silu(gate), both written
 * (dgate may equal gate, dup may equal up). */
FSC_API void fsc_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, int64_t n);

/* Causal self-attention with NKV key/value heads shared by NH query heads
 * (grouped-query; NKV must divide NH; NKV = 1 is multi-query, NKV = NH
 * multi-head). q is (B,T,NH*hd), k and v are (B,T,NKV*hd), out is
 * (B,T,NH*hd); query head h reads key/value head h / (NH/NKV) in place.
 * Scores are scaled by 1/sqrt(hd). att (B,NH,T,T) keeps the probabilities
 * for backward (upper triangle left unwritten). GEMMs at precision prec
 * through fsc_gemm, per head; softmax fp32, as fsc_attention_forward_prec's
 * per-head path. */
FSC_API void fsc_attention_gqa_forward_prec(float *out, float *att, const float *q, const float *k,
                                            const float *v, int B, int T, int NH, int NKV, int hd,
                                            fsc_gemm_prec prec);
/* dq (B,T,NH*hd), dk and dv (B,T,NKV*hd) written; a shared head's
 * gradients sum its query heads in order. Takes T*T floats of FSC_MEM_WORK
 * scratch per thread for the call; if that allocation fails, the three are
 * zeroed and the error logged. */
FSC_API void fsc_attention_gqa_backward_prec(float *dq, float *dk, float *dv, const float *dout,
                                             const float *q, const float *k, const float *v,
                                             const float *att, int B, int T, int NH, int NKV,
                                             int hd, fsc_gemm_prec prec);

/* ---- flash attention (tiled, online softmax) -------------------------------- */
/* One call's operands: B batch rows, NH query heads reading NKV key/value
 * heads (query head h reads KV head h / (NH/NKV)), head size hd; Tq query
 * positions against Tk key positions. Position r of batch row b of query
 * head h starts at q + (b*Tq + r)*ldq + h*hd; dq has q's layout, out and
 * dout use ldo, and k, dk (v, dv) use Tk rows of ldk (ldv) with KV head j
 * at j*hd. So a fused GPT-2 qkv (B,T,3C) is q = qkv, k = qkv + C,
 * v = qkv + 2C, with ldq = ldk = ldv = 3C.
 * Causality is by global position: key j is visible to query i when
 * k_pos0 + j <= q_pos0 + i, so one call can be a block of a longer sequence
 * (context parallelism's ring passes key blocks of other ranks). */
typedef struct fsc_attn_dims {
    int B, NH, NKV, hd;
    int Tq, Tk;
    int64_t q_pos0, k_pos0;
    int ldq, ldk, ldv, ldo; /* floats between consecutive positions: q/dq, k/dk, v/dv, out/dout */
} fsc_attn_dims;

/* out (B,Tq,.. ldo) = softmax(q k^T / sqrt(hd), causal) v, tiled over query
 * and key blocks with an online softmax; lse (B,NH,Tq) the log-sum-exp of
 * each row's scaled scores, all backward needs besides the operands. A
 * query row that sees no key gets out = 0 and lse = -inf. With merge, the
 * call's result for these keys is folded into the out and lse already there
 * (as if the earlier keys and these had been one call): how a ring of key
 * blocks builds one row's attention. GEMMs at precision prec. */
FSC_API void fsc_flash_attention_forward(const fsc_attn_dims *d, const float *q, const float *k,
                                         const float *v, float *out, float *lse, bool merge,
                                         fsc_gemm_prec prec);
/* delta (B,NH,Tq) = rowsum(dout * out) per head: backward's correction term,
 * computed once per row from the final out (not per key block). */
FSC_API void fsc_flash_attention_delta(const fsc_attn_dims *d, const float *out,
                                       const float *dout, float *delta);
/* Adds this call's gradients into dq, dk and dv (the caller zeroes them
 * first; a ring adds one key block at a time), recomputing each tile's
 * probabilities from lse. A shared KV head's gradients sum its query heads
 * in order. */
FSC_API void fsc_flash_attention_backward(const fsc_attn_dims *d, const float *q, const float *k,
                                          const float *v, const float *dout, const float *lse,
                                          const float *delta, float *dq, float *dk, float *dv,
                                          fsc_gemm_prec prec);

#ifdef __cplusplus
}
#endif
#endif
