/* The --isa names from the library's registry; see isa_names.h. */
#include "isa_names.h"

#include <stdio.h>

#include "tilegrad.h"

const char *tg_cli_isa_names(char *buf, size_t buflen, const char *sep) {
  size_t used = (size_t)snprintf(buf, buflen, "%s", tg_isa_name(TG_ISA_AUTO));
  for (int i = 0; i < tg_isa_count() && used < buflen; i++)
    used += (size_t)snprintf(buf + used, buflen - used, "%s%s", sep, tg_isa_name(tg_isa_at(i)));
  return buf;
}
