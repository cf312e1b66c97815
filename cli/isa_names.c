/* The --isa names from the library's registry; see isa_names.h. */
#include "isa_names.h"

#include <stdio.h>
#include <string.h>

#include "tilegrad.h"

const char *tg_cli_isa_names(char *buf, size_t buflen, const char *sep) {
  size_t used = (size_t)snprintf(buf, buflen, "%s", tg_isa_name(TG_ISA_AUTO));
  for (int i = 0; i < tg_isa_count() && used < buflen; i++)
    used += (size_t)snprintf(buf + used, buflen - used, "%s%s", sep, tg_isa_name(tg_isa_at(i)));
  return buf;
}

/* The public enum's tables that the library does not name: another
 * architecture's (tg_isa_name calls them "unknown" there). The library's
 * names win wherever it has them. */
static const char *const k_enum_names[] = {
    [TG_ISA_PORTABLE] = "portable", [TG_ISA_AVX512] = "avx512",
    [TG_ISA_AVX2] = "avx2",         [TG_ISA_AVX512_BF16] = "avx512bf16",
    [TG_ISA_AMX] = "amx",           [TG_ISA_NEON] = "neon",
    [TG_ISA_NEON_BF16] = "neonbf16",
};
enum { N_ENUM = (int)(sizeof k_enum_names / sizeof k_enum_names[0]) };

static int in_registry(tg_isa isa) {
  for (int i = 0; i < tg_isa_count(); i++)
    if (tg_isa_at(i) == isa) return 1;
  return 0;
}

/* Appends words to buf, wrapping before column 79 with `indent`. */
typedef struct {
  char *buf;
  size_t len, used;
  int col;
  const char *indent;
} wrap;

static void put(wrap *w, const char *word) {
  size_t n = strlen(word);
  if (w->used >= w->len) return;
  if (w->col > 0 && w->col + 1 + (int)n > 79) {
    w->used += (size_t)snprintf(w->buf + w->used, w->len - w->used, "\n%s", w->indent);
    w->col = (int)strlen(w->indent);
  } else if (w->col > 0) {
    w->used += (size_t)snprintf(w->buf + w->used, w->len - w->used, " ");
    w->col++;
  } else {
    w->used += (size_t)snprintf(w->buf + w->used, w->len - w->used, "%s", w->indent);
    w->col = (int)strlen(w->indent);
  }
  if (w->used < w->len) w->used += (size_t)snprintf(w->buf + w->used, w->len - w->used, "%s", word);
  w->col += (int)n;
}

/* "name," or "name;" (the last of a list) or "name". */
static void put_list(wrap *w, const tg_isa *v, int n, const char *last_end) {
  char word[64];
  for (int i = 0; i < n; i++) {
    const char *name = tg_isa_name(v[i]);
    if (strcmp(name, "unknown") == 0) name = k_enum_names[v[i]];
    snprintf(word, sizeof word, "%s%s", name, i + 1 < n ? "," : last_end);
    put(w, word);
  }
}

static void put_words(wrap *w, const char *text) {
  char word[64];
  while (*text) {
    size_t n = strcspn(text, " ");
    if (n >= sizeof word) n = sizeof word - 1;
    memcpy(word, text, n);
    word[n] = '\0';
    if (n) put(w, word);
    text += n;
    while (*text == ' ') text++;
  }
}

const char *tg_cli_isa_tables(char *buf, size_t buflen, const char *indent) {
  tg_isa all[N_ENUM], built[N_ENUM], runs[N_ENUM], other[N_ENUM];
  int n_all = 0, n_built = 0, n_runs = 0, n_other = 0;
  /* this build's tables in the library's order, then the rest of the enum */
  for (int i = 0; i < tg_isa_count() && n_built < N_ENUM; i++) {
    tg_isa isa = tg_isa_at(i);
    all[n_all++] = built[n_built++] = isa;
    if (tg_isa_available(isa)) runs[n_runs++] = isa;
  }
  for (int v = TG_ISA_PORTABLE; v < N_ENUM; v++)
    if (k_enum_names[v] && !in_registry((tg_isa)v) && n_all < N_ENUM)
      all[n_all++] = other[n_other++] = (tg_isa)v;
  wrap w = {buf, buflen, 0, 0, indent};
  buf[0] = '\0';
  put_words(&w, "tables:");
  put_list(&w, all, n_all, ";");
  put_words(&w, "this build has");
  put_list(&w, built, n_built, n_other ? "" : ";");
  if (n_other) {
    put_words(&w, "(not");
    put_list(&w, other, n_other, ":");
    put_words(&w, "another architecture's);");
  }
  put_words(&w, "this CPU runs");
  put_list(&w, runs, n_runs, "");
  if (w.used < w.len) snprintf(w.buf + w.used, w.len - w.used, "\n");
  return buf;
}
