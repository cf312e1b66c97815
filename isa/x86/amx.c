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
 * four loads feed four TDPBF16PS. The blocks at the M % 32 and N % 32 edges
 * run the same way, with only the tiles that hold rows below M and columns
 * below N (2 x 2, 2 x 1, 1 x 2 or 1 x 1 of them).
 *
 * Edges. Nothing outside A[M, K], Bp[K/2, N] and C[M, N] is read or written:
 * a block whose rows and columns are 16 or 32 each runs in place on the
 * tiles it has (a head dim of 80 or 112 leaves a 16-wide one); a tile that
 * would reach past them (rows >= M, columns >= N, k >= K) is
 * staged through a zero-padded buffer on the stack instead, with AVX-512
 * masked loads (which do not touch the masked-off bytes), and C of an edge
 * block likewise, its valid part stored back through a mask. The k padding
 * of a last partial chunk (K % 32) is zero on both sides, so it adds 0 * 0
 * (a NaN or inf of A or B never meets it); rows and columns past M, N hold
 * zeros on one side only and land in rows and columns of C that are never
 * stored. (Head dims between the multiples of 32 are such edges: D 72 is a
 * K % 32 of 8 in S = Q.K^T and an N % 32 of 8 in O = P.V. Staged with
 * memset and memcpy per tile, and the edge blocks run tile by tile, exact
 * mode's D 72 backward ran at 0.59x D 64's GFLOP/s on the lent Xeon. The
 * attention now pads S's and dP's K to the step itself, the table's
 * bf16_k_step: kernels/attention.h, tg_attn_k_padded.)
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

static inline void amx_configure(void) {
  _Alignas(64) amx_tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = AMX_R;
  AMX_SYNC();
  _tile_loadconfig(&cfg);
  AMX_SYNC();
}

/* The first kc (<= AMX_KC) bf16 of `rows` (<= nr) rows of A into buf
 * [nr][AMX_KC], zeros elsewhere; nothing past them is read. */
static inline void amx_stage_a(uint16_t *restrict buf, int nr, const uint16_t *restrict A,
                               int64_t lda, int rows, int kc) {
  const __mmask32 m = (__mmask32)(kc >= 32 ? ~0u : (1u << kc) - 1);
  for (int r = 0; r < nr; r++)
    _mm512_store_si512((void *)(buf + r * AMX_KC),
                       r < rows ? _mm512_maskz_loadu_epi16(m, A + r * lda)
                                : _mm512_setzero_si512());
}

/* The first cols (<= 32) pairs of np (<= AMX_R) rows of Bp into buf
 * [AMX_R][32] (the two B tiles' columns side by side), zeros elsewhere. */
static inline void amx_stage_b(uint32_t *restrict buf, const uint32_t *restrict Bp,
                               int64_t ldb, int np, int cols) {
  const __mmask16 lo = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1);
  const __mmask16 hi = (__mmask16)(cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
  for (int p = 0; p < AMX_R; p++) {
    const int in = p < np;
    _mm512_store_si512((void *)(buf + p * 32),
                       in ? _mm512_maskz_loadu_epi32(lo, Bp + p * ldb) : _mm512_setzero_si512());
    _mm512_store_si512((void *)(buf + p * 32 + 16), in && hi ? _mm512_maskz_loadu_epi32(
                                                                   hi, Bp + p * ldb + 16)
                                                             : _mm512_setzero_si512());
  }
}

/* rows x cols (<= 32 each) of C (stride ldc) to or from buf [32][32]
 * (stage: zeros past them; unstage: only they are written). */
static inline void amx_stage_c(float *restrict buf, const float *restrict C, int64_t ldc,
                               int rows, int cols) {
  const __mmask16 lo = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1);
  const __mmask16 hi = (__mmask16)(cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
  for (int r = 0; r < 32; r++) {
    const int in = r < rows;
    _mm512_store_ps(buf + r * 32, in ? _mm512_maskz_loadu_ps(lo, C + r * ldc) : _mm512_setzero_ps());
    _mm512_store_ps(buf + r * 32 + 16,
                    in && hi ? _mm512_maskz_loadu_ps(hi, C + r * ldc + 16) : _mm512_setzero_ps());
  }
}
static inline void amx_unstage_c(float *restrict C, int64_t ldc, const float *restrict buf,
                                 int rows, int cols) {
  const __mmask16 lo = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1);
  const __mmask16 hi = (__mmask16)(cols >= 32 ? 0xffff : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
  for (int r = 0; r < rows; r++) {
    _mm512_mask_storeu_ps(C + r * ldc, lo, _mm512_load_ps(buf + r * 32));
    if (hi) _mm512_mask_storeu_ps(C + r * ldc + 16, hi, _mm512_load_ps(buf + r * 32 + 16));
  }
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

/* The tile products of one k step of a block: tmm0-3 += (A rows tmm4,
 * tmm5) x (B columns tmm6, tmm7), only the tiles the block has (two_r: rows
 * 16-31, two_c: columns 16-31). */
static inline void amx_dot(int two_r, int two_c) {
  _tile_dpbf16ps(0, 4, 6);
  if (two_c) _tile_dpbf16ps(1, 4, 7);
  if (two_r) _tile_dpbf16ps(2, 5, 6);
  if (two_r && two_c) _tile_dpbf16ps(3, 5, 7);
}

/* A block of C of rows x cols (1..32 each; 16 or 32 of both: whole tiles
 * inside C, run in place), rows from i and columns from j of the terms' A
 * and B (C points at the block): tmm0-3. C (+)= A_0 . B_0 + ... + A_{n-1}
 * . B_{n-1}, group by group (amx_group_end), each group k step by k step:
 * per 32 k, each of its terms in turn, the shared operand's tiles loaded
 * once for all of them. Each element of C sees the same TDPBF16PS sequence whatever the
 * block's size: an edge block's bits are those of a whole one. */
static void amx_block(int rows, int cols, int n, const tg_bf16_term *terms, int64_t i,
                      int64_t j, int64_t lda, int64_t ldb, float *C, int64_t ldc,
                      int accumulate) {
  const int two_r = rows > AMX_R, two_c = cols > AMX_R;
  /* whole tiles: the block's rows and columns fill its tiles (16 or 32
   * each), so they load and store in place; else they go through the
   * zero-padded buffers */
  const int whole_r = rows % AMX_R == 0, whole_cols = cols % AMX_R == 0;
  const int whole_c = whole_r && whole_cols;
  _Alignas(64) float c[32 * 32];
  _Alignas(64) uint16_t a[2 * AMX_R * AMX_KC]; /* a staged A step [32][32] */
  _Alignas(64) uint32_t b[AMX_R * 32];         /* a staged B step [16][32] */
  float *const Cb = whole_c ? C : c;
  const int64_t scb = whole_c ? 4 * ldc : 4 * 32;
  if (accumulate && !whole_c) amx_stage_c(c, C, ldc, rows, cols);
  if (accumulate) {
    AMX_LOAD(0, Cb, scb);
    if (two_c) AMX_LOAD(1, Cb + 16, scb);
    if (two_r) AMX_LOAD(2, Cb + 16 * (scb / 4), scb);
    if (two_r && two_c) AMX_LOAD(3, Cb + 16 * (scb / 4) + 16, scb);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int g = 0, e, shared_a; g < n; g = e) {
    e = amx_group_end(n, terms, g, &shared_a);
    const int K = terms[g].K;
    for (int k = 0; k < K; k += AMX_KC) {
      const int kc = K - k < AMX_KC ? K - k : AMX_KC;
      const int a_in_place = whole_r && kc == AMX_KC, b_in_place = whole_cols && kc == AMX_KC;
      /* the operand the group's terms share loads once for the k step */
      for (int t = g; t < e; t++) {
        if (t == g || !shared_a) {
          const uint16_t *A = terms[t].A + i * lda + k;
          if (a_in_place) {
            AMX_LOAD(4, A, 2 * lda);
            if (two_r) AMX_LOAD(5, A + 16 * lda, 2 * lda);
          } else {
            uint16_t *s = a;
            amx_stage_a(s, two_r ? 2 * AMX_R : AMX_R, A, lda, rows, kc);
            AMX_LOAD(4, s, 2 * AMX_KC);
            if (two_r) AMX_LOAD(5, s + AMX_R * AMX_KC, 2 * AMX_KC);
          }
        }
        if (t == g || shared_a) {
          const uint32_t *B = terms[t].Bp + j + (int64_t)(k / 2) * ldb;
          if (b_in_place) {
            AMX_LOAD(6, B, 4 * ldb);
            if (two_c) AMX_LOAD(7, B + 16, 4 * ldb);
          } else {
            uint32_t *s = b;
            amx_stage_b(s, B, ldb, kc / 2, cols);
            AMX_LOAD(6, s, 4 * 32);
            if (two_c) AMX_LOAD(7, s + 16, 4 * 32);
          }
        }
        amx_dot(two_r, two_c);
      }
    }
  }
  _tile_stored(0, Cb, scb);
  if (two_c) _tile_stored(1, Cb + 16, scb);
  if (two_r) _tile_stored(2, Cb + 16 * (scb / 4), scb);
  if (two_r && two_c) _tile_stored(3, Cb + 16 * (scb / 4) + 16, scb);
  if (!whole_c) amx_unstage_c(C, ldc, c, rows, cols);
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
 * between in amx_block's order (the TDPBF16PS sequence of
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
    for (int j = 0; j < N; j += 32)
      amx_block(M - i < 32 ? M - i : 32, N - j < 32 ? N - j : 32, n, terms, i, j, lda, ldb,
                C + (int64_t)i * ldc + j, ldc, accumulate);
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
