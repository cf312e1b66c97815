/*
 * `tilegrad run <kernel> --in NAME=file.npy ... --out NAME=file.npy ...`
 *
 * Runs one contract kernel on .npy buffers, e.g. buffers dumped around a
 * Metal dispatch, so the CPU result can be compared with the GPU's.
 *
 * Design: every kernel is one row of the kernel table (cli/run_kernels.c:
 * its buffers with role, dtype and shape rule, and its scalar parameters)
 * plus one small adapter that turns the bound buffers/sizes/params into the
 * C call. The generic part does everything else; this file runs its steps:
 *   1. parse the command line and every --param value (cli/run_args.c,
 *      numbers through cli/num.h), check every --out location
 *      (cli/outfile.h), then load every --in array,
 *   2. check dtypes and match each input's shape against its rule, binding
 *      the rule's size symbols (B, H, qL, ...) and refusing disagreements
 *      (cli/run_shapes.c),
 *   3. bind size symbols given as --param (e.g. vocab_size),
 *   4. run the kernel's check hook if it has one, then allocate the outputs
 *      from their rules (accumulating outputs start from their --in array if
 *      one was given, else zeros),
 *   5. call the adapter, report a library error, write the --out arrays to
 *      temporaries and rename them over their targets: all of them or none.
 * The help texts are cli/run_help.c's.
 */
/* POSIX + XSI (fileno, stat, realpath, mkstemp, fsync, link, sigaction);
 * the same in every CLI file, so tests can compile them into one unit. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "run.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "npy.h"
#include "outfile.h"
#include "run_args.h"
#include "run_call.h"
#include "run_help.h"
#include "run_kernels.h"
#include "run_shapes.h"
#include "tilegrad.h"

int run_errorf(run_call *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return -1;
}

tg_status run_refuse(run_call *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  c->cli_failed = 1;
  return TG_ERR_BAD_SHAPE;
}

static double now_seconds(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Checks every --out location (outfile.h: writable directory, not a
 * directory or device, no two outputs on one file), then refuses an output
 * that would replace an input file, except its own buffer's --in where the
 * kernel updates that buffer in place (inout and acc buffers). Runs before
 * any input is read. */
static int check_outputs(run_call *c) {
  const kernel_spec *k = c->k;
  tg_outset_init(&c->outs);
  for (int i = 0; i < RUN_MAX_BUFS; i++) c->out_index[i] = -1;
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    if (!c->bufs[i].out_path) continue;
    char what[64];
    snprintf(what, sizeof what, "--out %s", k->bufs[i].name);
    const int oi = tg_outset_add(&c->outs, what, c->bufs[i].out_path, c->err, sizeof c->err);
    if (oi < 0) return -1;
    c->out_index[i] = oi;
  }
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    struct stat st;
    if (!c->bufs[i].in_path || stat(c->bufs[i].in_path, &st) != 0) continue;
    for (int j = 0; j < RUN_MAX_BUFS && k->bufs[j].name; j++) {
      if (c->out_index[j] < 0 ||
          !tg_out_is_file(&c->outs.o[c->out_index[j]], st.st_dev, st.st_ino))
        continue;
      if (i == j) continue; /* inout/acc: --in and --out of one buffer, in place */
      return run_errorf(c,
                        "--out %s=%s would replace the input --in %s=%s: %s does not work "
                        "in place on these buffers (only an inout or acc buffer may name "
                        "its own --in file); give another file name",
                        k->bufs[j].name, c->bufs[j].out_path, k->bufs[i].name,
                        c->bufs[i].in_path, k->name);
    }
  }
  return 0;
}

/* Everything after loading; split out so main can free in one place. */
static int run_prepare_and_call(run_call *c, int quiet) {
  const kernel_spec *k = c->k;
  /* 2. and 3. dtypes and shapes of the inputs, size symbols */
  if (run_bind_sizes(c)) return -1;
  /* the kernel's own checks of inputs against params, before allocating */
  if (k->check && k->check(c) != TG_OK) return -1;
  /* 4. outputs */
  if (run_alloc_outputs(c)) return -1;
  /* 5. the call */
  const double t0 = now_seconds();
  const tg_status s = k->adapter(c);
  const double t1 = now_seconds();
  if (c->cli_failed) return -1;
  if (s != TG_OK) {
    fprintf(stderr, "tilegrad run %s: kernel error %d: %s\n  %s\n", k->name, (int)s,
            tg_status_str(s), tg_ctx_last_error(c->ctx));
    return 1;
  }
  if (!quiet) fprintf(stderr, "tilegrad run %s: ok (%.3f ms)\n", k->name, (t1 - t0) * 1e3);
  /* 6. every output to its temporary, then all renamed at once, or none */
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    if (c->out_index[i] < 0) continue;
    FILE *f = tg_outset_open(&c->outs, c->out_index[i], c->err, sizeof c->err);
    if (!f || npy_write_stream(f, c->bufs[i].out_path, &c->bufs[i].arr, c->err,
                               sizeof c->err)) {
      tg_outset_discard(&c->outs);
      return -1;
    }
  }
  if (tg_outset_commit(&c->outs, c->err, sizeof c->err)) return -1;
  for (int i = 0; !quiet && i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const run_buf *rb = &c->bufs[i];
    char sb[256];
    if (rb->out_path)
      fprintf(stderr, "  wrote %s %s %s -> %s\n", k->bufs[i].name,
              npy_dtype_name(rb->arr.dtype), npy_shape_str(&rb->arr, sb, sizeof sb),
              rb->out_path);
  }
  return 0;
}

int tg_cli_run_main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    tg_cli_run_help(argc < 2 ? stderr : stdout, NULL);
    return argc < 2 ? RUN_EXIT_USAGE : RUN_EXIT_OK;
  }
  const kernel_spec *k = run_find_kernel(argv[1]);
  if (!k) {
    fprintf(stderr, "tilegrad run: unknown kernel '%s'; kernels:\n", argv[1]);
    tg_cli_run_list(stderr);
    return RUN_EXIT_USAGE;
  }

  run_call *c = calloc(1, sizeof *c);
  if (!c) {
    fprintf(stderr, "tilegrad run: out of memory\n");
    return RUN_EXIT_USAGE;
  }
  c->k = k;
  tg_outset_init(&c->outs);
  int rc = RUN_EXIT_USAGE;
  run_opts o;

  /* 1. the command line and params; then the output locations, before any
   * input is read or anything computed */
  const int pr = run_parse_command_line(c, argc, argv, &o);
  if (pr == PARSE_HELP) {
    run_kernel_help(stdout, k);
    rc = RUN_EXIT_OK;
    goto done;
  }
  if (pr != PARSE_GO_ON || check_outputs(c)) {
    fprintf(stderr, "tilegrad run %s: %s\n", k->name, c->err);
    goto done;
  }

  /* load the inputs */
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    if (!c->bufs[i].in_path) continue;
    char err[NPY_ERR_LEN];
    if (npy_read(c->bufs[i].in_path, &c->bufs[i].arr, err, sizeof err)) {
      fprintf(stderr, "tilegrad run: --in %s: %s\n", k->bufs[i].name, err);
      goto done;
    }
  }

  tg_status s = tg_ctx_create(&c->ctx);
  if (s != TG_OK) {
    fprintf(stderr, "tilegrad run: tg_ctx_create: %s\n", tg_status_str(s));
    goto done;
  }
  if (o.threads >= 0 && (s = tg_ctx_set_threads(c->ctx, o.threads)) != TG_OK) {
    fprintf(stderr, "tilegrad run: --threads %d: %s: %s\n", o.threads, tg_status_str(s),
            tg_ctx_last_error(c->ctx));
    goto done;
  }
  if (o.deterministic && (s = tg_ctx_set_deterministic(c->ctx, 1)) != TG_OK) {
    fprintf(stderr, "tilegrad run: --deterministic: %s: %s\n", tg_status_str(s),
            tg_ctx_last_error(c->ctx));
    goto done;
  }
  if (o.have_isa && (s = tg_ctx_set_isa(c->ctx, o.isa)) != TG_OK) {
    fprintf(stderr, "tilegrad run: --isa %s: %s: %s\n", tg_isa_name(o.isa), tg_status_str(s),
            tg_ctx_last_error(c->ctx));
    goto done;
  }

  const int r = run_prepare_and_call(c, o.quiet);
  if (r < 0) {
    fprintf(stderr, "tilegrad run %s: %s\n", k->name, c->err);
    rc = RUN_EXIT_USAGE;
  } else {
    rc = r == 0 ? RUN_EXIT_OK : RUN_EXIT_KERNEL;
  }

done:
  tg_outset_discard(&c->outs); /* after a commit there is nothing left to discard */
  for (int i = 0; i < RUN_MAX_BUFS; i++) npy_free(&c->bufs[i].arr);
  tg_ctx_destroy(c->ctx);
  free(c);
  return rc;
}
