/* `tilegrad run`'s shape rules: inputs against them, size symbols, output
 * shapes; see run_shapes.h. */
#include "run_shapes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUN_MAX_RULE_DIMS 8

const run_sym *run_sym_find(const run_call *c, const char *name) {
  for (int i = 0; i < c->n_syms; i++)
    if (!strcmp(c->syms[i].name, name)) return &c->syms[i];
  return NULL;
}

typedef struct {
  char sym[32];      /* symbol name, or "" for a literal */
  int64_t literal;
  int broadcast;     /* "SYM|1" */
} rule_dim;

/* Splits a rule like "B|1,H|1,qL,kL" (not "*" or "=x"); returns the dim count. */
static int parse_rule(const char *rule, rule_dim dims[RUN_MAX_RULE_DIMS]) {
  int n = 0;
  const char *p = rule;
  while (*p && n < RUN_MAX_RULE_DIMS) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    rule_dim *d = &dims[n++];
    memset(d, 0, sizeof *d);
    if (len >= 2 && !strncmp(p + len - 2, "|1", 2)) {
      d->broadcast = 1;
      len -= 2;
    }
    if (*p >= '0' && *p <= '9') {
      d->literal = strtoll(p, NULL, 10);
    } else {
      if (len >= sizeof d->sym) len = sizeof d->sym - 1;
      memcpy(d->sym, p, len);
    }
    p = end ? end + 1 : p + strlen(p);
  }
  return n;
}

static int bind_sym(run_call *c, const char *name, int64_t v, const char *from) {
  const run_sym *s = run_sym_find(c, name);
  if (s) {
    if (s->value != v)
      return run_errorf(c, "size %s is %lld from %s but %lld from %s", name,
                        (long long)s->value, s->from, (long long)v, from);
    return 0;
  }
  if (v > INT32_MAX)
    return run_errorf(c, "size %s = %lld (from %s) is larger than the kernels take (%d)",
                      name, (long long)v, from, INT32_MAX);
  if (c->n_syms == RUN_MAX_SYMS) return run_errorf(c, "too many size symbols");
  run_sym *t = &c->syms[c->n_syms++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->value = v;
  snprintf(t->from, sizeof t->from, "%s", from);
  return 0;
}

/* Matches an input array against its buffer's rule, binding symbols. */
static int bind_input(run_call *c, int bi) {
  const buf_spec *b = &c->k->bufs[bi];
  const npy_array *a = &c->bufs[bi].arr;
  char from[TG_OUT_PATH + 300], sb[256];
  snprintf(from, sizeof from, "%s (%s, shape %s)", b->name, c->bufs[bi].in_path,
           npy_shape_str(a, sb, sizeof sb));
  if (!strcmp(b->shape, "*")) return 0;
  if (b->shape[0] == '=') {
    const npy_array *ref = &c->bufs[run_buf_index(c->k, b->shape + 1)].arr;
    int same = ref->ndim == a->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = ref->shape[i] == a->shape[i];
    if (!same)
      return run_errorf(c, "%s must have the shape of %s %s", from, b->shape + 1,
                        npy_shape_str(ref, sb, sizeof sb));
    return 0;
  }
  rule_dim dims[RUN_MAX_RULE_DIMS];
  const int nd = parse_rule(b->shape, dims);
  int lead = nd - a->ndim; /* leading dims the array leaves out */
  int ok = lead >= 0;
  for (int i = 0; ok && i < lead; i++) ok = dims[i].broadcast;
  if (!ok)
    return run_errorf(c, "%s: expected %d dims [%s]", from, nd, b->shape);
  for (int i = lead; i < nd; i++) {
    const int64_t v = a->shape[i - lead];
    const rule_dim *d = &dims[i];
    if (!d->sym[0]) {
      if (v != d->literal)
        return run_errorf(c, "%s: dim %d must be %lld", from, i - lead, (long long)d->literal);
      continue;
    }
    if (d->broadcast && v == 1) continue; /* broadcasts; binds nothing */
    if (bind_sym(c, d->sym, v, from)) return -1;
  }
  return 0;
}

/* Allocates output bi (zero-filled) from its rule and the bound symbols. */
static int alloc_output(run_call *c, int bi) {
  const buf_spec *b = &c->k->bufs[bi];
  const npy_dtype dt = b->type == BT_F32 ? NPY_F32 : b->type == BT_BF16 ? NPY_BF16 : NPY_U32;
  char err[NPY_ERR_LEN];
  int64_t shape[NPY_MAX_DIMS];
  int nd;
  if (b->shape[0] == '=') {
    const npy_array *ref = &c->bufs[run_buf_index(c->k, b->shape + 1)].arr;
    nd = ref->ndim;
    for (int i = 0; i < nd; i++) shape[i] = ref->shape[i];
  } else {
    rule_dim dims[RUN_MAX_RULE_DIMS];
    nd = parse_rule(b->shape, dims);
    for (int i = 0; i < nd; i++) {
      if (!dims[i].sym[0]) {
        shape[i] = dims[i].literal;
        continue;
      }
      const run_sym *s = run_sym_find(c, dims[i].sym);
      if (!s) {
        if (run_param_index(c->k, dims[i].sym) >= 0)
          return run_errorf(c, "cannot tell size %s of %s: give --param %s=N%s", dims[i].sym,
                            b->name, dims[i].sym,
                            b->role == ROLE_ACC ? " or its start value with --in" : "");
        return run_errorf(c, "cannot tell size %s of %s", dims[i].sym, b->name);
      }
      shape[i] = s->value;
    }
  }
  if (npy_alloc(&c->bufs[bi].arr, dt, nd, shape, b->name, err, sizeof err))
    return run_errorf(c, "%s", err);
  return 0;
}

int run_bind_sizes(run_call *c) {
  const kernel_spec *k = c->k;
  /* 2. dtypes and shapes of the inputs */
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const buf_spec *b = &k->bufs[i];
    run_buf *rb = &c->bufs[i];
    if (!rb->in_path) {
      if (b->role == ROLE_IN || b->role == ROLE_INOUT)
        return run_errorf(c, "missing input: --in %s=file.npy (%s %s [%s])", b->name,
                          run_type_name(b->type), b->name, b->shape);
      continue;
    }
    const npy_dtype t = rb->arr.dtype;
    const int ok = b->type == BT_F32    ? t == NPY_F32
                   : b->type == BT_BF16 ? t == NPY_BF16
                                        : (t == NPY_U32 || t == NPY_I32);
    if (!ok)
      return run_errorf(c, "%s: %s must be %s, the file holds %s%s", rb->in_path, b->name,
                        b->type == BT_F32 ? "float32 ('<f4')"
                        : b->type == BT_BF16 ? "bfloat16 bits ('<u2')"
                                             : "uint32/int32",
                        npy_dtype_name(t),
                        b->type == BT_BF16 && t == NPY_F32
                            ? " (convert first, e.g. with `tilegrad run f32_to_bf16_cast`)"
                            : "");
    if (t == NPY_I32) rb->arr.dtype = NPY_U32; /* non-negative: same bits */
  }
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++)
    if (c->bufs[i].in_path && bind_input(c, i)) return -1;
  /* 3. size symbols given as params (parsed with the command line) */
  for (int i = 0; i < RUN_MAX_PARAMS && k->params[i].name; i++) {
    const param_spec *ps = &k->params[i];
    const run_param *p = &c->params[i];
    if (!p->given) continue;
    char from[64];
    snprintf(from, sizeof from, "--param %s", ps->name);
    /* only size symbols that appear in a rule bind */
    for (int j = 0; j < RUN_MAX_BUFS && k->bufs[j].name; j++) {
      rule_dim dims[RUN_MAX_RULE_DIMS];
      const char *rule = k->bufs[j].shape;
      if (rule[0] == '=' || !strcmp(rule, "*")) continue;
      const int nd = parse_rule(rule, dims);
      int uses = 0;
      for (int d = 0; d < nd; d++) uses |= !strcmp(dims[d].sym, ps->name);
      if (uses) {
        if (bind_sym(c, ps->name, p->i, from)) return -1;
        break;
      }
    }
  }
  return 0;
}

int run_alloc_outputs(run_call *c) {
  const kernel_spec *k = c->k;
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const buf_role r = k->bufs[i].role;
    if (r == ROLE_OUT || (r == ROLE_ACC && !c->bufs[i].in_path))
      if (alloc_output(c, i)) return -1;
  }
  return 0;
}
