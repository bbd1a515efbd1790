/* Internal to the bf16 GEMM path: oneDNN's matmul, loaded at run time.
 *
 * fsc does not link oneDNN and builds without its headers: dnnl.c dlopens
 * libdnnl.so.3 or libdnnl.so.2 and declares the few entry points it calls.
 * One fsc_dnnl_matmul is one primitive for one GEMM shape: bf16 A and B, fp32
 * C, products accumulated in fp32, with a user-managed scratchpad so that one
 * primitive can run on several threads at once (each with its own scratch).
 */
#ifndef FSC_KERNELS_DNNL_INTERNAL_H
#define FSC_KERNELS_DNNL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fsc_dnnl_matmul fsc_dnnl_matmul;

/* Loads oneDNN once (later calls return the first answer): true when it is
 * there with every entry point fsc needs; otherwise false, and why (size
 * bytes, always terminated) says what is missing. Thread-safe. */
bool fsc_dnnl_load(char *why, size_t size);
/* Whether fsc_dnnl_load has run (without loading anything). */
bool fsc_dnnl_tried(void);
/* "oneDNN 2.6.3 (libdnnl.so.2)" after a successful load, else "". */
const char *fsc_dnnl_version(void);

/* One operand of a matmul: 2 to 4 dimensions, the last two the matrix and
 * any before them batch dimensions (broadcast where 1), with strides in
 * elements, so that strided views (a head of a fused qkv buffer) need no
 * copy. */
typedef struct {
    int ndims;
    int64_t dims[4], strides[4];
} fsc_dnnl_layout;
/* A (rows, cols) matrix whose element (i, j) lies at i * ld + j, or at
 * j * ld + i when trans. */
fsc_dnnl_layout fsc_dnnl_matrix(int64_t rows, int64_t cols, bool trans, int64_t ld);

/* A primitive for C = A @ B over the batch dimensions, or C += A @ B when
 * accumulate (oneDNN's sum post-op, in fp32): A (.., M, K) and B (.., K, N)
 * bf16, C (.., M, N) fp32, all laid out as their fsc_dnnl_layout says; with
 * bias, an fp32 row of N is added to every row of C (before the sum).
 * threads is the thread count oneDNN plans for (and runs with, see
 * fsc_dnnl_matmul_run). NULL when oneDNN refuses it on this CPU; why then
 * says so. */
fsc_dnnl_matmul *fsc_dnnl_matmul_new_nd(const fsc_dnnl_layout *a, const fsc_dnnl_layout *b,
                                        const fsc_dnnl_layout *c, bool accumulate, bool bias,
                                        int threads, char *why, size_t size);
/* fsc_dnnl_matmul_new_nd for row-major C(M,N) = op(A) @ op(B): A packed as
 * (M,K) rows (ta false) or (K,M) rows (ta true), B as (K,N) or (N,K) rows
 * (tb), both dense; C with row stride ldc >= N. */
fsc_dnnl_matmul *fsc_dnnl_matmul_new(bool ta, bool tb, int M, int N, int K, int ldc,
                                     bool accumulate, bool bias, int threads, char *why,
                                     size_t size);
/* Bytes of scratch one run needs (may be 0). */
size_t fsc_dnnl_matmul_scratch(const fsc_dnnl_matmul *mm);
/* oneDNN's name for the kernel it chose ("brg:avx512_core_bf16"). */
const char *fsc_dnnl_matmul_impl(const fsc_dnnl_matmul *mm);
/* C = A @ B (+ bias; C += when the primitive accumulates) on the calling
 * thread's stream; bias given exactly when the primitive was made with one;
 * scratch holds fsc_dnnl_matmul_scratch bytes used by no other run
 * meanwhile. threads as at creation (ignored inside a parallel region, where
 * oneDNN runs on the calling thread). 0 on success, else nonzero (oneDNN's
 * status, or -1). */
int fsc_dnnl_matmul_run(const fsc_dnnl_matmul *mm, const uint16_t *A, const uint16_t *B, float *C,
                        const float *bias, void *scratch, int threads);
void fsc_dnnl_matmul_free(fsc_dnnl_matmul *mm); /* accepts NULL */

#endif
