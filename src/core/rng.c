/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
 * Counter-based: the output is a pure function of (key, counter), so a draw is
 * named by what it is for, and any layout of work reproduces it exactly. */
#include <math.h>
#include <string.h>

#include "fsc/core.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

fsc_philox_out fsc_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo) {
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32);
    uint32_t c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    return (fsc_philox_out){{c0, c1, c2, c3}};
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t fsc_rng_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; p && *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return splitmix64(splitmix64(seed) ^ h);
}

uint64_t fsc_rng_key_ints(uint64_t seed, uint64_t a, uint64_t b) {
    return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
}

float fsc_rng_uniform(uint32_t bits) {
    return (float)(bits >> 8) * (1.0f / 16777216.0f);
}

/* Box-Muller on element pairs: elements 2p and 2p+1 share counter p, so each
 * element's value depends only on its global index. */
void fsc_rng_normal_fill(float *out, int64_t n, int64_t first, uint64_t key, float mean,
                         float std) {
    for (int64_t i = 0; i < n; i++) {
        int64_t j = first + i;
        fsc_philox_out r = fsc_philox4x32(key, 0, (uint64_t)(j >> 1));
        double u1 = ((double)(((uint64_t)r.v[0] << 21) ^ r.v[1]) + 0.5) / 9007199254740992.0;
        double u2 = ((double)(((uint64_t)r.v[2] << 21) ^ r.v[3]) + 0.5) / 9007199254740992.0;
        u1 = fmod(u1, 1.0), u2 = fmod(u2, 1.0);
        if (u1 <= 0) u1 = 1e-300;
        double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        double z = (j & 1) ? rad * sin(th) : rad * cos(th);
        out[i] = mean + std * (float)z;
    }
}
