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

/* A primitive for row-major C(M,N) = op(A) @ op(B), or C += op(A) @ op(B)
 * when accumulate (oneDNN's sum post-op, in fp32): A packed as (M,K) rows
 * (ta false) or (K,M) rows (ta true), B as (K,N) or (N,K) rows (tb), both
 * bf16 and dense; C fp32 with row stride ldc >= N. threads is the thread
 * count oneDNN plans for (and runs with, see fsc_dnnl_matmul_run). NULL when
 * oneDNN refuses the shape on this CPU; why then says so. */
fsc_dnnl_matmul *fsc_dnnl_matmul_new(bool ta, bool tb, int M, int N, int K, int ldc,
                                     bool accumulate, int threads, char *why, size_t size);
/* Bytes of scratch one run needs (may be 0). */
size_t fsc_dnnl_matmul_scratch(const fsc_dnnl_matmul *mm);
/* oneDNN's name for the kernel it chose ("brg:avx512_core_bf16"). */
const char *fsc_dnnl_matmul_impl(const fsc_dnnl_matmul *mm);
/* C = op(A) @ op(B) (C += when the primitive accumulates) on the calling thread's
 * stream; scratch holds fsc_dnnl_matmul_scratch bytes used by no other run
 * meanwhile. threads as at creation (ignored inside a parallel region, where
 * oneDNN runs on the calling thread). 0 on success, else oneDNN's status. */
int fsc_dnnl_matmul_run(const fsc_dnnl_matmul *mm, const uint16_t *A, const uint16_t *B, float *C,
                        void *scratch, int threads);
void fsc_dnnl_matmul_free(fsc_dnnl_matmul *mm); /* accepts NULL */

#endif
