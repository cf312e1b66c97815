/*
 * The one parser for every number the CLI reads: --param values, --threads,
 * and the bench options (--threads, --reps, --triad-mib, --shapes fields).
 *
 * Numbers are decimal only. strtol(..., 0) read "010" as octal 8 and strtod
 * takes hex floats, "inf", "nan" and leading blanks; none of that is what a
 * user typing a size or a scale means, so the text is checked against a
 * plain decimal grammar before it is converted:
 *   integer: [-+]?digits, no leading zero (a leading zero is refused rather
 *            than read as decimal, so "010" is never silently 10 or 8)
 *   float:   [-+]?(digits[.digits?] | .digits)([eE][-+]?digits)?
 * Refused with a message (exit 2 for the caller): empty text, anything else
 * in the text (blanks, trailing junk), an integer outside [lo, hi], a float
 * outside float's finite range, and a non-zero float that rounds to zero or
 * to a float subnormal (scale=1e-50 must not quietly become 0).
 *
 * Messages read "LABEL: reason", LABEL being what the caller passes, e.g.
 * "--param qL_off=010" or "--threads 3x", so they name the parameter and the
 * value. A long value is shortened in the label by tg_num_label.
 */
#ifndef TG_CLI_NUM_H
#define TG_CLI_NUM_H

#include <stddef.h>
#include <stdint.h>

/* Parses text as a decimal integer in [lo, hi] into *out. Returns 0, or -1
 * with "label: reason" in err (*out untouched). */
int tg_num_int(const char *label, const char *text, int64_t lo, int64_t hi, int64_t *out,
               char *err, size_t errlen);

/* Parses text as a finite decimal float that float (f32) can hold as a
 * normal number or zero; the value comes back as a double holding exactly
 * that float. Returns 0, or -1 with "label: reason" in err. */
int tg_num_float(const char *label, const char *text, double *out, char *err, size_t errlen);

/* Writes "<opt><sep><value>" into buf, the value cut to its first 64 chars
 * plus "...(N chars)" when longer, so a message about it always has room for
 * its reason. Returns buf. */
const char *tg_num_label(char *buf, size_t buflen, const char *opt, char sep,
                         const char *value);

#define TG_NUM_LABEL_LEN 192 /* enough for any tg_num_label with opt < 100 chars */

#endif /* TG_CLI_NUM_H */
