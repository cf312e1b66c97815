/*
 * The bf16 dot GEMM on AMX tiles, for the amx table (built with -mamx-tile
 * -mamx-bf16 on top of avx512bf16's flags), in place of x86/bf16_dot.c's
 * vdpbf16ps GEMM (common/table.c). Same contract: C[M,N] (+)= A[M,K] .
 * B[K,N], A bf16 rows at stride lda, B in pairs Bp[p * ldb + j] =
 * (B[2p, j], B[2p+1, j]), K even, any M, N >= 0; pack_bf16_pairs is
 * x86/bf16_pairs.c's.
 *
 * Layout. TDPBF16PS tC, tA, tB adds, for every row m of tA and column n of
 * tB, the products of the bf16 pairs of row m of tA (pair q: k = 2q, 2q+1)
 * and of row q of tB (column n: a 32-bit pair) to tC[m][n] (f32). With
 * every tile 16 rows x 64 bytes, an A tile is 16 rows of A, 32 bf16 each
 * (the row layout of A itself), a B tile 16 rows of Bp, 16 pairs each (the
 * layout pack_bf16_pairs writes), a C tile 16 x 16 f32: whole tiles load
 * from the operands in place (TILELOADD takes a byte stride and any
 * alignment) and C stores in place.
 *
 * Blocking. One palette-1 configuration, all eight tiles 16 rows x 64 bytes:
 * tmm0-3 a 32 x 32 block of C (2 x 2 tiles), tmm4-5 A rows i..i+15 and
 * i+16..i+31, tmm6-7 Bp columns j..j+15 and j+16..j+31; per 32 k (16 pairs)
 * four loads feed four TDPBF16PS. Blocks wholly inside C run so; the rest
 * (the M % 32 and N % 32 edges) run 16 x 16 tile by tile (tmm0, tmm4, tmm6).
 *
 * Edges. Nothing outside A[M, K], Bp[K/2, N] and C[M, N] is read or written:
 * a tile that would reach past them (rows >= M, columns >= N, k >= K) is
 * staged through a zero-padded buffer on the stack instead, C (when
 * accumulating) and the result copied back for the valid part only. The k
 * padding of a last partial chunk (K % 32) is zero on both sides, so it adds
 * 0 * 0 (a NaN or inf of A or B never meets it); rows and columns past M, N
 * hold zeros on one side only and land in rows and columns of C that are
 * never stored.
 *
 * The configuration is loaded at the start of every call (another library
 * on this thread, e.g. oneDNN under PyTorch, may have loaded its own since
 * the last) and the tiles released before return (TILERELEASE: the OS then
 * saves no tile data at a context switch). The table is chosen only where
 * isa/select.c's tg_cpu_amx holds, i.e. the OS has granted this process
 * the tile data (Linux: arch_prctl); any thread of the process may then
 * run it.
 *
 * Numerics: the products of two bf16 are exact in f32; the sums are f32,
 * rounded to nearest even at each accumulation (the SDM's pseudocode adds
 * the products in k order, but the order and grouping inside the tile unit
 * is its own and differs from vdpbf16ps's pairs and from an FMA chain, so
 * the amx table's bits are not avx512bf16's). As vdpbf16ps, TDPBF16PS
 * treats subnormal inputs as zero and flushes subnormal results to zero
 * (below 1.2e-38) and neither reads nor updates MXCSR (Intel SDM, TDPBF16PS:
 * "Output denormals are always flushed to zero and input denormals are
 * always treated as zero").
 */
#include "common/build.h"

/* The amx table's flags (isa/isa.cmake) without the tile intrinsics: no
 * table rather than a copy of avx512bf16's under amx's name (the build
 * then uses absent.c). */
#if !(defined(__AMX_BF16__) || defined(__AMXBF16__)) || \
    !(defined(__AMX_TILE__) || defined(__AMXTILE__)) /* gcc's names || clang's */
#error "the amx table needs a compiler that defines the AMX-BF16 and AMX-TILE macros"
#endif

/* LDTILECFG's 64-byte operand, palette 1. */
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16]; /* bytes per row of tile t */
  uint8_t rows[16];   /* rows of tile t */
} amx_tilecfg;
_Static_assert(sizeof(amx_tilecfg) == 64, "the tile configuration is 64 bytes");

/* gcc's tile intrinsics are asm statements that do not tell the compiler
 * which memory they read (TILELOADD gets its address in a register,
 * LDTILECFG names 8 of its 64 bytes), so the compiler could move a store
 * to a staging buffer (or the configuration) across them: each goes
 * between two compiler barriers (no instruction; clang's builtins need
 * none). TILESTORED's asm clobbers memory already. */
#define AMX_SYNC() __asm__ volatile("" ::: "memory")
#define AMX_LOAD(t, base, stride) \
  do {                            \
    AMX_SYNC();                   \
    _tile_loadd(t, base, stride); \
    AMX_SYNC();                   \
  } while (0)

enum { AMX_R = 16, AMX_KC = 32 }; /* tile rows (and f32 columns); bf16 per A row */

/* The 2 x 2 block's four products: tmm0-3 += (A rows tmm4, tmm5) x (B
 * columns tmm6, tmm7). */
#define AMX_DOT_2X2()          \
  do {                         \
    _tile_dpbf16ps(0, 4, 6);   \
    _tile_dpbf16ps(1, 4, 7);   \
    _tile_dpbf16ps(2, 5, 6);   \
    _tile_dpbf16ps(3, 5, 7);   \
  } while (0)

static inline void amx_configure(void) {
  _Alignas(64) amx_tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = AMX_R;
  AMX_SYNC();
  _tile_loadconfig(&cfg);
  AMX_SYNC();
}

/* The first kc (<= AMX_KC) elements of `rows` (<= nr) rows of A into buf
 * [nr][AMX_KC], zeros elsewhere. */
static inline void amx_stage_a(uint16_t *restrict buf, int nr, const uint16_t *restrict A,
                               int64_t lda, int rows, int kc) {
  memset(buf, 0, sizeof(uint16_t) * (size_t)(nr * AMX_KC));
  for (int r = 0; r < rows; r++) memcpy(buf + r * AMX_KC, A + r * lda, sizeof(uint16_t) * kc);
}

/* The first cols (<= ncb) pairs of np (<= AMX_R) rows of Bp into buf
 * [AMX_R][ncb], zeros elsewhere. */
static inline void amx_stage_b(uint32_t *restrict buf, int ncb, const uint32_t *restrict Bp,
                               int64_t ldb, int np, int cols) {
  memset(buf, 0, sizeof(uint32_t) * (size_t)(AMX_R * ncb));
  for (int p = 0; p < np; p++) memcpy(buf + p * ncb, Bp + p * ldb, sizeof(uint32_t) * cols);
}

/* The end of the group of terms that starts at g: the terms after it with
 * its K and its A (all of them) or its Bp (all of them), i.e. the bf16
 * parts of one operand against the same other operand. */
static int amx_group_end(int n, const tg_bf16_term *terms, int g, int *shared_a) {
  int same_a = 1, same_b = 1, e = g + 1;
  for (; e < n && terms[e].K == terms[g].K; e++) {
    const int a = same_a && terms[e].A == terms[g].A, b = same_b && terms[e].Bp == terms[g].Bp;
    if (!a && !b) break;
    same_a = a, same_b = b;
  }
  *shared_a = same_a && e - g > 1;
  return e;
}

/* A 32 x 32 block of C, wholly inside it, rows from i and columns from j
 * of the terms' A and B (C points at the block): tmm0-3. C (+)= A_0 . B_0
 * + ... + A_{n-1} . B_{n-1}, group by group (amx_group_end), each group
 * k step by k step: per 32 k, each of its terms in turn, the shared
 * operand's two tiles loaded once for all of them. */
static void amx_block32(int n, const tg_bf16_term *terms, int64_t i, int64_t j, int64_t lda,
                        int64_t ldb, float *C, int64_t ldc, int accumulate) {
  const int64_t sa = 2 * lda, sb = 4 * ldb, sc = 4 * ldc; /* byte strides */
  if (accumulate) {
    AMX_LOAD(0, C, sc);
    AMX_LOAD(1, C + 16, sc);
    AMX_LOAD(2, C + 16 * ldc, sc);
    AMX_LOAD(3, C + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int g = 0, e, shared_a; g < n; g = e) {
    e = amx_group_end(n, terms, g, &shared_a);
    const int K = terms[g].K;
    int k = 0;
    if (shared_a) { /* the terms' A tiles loaded once per k step */
      for (; k + AMX_KC <= K; k += AMX_KC) {
        const uint16_t *A = terms[g].A + i * lda + k;
        AMX_LOAD(4, A, sa);
        AMX_LOAD(5, A + 16 * lda, sa);
        for (int t = g; t < e; t++) {
          const uint32_t *b = terms[t].Bp + j + (int64_t)(k / 2) * ldb;
          AMX_LOAD(6, b, sb);
          AMX_LOAD(7, b + 16, sb);
          AMX_DOT_2X2();
        }
      }
    } else { /* one term, or the terms' B tiles loaded once per k step */
      for (; k + AMX_KC <= K; k += AMX_KC) {
        const uint32_t *b = terms[g].Bp + j + (int64_t)(k / 2) * ldb;
        AMX_LOAD(6, b, sb);
        AMX_LOAD(7, b + 16, sb);
        for (int t = g; t < e; t++) {
          const uint16_t *A = terms[t].A + i * lda + k;
          AMX_LOAD(4, A, sa);
          AMX_LOAD(5, A + 16 * lda, sa);
          AMX_DOT_2X2();
        }
      }
    }
    if (k < K) /* the last K % 32: both sides zero-padded along k */
      for (int t = g; t < e; t++) {
        _Alignas(64) uint16_t a[2 * AMX_R * AMX_KC];
        _Alignas(64) uint32_t b[AMX_R * 32];
        amx_stage_a(a, 2 * AMX_R, terms[t].A + i * lda + k, lda, 2 * AMX_R, K - k);
        amx_stage_b(b, 32, terms[t].Bp + j + (int64_t)(k / 2) * ldb, ldb, (K - k) / 2, 32);
        AMX_LOAD(4, a, 2 * AMX_KC);
        AMX_LOAD(5, a + AMX_R * AMX_KC, 2 * AMX_KC);
        AMX_LOAD(6, b, 4 * 32);
        AMX_LOAD(7, b + 16, 4 * 32);
        AMX_DOT_2X2();
      }
  }
  _tile_stored(0, C, sc);
  _tile_stored(1, C + 16, sc);
  _tile_stored(2, C + 16 * ldc, sc);
  _tile_stored(3, C + 16 * ldc + 16, sc);
}

/* One tile of C, rows x cols (1..16 each; tmm0, tmm4, tmm6) at row i and
 * column j of the terms: in place where whole, else through zero-padded
 * copies; the terms in amx_block32's order. */
static void amx_tile1(int rows, int cols, int n, const tg_bf16_term *terms, int64_t i, int64_t j,
                      int64_t lda, int64_t ldb, float *C, int64_t ldc, int accumulate) {
  const int whole = rows == AMX_R && cols == AMX_R;
  _Alignas(64) float c[AMX_R * AMX_R];
  _Alignas(64) uint16_t a[AMX_R * AMX_KC];
  _Alignas(64) uint32_t b[AMX_R * AMX_R];
  if (!accumulate) {
    _tile_zero(0);
  } else if (whole) {
    AMX_LOAD(0, C, 4 * ldc);
  } else {
    memset(c, 0, sizeof c);
    for (int r = 0; r < rows; r++) memcpy(c + r * AMX_R, C + r * ldc, sizeof(float) * cols);
    AMX_LOAD(0, c, 4 * AMX_R);
  }
  for (int g = 0, e, shared_a; g < n; g = e) {
    e = amx_group_end(n, terms, g, &shared_a);
    const int K = terms[g].K;
    for (int k = 0; k < K; k += AMX_KC)
      for (int t = g; t < e; t++) {
        const uint16_t *A = terms[t].A + i * lda + k;
        const uint32_t *bk = terms[t].Bp + j + (int64_t)(k / 2) * ldb;
        const int kc = K - k < AMX_KC ? K - k : AMX_KC;
        if (rows == AMX_R && kc == AMX_KC) {
          AMX_LOAD(4, A, 2 * lda);
        } else {
          amx_stage_a(a, AMX_R, A, lda, rows, kc);
          AMX_LOAD(4, a, 2 * AMX_KC);
        }
        if (cols == AMX_R && kc == AMX_KC) {
          AMX_LOAD(6, bk, 4 * ldb);
        } else {
          amx_stage_b(b, AMX_R, bk, ldb, kc / 2, cols);
          AMX_LOAD(6, b, 4 * AMX_R);
        }
        _tile_dpbf16ps(0, 4, 6);
      }
  }
  if (whole) {
    _tile_stored(0, C, 4 * ldc);
  } else {
    _tile_stored(0, c, 4 * AMX_R);
    for (int r = 0; r < rows; r++) memcpy(C + r * ldc, c + r * AMX_R, sizeof(float) * cols);
  }
}

/* Inside a bf16_dot_begin / _end bracket on this thread: the configuration
 * is loaded and the tiles stay in use until the end (one LDTILECFG and one
 * TILERELEASE per work item instead of per product). */
static _Thread_local int amx_bracket;

void TG_NAME(bf16_dot_begin_amx)(void) {
  amx_configure();
  amx_bracket = 1;
}

void TG_NAME(bf16_dot_end_amx)(void) {
  _tile_release();
  amx_bracket = 0;
}

/* C (+)= A_0 . B_0 + ... + A_{n-1} . B_{n-1}, block by block: each 32 x 32
 * block of C is loaded (or zeroed) once and stored once, its terms run
 * between in amx_block32's order (the TDPBF16PS sequence of
 * mm_bf16_pairs_amx calls on 32-k slices in that order, so their bits: C's
 * f32 values go to memory and back unchanged between calls). Group by
 * group, k step by k step, and not term by term: where the terms are an
 * operand's two or three bf16 parts, per k step the other operand's tiles
 * load once instead of once per part (8 tile loads for 12 TDPBF16PS, not
 * 12). Exact mode's forward took 0.88-0.92 the time at D 256-512 with it,
 * 0.97-1.02 at D 64-160, the backward 0.96-1.00; split mode 0.97-1.02
 * (2-core Xeon, 2 threads, paired calls, 9 pairs,
 * bench/results/xeon2-amx/ab-terms-by-k.txt). */
static void amx_gemm(int n, const tg_bf16_term *terms, int M, int N, int64_t lda, int64_t ldb,
                     float *C, int64_t ldc, int accumulate) {
  if (M <= 0 || N <= 0) return;
  if (!amx_bracket) amx_configure();
  for (int i = 0; i < M; i += 32)
    for (int j = 0; j < N; j += 32) {
      float *Cij = C + (int64_t)i * ldc + j;
      if (i + 32 <= M && j + 32 <= N) {
        amx_block32(n, terms, i, j, lda, ldb, Cij, ldc, accumulate);
        continue;
      }
      for (int ii = 0; ii < 32 && i + ii < M; ii += AMX_R)
        for (int jj = 0; jj < 32 && j + jj < N; jj += AMX_R) {
          const int rows = M - i - ii < AMX_R ? M - i - ii : AMX_R;
          const int cols = N - j - jj < AMX_R ? N - j - jj : AMX_R;
          amx_tile1(rows, cols, n, terms, i + ii, j + jj, lda, ldb,
                    Cij + (int64_t)ii * ldc + jj, ldc, accumulate);
        }
    }
  if (!amx_bracket) _tile_release();
}

void TG_NAME(mm_bf16_pairs_amx)(int M, int N, int K, const uint16_t *A, int64_t lda,
                                const uint32_t *Bp, int64_t ldb, float *C, int64_t ldc,
                                int accumulate) {
  const tg_bf16_term term = {A, Bp, K};
  amx_gemm(1, &term, M, N, lda, ldb, C, ldc, accumulate);
}

void TG_NAME(mm_bf16_terms_amx)(int n, const tg_bf16_term *terms, int M, int N, int64_t lda,
                                int64_t ldb, float *C, int64_t ldc, int accumulate) {
  amx_gemm(n, terms, M, N, lda, ldb, C, ldc, accumulate);
}
