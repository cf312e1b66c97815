/*
 * The CLI's number parser (cli/num.c) and all-or-nothing outputs
 * (cli/outfile.c), compiled into this test directly like test_cli_npy.c.
 *
 * Numbers: decimal only (octal-looking leading zeros, hex, blanks, junk,
 * empty refused), ranges, float32 overflow and underflow (zero or subnormal).
 * Outputs: a commit replaces every target and keeps an existing file's mode;
 * a write failure (file-size limit) and a failing rename change no target
 * (the ones already renamed are put back) and leave no temporary; the checks
 * made before computing (missing directory, a file as directory, directory
 * or device or dangling link at the path, two outputs on one file through
 * ./, a symlink or a hard link); a symlink is written through; SIGTERM while
 * temporaries are open removes them and kills with SIGTERM.
 */
#define _XOPEN_SOURCE 700 /* before any header: mkdtemp, symlink, link, fork */
#include "../cli/num.c"
#include "../cli/outfile.c"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define NPY_ERR_LEN_T (3 * 4096 + 1024) /* as cli/npy.h's NPY_ERR_LEN */

/* --- numbers ----------------------------------------------------------------- */
static void expect_int_refused(const char *text, int64_t lo, int64_t hi, const char *why) {
  char err[512] = "";
  int64_t v = 12345;
  if (tg_num_int("--param n=X", text, lo, hi, &v, err, sizeof err) != -1)
    fail_msg("'%s' accepted as %lld", text, (long long)v);
  assert_int_equal(v, 12345); /* untouched */
  if (!strstr(err, "--param n=X") || !strstr(err, why))
    fail_msg("'%s': message '%s' lacks the label or '%s'", text, err, why);
}

static void test_int_decimal_only(void **state) {
  (void)state;
  int64_t v;
  char err[512];
  const struct { const char *t; int64_t want; } ok[] = {
      {"0", 0}, {"-0", 0}, {"7", 7}, {"+7", 7}, {"-2147483648", INT32_MIN},
      {"4294967295", UINT32_MAX}, {"10", 10}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    if (tg_num_int("x", ok[i].t, INT32_MIN, UINT32_MAX, &v, err, sizeof err))
      fail_msg("'%s' refused: %s", ok[i].t, err);
    assert_int_equal(v, ok[i].want);
  }
  expect_int_refused("010", 0, 100, "leading zero");
  expect_int_refused("-010", -100, 100, "leading zero");
  expect_int_refused("00", 0, 100, "leading zero");
  expect_int_refused("0x10", 0, 100, "hexadecimal");
  expect_int_refused("0X1f", 0, 100, "hexadecimal");
  expect_int_refused("", 0, 100, "empty");
  expect_int_refused(" 5", 0, 100, "blank");
  expect_int_refused("5 ", 0, 100, "blank");
  expect_int_refused("5x", 0, 100, "not a decimal integer");
  expect_int_refused("1e3", 0, 10000, "not a decimal integer");
  expect_int_refused("1.0", 0, 100, "not a decimal integer");
  expect_int_refused("-", 0, 100, "not a decimal integer");
  expect_int_refused("101", 0, 100, "out of range [0, 100]");
  expect_int_refused("-1", 0, 100, "out of range");
  expect_int_refused("99999999999999999999", 0, 100, "out of range");
  expect_int_refused("-99999999999999999999", -100, 100, "out of range");
}

static void expect_float_refused(const char *text, const char *why) {
  char err[512] = "";
  double v = 42.0;
  if (tg_num_float("--param scale=X", text, &v, err, sizeof err) != -1)
    fail_msg("'%s' accepted as %g", text, v);
  assert_true(v == 42.0);
  if (!strstr(err, "--param scale=X") || !strstr(err, why))
    fail_msg("'%s': message '%s' lacks the label or '%s'", text, err, why);
}

static void test_float_decimal_finite_normal(void **state) {
  (void)state;
  double v;
  char err[512];
  const struct { const char *t; double want; } ok[] = {
      {"0", 0.0}, {"-0.0", -0.0}, {"0.125", 0.125}, {".5", 0.5}, {"5.", 5.0},
      {"1e-3", (double)1e-3f}, {"1E+2", 100.0}, {"-2.5e1", -25.0}, {"0e-999", 0.0},
      {"1.1754944e-38", (double)FLT_MIN}, {"3.4028235e38", (double)FLT_MAX}, {"0010", 10.0}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    if (tg_num_float("x", ok[i].t, &v, err, sizeof err)) fail_msg("'%s' refused: %s", ok[i].t, err);
    if (v != ok[i].want) fail_msg("'%s' -> %.9g, want %.9g", ok[i].t, v, ok[i].want);
  }
  expect_float_refused("1e-50", "underflows");
  expect_float_refused("1e-50", "as 0");
  expect_float_refused("1e-40", "subnormal");
  expect_float_refused("-1e-45", "underflow");
  expect_float_refused("1e-400", "underflow");
  expect_float_refused("1e39", "out of range");
  expect_float_refused("-1e400", "out of range");
  expect_float_refused("0x1p-3", "hexadecimal");
  expect_float_refused("inf", "not a finite number");
  expect_float_refused("-nan", "not a finite number");
  expect_float_refused("", "empty");
  expect_float_refused(" 1", "blank");
  expect_float_refused("1e", "not a decimal number");
  expect_float_refused("1e+", "not a decimal number");
  expect_float_refused("1.5f", "not a decimal number");
  expect_float_refused(".", "not a decimal number");
  expect_float_refused("e5", "not a decimal number");
  expect_float_refused("1..2", "not a decimal number");
}

/* A long value is shortened in the label, so the reason always fits. */
static void test_label_shortens_long_values(void **state) {
  (void)state;
  char big[5000], label[TG_NUM_LABEL_LEN], err[512];
  memset(big, '7', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  tg_num_label(label, sizeof label, "--param count", '=', big);
  assert_non_null(strstr(label, "...(4999 chars)"));
  int64_t v;
  assert_int_equal(tg_num_int(label, big, 0, 10, &v, err, sizeof err), -1);
  assert_non_null(strstr(err, "out of range"));
  tg_num_label(label, sizeof label, "--threads", ' ', "12");
  assert_string_equal(label, "--threads 12");
}

/* --- outputs ------------------------------------------------------------------- */
static char g_dir[256];

static int setup_dir(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/tg_outfile_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *P(const char *name) { /* g_dir/name, 4 rotating buffers */
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
  return buf[k];
}

static void put(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static void expect_content(const char *path, const char *text) {
  char buf[256] = "";
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("%s: missing", path);
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  if (strcmp(buf, text)) fail_msg("%s holds '%s', want '%s'", path, buf, text);
}

/* Number of entries of g_dir whose name holds ".tmp-" (our temporaries). */
static int temporaries(void) {
  DIR *d = opendir(g_dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp-") != NULL;
  closedir(d);
  return n;
}

static void test_commit_replaces_all_keeps_mode(void **state) {
  (void)state;
  put(P("a"), "old a");
  chmod(P("a"), 0640);
  tg_outset s;
  char err[NPY_ERR_LEN_T];
  tg_outset_init(&s);
  assert_int_equal(tg_outset_add(&s, "--out a", P("a"), err, sizeof err), 0);
  assert_int_equal(tg_outset_add(&s, "--out b", P("b"), err, sizeof err), 1);
  assert_int_equal(temporaries(), 0); /* the probe is gone again */
  fputs("new a", tg_outset_open(&s, 0, err, sizeof err));
  fputs("new b", tg_outset_open(&s, 1, err, sizeof err));
  assert_int_equal(temporaries(), 2);
  expect_content(P("a"), "old a"); /* nothing replaced before the commit */
  if (tg_outset_commit(&s, err, sizeof err)) fail_msg("%s", err);
  expect_content(P("a"), "new a");
  expect_content(P("b"), "new b");
  struct stat st;
  assert_int_equal(stat(P("a"), &st), 0);
  assert_int_equal(st.st_mode & 0777, 0640);
  assert_int_equal(temporaries(), 0);
  tg_outset_discard(&s); /* nothing left to do: harmless */
  expect_content(P("a"), "new a");
}

/* ulimit -f hit while writing: the earlier file stays, no temporary. In a
 * child, as the limit and SIGXFSZ's disposition are process-wide. */
static void test_write_error_changes_nothing(void **state) {
  (void)state;
  put(P("keep"), "earlier results");
  fflush(NULL);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    tg_out_signals_install(); /* SIGXFSZ ignored: write fails with EFBIG */
    const struct rlimit lim = {1000, 1000};
    setrlimit(RLIMIT_FSIZE, &lim);
    tg_outset s;
    char err[NPY_ERR_LEN_T];
    tg_outset_init(&s);
    if (tg_outset_add(&s, "--out x", P("keep"), err, sizeof err) != 0) _exit(10);
    FILE *f = tg_outset_open(&s, 0, err, sizeof err);
    if (!f) _exit(11);
    for (int i = 0; i < 5000; i++) fputc('z', f);
    if (tg_outset_commit(&s, err, sizeof err) != -1) _exit(12);
    if (!strstr(err, "File too large") || !strstr(err, "no output was changed")) _exit(13);
    _exit(0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  expect_content(P("keep"), "earlier results");
  assert_int_equal(temporaries(), 0);
}

/* The second rename fails (its target became a directory after the checks):
 * the first target, already replaced, is put back; a target that did not
 * exist before is removed again. */
static void test_failed_rename_rolls_back(void **state) {
  (void)state;
  for (int existed = 0; existed < 2; existed++) {
    remove(P("a"));
    if (existed) put(P("a"), "old a");
    tg_outset s;
    char err[NPY_ERR_LEN_T];
    tg_outset_init(&s);
    assert_int_equal(tg_outset_add(&s, "--out a", P("a"), err, sizeof err), 0);
    assert_int_equal(tg_outset_add(&s, "--out b", P("b"), err, sizeof err), 1);
    fputs("new a", tg_outset_open(&s, 0, err, sizeof err));
    fputs("new b", tg_outset_open(&s, 1, err, sizeof err));
    assert_int_equal(mkdir(P("b"), 0755), 0);
    put(P("b/inside"), "x");
    assert_int_equal(tg_outset_commit(&s, err, sizeof err), -1);
    if (!strstr(err, "--out b") || !strstr(err, "no output was changed"))
      fail_msg("message: %s", err);
    if (existed) expect_content(P("a"), "old a");
    else assert_int_equal(access(P("a"), F_OK), -1);
    expect_content(P("b/inside"), "x");
    assert_int_equal(temporaries(), 0);
    /* no backup name left either */
    DIR *d = opendir(g_dir);
    for (struct dirent *e; (e = readdir(d));)
      if (strstr(e->d_name, ".old")) fail_msg("left: %s", e->d_name);
    closedir(d);
    remove(P("b/inside"));
    rmdir(P("b"));
  }
}

static void expect_add_refused(tg_outset *s, const char *path, const char *why) {
  char err[NPY_ERR_LEN_T] = "";
  const int n = s->n;
  if (tg_outset_add(s, "--out y", path, err, sizeof err) != -1)
    fail_msg("%s accepted", path);
  assert_int_equal(s->n, n);
  if (!strstr(err, "--out y") || !strstr(err, path) || !strstr(err, why))
    fail_msg("%s: message '%s' lacks the option, the path or '%s'", path, err, why);
}

static void test_checks_before_computing(void **state) {
  (void)state;
  tg_outset s;
  char err[NPY_ERR_LEN_T];
  tg_outset_init(&s);
  put(P("file"), "f");
  assert_int_equal(mkdir(P("sub"), 0755), 0);
  assert_int_equal(symlink("/dev/null", P("null.npy")), 0);
  assert_int_equal(symlink("nowhere/x", P("dangling.npy")), 0);
  expect_add_refused(&s, P("no/such/dir/x.npy"), "does not exist");
  expect_add_refused(&s, P("file/x.npy"), "not a directory");
  expect_add_refused(&s, P("sub"), "is a directory");
  expect_add_refused(&s, P("sub/"), "is a directory");
  expect_add_refused(&s, P("sub/.."), "is a directory");
  expect_add_refused(&s, P("null.npy"), "not a regular file");
  expect_add_refused(&s, P("dangling.npy"), "leads nowhere");
  expect_add_refused(&s, "", "empty");
  struct stat st;
  assert_int_equal(lstat(P("null.npy"), &st), 0); /* still there */
  assert_true(S_ISLNK(st.st_mode));
  /* one file, several names */
  put(P("t"), "t");
  assert_int_equal(symlink("t", P("t_link")), 0);
  assert_int_equal(link(P("t"), P("t_hard")), 0);
  assert_int_equal(tg_outset_add(&s, "--out x", P("t"), err, sizeof err), 0);
  expect_add_refused(&s, P("./t"), "same file");
  expect_add_refused(&s, P("sub/../t"), "same file");
  expect_add_refused(&s, P("t_link"), "same file");
  expect_add_refused(&s, P("t_hard"), "same file");
  assert_int_equal(tg_outset_add(&s, "--out z", P("new"), err, sizeof err), 1);
  expect_add_refused(&s, P("./new"), "same file");
  /* the input-identity test */
  assert_int_equal(stat(P("t_hard"), &st), 0);
  assert_true(tg_out_is_file(&s.o[0], st.st_dev, st.st_ino));
  assert_false(tg_out_is_file(&s.o[1], st.st_dev, st.st_ino));
  tg_outset_discard(&s);
  assert_int_equal(temporaries(), 0);
}

/* Written through a symlink: the link stays, its file gets the data. */
static void test_symlink_written_through(void **state) {
  (void)state;
  put(P("real"), "old");
  assert_int_equal(symlink("real", P("lnk")), 0);
  tg_outset s;
  char err[NPY_ERR_LEN_T];
  tg_outset_init(&s);
  assert_int_equal(tg_outset_add(&s, "--out x", P("lnk"), err, sizeof err), 0);
  fputs("new", tg_outset_open(&s, 0, err, sizeof err));
  if (tg_outset_commit(&s, err, sizeof err)) fail_msg("%s", err);
  struct stat st;
  assert_int_equal(lstat(P("lnk"), &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  expect_content(P("real"), "new");
}

/* SIGTERM with temporaries open (and written): they are removed, the
 * target is untouched and the process dies of SIGTERM. */
static void test_signal_removes_temporaries(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    const int sig = k ? SIGINT : SIGTERM;
    put(P("target"), "before");
    fflush(NULL);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      tg_out_signals_install();
      tg_outset s;
      char err[NPY_ERR_LEN_T];
      tg_outset_init(&s);
      if (tg_outset_add(&s, "--out a", P("target"), err, sizeof err) != 0) _exit(10);
      if (tg_outset_add(&s, "--out b", P("other"), err, sizeof err) != 1) _exit(11);
      fputs("half", tg_outset_open(&s, 0, err, sizeof err));
      fputs("half", tg_outset_open(&s, 1, err, sizeof err));
      fflush(NULL);
      raise(sig);
      _exit(12); /* not reached */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != sig)
      fail_msg("child status %#x, want death by signal %d", status, sig);
    expect_content(P("target"), "before");
    assert_int_equal(access(P("other"), F_OK), -1);
    assert_int_equal(temporaries(), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_int_decimal_only),
      cmocka_unit_test(test_float_decimal_finite_normal),
      cmocka_unit_test(test_label_shortens_long_values),
      cmocka_unit_test_setup_teardown(test_commit_replaces_all_keeps_mode, setup_dir,
                                      teardown_dir),
      cmocka_unit_test_setup_teardown(test_write_error_changes_nothing, setup_dir,
                                      teardown_dir),
      cmocka_unit_test_setup_teardown(test_failed_rename_rolls_back, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_checks_before_computing, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_symlink_written_through, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_signal_removes_temporaries, setup_dir,
                                      teardown_dir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
