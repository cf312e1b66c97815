/*
 * `tilegrad run`'s command line for the attention variants (cli/run_args.c
 * through tg_cli_run_check_args, which touches no file), the CLI sources
 * compiled into this test directly like test_cli_npy.c.
 *
 * Covers: --window W, --sinks FILE and --v-head-dim Dv, in both spellings
 * ("--opt v", "--opt=v"), are the params window / v_head_dim and the input
 * sinks of the FA-2 forward and backward; refused with exit 2 and a message
 * naming the option: on a kernel without them, with no value, a bad number
 * (named as typed, not as the param), given twice (also once as the option
 * and once as --param / --in), d_sinks on the forward. The help lists them.
 * The checks that need the files (Dv against V's columns, d_sinks without
 * sinks, sinks' shape) are tests/cli_run_check.py's.
 */
#define _XOPEN_SOURCE 700 /* before any header, as in every CLI file */
#include "../cli/isa_names.c"
#include "../cli/npy.c"
#include "../cli/num.c"
#include "../cli/outfile.c"
#include "../cli/run.c"
#include "../cli/run_args.c"
#include "../cli/run_help.c"
#include "../cli/run_kernels.c"
#include "../cli/run_shapes.c"

#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define MAX_ARGV 24

/* tg_cli_run_check_args on "run" + the NULL-terminated words; the message
 * goes to msg. */
static int check_args(char *msg, size_t msglen, const char *first, ...) {
  char *argv[MAX_ARGV];
  int argc = 0;
  argv[argc++] = "run";
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a && argc < MAX_ARGV - 1; a = va_arg(ap, const char *))
    argv[argc++] = (char *)a;
  va_end(ap);
  argv[argc] = NULL;
  return tg_cli_run_check_args(argc, argv, msg, msglen);
}

/* Refused with exit 2 and a message holding every one of the words. */
#define EXPECT_REFUSED(words, ...)                                                 \
  do {                                                                             \
    char msg_[1024];                                                               \
    const int rc_ = check_args(msg_, sizeof msg_, __VA_ARGS__, (const char *)NULL); \
    if (rc_ != RUN_EXIT_USAGE) fail_msg("exit %d, want 2 (message '%s')", rc_, msg_); \
    for (const char *const *w_ = (words); *w_; w_++)                               \
      if (!strstr(msg_, *w_)) fail_msg("message '%s' lacks '%s'", msg_, *w_);      \
  } while (0)

#define EXPECT_OK(...)                                                             \
  do {                                                                             \
    char msg_[1024];                                                               \
    const int rc_ = check_args(msg_, sizeof msg_, __VA_ARGS__, (const char *)NULL); \
    if (rc_ != RUN_EXIT_OK) fail_msg("exit %d, want 0: '%s'", rc_, msg_);          \
  } while (0)

#define FWD "flash_attn_train_fwd_bf16"
#define BWD "flash_attn_train_bwd_bf16"

static void test_options_accepted(void **state) {
  (void)state;
  EXPECT_OK(FWD, "--out", "O=o.npy", "--window", "16", "--sinks", "s.npy", "--v-head-dim",
            "64");
  EXPECT_OK(FWD, "--out", "O=o.npy", "--window=16", "--sinks=s.npy", "--v-head-dim=64");
  EXPECT_OK(BWD, "--out", "dQ=q.npy", "--out", "d_sinks=ds.npy", "--window", "0", "--sinks",
            "s.npy");
  /* the params themselves, as --param: the same thing */
  EXPECT_OK(BWD, "--out", "dV=v.npy", "--param", "window=4294967295", "--param",
            "v_head_dim=512", "--in", "sinks=s.npy");
}

static void test_not_on_other_kernels(void **state) {
  (void)state;
  static const char *const window[] = {"--window", "has no sliding window", FWD, NULL};
  EXPECT_REFUSED(window, "flash_attn_train_bwd_compute_d_bf16", "--out", "D_out=d.npy",
                 "--window", "4");
  static const char *const sinks[] = {"--sinks", "transpose_2d has no attention sinks", NULL};
  EXPECT_REFUSED(sinks, "transpose_2d", "--out", "output=y.npy", "--sinks", "s.npy");
  static const char *const dv[] = {"--v-head-dim", "has no value head dim", NULL};
  EXPECT_REFUSED(dv, "softmax_backward", "--out", "grad_in=g.npy", "--v-head-dim", "8");
  /* the forward has no sinks gradient */
  static const char *const dsinks[] = {"--out d_sinks: no such buffer", NULL};
  EXPECT_REFUSED(dsinks, FWD, "--out", "O=o.npy", "--out", "d_sinks=ds.npy");
}

static void test_values_refused(void **state) {
  (void)state;
  static const char *const missing[] = {"--window needs a value", NULL};
  EXPECT_REFUSED(missing, FWD, "--out", "O=o.npy", "--window");
  EXPECT_REFUSED(missing, FWD, "--out", "O=o.npy", "--window=");
  static const char *const sinks_missing[] = {"--sinks needs a value", NULL};
  EXPECT_REFUSED(sinks_missing, FWD, "--out", "O=o.npy", "--sinks=");
  /* numbers are named as typed: the option, not the param */
  static const char *const neg[] = {"--window -1", "out of range", NULL};
  EXPECT_REFUSED(neg, FWD, "--out", "O=o.npy", "--window", "-1");
  static const char *const big[] = {"--window 4294967296", "out of range", NULL};
  EXPECT_REFUSED(big, FWD, "--out", "O=o.npy", "--window=4294967296");
  static const char *const text[] = {"--v-head-dim 1x", NULL};
  EXPECT_REFUSED(text, FWD, "--out", "O=o.npy", "--v-head-dim", "1x");
  static const char *const octal[] = {"--v-head-dim 064", "leading zero", NULL};
  EXPECT_REFUSED(octal, BWD, "--out", "dQ=q.npy", "--v-head-dim", "064");
  static const char *const as_param[] = {"--param window=abc", NULL};
  EXPECT_REFUSED(as_param, FWD, "--out", "O=o.npy", "--param", "window=abc");
}

static void test_given_twice(void **state) {
  (void)state;
  static const char *const twice[] = {"--window given twice (it is --param window)", NULL};
  EXPECT_REFUSED(twice, FWD, "--out", "O=o.npy", "--window", "4", "--window", "4");
  EXPECT_REFUSED(twice, FWD, "--out", "O=o.npy", "--window", "4", "--param", "window=4");
  EXPECT_REFUSED(twice, FWD, "--out", "O=o.npy", "--param", "window=4", "--window", "4");
  static const char *const dv[] = {"--v-head-dim given twice (it is --param v_head_dim)", NULL};
  EXPECT_REFUSED(dv, BWD, "--out", "dQ=q.npy", "--v-head-dim", "8", "--v-head-dim", "16");
  static const char *const param[] = {"--param window given twice", NULL};
  EXPECT_REFUSED(param, FWD, "--out", "O=o.npy", "--param", "window=1", "--param",
                 "window=2");
  static const char *const sinks[] = {"--in sinks given twice (--sinks is --in sinks)", NULL};
  EXPECT_REFUSED(sinks, FWD, "--out", "O=o.npy", "--sinks", "a.npy", "--in", "sinks=b.npy");
}

static void test_help_lists_the_options(void **state) {
  (void)state;
  FILE *f = tmpfile();
  assert_non_null(f);
  assert_int_equal(tg_cli_run_help(f, NULL), 0);
  const long n = ftell(f);
  rewind(f);
  char *text = calloc(1, (size_t)n + 1);
  assert_non_null(text);
  assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  static const char *const words[] = {
      "[--window W] [--sinks FILE] [--v-head-dim Dv]", "--out d_sinks=FILE",
      "[B,H_kv,kL,Dv]", "d_sinks", "param window", "param v_head_dim"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (!strstr(text, words[i])) fail_msg("run --help lacks '%s'", words[i]);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_options_accepted),
      cmocka_unit_test(test_not_on_other_kernels),
      cmocka_unit_test(test_values_refused),
      cmocka_unit_test(test_given_twice),
      cmocka_unit_test(test_help_lists_the_options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
