/* Internal to the BLAS loader: the comparison behind fsc_blas_hint, with both
 * core type names as arguments so that tests need not depend on the real CPU;
 * and what the bf16 GEMM path (gemm_bf16.c) borrows from it.
 */
#ifndef FSC_BLAS_INTERNAL_H
#define FSC_BLAS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

/* Writes to out (size bytes) the one line advising `best` when the user's
 * OPENBLAS_CORETYPE=`user` names an older kernel family than `best` (fsc's
 * CPUID choice), and returns true; returns false and writes "" when there is
 * nothing to say: either is NULL or not a core type fsc knows, or `user` is as
 * fast as `best`. Names compare without case, as OpenBLAS reads them. */
bool fsc_blas_coretype_hint(char *out, size_t size, const char *user, const char *best);

/* The BLAS thread count (fsc_blas_set_threads, else OPENBLAS_NUM_THREADS or
 * 1), loading OpenBLAS if needed: the bf16 path runs oneDNN on as many. */
int fsc_blas_threads(void);

#endif
