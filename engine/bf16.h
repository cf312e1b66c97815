/* bfloat16 <-> float: exact widening, round-to-nearest-even narrowing. */
#ifndef TG_BF16_H
#define TG_BF16_H

#include <stdint.h>
#include <string.h>

static inline float tg_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Any NaN -> 0x7FC0 (quiet, positive); +-Inf stay +-Inf; finite values round
 * to nearest even, overflowing to +-Inf as IEEE rounding does. */
static inline uint16_t tg_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#endif /* TG_BF16_H */
