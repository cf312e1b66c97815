/* Decimal number parsing for the CLI; see num.h for the grammar and why. */
#include "num.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int num_fail(char *err, size_t errlen, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int num_fail(char *err, size_t errlen, const char *label, const char *fmt, ...) {
  if (err && errlen) {
    int n = snprintf(err, errlen, "%s: ", label);
    if (n >= 0 && (size_t)n < errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return -1;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

const char *tg_num_label(char *buf, size_t buflen, const char *opt, char sep,
                         const char *value) {
  const size_t n = strlen(value);
  if (n <= 64)
    snprintf(buf, buflen, "%s%c%s", opt, sep, value);
  else
    snprintf(buf, buflen, "%s%c%.64s...(%zu chars)", opt, sep, value, n);
  return buf;
}

/* Explains why text is not a plain decimal number (called once the grammar
 * check has failed): empty, a blank, hex, or something after the digits. */
static int not_decimal(char *err, size_t errlen, const char *label, const char *text,
                       const char *kind) {
  if (!text[0]) return num_fail(err, errlen, label, "empty value (expected %s)", kind);
  const char *p = text + (text[0] == '-' || text[0] == '+');
  if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
    return num_fail(err, errlen, label, "hexadecimal is not accepted (expected %s)",
                    kind);
  for (const char *q = text; *q; q++)
    if (*q == ' ' || *q == '\t' || *q == '\n')
      return num_fail(err, errlen, label, "blank in the value (expected %s)", kind);
  return num_fail(err, errlen, label, "not %s", kind);
}

int tg_num_int(const char *label, const char *text, int64_t lo, int64_t hi, int64_t *out,
               char *err, size_t errlen) {
  const char *p = text + (text[0] == '-' || text[0] == '+');
  const char *d = p;
  while (is_digit(*d)) d++;
  if (d == p || *d) return not_decimal(err, errlen, label, text, "a decimal integer");
  if (p[0] == '0' && d - p > 1)
    return num_fail(err, errlen, label,
                    "leading zero (numbers are decimal, never octal; write it without "
                    "the leading zeros)");
  /* The grammar holds: strtoll in base 10 reads exactly these digits. */
  errno = 0;
  const long long v = strtoll(text, NULL, 10);
  if (errno == ERANGE || v < lo || v > hi)
    return num_fail(err, errlen, label, "out of range [%lld, %lld]", (long long)lo,
                    (long long)hi);
  *out = v;
  return 0;
}

int tg_num_float(const char *label, const char *text, double *out, char *err, size_t errlen) {
  const char *p = text + (text[0] == '-' || text[0] == '+');
  int digits = 0, nonzero = 0;
  while (is_digit(*p)) digits++, nonzero |= *p++ != '0';
  if (*p == '.') {
    p++;
    while (is_digit(*p)) digits++, nonzero |= *p++ != '0';
  }
  if (digits && (*p == 'e' || *p == 'E')) {
    const char *e = p + 1 + (p[1] == '-' || p[1] == '+');
    if (is_digit(*e)) { /* else "1e" / "1e+": p stays on the 'e', refused below */
      while (is_digit(*e)) e++;
      p = e;
    }
  }
  if (!digits || *p) {
    const char *t = text + (text[0] == '-' || text[0] == '+');
    if (!strcmp(t, "inf") || !strcmp(t, "infinity") || !strcmp(t, "nan") ||
        !strcmp(t, "INF") || !strcmp(t, "NAN") || !strcmp(t, "Inf") || !strcmp(t, "NaN"))
      return num_fail(err, errlen, label, "not a finite number");
    return not_decimal(err, errlen, label, text, "a decimal number");
  }
  /* strtod of this grammar is locale-independent here: the CLI never calls
   * setlocale, so the decimal point is '.'. ERANGE is judged below from the
   * value itself, as float (the kernels' type) is what must hold it. */
  const double v = strtod(text, NULL);
  const float f = (float)v;
  if (isinf(f))
    return num_fail(err, errlen, label, "out of range (|x| <= %g for float32)",
                    (double)FLT_MAX);
  if (nonzero && !(fabsf(f) >= FLT_MIN))
    return num_fail(err, errlen, label,
                    "underflows: a non-zero value below float32's smallest normal "
                    "number %g would be used as %s",
                    (double)FLT_MIN, f == 0.0f ? "0" : "a subnormal");
  *out = (double)f;
  return 0;
}
