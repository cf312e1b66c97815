/*
 * Elements of an f32-or-bf16 buffer by index, for the suites whose kernels
 * take either dtype (tests/test_rope.c, tests/test_glu.c): its size, an
 * element widened to double (bf16 exactly), a store (bf16 by truncation:
 * exact for the bf16-representable values and the specials the suites
 * put), a NaN poison (bf16: 0x7FC1, a NaN no kernel writes) and a random
 * fill.
 */
#ifndef TG_DTYPE_ELEMS_H
#define TG_DTYPE_ELEMS_H

#include <stdint.h>
#include <string.h>

#include "testutil.h"

static inline size_t te_size(int t) { return t == TG_DTYPE_F32 ? 4 : 2; }

static inline double te_get(const void *p, int t, int64_t i) {
  if (t == TG_DTYPE_F32) return ((const float *)p)[i];
  const uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline void te_put(void *p, int t, int64_t i, float v) {
  if (t == TG_DTYPE_F32) {
    ((float *)p)[i] = v;
  } else {
    uint32_t u;
    memcpy(&u, &v, 4);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
  }
}

static inline void te_poison(void *p, int t, int64_t n) {
  if (t == TG_DTYPE_F32)
    tu_poison_f32(p, n);
  else
    for (int64_t i = 0; i < n; i++) ((uint16_t *)p)[i] = 0x7FC1;
}

static inline void te_fill(tu_rng *rng, void *p, int t, int64_t n, double lo, double hi) {
  if (t == TG_DTYPE_F32)
    tu_fill_f32(rng, p, n, lo, hi);
  else
    tu_fill_bf16(rng, p, n, lo, hi);
}

#endif
