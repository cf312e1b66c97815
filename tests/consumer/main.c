/* Uses an installed tilegrad: the version, a context, one kernel. Exits
 * non-zero with a message on any mismatch (tests/consumer/check.sh). */
#include <stdio.h>
#include <string.h>

#include <tilegrad.h>

int main(void) {
  if (strcmp(tg_version(), TG_VERSION) != 0) {
    fprintf(stderr, "consumer: library %s, header %s\n", tg_version(), TG_VERSION);
    return 1;
  }
  tg_ctx *ctx = NULL;
  tg_status st = tg_ctx_create(&ctx);
  if (st != TG_OK) {
    fprintf(stderr, "consumer: tg_ctx_create: %s\n", tg_status_str(st));
    return 1;
  }
  /* exact in bf16, a round-to-nearest-even tie, +-Inf */
  const float src[5] = {1.0f, -2.5f, 1.00390625f, 1.0f / 0.0f, -1.0f / 0.0f};
  const tg_bf16 want[5] = {0x3F80, 0xC020, 0x3F80, 0x7F80, 0xFF80};
  tg_bf16 dst[5] = {0};
  st = tg_f32_to_bf16_cast(ctx, src, dst, 5);
  int bad = st != TG_OK;
  if (bad) fprintf(stderr, "consumer: tg_f32_to_bf16_cast: %s\n", tg_ctx_last_error(ctx));
  for (int i = 0; !bad && i < 5; i++)
    if (dst[i] != want[i]) {
      fprintf(stderr, "consumer: dst[%d] = 0x%04X, want 0x%04X\n", i, dst[i], want[i]);
      bad = 1;
    }
  tg_ctx_destroy(ctx);
  if (!bad) printf("consumer: tilegrad %s, tg_f32_to_bf16_cast ok\n", tg_version());
  return bad;
}
