/* Rotary position embeddings, Hugging Face's rotate-half convention: in each
 * head of hd values, element i pairs with i + hd/2 and the pair turns by
 * angle p * inv_freq[i] at position p. The angles are taken as HF takes them
 * (the fp32 product of position and fp32 frequency, then fp32 cos and sin),
 * so long contexts round the angle the way the published models were
 * trained to. The tables depend on positions only: one per call, shared by
 * every batch row and head, and by q and k. */
#include <math.h>

#include "fsc/kernels.h"

#define PAR_MIN (1 << 16)

void fsc_rope_inv_freq(float *inv_freq, int hd, float theta, const fsc_rope_scaling *scaling) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
    if (!scaling || !(scaling->factor > 0.f)) return;
    /* LLaMA-3.1: wavelengths longer than original / low_freq_factor slow down
     * by factor, those shorter than original / high_freq_factor stay, and the
     * band between interpolates linearly in original / wavelength. */
    const float pi2 = 6.283185307179586f, old = (float)scaling->original_max_position_embeddings;
    const float lo = scaling->low_freq_factor, hi = scaling->high_freq_factor;
    const float low_wavelen = old / lo, high_wavelen = old / hi;
    for (int i = 0; i < half; i++) {
        float f = inv_freq[i], wavelen = pi2 / f;
        if (wavelen > low_wavelen) {
            inv_freq[i] = f / scaling->factor;
        } else if (wavelen >= high_wavelen) {
            float smooth = (old / wavelen - lo) / (hi - lo);
            inv_freq[i] = (1.0f - smooth) * f / scaling->factor + smooth * f;
        }
    }
}

// cos, sin are (T, hd/2): row t holds position pos0 + t
void fsc_rope_table(float *cos_t, float *sin_t, const float *inv_freq, int T, int hd, int pos0) {
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)(pos0 + t) * inv_freq[i];
            cos_t[(size_t)t * half + i] = cosf(a);
            sin_t[(size_t)t * half + i] = sinf(a);
        }
}

/* Rotates every head of rows (B,T,H,hd) by its position's angles, sign +1
 * (forward) or -1 (backward: the transposed rotation). out may equal inp. */
static void rotate(float *out, const float *inp, const float *cos_t, const float *sin_t, int B,
                   int T, int H, int hd, float sign) {
    int half = hd / 2;
    int64_t rows = (int64_t)B * T;
#pragma omp parallel for if (rows * H * hd >= PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_t + (size_t)(r % T) * half, *s = sin_t + (size_t)(r % T) * half;
        for (int h = 0; h < H; h++) {
            const float *x = inp + ((size_t)r * H + h) * hd;
            float *y = out + ((size_t)r * H + h) * hd;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half], sn = sign * s[i];
                y[i] = x1 * c[i] - x2 * sn;
                y[i + half] = x2 * c[i] + x1 * sn;
            }
        }
    }
}

// out, inp are (B,T,H,hd); cos, sin are (T, hd/2)
void fsc_rope_forward(float *out, const float *inp, const float *cos_t, const float *sin_t, int B,
                      int T, int H, int hd) {
    rotate(out, inp, cos_t, sin_t, B, T, H, hd, 1.0f);
}

void fsc_rope_backward(float *dinp, const float *dout, const float *cos_t, const float *sin_t,
                       int B, int T, int H, int hd) {
    rotate(dinp, dout, cos_t, sin_t, B, T, H, hd, -1.0f);
}
