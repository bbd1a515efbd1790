/* Internal to the optimizer floor: Adam's and AdamW's update of one block of
 * elements, written once so that the per-range kernel (update.c) and the
 * multi-tensor pass (adam_multi.c) compute every element with the same
 * operations in the same order, hence bit for bit the same result. */
#ifndef FSC_OPTIM_ADAM_INTERNAL_H
#define FSC_OPTIM_ADAM_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* torch's add(x, alpha=a) is one fused multiply-add on CPUs that have it
 * (Vectorized::fmadd); doing the same keeps results bit-identical to torch's.
 * Without hardware FMA, libm's fmaf is slow, so fall back to a*b + c. */
#if defined(__FMA__)
#define FSC_MADD(a, b, c) fmaf(a, b, c)
#else
#define FSC_MADD(a, b, c) ((a) * (b) + (c))
#endif

/* Elements per block: the moments, the square roots and the update of one
 * block stay in L1. */
#define FSC_ADAM_BLOCK 512

/* One tensor's scalars for one step, rounded once to float from doubles
 * (as PyTorch's Python floats are). */
typedef struct {
    float b1, c1, b2, c2; /* beta1, 1 - beta1, beta2, 1 - beta2 */
    float neg_step;       /* -lr / (1 - beta1^step) */
    float bc2_sqrt;       /* sqrt(1 - beta2^step) */
    float eps;
    float shrink; /* AdamW: 1 - lr * wd; Adam: 1 */
    float l2;     /* Adam: wd; AdamW: 0 */
} fsc_adam_consts;

static inline fsc_adam_consts fsc_adam_consts_make(double lr, double beta1, double beta2,
                                                   double eps, double weight_decay, bool decoupled,
                                                   int64_t step) {
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const double bc2 = 1.0 - pow(beta2, (double)step);
    /* AdamW shrinks p first; Adam adds the L2 term to the gradient. With
     * weight_decay 0 both are exact no-ops (p * 1, g + 0 * p). */
    return (fsc_adam_consts){.b1 = (float)beta1,
                             .c1 = (float)(1.0 - beta1),
                             .b2 = (float)beta2,
                             .c2 = (float)(1.0 - beta2),
                             .neg_step = (float)(-(lr / bc1)),
                             .bc2_sqrt = (float)sqrt(bc2),
                             .eps = (float)eps,
                             .shrink = decoupled ? (float)(1.0 - lr * weight_decay) : 1.0f,
                             .l2 = decoupled ? 0.0f : (float)weight_decay};
}

/* sqrt of x[0..n) in place. libm's sqrtf may set errno, which keeps GCC from
 * vectorising it unless -fno-math-errno; the hardware instruction gives the
 * same correctly rounded result. */
static inline void fsc_adam_sqrt_inplace(float *restrict x, int n) {
    int i = 0;
#if defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = sqrtf(x[i]);
}

/* torch.optim.Adam / AdamW (_single_tensor_adam[w]) on len <= FSC_ADAM_BLOCK
 * elements: denom = sqrt(v) / sqrt(bc2) + eps, p += (-lr / bc1) * m / denom,
 * with the operations in torch's order so results agree to rounding. */
static inline void fsc_adam_block(float *restrict pb, const float *restrict gb, float *restrict mb,
                                  float *restrict vb, int len, const fsc_adam_consts *k) {
    const float b1 = k->b1, c1 = k->c1, b2 = k->b2, c2 = k->c2, shrink = k->shrink, l2 = k->l2;
    const float neg_step = k->neg_step, bc2_sqrt = k->bc2_sqrt, epsf = k->eps;
    float root[FSC_ADAM_BLOCK];
#pragma omp simd
    for (int i = 0; i < len; i++) {
        float pi = pb[i] * shrink;
        float gi = FSC_MADD(pi, l2, gb[i]);
        float mi = FSC_MADD(gi, c1, mb[i] * b1);
        float vi = vb[i] * b2 + c2 * gi * gi; /* addcmul: no fused op */
        pb[i] = pi;
        mb[i] = mi;
        vb[i] = vi;
        root[i] = vi;
    }
    fsc_adam_sqrt_inplace(root, len);
#pragma omp simd
    for (int i = 0; i < len; i++) {
        float denom = root[i] / bc2_sqrt + epsf;
        pb[i] = pb[i] + neg_step * mb[i] / denom; /* addcdiv: p + (s * m) / denom */
    }
}

/* One tensor of a multi-tensor step: its four arrays of n elements and its
 * own learning rate and weight decay (a parameter group's). */
typedef struct {
    float *p;
    const float *g;
    float *m, *v;
    int64_t n;
    double lr, wd;
} fsc_adam_tensor;

/* Adam (decoupled false) or AdamW over every tensor of t[0..count) in one
 * pass: the tensors' blocks are numbered end to end and the threads take
 * equal runs of that numbering, so many small tensors cost one parallel
 * region, not one each (or none: a tensor under the per-range kernel's
 * threshold ran on one thread). Every element gets fsc_adam_block's
 * update, bit for bit what fsc_adam[w]_update gives it tensor by tensor.
 * k (count) and block_start (count + 1) are the caller's scratch. */
void fsc_adam_multi_update(const fsc_adam_tensor *t, int count, fsc_adam_consts *k,
                           int64_t *block_start, double beta1, double beta2, double eps,
                           bool decoupled, int64_t step);

#endif
