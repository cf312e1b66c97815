/*
 * tilegrad test hooks: for the project's own tests (tests/test_hardening.c,
 * the attention suites) and its bench (bench/bench.c reads
 * tg_testing_attn_bf16_parts for the step's ceiling).
 * NOT part of the API: no ABI or behaviour promise, may change or go away in
 * any release (the Python package ships tilegrad.h only). libtilegrad
 * exports these symbols so that a test linked against the shared library
 * can reach them.
 *
 * Allocation failure. Every allocation libtilegrad makes (contexts, scratch,
 * workspace, per-call buffers) goes through one function, which counts its
 * calls while the hook is armed and returns NULL for the chosen one: a test
 * fails allocation k = 0, 1, 2, ... of a call in turn and checks that each
 * gives TG_ERR_NO_MEMORY with nothing written. The counters are atomic
 * (allocations may come from OpenMP threads). OpenMP's own allocations
 * (libgomp's thread pool) are not the library's and are not counted.
 */
#ifndef TILEGRAD_TESTING_H
#define TILEGRAD_TESTING_H

#include "tilegrad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arms the hook: library allocations are counted from 0 on, and the one
 * numbered fail_at returns NULL (fail_at < 0: none; count only). */
void tg_testing_alloc_arm(long long fail_at);

/* Disarms the hook. Returns how many library allocations were made since
 * the arm; *failed (if not NULL) gets 1 if allocation fail_at was refused. */
long long tg_testing_alloc_disarm(int *failed);

/* Work plans as if tg_plan_cpus() gave n (n >= 1); n <= 0 restores the
 * machine's count. The suites plan for a fixed count so that the KV
 * schedule's several key ranges run whatever CPU count the test machine
 * has. Set it between calls, not while one runs. */
void tg_testing_plan_cpus(int n);

/* Work plans as if this machine's L2 per CPU were `bytes` (>= 0; 0: as
 * small as can be); bytes < 0 restores the machine's. The suites use it to
 * run the FA-2 backward's key-tile chunks (kernels/attention_bwd.c) at one
 * tile and at several. Set it between calls, not while one runs. */
void tg_testing_plan_l2_bytes(long long bytes);

/* The FA-2 backward's KV schedule as if its plan took `units` q units per
 * dK, dV product (1..8) wherever all its products run on the bf16 unit,
 * whatever the head dim; units <= 0 restores the plan's own
 * (kernels/attention_bwd.c, plan_dkv_units). The suites use it to check
 * that bf16 mode's bits do not depend on it. Set it between calls, not
 * while one runs. */
void tg_testing_attn_dkv_units(int units);

/* The FA-2 backward as if its plan summed dK, dV transposed (dK^T = Q^T .
 * dS, dV^T = dO^T . P) at every head dim (mode > 0) or at none (mode 0)
 * wherever all its products run on the bf16 unit; mode < 0 restores the
 * plan's own (up to TG_ATTN_DKV_T_MAX_D, isa/tuning.h). The suites use it
 * to check that the bits do not depend on it. Set it between calls, not
 * while one runs. */
void tg_testing_attn_dkv_transposed(int mode);

/* The attention as if every table with bf16 dot products stepped its k
 * by `step` (even, > 0): S's and dP's K then padded to it in the
 * kernels' own copies where D or Dv is above it and no multiple of it, as
 * on the amx table (its tile step, 32); step <= 0 restores each table's
 * own (kernels/attention.h, tg_attn_k_padded). The suites use it to run
 * the padded path on tables other than amx. Set it between calls, not
 * while one runs. */
void tg_testing_attn_k_step(int step);

/* How the attention's products that take P or dS (O += P.V; dQ, dK, dV)
 * run with bf16 inputs of head dim D on table `isa` in `precision` mode,
 * in the forward (backward = 0) or the backward: the number of bf16 parts
 * each P or dS operand is split into on the table's bf16 dot unit (1 bf16
 * mode, 2 split, 3 exact; the unit flushes subnormal parts to zero), or 0
 * where they run on the f32 GEMM. -1: no such table in this build. The
 * suites' f64 references size their bounds by it. */
int tg_testing_attn_bf16_parts(tg_isa isa, tg_attn_precision precision, int D, int backward);

#ifdef __cplusplus
}
#endif
#endif /* TILEGRAD_TESTING_H */
