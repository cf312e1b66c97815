/*
 * `tilegrad run`'s table of kernels (cli/run_kernels.c): every kernel is one
 * kernel_spec, its buffers with role, dtype and shape rule, its scalar
 * parameters, and one small adapter that turns the bound buffers, sizes and
 * params into the C call.
 *
 * Shape rules: comma-separated dims; a dim is a size symbol ("qL"), a symbol
 * that may also be 1 and then broadcasts ("B|1"; leading broadcast dims may
 * be left out of the array altogether), or an integer literal ("1").
 * "*" accepts any shape; "=src" means "the shape of buffer src".
 * (cli/run_shapes.c matches arrays against them.)
 */
#ifndef TG_CLI_RUN_KERNELS_H
#define TG_CLI_RUN_KERNELS_H

#include "tilegrad.h"

#define RUN_MAX_BUFS 14
#define RUN_MAX_PARAMS 8

typedef enum {
  ROLE_IN,     /* required input */
  ROLE_OPT_IN, /* optional input (NULL to the kernel when absent) */
  ROLE_OUT,    /* output the kernel writes */
  ROLE_ACC,    /* output the kernel accumulates into: --in gives its start, else zeros */
  ROLE_INOUT   /* required input modified in place; --out writes the result */
} buf_role;

typedef enum {
  BT_F32,  /* float32 */
  BT_BF16, /* raw bfloat16 bits */
  BT_IDS   /* uint32 ids/targets; int32 files accepted (negatives refused on read) */
} buf_type;

typedef struct {
  const char *name;  /* the C parameter name in include/tilegrad.h */
  buf_role role;
  buf_type type;
  const char *shape; /* shape rule, see the top of this file */
  const char *note;  /* extra help text or NULL */
} buf_spec;

typedef enum {
  P_BOOL,  /* 0/1 (also true/false) */
  P_I32,   /* int32 */
  P_U32,   /* uint32 */
  P_FLOAT  /* float */
} param_type;

typedef struct {
  const char *name;
  param_type type;
  /* Default as text; NULL = required; "" = the adapter derives it when the
   * param is absent (help says how). A param named like a size symbol binds
   * that symbol. */
  const char *def;
  const char *help;
} param_spec;

typedef struct run_call run_call; /* one invocation's state: run_call.h */

typedef struct {
  const char *name;    /* Metal host name without tg_ */
  const char *summary; /* one line */
  buf_spec bufs[RUN_MAX_BUFS];       /* in C argument order; ends at name NULL */
  param_spec params[RUN_MAX_PARAMS]; /* ends at name NULL */
  tg_status (*adapter)(run_call *c);
  /* Optional: checks the inputs against the params before the outputs are
   * allocated (a mismatch must not cost an allocation sized by the params). */
  tg_status (*check)(run_call *c);
} kernel_spec;

/* The kernel named `name` (with or without the C name's tg_), or NULL. */
const kernel_spec *run_find_kernel(const char *name);

/* The table in order: run_kernel_at(i) for 0 <= i < run_kernel_count(). */
int run_kernel_count(void);
const kernel_spec *run_kernel_at(int i);

/* The index of k's buffer or param `name`, or -1. */
int run_buf_index(const kernel_spec *k, const char *name);
int run_param_index(const kernel_spec *k, const char *name);

/* "f32", "bf16" or "u32", as help and messages write a buffer's dtype. */
const char *run_type_name(buf_type t);

#endif /* TG_CLI_RUN_KERNELS_H */
