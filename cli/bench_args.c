/* Checks of `tilegrad bench`'s arguments before it runs; see bench_args.h. */
#include "bench_args.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "num.h"
#include "outfile.h"

/* One field of a --shapes item, trimmed of the blanks the bench's own parser
 * allows around it, checked as a decimal integer in [lo, hi]. */
static int shape_field(const char *item, int k, const char *f, size_t len, int64_t lo,
                       int64_t hi, char *msg, size_t msglen) {
  static const char *const names[6] = {"B", "H", "Hkv", "L", "D", "causal"};
  while (len && *f == ' ') f++, len--;
  while (len && f[len - 1] == ' ') len--;
  char text[64], opt[160], label[TG_NUM_LABEL_LEN + 160];
  if (len >= sizeof text) len = sizeof text - 1; /* still not a valid number: refused */
  memcpy(text, f, len);
  text[len] = '\0';
  snprintf(opt, sizeof opt, "--shapes '%.64s%s': field %s", item,
           strlen(item) > 64 ? "..." : "", names[k]);
  tg_num_label(label, sizeof label, opt, '=', text);
  int64_t v;
  return tg_num_int(label, text, lo, hi, &v, msg, msglen);
}

/* "B,H,Hkv,L,D,causal;..." as bench/bench.c reads it; blank items are
 * skipped there, so here too. */
static int check_shapes(const char *spec, char *msg, size_t msglen) {
  const char *p = spec;
  while (*p) {
    const char *semi = strchr(p, ';');
    const size_t len = semi ? (size_t)(semi - p) : strlen(p);
    char item[256];
    snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item ? len : sizeof item - 1), p);
    p += len + (semi ? 1 : 0);
    if (strspn(item, " ") == strlen(item)) continue;
    if (len >= sizeof item) {
      snprintf(msg, msglen, "--shapes: item of %zu chars is too long", len);
      return -1;
    }
    const char *f = item;
    for (int k = 0; k < 6; k++) {
      const char *comma = strchr(f, ',');
      if ((k < 5) != (comma != NULL)) {
        snprintf(msg, msglen,
                 "--shapes '%s': want 6 fields B,H,Hkv,L,D,causal (positive sizes, "
                 "causal 0 or 1)", item);
        return -1;
      }
      const size_t flen = comma ? (size_t)(comma - f) : strlen(f);
      if (shape_field(item, k, f, flen, k < 5 ? 1 : 0, k < 5 ? (1 << 30) : 1, msg, msglen))
        return -1;
      f = comma ? comma + 1 : f + flen;
    }
  }
  return 0;
}

int tg_cli_bench_precheck(int argc, char **argv, int check_files, char *msg, size_t msglen) {
  if (msg && msglen) msg[0] = '\0';
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = NULL;
    char name[64];
    const char *eq = strchr(a, '=');
    if (!strncmp(a, "--", 2) && eq && (size_t)(eq - a) < sizeof name) {
      snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
      val = eq + 1;
    } else {
      snprintf(name, sizeof name, "%.63s", a);
    }
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) return 0; /* the bench says it */
    if (!strcmp(name, "--quick") || !strcmp(name, "--deterministic")) continue;
    static const char *const valued[] = {"--threads", "--reps", "--triad-mib", "--json",
                                         "--isa", "--section", "--shapes"};
    int known = 0;
    for (size_t v = 0; v < sizeof valued / sizeof valued[0]; v++) known |= !strcmp(name, valued[v]);
    if (!known) return 0; /* the bench refuses it with its own message */
    if (!val) {
      if (i + 1 >= argc) return 0; /* "needs a value": the bench says it */
      val = argv[++i];
    }
    char label[TG_NUM_LABEL_LEN];
    int64_t v;
    tg_num_label(label, sizeof label, name, ' ', val);
    int bad = 0;
    if (!strcmp(name, "--threads")) bad = tg_num_int(label, val, 1, 4096, &v, msg, msglen);
    else if (!strcmp(name, "--reps")) bad = tg_num_int(label, val, 1, 100000, &v, msg, msglen);
    else if (!strcmp(name, "--triad-mib"))
      bad = tg_num_int(label, val, 1, 1 << 20, &v, msg, msglen);
    else if (!strcmp(name, "--shapes")) bad = check_shapes(val, msg, msglen);
    else if (!strcmp(name, "--json") && check_files) {
      tg_outset set;
      tg_outset_init(&set);
      bad = tg_outset_add(&set, "--json", val, msg, msglen) < 0;
    }
    if (bad) return 2;
  }
  return 0;
}
