/* Adam and AdamW over all of an optimizer's tensors in one pass (the
 * multi-tensor form of update.c's kernel): one parallel region per step in
 * which each thread walks an equal run of the tensors' blocks, numbered end
 * to end. A model's many small tensors (biases, norms) then share the
 * threads with its large ones instead of each paying a region of its own or
 * running on one thread; every element's arithmetic is fsc_adam_block's. */
#include "adam_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "fsc/core.h"

#define PAR_MIN (1 << 15) /* update.c's threshold, over the whole step */

/* The tensor holding global block b: the last i with start[i] <= b. */
static int tensor_of(const int64_t *start, int count, int64_t b) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (start[mid] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Blocks [b0, b1) of the numbering, tensor by tensor. */
static void run_blocks(const fsc_adam_tensor *t, int count, const fsc_adam_consts *k,
                       const int64_t *start, int64_t b0, int64_t b1) {
    if (b0 >= b1) return;
    for (int i = tensor_of(start, count, b0); i < count && start[i] < b1; i++) {
        const int64_t first = b0 > start[i] ? b0 - start[i] : 0;
        const int64_t last = (b1 < start[i + 1] ? b1 : start[i + 1]) - start[i];
        for (int64_t blk = first; blk < last; blk++) {
            const int64_t e0 = blk * FSC_ADAM_BLOCK;
            const int len = (int)(t[i].n - e0 < FSC_ADAM_BLOCK ? t[i].n - e0 : FSC_ADAM_BLOCK);
            fsc_adam_block(t[i].p + e0, t[i].g + e0, t[i].m + e0, t[i].v + e0, len, &k[i]);
        }
    }
}

void fsc_adam_multi_update(const fsc_adam_tensor *t, int count, fsc_adam_consts *k,
                           int64_t *block_start, double beta1, double beta2, double eps,
                           bool decoupled, int64_t step) {
    int64_t nblocks = 0, numel = 0;
    for (int i = 0; i < count; i++) {
        block_start[i] = nblocks;
        nblocks += (t[i].n + FSC_ADAM_BLOCK - 1) / FSC_ADAM_BLOCK;
        numel += t[i].n;
        k[i] = fsc_adam_consts_make(t[i].lr, beta1, beta2, eps, t[i].wd, decoupled, step);
    }
    block_start[count] = nblocks;
    if (nblocks == 0) return;
    const int nt = fsc_get_num_threads();
#pragma omp parallel if (numel >= PAR_MIN) num_threads(nt)
    {
#if defined(_OPENMP)
        const int64_t id = omp_get_thread_num(), n = omp_get_num_threads();
#else
        const int64_t id = 0, n = 1;
#endif
        /* equal runs, as schedule(static) would cut them */
        run_blocks(t, count, k, block_start, nblocks * id / n, nblocks * (id + 1) / n);
    }
}
