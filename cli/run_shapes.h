/* `tilegrad run`'s shape rules (run_kernels.h says how they are written):
 * the input arrays' dtypes and shapes against their buffers' rules, the size
 * symbols (B, H, qL, ...) those bind, and the outputs' shapes from them. The
 * shape checks are what keep the kernels in bounds: the C API takes sizes,
 * not array lengths. Each returns 0, or -1 with the message in c->err. */
#ifndef TG_CLI_RUN_SHAPES_H
#define TG_CLI_RUN_SHAPES_H

#include "run_call.h"

/* Refuses a missing required input, checks every loaded input's dtype and
 * matches its shape against its rule, binding the rule's size symbols and
 * refusing disagreements, then binds the size symbols given as --param
 * (e.g. vocab_size). */
int run_bind_sizes(run_call *c);

/* Allocates the outputs from their rules, zero-filled: every out buffer and
 * every acc buffer without an --in (an acc buffer with one starts from it). */
int run_alloc_outputs(run_call *c);

/* The bound size symbol `name`, or NULL. */
const run_sym *run_sym_find(const run_call *c, const char *name);

#endif /* TG_CLI_RUN_SHAPES_H */
