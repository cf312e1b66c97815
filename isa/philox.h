/*
 * Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and
 * Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3" (SC'11): four 32-bit
 * words out of a 128-bit counter and a 64-bit key, with no state between
 * calls, so any draw can be recomputed from its number alone (the attention
 * backward recomputes the forward's dropout mask this way).
 *
 * A round multiplies counter words 0 and 2 by two constants into 64-bit
 * products and mixes their halves with words 1 and 3 and the key:
 *
 *   (hi0, lo0) = M0 * c0,  (hi1, lo1) = M1 * c2
 *   c' = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
 *
 * and the key is bumped by the Weyl constants (W0, W1) between rounds; ten
 * rounds. tests/test_attn_ext.c checks the paper's known-answer vectors.
 */
#ifndef TG_PHILOX_H
#define TG_PHILOX_H

#include <stdint.h>

enum { TG_PHILOX_ROUNDS = 10 };
/* the round multipliers M0, M1 and the key's Weyl increments W0, W1 of
 * Philox4x32 (the paper's constants) */
#define TG_PHILOX_M0 0xD2511F53u
#define TG_PHILOX_M1 0xCD9E8D57u
#define TG_PHILOX_W0 0x9E3779B9u
#define TG_PHILOX_W1 0xBB67AE85u

/* out = Philox4x32-10(key, ctr); out may alias ctr. */
static inline void tg_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                    uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < TG_PHILOX_ROUNDS; r++) {
    if (r > 0) k0 += TG_PHILOX_W0, k1 += TG_PHILOX_W1;
    const uint64_t p0 = (uint64_t)TG_PHILOX_M0 * c0, p1 = (uint64_t)TG_PHILOX_M1 * c2;
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0, c1 = (uint32_t)p1, c2 = n2, c3 = (uint32_t)p0;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

#endif /* TG_PHILOX_H */
