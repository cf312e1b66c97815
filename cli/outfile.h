/*
 * All-or-nothing output files for the CLI (`tilegrad run --out`, `tilegrad
 * bench --json`).
 *
 * A run's outputs form one set:
 *   1. tg_outset_add, for every output BEFORE anything is computed: resolves
 *      the path (realpath of its directory + its base name; a symbolic link
 *      at the target is followed, so the file it points to is the one
 *      replaced), refuses a directory, a device/FIFO/socket, a dangling link,
 *      a target or directory that is not writable, and a second output naming
 *      the same file (same resolved path, or same device and inode), then
 *      proves the directory takes a new file by creating and removing a
 *      temporary there;
 *   2. tg_outset_open, for each output: a temporary file (mkstemp) in the
 *      target's directory, so the final rename stays within one file system
 *      and is atomic;
 *   3. tg_outset_commit: flushes, fsyncs and closes every temporary; only if
 *      all of that worked does it rename them over their targets. If a rename
 *      fails, the targets already replaced are put back (their old files were
 *      given a second name, a hard link, just before).
 *   On any failure, tg_outset_discard (called by commit itself when it fails)
 *   removes the temporaries: no target changes and nothing is left behind.
 * The run removes nothing it did not create: the old approach (fopen "wb" on
 * the target, remove() on failure) destroyed the previous result on a failed
 * write and would have unlinked a symlink or device node at the path.
 *
 * Signals: tg_out_signals_install (called once at start-up) makes SIGINT,
 * SIGTERM and SIGHUP unlink the live temporaries (kept in a fixed table, so
 * the handler needs only unlink, which is async-signal-safe) and then die of
 * the same signal with its default action; SIGXFSZ (`ulimit -f` exceeded) is
 * ignored so that the write fails with EFBIG and is cleaned up like any
 * other write error, instead of killing the process with a temporary left.
 * While the renames of a commit run those signals are held back, so a signal
 * never leaves half of the outputs replaced.
 */
#ifndef TG_CLI_OUTFILE_H
#define TG_CLI_OUTFILE_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define TG_OUT_MAX 16       /* outputs in one set */
#define TG_OUT_PATH 4096    /* Linux's PATH_MAX: longer paths cannot be opened */

typedef struct {
  char what[64];            /* "--out dQ", "--json": says which option in messages */
  char path[TG_OUT_PATH];   /* the resolved target */
  size_t dirlen;            /* path[0..dirlen) is its directory ("/" keeps its slash) */
  int exists;               /* a regular file is there now (dev, ino, mode are its) */
  dev_t dev;
  ino_t ino;
  mode_t mode;
  FILE *f;                  /* the open temporary, or NULL */
  int slot;                 /* its entry in the signal handler's table, -1 = none */
} tg_out;

typedef struct {
  int n;
  tg_out o[TG_OUT_MAX];
} tg_outset;

/* Once, at start-up: the signal handlers described above. */
void tg_out_signals_install(void);

void tg_outset_init(tg_outset *s);

/* Checks and adds one output (step 1). `what` names the option for messages
 * ("--out dQ"); `path` is the path as given. Returns its index, or -1 with a
 * message in err that names what and path. */
int tg_outset_add(tg_outset *s, const char *what, const char *path, char *err,
                  size_t errlen);

/* 1 if output i is the existing file with this device and inode (an input
 * that the output would replace), else 0. */
int tg_out_is_file(const tg_out *o, dev_t dev, ino_t ino);

/* Creates output i's temporary (step 2) and returns a stream on it, or NULL
 * with a message in err. The stream belongs to the set: never fclose it. */
FILE *tg_outset_open(tg_outset *s, int i, char *err, size_t errlen);

/* Step 3: every output must have been opened. Returns 0 when all targets are
 * replaced; otherwise -1 with a message in err, no target changed and no
 * temporary left. */
int tg_outset_commit(tg_outset *s, char *err, size_t errlen);

/* Closes and removes every temporary of the set; targets untouched. */
void tg_outset_discard(tg_outset *s);

/* The CLI file code's error convention: formats the message into err (when
 * err and errlen are given) and returns -1. */
int tg_out_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* TG_CLI_OUTFILE_H */
