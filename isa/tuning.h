/*
 * Every blocking and tuning constant of tilegrad, each with the measurement
 * (or the register count) that chose it: the work plans of the kernels and
 * engine first, then each ISA build's blocking. Limits of the contract or
 * the ABI stay beside what they limit (kernels/attention.h: TG_METAL_BQ,
 * TG_METAL_BK of the Metal params struct, TG_ATTN_MAX_D; x86/amx.c: the
 * tile geometry AMX_R, AMX_KC, which palette 1 fixes).
 *
 * None of these changes a result: they decide how work is split and what
 * stays in cache, never a summation order that depends on the thread count
 * (the row reductions' 16 lanes, LANES below, are fixed for that reason).
 */
#ifndef TG_ISA_TUNING_H
#define TG_ISA_TUNING_H

#include <stdint.h>

/* --- row kernels ------------------------------------------------------------
 * Row kernels hand each work item a block of whole rows of about this many
 * elements (at least one row, 256 KiB of f32; tg_rows_per_block, isa/reduce.h):
 * work items are taken in dynamic order, so the two threads alternate blocks,
 * and every block starts a new stream whose first lines are demand misses
 * before the prefetchers catch up; with 32 KiB blocks that was a large part
 * of each block. */
enum { TG_ROW_BLOCK_ELEMS = 65536 };

/* Outputs at least this large are written with non-temporal stores where the
 * row op offers them: far past the caches a cached store first reads its line
 * from memory (read-for-ownership), a stream more than the kernel needs. */
#define TG_STREAM_BYTES ((int64_t)16 << 20)

/* Chunk of the online softmax row ops (softmax_exp_f32, scale_chunks_f32):
 * 4 KiB, so a chunk stays in L1 between its max and its exp. */
enum { TG_SOFTMAX_CHUNK = 1024 };

/* --- the memory-bound kernels' own blocks ------------------------------------
 * f32 -> bf16 cast (kernels/cast.c): elements per work item, and the size
 * from which the in-place cast's doubling rounds run in parallel. */
enum { TG_CAST_CHUNK = 1 << 16 };

/* Embedding backward (kernels/embedding.c): column blocks of 4 KiB (whole
 * rows up to dim 1024) to 16 KiB of each row, aiming for
 * TG_EMB_GROUPS_PER_THREAD groups per thread; and the entries ahead whose
 * rows are prefetched: the rows are scattered (random ids, and the tokens of
 * one id scattered over the sequence), so no hardware prefetcher sees them
 * coming. */
enum { TG_EMB_COLS_MIN = 1024, TG_EMB_COLS_MAX = 4096, TG_EMB_GROUPS_PER_THREAD = 8 };
enum { TG_EMB_PF_AHEAD = 2 };

/* RMSNorm backward dw (kernels/rmsnorm.c): fused and deterministic, at most
 * TG_RMS_DW_MAX_BLOCKS row blocks; fused and split, about one row block per
 * TG_RMS_DW_MIN_ROWS rows; split, at most TG_RMS_DW_SPLIT_MAX_BLOCKS; and
 * TG_RMS_COL_BLOCK columns per group of the column passes. The blocks are
 * fixed by the shape alone, never the thread count (determinism). */
enum {
  TG_RMS_DW_MAX_BLOCKS = 256,
  TG_RMS_DW_MIN_ROWS = 16,
  TG_RMS_DW_SPLIT_MAX_BLOCKS = 64,
  TG_RMS_COL_BLOCK = 256
};

/* Transpose (kernels/transpose.c): 64 x 64 float tiles (16 KiB), and
 * TG_TR_STRIPE tiles per group along a tile row. */
enum { TG_TR_TILE = 64, TG_TR_STRIPE = 4 };

/* --- work plans ---------------------------------------------------------------
 * The L2 per CPU a plan assumes where the machine does not say
 * (tg_plan_l2_bytes, engine/plan.c: Linux sysfs, else sysconf, else this). */
#define TG_PLAN_L2_DEFAULT (512LL * 1024)

/* --- attention ----------------------------------------------------------------
 * The largest q- or key-tile of any table (ATTN_BQ, ATTN_BK and their bf16
 * tiles below): the kernels' per-tile stack rows are this long. */
enum { TG_ATTN_MAX_TILE = 128 };

/* Backward, KV schedule: aim for TG_ATTN_ITEMS_PER_CPU work items per CPU
 * planned for (tg_ctx_plan_cpus: the machine's in deterministic mode, else
 * at most the call's threads; several per thread, for dynamic load balance
 * under causality; fewer items mean fewer dQ partials to write and sum), but
 * never split a kv head's keys into ranges shorter than
 * TG_ATTN_MIN_RANGE_TILES key tiles, nor into more than TG_ATTN_MAX_RANGES,
 * nor so many that the dQ partials ((ranges - 1) copies of dQ) pass
 * TG_ATTN_PARTIALS_BUDGET bytes (a dQ larger than that gets one range). In
 * deterministic mode none of this depends on the thread count. */
enum { TG_ATTN_ITEMS_PER_CPU = 4, TG_ATTN_MIN_RANGE_TILES = 4, TG_ATTN_MAX_RANGES = 16 };
/* When the ranges leave fewer items than that (few kv heads, short keys),
 * the q units of a (range, kv head), its (query head, q-tile) pairs, split
 * into query groups with dK, dV parts of their own: at least
 * TG_ATTN_MIN_GROUP_UNITS units per group, at most TG_ATTN_MAX_QGROUPS. */
/* Lower minimums did not pay (lent Xeon, amx, 16 planned CPUs, bench/
 * results/xeon16-amx/README.md, "Few-item shapes"): on 1,6,2,384,128 full
 * (8 items in exact mode) 2 units per group took 0.77x the step time at 16
 * threads but 1.13x at 1; 1 unit and ranges of 1 key tile 0.66x and 1.23x
 * (bf16 mode 0.68x, 1.36x); no consistent sign on the rest of the grid.
 * Except where even the most groups of this minimum leave fewer items than
 * planned CPUs (starved): there the minimum is 1 unit. With the plan capped
 * by the call's threads (tg_ctx_plan_cpus) only a call with many threads
 * and few units meets that: 1,6,2,384,128 at 16 threads 0.43x (bf16 mode)
 * and 0.77x (exact) the backward's time, every other grid shape and every
 * 2-thread call unchanged (paired-calls/starved-groups.txt there). */
enum { TG_ATTN_MIN_GROUP_UNITS = 4, TG_ATTN_MAX_QGROUPS = 16 };
/* The minimum range counts the table's key tile (attn_bk), also where the
 * plan takes longer ones (bf16 mode on amx: 128 keys, attn_bk_bf16): query
 * groups there are traded for ranges, two for one, down to
 * TG_ATTN_MIN_RANGE_TILES * attn_bk keys a range (kernels/attention_bwd.c,
 * plan_groups_to_ranges), the items' count kept. A range split reloads
 * the q units of a kv head (gqa q rows a key) and a group split its key
 * tiles: at gqa 8 the ranges cost more, so it stops above
 * TG_ATTN_RANGES_OVER_GROUPS_MAX_GQA. 2-core Xeon (model 167, amx, bf16
 * mode, 2 threads planned for 16 CPUs: the work of a 16-core machine's
 * plan), paired calls, backward time new / old: first with the trade at
 * every gqa (7 pairs): 2,8,4,1024,256 full 0.854 (2 ranges x 4 groups ->
 * 4 x 2), 1,6,2,1024,512 causal 0.841, 1,8,4,1024,256 full 0.888,
 * 1,8,8,1024,64 full 0.925, the D 96-160 shapes 0.98-1.00, but
 * 1,16,2,3072,64 causal (gqa 8) 1.064, hence the limit; with it (7 pairs,
 * bench/results/xeon2-amx/ab-plan16-ranges.txt) 0.823-0.999 on the users'
 * grid; on the 2-CPU plan 1,6,2,1024,512 0.874 (ab-plan2-ranges.txt). */
enum { TG_ATTN_RANGES_OVER_GROUPS_MAX_GQA = 4 };
#define TG_ATTN_PARTIALS_BUDGET ((int64_t)1 << 30)

/* Backward, KV schedule: the q-tiles stream past a chunk of up to
 * TG_ATTN_MAX_CHUNK_TILES key tiles of a range at once (plan_chunk, which
 * sizes it to the L2), so each q-tile's Q, dO rows are loaded, and its dQ
 * rows fetched from L3 or memory, once per chunk rather than once per key
 * tile. */
enum { TG_ATTN_MAX_CHUNK_TILES = 8 };

/* Backward, KV schedule: a q unit's dQ rows take one product over the
 * chunk's key tiles it sees (dS of those tiles side by side, their K rows
 * contiguous), not one per key tile, so each block of the f32 dQ rows is
 * loaded and stored once per chunk (kernels/attention_bwd.c, bwd_dq; the
 * same bits). With the f32 GEMM at every D; on the bf16 unit (one part,
 * or two or three as mm_bf16_terms, tile by tile) from head dim
 * TG_ATTN_DQ_CHUNK_MIN_D, where the dQ rows outweigh the dS parts that now
 * wait in L2 for the product. Paired calls
 * (bench/ab_calls), medians of 7-15 pairs, backward time over one product
 * per tile: AMD EPYC (family 23, avx2, 2 threads, exact) 0.97-0.98 on 5
 * shapes D 64-256; lent Xeon (amx, bf16 mode, 2 threads) 0.93-1.00 on D
 * 128-512, but 1.03-1.12 on the D 64 and 96 causal shapes (two runs),
 * where one product per tile then took 0.90-0.97 the fused time
 * (bench/results/xeon16-amx/README.md, "dQ over the chunk"). Exact and
 * split mode's parts as mm_bf16_terms, tile by tile (the same bits): 2
 * threads, exact 0.87-0.96 on D 128 causal, 256 full (two batches), 512
 * causal, split 0.92-0.96 on D 128-512. */
enum { TG_ATTN_DQ_CHUNK_MIN_D = 128 };

/* Backward on the bf16 unit: up to this head dim (D and Dv) dK, dV are
 * summed transposed, dK^T = Q^T . dS and dV^T = dO^T . P, with dS and P
 * converted in row pairs (a third of the cost of the transposed
 * conversion dS^T, P^T need) and Q^T, dO^T made once per q-tile load
 * (kernels/attention_bwd.c; the same bits). Above it the q-tile's
 * transposes, made once per key tile at D 512 (a chunk of one tile), cost
 * more than the conversions save. Paired calls on the lent Xeon (amx,
 * bf16 inputs, 9 pairs, backward time over 2f33746's dS^T, P^T;
 * bench/results/xeon16-amx/dkv-transposed/): transposed at every D, bf16
 * mode, 2 threads, 0.905-0.947 at D 64, 0.937 at D 96, 0.906-0.911 at D
 * 128, 0.936 at D 160 (1.03 at 16 threads), 0.955-1.002 at D 256
 * (1.07-1.12 at 16), 1.076 at D 512 causal (1.13 at 16); up to D 128, 2
 * threads, 0.892-0.912 at D 64, 0.899 at D 96, 0.946-0.973 at D 128, 16
 * threads 0.937-1.002; exact mode (three parts from D 96) 0.944-0.993 at
 * 2 threads, 0.972-0.988 at 16. */
enum { TG_ATTN_DKV_T_MAX_D = 128 };

/* Forward: key tiles of up to TG_ATTN_FWD_KEY_TILES of the table's attn_bk,
 * as many as keep K^T's and V's f32 tiles within TG_ATTN_FWD_TILE_BYTES
 * (half of a 512 KiB L2; a constant, not the machine's L2, because the tile
 * sets the order of the softmax sums: kernels/attention_fwd.c, fwd_key_tile).
 * Measured on the 2-core AMD EPYC (family 23, avx2, 1 thread, f32, medians
 * of 3): 1,2,1,4096,64 causal 188 / 171 / 168 ms at 2 / 4 / 8 tiles; D 128
 * full 320 / 316 / 314 ms; D 256 full 77 / 80 / 81 ms (the rule gives it 2),
 * D 512 causal 86 / 84 / 95 ms (the rule gives it 1, not timed there).
 * Where K^T, resp. V, is packed as bf16 pairs for the bf16 unit, it counts
 * 2 bytes an element, not 4: on the lent Xeon (amx, 2 threads, 13-14
 * rotating rounds, forward time over f32-counted tiles, medians of the
 * per-round ratios; bench/results/xeon16-amx/dkv-units/) exact mode D 512
 * causal (64 -> 128 keys) 0.78, D 256 full (128 -> 256) 0.75, bf16 mode
 * D 256 full (128 -> 256) 0.91, 2048,128 causal (256 -> 512) 1.00; at 16
 * threads 0.92-1.00. */
enum { TG_ATTN_FWD_KEY_TILES = 4 };
#define TG_ATTN_FWD_TILE_BYTES ((int64_t)256 * 1024)

/* Forward: q units ((q-tile, query head) pairs of a kv head) per work item
 * (kernels/attention_fwd.c, fwd_q_tiles), which share each key tile's
 * load: K transposed or packed in pairs, V widened or packed. With one
 * q-tile per item those loads took 10-26% of the forward's time on the
 * lent Xeon (amx table, bf16 inputs, 2 and 16 threads, D 64-512; a
 * temporary cycle-counter build) and 9% on the AVX2 EPYC (family 23, D
 * 64). 2 q-tiles against 1 on the EPYC (avx2, 2 threads, bf16 inputs,
 * exact, 3 alternating rounds): 0.94-0.96x the time on 1,8,8,1024,64 full,
 * 1,8,8,2048,128 causal, 2,8,4,1024,256 full and 1,4,4,2560,160 full; 4
 * was no faster than 2 (two rounds, within noise). The units of a GQA
 * group's heads at one q-tile see the same keys, so an item takes all of
 * them (gqa units, TG_ATTN_FWD_Q_TILES at least, TG_ATTN_FWD_MAX_UNITS at
 * most): on the EPYC (paired calls, 9 pairs, exact, 2 threads) the
 * forward of 1,16,2,3072,64 causal, 1,6,2,1024,512 causal and
 * 1,16,2,2048,128 causal took 0.96-0.97x the time of 2 units an item; on
 * the lent Xeon (amx, 11 pairs, bf16 and exact mode, 2 and 16 threads)
 * gqa 3 and 8 0.93-0.97x (bench/results/xeon16-amx/README.md, "the
 * forward's GQA units"). Where Q.K^T runs on the bf16 unit the loads weigh
 * more: there an item takes as many units as keep their f32 accumulators
 * within TG_ATTN_FWD_ACC_BYTES (fewer where that leaves fewer than
 * TG_ATTN_ITEMS_PER_CPU items per thread): 0.89-0.97x the forward's time
 * of a GQA group an item on the D 64-256 shapes of the users' grid in bf16
 * mode, 0.92-0.99x in exact mode, the rest 0.99-1.09 (2-core Xeon, amx, 2
 * threads, 9 paired calls, bench/results/xeon2-amx/ab-fwd-units.txt; 8
 * units with no byte cap: 1.03-1.04x at D 512; 16 threads on the 16-core
 * Xeon: xeon16-amx/exp-split/). */
enum { TG_ATTN_FWD_Q_TILES = 2, TG_ATTN_FWD_MAX_UNITS = 8 };
#define TG_ATTN_FWD_ACC_BYTES ((int64_t)512 * 1024)

/* Forward in bf16 mode (P's bf16 part from the exp rows): a row keeps its
 * running max m while a key tile's scores stay within TG_ATTN_FWD_MAX_LAG
 * above it (P up to e^8, well inside f32 and bf16), so the tile takes one
 * pass (attn_exp_sum_lag_bf16_row) instead of a max pass and an exp pass;
 * a tile whose max passes m by more takes both, moving m. Where the max
 * does not pass m the bits are those of the two passes. The forward's time
 * with it, paired calls against the two passes: 0.91-0.97 on the users'
 * grid shapes of several key tiles on the 2-core Xeon (model 167, amx, 2
 * threads; bench/results/xeon2-amx/ab-fwd-max-lag.txt), 0.93-0.99 at 2 and
 * 16 threads on the lent 16-core one (xeon16-amx/exp-bf16-row/). */
#define TG_ATTN_FWD_MAX_LAG 8.0f

/* Backward, KV schedule, bf16 dot products: a key tile's dK += dS^T . Q and
 * dV += P^T . dO run over several q units of a work item at once (their
 * rows side by side along k), not one q-tile's BQ rows: as many units as
 * make k TG_ATTN_DKV_K bf16 rows, each P or dS part counted (bf16 mode 1,
 * split 2, exact 3 parts), at most TG_ATTN_MAX_DKV_UNITS (a work item's
 * scratch holds them); from head dim TG_ATTN_DKV_MIN_D on. Each block of
 * the f32 dK, dV tile is then loaded and stored once per product instead
 * of once per unit: at BK 128 and D 256 the tile is 128 KiB, out of L1,
 * and with k 64-128 those loads and stores bound the AMX tile GEMM (one
 * core of the lent Xeon: 690-860 GFLOP/s at k 64-128 against 1150 at
 * 256 and 2600-2800 for the tile unit alone; M 128, N 256). bf16 mode
 * gives the same bits as one unit per product; with parts, all units' hi
 * terms now come before their lo terms.
 * Lent Xeon, amx, backward step over one unit per product, medians of the
 * per-round ratios of 10 rotating rounds (bench/results/xeon16-amx/
 * dkv-units/), k 128 / 256 / 512 bf16 rows per product, 2 threads: bf16
 * mode 1,6,2,1024,512 causal 0.88 / 0.90 / 0.92, 1,8,4,1024,256 full
 * 1.00 (one unit) / 0.96 / 0.99, 1,8,8,2048,128 causal 0.94 / 0.92 / 0.93,
 * 4,16,16,512,64 causal 1.09 / 1.06 / 1.08 (hence the minimum D);
 * exact mode (three parts: k 384 / 768 / 1536) D 512 causal 0.95 / 0.99
 * / 1.10, D 256 full 0.99 / 0.97 / 1.07. */
enum { TG_ATTN_DKV_K = 256, TG_ATTN_DKV_MIN_D = 128, TG_ATTN_MAX_DKV_UNITS = 8 };

/* Backward pre-pass D = rowsum(O * dO): rows per work item. */
enum { TG_ATTN_D_ROWS_PER_GROUP = 256 };

/* --- each ISA build's blocking (isa/common/, isa/<arch>/) -------------------
 * The build is told which ISA it is by the compiler's own target macros (the
 * flags isa/isa.cmake gives each table), so a section cannot be paired with
 * the wrong instructions. Seen only by the ISA builds (TG_ISA_SUFFIX); the
 * kernels read a table's blocking from it (isa/ops.h: gemm_mr, attn_bq, ...).
 *
 *   MR x NR   register block of the GEMM core: MR rows of C, NR columns
 *             (NR a multiple of the vector width), MR * NR / width
 *             accumulators kept in registers while k runs.
 *   ATTN_BQ   attention q-tile rows, ATTN_BK key-tile rows (a multiple of
 *             NR: the packed K^T / V^T are NR-aligned panels of ATTN_BK
 *             columns). The backward's f32 working set is about
 *             (3 BQ + 5 BK) D + 2 BQ BK floats.
 *   ATTN_BQ_BF16, ATTN_BK_BF16  the tiles in bf16 precision mode on a
 *             bf16 unit (at the end of this file).
 *   BF16_MR (x BF16_NR)  register block of the bf16 dot GEMM.
 *   PF_AHEAD  prefetch distance of the streaming row ops.
 *   LANES     partial sums of the row reductions. Fixed at 16 for every ISA:
 *             the summation order of every row op is then the same on every
 *             ISA, so the memory-bound kernels give the same bits whichever
 *             table runs (their tests check it).
 */
#if defined(TG_ISA_SUFFIX)
enum { LANES = 16 };

#if defined(__AVX512F__)
/* (Also the avx512bf16 and amx builds: their f32 GEMMs and rows are
 * avx512's, so is their blocking for now; the amx table's tile GEMM blocks
 * C by 32 x 32 itself, isa/x86/amx.c.)
 * 32 zmm: an 8 x 32 block is 16 accumulators + 2 B vectors + broadcasts.
 * 8 x 32 vs 8 x 16 / 4 x 32 at 1 thread, L = 1024 (Xeon, AVX-512): D = 64
 * 123 -> 157, D = 256 85 -> 164 GFLOP/s. */
enum { MR = 8, NR = 32, ATTN_BQ = 64, ATTN_BK = 64 };
/* Smaller backward tiles where D is large (the f32 working set of a 64 x 64
 * pair at D 512 is ~1 MiB) did not pay: lent Xeon, amx table, exact mode,
 * step time over 64 x 64's, medians of 3 rotating rounds (bench/results/
 * xeon16-amx/bwd-tiles-by-d/): BQ x BK 64 x 32, 32 x 32, 32 x 64 at 1
 * thread D 256 full 1.26 / 1.27 / 1.21, D 512 causal 1.01 / 1.29 / 1.15,
 * D 512 full 1.01 / 1.36 / 1.85; at 16 threads 0.85 / 1.00 / 0.91, 0.94 /
 * 1.05 / 1.01, 1.02 / 1.17 / 1.16. 64 x 64 stays at every D.
 * k-blocking of the f32 GEMM (BLIS's KC: the k loop in chunks of KC, the
 * chunk's B panel kept in L1 across the row blocks; the same bits) did not
 * pay either: avx512 table, all five products in f32, step and forward
 * time with KC 64 or 128 over none, 2 rotating rounds (bench/results/
 * xeon16-amx/README.md, "Three parts in one call"): 0.82-0.95 at 1 thread
 * on the D 256 (two heads) and D 512 backward and the D 512 forward, but
 * 1.03-1.14 on D 128 and 1,8,4,1024,256, and 0.93-1.25 at 16 threads; on
 * the AVX2 EPYC, where the 1-thread step runs at 66-76% of the FMA peak
 * from D 64 to 512, KC 64-256 was within noise. */

#elif defined(__AVX2__) && defined(__FMA__)
/* 16 ymm: a 6 x 16 block is 12 accumulators + 2 B vectors + 1 broadcast
 * (the BLIS Haswell shape): per k, 8 loads feed 12 FMAs, so the FMA ports
 * and not the load ports bound it. The 8 x 32 block of AVX-512 needs 32
 * ymm accumulators and spills (22-31% of a Zen 3's FMA peak, measured).
 * Tiles of 48 rows are whole 6-row blocks and 16-column panels; with 64-row
 * tiles one block in 11 is a 4-row edge. 48 vs 64 on the FA-2 backward step
 * (Zen 5, avx2 table, 2 threads, 8 bench shapes, alternating): 48 faster by
 * 0-5% on every shape. */
enum { MR = 6, NR = 16, ATTN_BQ = 48, ATTN_BK = 48 };

#elif defined(__aarch64__) && defined(TG_ISA_WITH_NEON)
/* NEON (the neon and neonbf16 tables): 32 q registers of 4 floats. A 6 x 16
 * block is 24 accumulators + 4 B vectors + the A values (by-element FMLA
 * takes them from lanes of 2 registers): 30 of 32. 8 x 12 (24 + 3 + 2) is
 * the other fit, but its 12-column panels do not divide the head dims
 * (64, 128, 256: D is the N of O = P.V, dQ = dS.K, dK = dS^T.Q and
 * dV = P^T.dO), and the 4 or 8 columns left over would run block_edge's
 * row-at-a-time loop. Tiles
 * of 48 rows are whole 6-row blocks and three 16-column panels (the shape
 * avx2 measured best with the same block). Chosen by register count, not
 * measured: nothing here has run on an aarch64 machine, only under qemu
 * (docs/AARCH64.md says what to measure). */
enum { MR = 6, NR = 16, ATTN_BQ = 48, ATTN_BK = 48 };

#else
/* Portable: the target's baseline (SSE2 on x86-64, 16 xmm): 4 x 8 is 8
 * accumulators of 4 floats, leaving room for the B vectors and the
 * broadcast (chosen by register count, not tuned: the portable table is the
 * reference; 59-72% of the SSE2 FMA peak on the FA-2 step, Zen 5). */
enum { MR = 4, NR = 8, ATTN_BQ = 64, ATTN_BK = 64 };
#endif

/* ATTN_BQ_BF16 x ATTN_BK_BF16: the tiles when all five attention products
 * run on the bf16 unit (bf16 precision mode with bf16 inputs: tg_attn_bq,
 * tg_attn_bk; the q tile only where not causal). The amx table doubles
 * both. In the KV schedule every key tile is one more pass of
 * read-modify-write over its heads' dQ rows (out of L2: 2 MiB at gqa 2,
 * qL 1024, D 256), and one key range in MIN_RANGE_TILES key tiles more dQ
 * partials; 128 keys halve both. 128 q rows halve the loads and stores of
 * the tile GEMM's f32 dK, dV tiles per product; under causality they would
 * compute twice the masked scores on the diagonal, so causal keeps 64.
 * Lent Xeon, bf16 mode, the 4 vs_torch shapes, step time, medians of the
 * per-round ratios of paired runs in one binary (bench/results/xeon16-
 * amx/tiles/): 128 q rows on top of 64 x 64: 2,8,4,1024,256 full 0.88
 * and 0.89 at 2 threads, 0.98 and 0.94 at 16; 2048,128 causal 1.04 at 2
 * threads. Then 128 keys on top of that (9 rounds): 0.82 / 0.82 / 0.87 /
 * 0.99 at 2 threads, 1.00 / 0.96 / 1.00 / 0.85 at 16 (1024,64 full;
 * 2048,128 causal; 1024,256 full; 512,64 causal). Single pairs ranged
 * 0.45-1.50 on that lease. Split and exact mode with 64 x 128 or 128 x 128
 * (7 rounds): 0.86-1.17x, no consistent sign; they keep the tiles above.
 * So does the avx512bf16 table: on Zen 5 (vdpbf16ps, 1 and 2 threads, 6
 * rounds, bench/results/zen5/paired-bf16-tiles-avx512bf16.*) 128 keys gave
 * 0.96-1.03x and 128 x 128 0.96-1.03x, the causal 512 shape slower in both.
 * neonbf16 is unmeasured (no aarch64 machine); the rest have no bf16 unit. */
#if defined(TG_ISA_WITH_AMX)
enum { ATTN_BQ_BF16 = 128, ATTN_BK_BF16 = 128 };
#else
enum { ATTN_BQ_BF16 = ATTN_BQ, ATTN_BK_BF16 = ATTN_BK };
#endif
/* EXACT_PARTS_MIN_D_FWD, _BWD: from this head dim D on, exact mode with
 * bf16 inputs runs the products that take P or dS on the bf16 unit too, in
 * the forward (O += P.V), resp. the backward (dQ, dK, dV), each f32 operand
 * as three bf16 parts (hi + lo + lo2 = x exactly: f32_to_bf16_split), so
 * only the order and rounding of the f32 sums differ from the f32 GEMM
 * (docs/KERNELS.md, precision modes); the forward's P takes split mode's
 * two (kernels/attention.h, tg_attn_parts), and the forward's figures
 * below were taken with three, which cost more. 0: never (the f32 FMA
 * GEMM). The amx table, on the lent Xeon (16 cores; the forward's and the backward step's
 * times with three parts over those with the f32 GEMM, medians of 4
 * rotating rounds, bench/results/xeon16-amx/README.md, "Exact mode on
 * AMX, and the forward's key tiles"): forward at 16 / 2 threads D 64 1.00-1.10 / 1.07, D 128 0.88 /
 * 0.93, D 256 0.86 / 0.85, D 512 0.80 / 0.84; backward step D 64
 * 0.94-1.17 / 1.13, D 128 0.98 / 1.30, D 256 0.83 / 0.84, D 512 0.78 /
 * 0.81. Since the parts run in one call (mm_bf16_terms: each block of C
 * loaded and stored once, not once per part), the backward gains from D
 * 128 too: step time with three parts from D 128 over from D 256, paired
 * in each of 5 rotating rounds, medians (bench/results/xeon16-amx/
 * README.md, "Three parts in one call"): D 128 causal 0.82 / 0.87, D 128
 * full (L 384) 0.92 / 0.86, D 160 full 0.83 / 0.76 at 16 / 2 threads;
 * from D 64 on, both passes, the D 64 step was 0.85-1.04 / 1.04-1.24 and
 * the D 64 forward 0.97-1.06 / 0.91-1.11: no gain below 128. Three passes
 * of small tile products and the parts' packing cost more than they save
 * below that. D 96 was not measured then; measured later, the backward
 * gains from D 96: from D 64 over from D 128, paired calls,
 * 13 pairs (bench/results/xeon16-amx/dq-chunk/ab-exact-parts-from-64.txt):
 * 1,8,8,2048,96 causal 0.914 / 0.921 at 2 / 16 threads, but D 64 1.04-1.15
 * at 2 threads (1,8,8,1024,64 full, 4,16,16,512,64 and 1,16,2,3072,64
 * causal); so the backward from 96. Measured again after the dK, dV
 * transposed sums (up to D 128) and the AVX-512 exp, on a 2-core Xeon of
 * the same model (paired calls, 9 pairs, bench/results/xeon2-amx/
 * ab-exact-parts-from-8-vs-from-96-128.txt, two runs): from D 64 the
 * backward takes 0.79-0.84x and the forward 0.88-0.93x the time at D 64,
 * the forward 0.83-0.85x at D 96; at D 32 both lose (1.08-1.18x). So both
 * passes from 64. With the forward's two parts (lent Xeon, paired calls,
 * 9 pairs at 16 threads and 7 at 2, bench/results/xeon16-amx/paired-calls/
 * exact-fwd-two-parts.txt, second set): from D 8 against from D 64, the
 * forward took 0.86-0.92x the time at D 32, 0.80-0.84x at D 48 and 0.78x
 * at D 56, at D 16 0.97-1.03x; so the forward from 32.
 * The avx512bf16 table keeps the FMA GEMM at every D: three parts on its
 * vdpbf16ps took 2.1-3.7x the backward's and 2.0-3.2x the forward's time
 * (lent Xeon, D 64-512, 2 and 16 threads, 3 rounds), where vdpbf16ps
 * peaks at half the FMA rate: three bf16 products per f32 product at half
 * the rate cannot win (where vdpbf16ps reached twice the FMA's FLOP rate,
 * three parts would still take 1.5x the FMA GEMM's instructions). On
 * Zen 5 (2-core EPYC, family 26), whose vdpbf16ps does run at twice the
 * FMA's FLOP rate (877 against 463 GFLOP/s at 2 threads), three parts from
 * D 8 took 1.26-1.51x the backward's and 1.18-1.39x the forward's time
 * (D 64-512, full and causal, 9 paired calls at 2 threads, 5 at 1:
 * bench/results/zen5/ab-exact-parts-avx512bf16.txt): the FMA GEMM stays. */
#if defined(TG_ISA_WITH_AMX)
enum { EXACT_PARTS_MIN_D_FWD = 32, EXACT_PARTS_MIN_D_BWD = 64 };
#else
enum { EXACT_PARTS_MIN_D_FWD = 0, EXACT_PARTS_MIN_D_BWD = 0 };
#endif
_Static_assert((int)ATTN_BQ <= (int)TG_ATTN_MAX_TILE && (int)ATTN_BK <= (int)TG_ATTN_MAX_TILE &&
                   (int)ATTN_BQ_BF16 <= (int)TG_ATTN_MAX_TILE &&
                   (int)ATTN_BK_BF16 <= (int)TG_ATTN_MAX_TILE,
               "the attention tiles fit the kernels' TG_ATTN_MAX_TILE rows");

/* The bf16 dot GEMM's register block. x86/bf16_dot.c (AVX512_BF16):
 * BF16_MR rows x 32 columns (two zmm): 16 accumulators, 2 B vectors and one
 * broadcast of 32 zmm. arm/bf16_mmla.c (FEAT_BF16): BF16_MR x BF16_NR, 4 x 4
 * BFMMLA tiles of 2 x 2: 16 accumulators, 4 B vectors and an A vector per
 * row pair. Both name their 8 rows in code (a static assert each). */
enum { BF16_MR = 8, BF16_NR = 8 };

/* Streaming row ops (common/row_ops.c) prefetch PF_AHEAD floats (2 KiB)
 * ahead, one line per 16 floats: one thread walking one row at a time
 * otherwise leans on the L2 streamer alone, which stops at every 4 KiB page
 * and keeps too few misses in flight to reach the bandwidth a multi-stream
 * triad gets. A prefetch never faults, so running past the end of a row is
 * harmless. */
enum { PF_AHEAD = 512 };
#endif /* TG_ISA_SUFFIX */

#endif /* TG_ISA_TUNING_H */
