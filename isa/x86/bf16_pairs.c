/*
 * pack_bf16_pairs of the avx512bf16 and amx tables: X^T in the pair layout
 * that vdpbf16ps (x86/bf16_dot.c) and an AMX B tile (x86/amx.c) both read.
 */
#include "common/build.h"

#if !defined(__AVX512F__)
#error "x86/bf16_pairs.c is for tables built with AVX-512 (isa/isa.cmake)"
#endif

/* 16 rows x 16 pairs per block through the in-register transpose; the
 * edges pair by pair. Bits are moved, never computed on. */
void TG_NAME(pack_bf16_pairs)(int64_t nr, int64_t K, const uint16_t *restrict X,
                              int64_t lds, uint32_t *restrict Bp, int64_t ldb) {
  const int64_t P = K / 2, rb = nr - nr % 16, pb = P - P % 16;
  for (int64_t r = 0; r < rb; r += 16)
    for (int64_t p = 0; p < pb; p += 16) {
      __m512 m[16];
      for (int i = 0; i < 16; i++)
        m[i] = _mm512_castsi512_ps(_mm512_loadu_si512(X + (r + i) * lds + 2 * p));
      transpose16_regs(m);
      for (int i = 0; i < 16; i++)
        _mm512_storeu_si512(Bp + (p + i) * ldb + r, _mm512_castps_si512(m[i]));
    }
  for (int64_t r = 0; r < nr; r++)
    for (int64_t p = r < rb ? pb : 0; p < P; p++)
      memcpy(Bp + p * ldb + r, X + r * lds + 2 * p, sizeof(uint32_t));
}
