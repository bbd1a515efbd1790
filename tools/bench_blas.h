/* fsc-bench and the BLAS under it: --blas-info's line (the kernels fsc
 * would run on this machine, so that scripts give a peer the same ones),
 * and where the time of --mixed-precision bf16's GEMMs went, beside both
 * GEMM peaks. */
#ifndef FSC_TOOLS_BENCH_BLAS_H
#define FSC_TOOLS_BENCH_BLAS_H

#include "fsc/core.h"
#include "fsc/kernels.h"

/* --blas-info: loads OpenBLAS as training would (no MPI) and prints which
 * kernels it runs, the environment's OPENBLAS_CORETYPE as given, and fsc's
 * hint if any, as one JSON line. The process's exit status. */
int bench_blas_info(void);
/* JSON fields for fsc-bench's line (each followed by ", "): the bf16 GEMM
 * counters b over `timed` seconds of timed steps, and the two peaks. */
void bench_bf16_print(const fsc_bf16_gemm_stats *b, double timed, double bf16_peak,
                      double fp32_peak);

#endif
