/*
 * Portable versions of the blocks isa/common/table.c takes from a
 * simd_<isa>.h: the readable statement of what each computes.
 */

/* The 16-float Walsh-Hadamard block: stages len = 1, 2, 4, 8, each
 * y[l] = x[l ^ len] + (l & len ? -x[l] : x[l]). */
static inline void fwht16_block(float *restrict x) {
  float t[16], u[16];
  for (int l = 0; l < 16; l++) t[l] = x[l];
  for (int l = 0; l < 16; l++) u[l] = t[l ^ 1] + ((l & 1) ? -t[l] : t[l]);
  for (int l = 0; l < 16; l++) t[l] = u[l ^ 2] + ((l & 2) ? -u[l] : u[l]);
  for (int l = 0; l < 16; l++) u[l] = t[l ^ 4] + ((l & 4) ? -t[l] : t[l]);
  for (int l = 0; l < 16; l++) t[l] = u[l ^ 8] + ((l & 8) ? -u[l] : u[l]);
  for (int l = 0; l < 16; l++) x[l] = t[l];
}

/* No conversion block: common/rows.c's scalar loops are the statement. */
enum { CVT_W = 0 };
static inline void bf16_widen_block(const uint16_t *restrict src, float *restrict dst) {
  (void)src, (void)dst;
}
static inline void bf16_narrow_block(const float *restrict src, uint16_t *restrict dst) {
  (void)src, (void)dst;
}

/* No transpose block: plain C has no register transpose and no
 * non-temporal store; common/row_ops.c copies element by element. */
enum { TB = 0 };
static inline int transpose_can_stream(const float *dst, int64_t ldd) {
  (void)dst, (void)ldd;
  return 0;
}
static inline void transpose_block(const float *restrict src, int64_t lds, float *restrict dst,
                                   int64_t ldd, int stream) {
  (void)src, (void)lds, (void)dst, (void)ldd, (void)stream;
}
static inline void stream_fence(void) {}
/* No non-temporal store in plain C: the row ops take their ordinary loops
 * (STREAM_STORES = 0); stream16 is an ordinary copy. */
enum { STREAM_STORES = 0 };
static inline void stream16(float *dst, const float *v) {
  for (int l = 0; l < 16; l++) dst[l] = v[l];
}
