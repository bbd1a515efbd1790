/* Optimizer update kernels on one flat range: SGD, Adam, AdamW.
 *
 * Each kernel is element-wise over (param, grad, state) of length n and knows
 * nothing of tensors or modules, so an unsharded optimizer, an OSS shard and an
 * FSDP shard all run exactly this code. Scalars are combined in double, as
 * PyTorch's Python floats are, then rounded once to float for the loop. */
#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "fsc/core.h"
#include "fsc/optim.h"

#define PAR_MIN (1 << 15)

/* torch's add(x, alpha=a) is one fused multiply-add on CPUs that have it
 * (Vectorized::fmadd); doing the same keeps results bit-identical to torch's.
 * Without hardware FMA, libm's fmaf is slow, so fall back to a*b + c. */
#if defined(__FMA__)
#define MADD(a, b, c) fmaf(a, b, c)
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

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
        for (int64_t i = 0; i < n; i++) p[i] = MADD(MADD(p[i], wd, g[i]), neg_lr, p[i]);
    } else if (first) {
#pragma omp parallel for simd if (n >= PAR_MIN) num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float d = MADD(p[i], wd, g[i]);
            buf[i] = d;
            d = nesterov ? MADD(d, mom, d) : d;
            p[i] = MADD(d, neg_lr, p[i]);
        }
    } else {
#pragma omp parallel for simd if (n >= PAR_MIN) num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float d = MADD(p[i], wd, g[i]);
            float b = MADD(d, keep, buf[i] * mom);
            buf[i] = b;
            d = nesterov ? MADD(b, mom, d) : b;
            p[i] = MADD(d, neg_lr, p[i]);
        }
    }
}

/* sqrt of x[0..n) in place. libm's sqrtf may set errno, which keeps GCC from
 * vectorising it unless -fno-math-errno; the hardware instruction gives the
 * same correctly rounded result. */
static inline void sqrt_inplace(float *restrict x, int n) {
    int i = 0;
#if defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = sqrtf(x[i]);
}

#define ADAM_BLOCK 512

/* torch.optim.Adam / AdamW (_single_tensor_adam[w]); decoupled selects AdamW.
 * denom = sqrt(v) / sqrt(bc2) + eps, p += (-lr / bc1) * m / denom, with the
 * operations in torch's order so results agree to rounding. Works in blocks
 * that stay in L1: moments first, then sqrt, then the parameter update. */
static void adam_kernel(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, int64_t n, double lr, double beta1, double beta2,
                        double eps, double weight_decay, bool decoupled, int64_t step) {
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const double bc2 = 1.0 - pow(beta2, (double)step);
    const float b1 = (float)beta1, c1 = (float)(1.0 - beta1);
    const float b2 = (float)beta2, c2 = (float)(1.0 - beta2);
    const float neg_step = (float)(-(lr / bc1)), bc2_sqrt = (float)sqrt(bc2);
    const float epsf = (float)eps;
    /* AdamW shrinks p first; Adam adds the L2 term to the gradient. With
     * weight_decay 0 both are exact no-ops (p * 1, g + 0 * p). */
    const float shrink = decoupled ? (float)(1.0 - lr * weight_decay) : 1.0f;
    const float l2 = decoupled ? 0.0f : (float)weight_decay;
    const int nt = fsc_get_num_threads();
    const int64_t nblocks = (n + ADAM_BLOCK - 1) / ADAM_BLOCK;
#pragma omp parallel for if (n >= PAR_MIN) num_threads(nt) schedule(static)
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const int64_t b0 = blk * ADAM_BLOCK;
        const int len = (int)(n - b0 < ADAM_BLOCK ? n - b0 : ADAM_BLOCK);
        float *restrict pb = p + b0, *restrict mb = m + b0, *restrict vb = v + b0;
        const float *restrict gb = g + b0;
        float root[ADAM_BLOCK];
#pragma omp simd
        for (int i = 0; i < len; i++) {
            float pi = pb[i] * shrink;
            float gi = MADD(pi, l2, gb[i]);
            float mi = MADD(gi, c1, mb[i] * b1);
            float vi = vb[i] * b2 + c2 * gi * gi; /* addcmul: no fused op */
            pb[i] = pi;
            mb[i] = mi;
            vb[i] = vi;
            root[i] = vi;
        }
        sqrt_inplace(root, len);
#pragma omp simd
        for (int i = 0; i < len; i++) {
            float denom = root[i] / bc2_sqrt + epsf;
            pb[i] = pb[i] + neg_step * mb[i] / denom; /* addcdiv: p + (s * m) / denom */
        }
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
