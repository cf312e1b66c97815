/*
 * Proves the race check can see races: the engine's own dispatch (tg_dispatch,
 * OpenMP dynamic loop) running a group function that adds into one shared
 * float without synchronisation must make ThreadSanitizer report a data race;
 * the same adds through tg_add_f32(..., atomic = 1) -- the library's mapping of
 * Metal's atomic_fetch_add -- and per-group owned outputs must not.
 *
 *   race_canary racy     -> TSan reports (scripts/race_check.sh expects exit 66)
 *   race_canary atomic   -> clean, exit 0
 *   race_canary owned    -> clean, exit 0
 */
#include <stdio.h>
#include <string.h>

#include "engine.h"

typedef struct {
  float *shared, *owned;
  int mode; /* 0 racy, 1 atomic, 2 owned */
} canary_args;

static void group(const void *vargs, int64_t x, int64_t y, int64_t z, void *scratch) {
  const canary_args *a = vargs;
  const float one = 1.0f;
  /* ~0.1 ms of work per group, so every thread takes groups (TSan sees only
   * accesses that really happen on two threads) */
  for (volatile int spin = 0; spin < 20000; spin++) {
  }
  for (int rep = 0; rep < 64; rep++) {
    if (a->mode == 0) a->shared[0] += one; /* the deliberate race */
    if (a->mode == 1) tg_add_f32(a->shared, &one, 1, 1);
    if (a->mode == 2) a->owned[x] += one;
  }
}

int main(int argc, char **argv) {
  const int mode = argc > 1 && !strcmp(argv[1], "atomic") ? 1
                   : argc > 1 && !strcmp(argv[1], "owned") ? 2
                                                           : 0;
  tg_ctx *ctx;
  if (tg_ctx_create(&ctx) != TG_OK || tg_ctx_set_threads(ctx, 3) != TG_OK) return 2;
  float shared = 0.0f, owned[256] = {0};
  canary_args a = {&shared, owned, mode};
  if (tg_dispatch(ctx, 256, 1, 1, 0, group, &a) != TG_OK) return 2;
  printf("race_canary %s: shared = %g\n", mode == 0 ? "racy" : mode == 1 ? "atomic" : "owned",
         (double)shared);
  tg_ctx_destroy(ctx);
  return 0;
}
