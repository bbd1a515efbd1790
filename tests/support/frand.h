/* A reproducible uniform draw for tests' inputs: a 64-bit LCG (Knuth's
 * MMIX constants) whose top 24 bits of state become a float in [-0.5, 0.5).
 * 24 bits fill a float's mantissa, so every value is exact and the same on
 * every CPU; the caller keeps the state, so each test owns its sequence. */
#ifndef FSC_TEST_FRAND_H
#define FSC_TEST_FRAND_H

#include <stdint.h>

static inline float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 - 0.5f;
}

#endif
