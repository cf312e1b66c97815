/* The register-blocked f32 GEMM of every table: mm_nn and mm_tn_acc. */
#include "build.h"

/*
 * Register-blocked GEMM core shared by both shapes: an MR x NR block of C
 * (isa/tuning.h) is held in registers while k runs; A is addressed as
 * A[r * a_rs + k * a_ks], so the same core serves A (row-major, nn) and A^T
 * (tn). `rows` (<= MR) and `cols` (<= NR) are literals at every call site,
 * so each block shape gets its own fully unrolled copy: a tile whose height
 * is not a multiple of MR still runs its last rows from registers, and so
 * does a last panel narrower than NR (a head dim such as 80 or 72 is two
 * 32-column panels and one of 16 or 8 on AVX-512). (An intrinsics version
 * of the 8 x 32 AVX-512 block measured the same: gcc 12 and 13 keep the
 * plain C form in registers.)
 */
static inline __attribute__((always_inline)) void block_rows(
    const int rows, const int cols, int K, const float *restrict A, int64_t a_rs,
    int64_t a_ks, const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc,
    int accumulate) {
  float acc[MR][NR];
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < cols; j++) acc[r][j] = accumulate ? C[r * ldc + j] : 0.0f;
  for (int k = 0; k < K; k++) {
    const float *restrict b = B + (int64_t)k * ldb;
    for (int r = 0; r < rows; r++) {
      const float x = A[r * a_rs + (int64_t)k * a_ks];
#pragma omp simd
      for (int j = 0; j < cols; j++) acc[r][j] += x * b[j];
    }
  }
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < cols; j++) C[r * ldc + j] = acc[r][j];
}

/* A block of 1..MR rows and `cols` columns, `cols` a literal. */
#define TG_BLOCK_OF_COLS(cols)                                                            \
  switch (rows) {                                                                         \
    TG_ROWS_CASE(1, cols) TG_ROWS_CASE(2, cols) TG_ROWS_CASE(3, cols)                     \
    TG_ROWS_CASE(4, cols) TG_ROWS_CASE(5, cols) TG_ROWS_CASE(6, cols)                     \
    TG_ROWS_CASE(7, cols) TG_ROWS_CASE(8, cols)                                           \
  }
#define TG_ROWS_CASE(n, cols)                                                           \
  case n:                                                                               \
    if (n <= MR) block_rows(n, cols, K, A, a_rs, a_ks, B, ldb, C, ldc, accumulate);      \
    break;
_Static_assert(MR <= 8, "block has cases for up to 8 rows");

/* A block of 1..MR rows and NR columns, or of a last panel's 8, 16 or 24
 * (below NR: the head dims in steps of 8). */
static void block(int rows, int cols, int K, const float *restrict A, int64_t a_rs,
                  int64_t a_ks, const float *restrict B, int64_t ldb, float *restrict C,
                  int64_t ldc, int accumulate) {
  if (cols == NR) {
    TG_BLOCK_OF_COLS(NR)
  } else if (cols == 8 && NR > 8) {
    TG_BLOCK_OF_COLS(8)
  } else if (cols == 16 && NR > 16) {
    TG_BLOCK_OF_COLS(16)
  } else if (cols == 24 && NR > 24) {
    TG_BLOCK_OF_COLS(24)
  }
}
#undef TG_ROWS_CASE
#undef TG_BLOCK_OF_COLS
_Static_assert(NR % 8 == 0 && NR <= 32, "block's panel widths are multiples of 8 up to 32");

/* Any-size edge block (the fewer than 8 columns left after block's
 * panels): rows x cols of C, a row at a time. */
static void block_edge(int rows, int cols, int K, const float *restrict A, int64_t a_rs,
                       int64_t a_ks, const float *restrict B, int64_t ldb, float *restrict C,
                       int64_t ldc, int accumulate) {
  for (int r = 0; r < rows; r++) {
    float *restrict c = C + r * ldc;
    if (!accumulate)
      for (int j = 0; j < cols; j++) c[j] = 0.0f;
    for (int k = 0; k < K; k++) {
      const float x = A[r * a_rs + (int64_t)k * a_ks];
      const float *restrict b = B + (int64_t)k * ldb;
#pragma omp simd
      for (int j = 0; j < cols; j++) c[j] += x * b[j];
    }
  }
}

/* Row blocks outside, column panels inside. The other order (each K x NR
 * panel of B read from L2 once, then from L1 by every row block) measured
 * the same: 0.98-1.02x the backward step and the forward on six shapes, D
 * 64-512 (AMD EPYC family 23, avx2, 2 threads, 3 alternating rounds). */
static void gemm(int M, int N, int K, const float *A, int64_t a_rs, int64_t a_ks,
                 const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate) {
  for (int i = 0; i < M; i += MR) {
    const int rows = M - i < MR ? M - i : MR;
    const float *Ai = A + (int64_t)i * a_rs;
    float *Ci = C + (int64_t)i * ldc;
    int j = 0;
    for (; j + NR <= N; j += NR)
      block(rows, NR, K, Ai, a_rs, a_ks, B + j, ldb, Ci + j, ldc, accumulate);
    const int panel = (N - j) & ~7; /* 8, 16 or 24 columns, below NR */
    if (panel) block(rows, panel, K, Ai, a_rs, a_ks, B + j, ldb, Ci + j, ldc, accumulate);
    j += panel;
    if (j < N) block_edge(rows, N - j, K, Ai, a_rs, a_ks, B + j, ldb, Ci + j, ldc, accumulate);
  }
}

/* C[M,N] (+)= A[M,K] . B[K,N] */
void TG_NAME(mm_nn)(int M, int N, int K, const float *restrict A, int64_t lda,
                    const float *restrict B, int64_t ldb, float *restrict C,
                    int64_t ldc, int accumulate) {
  gemm(M, N, K, A, lda, 1, B, ldb, C, ldc, accumulate);
}

/* C[M,N] += A[K,M]^T . B[K,N] */
void TG_NAME(mm_tn_acc)(int M, int N, int K, const float *restrict A, int64_t lda,
                        const float *restrict B, int64_t ldb, float *restrict C,
                        int64_t ldc) {
  gemm(M, N, K, A, 1, lda, B, ldb, C, ldc, 1);
}
