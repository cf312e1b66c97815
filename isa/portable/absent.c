/*
 * The table of an ISA this build cannot compile (its flags were refused, or
 * the target is another architecture): a name and no functions, so every
 * entry of isa/registry.h has a table and tg_isa_table can say "not in this
 * build" instead of the linker failing.
 */
#include "ops.h"

#define TG_CAT2(a, b) a##_##b
#define TG_CAT(a, b) TG_CAT2(a, b)
#define TG_STR2(x) #x
#define TG_STR(x) TG_STR2(x)

const tg_isa_ops TG_CAT(tg_isa_ops, TG_ISA_SUFFIX) = {.name = TG_STR(TG_ISA_SUFFIX)};
