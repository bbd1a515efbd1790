/* Optimizer update kernels on one flat range: SGD, Adam, AdamW.
 *
 * Each kernel is element-wise over (param, grad, state) of length n and knows
 * nothing of tensors or modules, so an unsharded optimizer, an OSS shard and an
 * FSDP shard all run exactly this code. Scalars are combined in double, as
 * PyTorch's Python floats are, then rounded once to float for the loop.
 * fsc_optim_step runs Adam and AdamW through adam_multi.c's one pass over
 * all ranges instead; both compute each element with fsc_adam_block. */
#include "adam_internal.h"
#include "fsc/core.h"
#include "fsc/optim.h"

#define PAR_MIN (1 << 15)

/* torch.optim.SGD (_single_tensor_sgd):
 *   d = g + wd * p;  buf = first ? d : mom * buf + (1 - damp) * d;
 *   d = nesterov ? d + mom * buf : buf;  p += -lr * d. */
void fsc_sgd_update(float *restrict p, const float *restrict g, float *restrict buf, int64_t n,
                    double lr, double momentum, double dampening, bool nesterov,
                    double weight_decay, bool first) {
    const float wd = (float)weight_decay, mom = (float)momentum;
    const float keep = (float)(1.0 - dampening), neg_lr = (float)(-lr);
    const int nt = fsc_get_num_threads();
    if (momentum == 0.0 || buf == NULL) {
#pragma omp parallel for simd if (n >= PAR_MIN) num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) p[i] = FSC_MADD(FSC_MADD(p[i], wd, g[i]), neg_lr, p[i]);
    } else if (first) {
#pragma omp parallel for simd if (n >= PAR_MIN) num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float d = FSC_MADD(p[i], wd, g[i]);
            buf[i] = d;
            d = nesterov ? FSC_MADD(d, mom, d) : d;
            p[i] = FSC_MADD(d, neg_lr, p[i]);
        }
    } else {
#pragma omp parallel for simd if (n >= PAR_MIN) num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float d = FSC_MADD(p[i], wd, g[i]);
            float b = FSC_MADD(d, keep, buf[i] * mom);
            buf[i] = b;
            d = nesterov ? FSC_MADD(b, mom, d) : b;
            p[i] = FSC_MADD(d, neg_lr, p[i]);
        }
    }
}

/* Adam / AdamW on one range (decoupled selects AdamW), in blocks of
 * FSC_ADAM_BLOCK that stay in L1 (adam_internal.h has the arithmetic). */
static void adam_kernel(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, int64_t n, double lr, double beta1, double beta2,
                        double eps, double weight_decay, bool decoupled, int64_t step) {
    const fsc_adam_consts k =
        fsc_adam_consts_make(lr, beta1, beta2, eps, weight_decay, decoupled, step);
    const int nt = fsc_get_num_threads();
    const int64_t nblocks = (n + FSC_ADAM_BLOCK - 1) / FSC_ADAM_BLOCK;
#pragma omp parallel for if (n >= PAR_MIN) num_threads(nt) schedule(static)
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const int64_t b0 = blk * FSC_ADAM_BLOCK;
        const int len = (int)(n - b0 < FSC_ADAM_BLOCK ? n - b0 : FSC_ADAM_BLOCK);
        fsc_adam_block(p + b0, g + b0, m + b0, v + b0, len, &k);
    }
}

void fsc_adam_update(float *p, const float *g, float *m, float *v, int64_t n, double lr,
                     double beta1, double beta2, double eps, double weight_decay, int64_t step) {
    adam_kernel(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, false, step);
}

void fsc_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, double lr,
                      double beta1, double beta2, double eps, double weight_decay, int64_t step) {
    adam_kernel(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, true, step);
}
