/*
 * Operand packing of the attention's precision modes (TG_ATTN_PRECISION_
 * SPLIT and _BF16; kernels/attention_lowp.c): the f32 probabilities P and
 * score gradients dS become bf16 rows, or bf16 hi + lo pairs, in the A
 * layout mm_bf16_pairs reads, and the bf16 rows of K, V, Q and dO become its
 * B layout (pairs along the reduction). Plain C on every table, with the
 * 16 x 16 register transpose where AVX-512 has one; included by micro.c.
 */

/* hi = bf16(x) rounded to nearest even (NaN -> 0x7FC0, as f32_to_bf16);
 * lo = bf16(x - hi), and 0 where hi is not finite (x - hi would be NaN for
 * x = inf, and inf - inf for an x that rounds up to inf). lo NULL: hi only. */
static inline __attribute__((always_inline)) void split_row(const float *restrict x, int64_t n,
                                                            uint16_t *restrict hi,
                                                            uint16_t *restrict lo) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], sizeof u);
    const uint32_t nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    const uint16_t h = (uint16_t)(nan ? 0x7FC0u : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    hi[i] = h;
    if (lo) {
      const uint32_t hu = (uint32_t)h << 16;
      float hf;
      memcpy(&hf, &hu, sizeof hf);
      const float r = (h & 0x7F80u) == 0x7F80u ? 0.0f : x[i] - hf; /* exact */
      uint32_t v;
      memcpy(&v, &r, sizeof v);
      lo[i] = (uint16_t)((v + 0x7FFFu + ((v >> 16) & 1u)) >> 16);
    }
  }
}

/* 16 x 16 block (rows r < nr, columns c < nc of src, the rest 0) to
 * t[c][r]. */
static inline void transpose_in(const float *restrict src, int64_t lds, int nr, int nc,
                                float t[16][16]) {
#if defined(__AVX512F__)
  __m512 m[16];
  const __mmask16 cols = (__mmask16)((1u << nc) - 1);
  for (int r = 0; r < 16; r++)
    m[r] = r < nr ? _mm512_maskz_loadu_ps(cols, src + r * lds) : _mm512_setzero_ps();
  transpose16_regs(m);
  for (int c = 0; c < 16; c++) _mm512_storeu_ps(t[c], m[c]);
#else
  for (int c = 0; c < 16; c++)
    for (int r = 0; r < 16; r++) t[c][r] = r < nr && c < nc ? src[r * lds + c] : 0.0f;
#endif
}

static void TG_NAME(f32_to_bf16_split)(int64_t rows, int64_t cols, const float *restrict src,
                                       int64_t lds, int transpose, uint16_t *restrict hi,
                                       uint16_t *restrict lo, int64_t ldd) {
  if (!transpose) {
    for (int64_t r = 0; r < rows; r++) {
      split_row(src + r * lds, cols, hi + r * ldd, lo ? lo + r * ldd : NULL);
      if (cols % 2) {
        hi[r * ldd + cols] = 0;
        if (lo) lo[r * ldd + cols] = 0;
      }
    }
    return;
  }
  float t[16][16] __attribute__((aligned(64)));
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int nr = rows - r0 < 16 ? (int)(rows - r0) : 16;
      const int nc = cols - c0 < 16 ? (int)(cols - c0) : 16;
      transpose_in(src + r0 * lds + c0, lds, nr, nc, t);
      const int n = nr + (nr % 2); /* the zero pad of an odd row count */
      for (int c = 0; c < nc; c++) {
        const int64_t d = (c0 + c) * ldd + r0;
        split_row(t[c], n, hi + d, lo ? lo + d : NULL);
      }
    }
}

static void TG_NAME(pack_bf16_row_pairs)(int64_t nr, int64_t ncols, const uint16_t *restrict X,
                                         int64_t lds, uint32_t *restrict Bp, int64_t ldb) {
  for (int64_t p = 0; 2 * p < nr; p++) {
    const uint16_t *restrict a = X + 2 * p * lds, *restrict b = a + lds;
    uint32_t *restrict dst = Bp + p * ldb;
    if (2 * p + 1 < nr) {
#pragma omp simd
      for (int64_t j = 0; j < ncols; j++) dst[j] = (uint32_t)a[j] | (uint32_t)b[j] << 16;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < ncols; j++) dst[j] = a[j];
    }
  }
}

#define TG_BF16_PACK_OPS                                   \
  .f32_to_bf16_split = TG_NAME(f32_to_bf16_split),         \
  .pack_bf16_row_pairs = TG_NAME(pack_bf16_row_pairs),
