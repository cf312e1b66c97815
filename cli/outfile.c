/* All-or-nothing output files; see outfile.h for the protocol and why. */
/* POSIX + XSI (fileno, stat, realpath, mkstemp, fsync, link, sigaction);
 * the same in every CLI file, so tests can compile them into one unit. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- the signal handler's table ----------------------------------------------
 * Fixed storage, so the handler reads it without calling anything unsafe. The
 * main thread changes it only with the cleanup signals blocked, and the
 * handler does its work only on the main thread (see below), so the handler
 * never sees an entry half written. */
#define TMP_SLOTS (TG_OUT_MAX + 1) /* the outputs' temporaries + one probe */
static char g_tmp[TMP_SLOTS][TG_OUT_PATH];
static volatile sig_atomic_t g_live[TMP_SLOTS];
static pthread_t g_main_thread;
static const int g_cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void cleanup_handler(int sig) {
  /* A process-directed signal may land on an OpenMP worker. Only the main
   * thread blocks the signals while it edits the table or renames, so the
   * work is passed to it: there it waits for the end of such a section. */
  if (!pthread_equal(pthread_self(), g_main_thread)) {
    pthread_kill(g_main_thread, sig);
    return;
  }
  const int saved = errno;
  for (int i = 0; i < TMP_SLOTS; i++)
    if (g_live[i]) unlink(g_tmp[i]);
  /* Die of the same signal (the shell and the caller see a SIGINT death, not
   * an exit code): default action, then raise; the signal stays blocked
   * until this handler returns, and then terminates the process. */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  raise(sig);
  errno = saved;
}

void tg_out_signals_install(void) {
  g_main_thread = pthread_self();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = cleanup_handler;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof g_cleanup_signals / sizeof g_cleanup_signals[0]; i++)
    sigaddset(&sa.sa_mask, g_cleanup_signals[i]);
  for (size_t i = 0; i < sizeof g_cleanup_signals / sizeof g_cleanup_signals[0]; i++) {
    struct sigaction old;
    /* A signal the caller set to be ignored (nohup, a background job's
     * SIGINT) stays ignored. */
    if (sigaction(g_cleanup_signals[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
      continue;
    sigaction(g_cleanup_signals[i], &sa, NULL);
  }
  /* Past `ulimit -f` write() then fails with EFBIG, which is reported and
   * cleaned up; the default action would kill the process mid-write. */
  signal(SIGXFSZ, SIG_IGN);
}

/* Blocks (on = 1) or restores the cleanup signals in the calling thread. */
static void hold_signals(int on, sigset_t *old) {
  if (on) {
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof g_cleanup_signals / sizeof g_cleanup_signals[0]; i++)
      sigaddset(&set, g_cleanup_signals[i]);
    pthread_sigmask(SIG_BLOCK, &set, old);
  } else {
    pthread_sigmask(SIG_SETMASK, old, NULL);
  }
}

/* Creates a temporary next to the target path[0..dirlen) + base (mode 0600,
 * open fd returned) and records it in a free slot of the table (*slot).
 * Returns -1 with errno set on failure. */
static int make_temp(const tg_out *o, int *slot) {
  int k = 0;
  while (k < TMP_SLOTS && g_live[k]) k++;
  if (k == TMP_SLOTS) {
    errno = EMFILE;
    return -1;
  }
  const char *base = o->path + o->dirlen + (o->path[o->dirlen] == '/');
  const char *sep = o->dirlen && o->path[o->dirlen - 1] == '/' ? "" : "/";
  /* Hidden, named after the target (a leftover is easy to trace), and short
   * enough for NAME_MAX (255): the base is cut to 200 bytes. */
  char tmpl[TG_OUT_PATH];
  const int n = snprintf(tmpl, sizeof tmpl, "%.*s%s.%.200s.tmp-XXXXXX", (int)o->dirlen,
                         o->path, sep, base);
  if (n < 0 || (size_t)n >= sizeof tmpl) {
    errno = ENAMETOOLONG;
    return -1;
  }
  sigset_t old;
  hold_signals(1, &old);
  memcpy(g_tmp[k], tmpl, (size_t)n + 1);
  const int fd = mkstemp(g_tmp[k]);
  const int e = errno;
  if (fd >= 0) g_live[k] = 1;
  hold_signals(0, &old);
  errno = e;
  if (fd >= 0) *slot = k;
  return fd;
}

/* Unlinks (if remove) and forgets a slot. */
static void drop_temp(int slot, int remove) {
  if (slot < 0) return;
  sigset_t old;
  hold_signals(1, &old);
  if (remove) unlink(g_tmp[slot]);
  g_live[slot] = 0;
  hold_signals(0, &old);
}

/* --- the set ------------------------------------------------------------------ */
int tg_out_fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void tg_outset_init(tg_outset *s) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < TG_OUT_MAX; i++) s->o[i].slot = -1;
}

int tg_out_is_file(const tg_out *o, dev_t dev, ino_t ino) {
  return o->exists && o->dev == dev && o->ino == ino;
}

/* Sets o->path to the resolved path p (absolute) and o->dirlen. */
static void set_resolved(tg_out *o, const char *p) {
  if (p != o->path) snprintf(o->path, sizeof o->path, "%s", p);
  const char *slash = strrchr(o->path, '/');
  o->dirlen = slash == o->path ? 1 : (size_t)(slash - o->path);
}

/* realpath of the directory part of `given` joined with its base name. */
static int resolve(tg_out *o, const char *given, char *err, size_t errlen) {
  const char *w = o->what;
  const size_t len = strlen(given);
  if (!len) return tg_out_fail(err, errlen, "%s: empty file name", w);
  if (len >= TG_OUT_PATH)
    return tg_out_fail(err, errlen, "%s: path of %zu bytes is longer than the system takes (%d)",
                    w, len, TG_OUT_PATH - 1);
  if (given[len - 1] == '/')
    return tg_out_fail(err, errlen, "%s=%s: is a directory (give a file name)", w, given);
  const char *slash = strrchr(given, '/');
  const char *base = slash ? slash + 1 : given;
  if (!strcmp(base, ".") || !strcmp(base, ".."))
    return tg_out_fail(err, errlen, "%s=%s: is a directory (give a file name)", w, given);
  char dir[TG_OUT_PATH];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == given) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - given), given);
  char *rdir = realpath(dir, NULL);
  if (!rdir) {
    const int e = errno;
    if (e == ENOENT)
      return tg_out_fail(err, errlen, "%s=%s: directory %s does not exist", w, given, dir);
    if (e == ENOTDIR)
      return tg_out_fail(err, errlen, "%s=%s: %s is not a directory", w, given, dir);
    return tg_out_fail(err, errlen, "%s=%s: directory %s: %s", w, given, dir, strerror(e));
  }
  struct stat st;
  if (stat(rdir, &st) == 0 && !S_ISDIR(st.st_mode)) {
    free(rdir);
    return tg_out_fail(err, errlen, "%s=%s: %s is not a directory", w, given, dir);
  }
  const int n = snprintf(o->path, sizeof o->path, "%s%s%s", rdir,
                         strcmp(rdir, "/") ? "/" : "", base);
  free(rdir);
  if (n < 0 || (size_t)n >= sizeof o->path)
    return tg_out_fail(err, errlen, "%s=%s: resolved path is too long", w, given);
  set_resolved(o, o->path);

  if (lstat(o->path, &st) != 0) {
    if (errno == ENOENT) return 0; /* a new file */
    return tg_out_fail(err, errlen, "%s=%s: %s", w, given, strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    /* Write through the link (as fopen did): replace the file it names. */
    char *real = realpath(o->path, NULL);
    if (!real)
      return tg_out_fail(err, errlen, "%s=%s: is a symbolic link that leads nowhere (%s)", w,
                      given, strerror(errno));
    set_resolved(o, real);
    free(real);
    if (lstat(o->path, &st) != 0)
      return tg_out_fail(err, errlen, "%s=%s: %s", w, given, strerror(errno));
  }
  if (S_ISDIR(st.st_mode))
    return tg_out_fail(err, errlen, "%s=%s: is a directory (give a file name)", w, given);
  if (!S_ISREG(st.st_mode))
    return tg_out_fail(err, errlen,
                    "%s=%s: is not a regular file (a device, FIFO or socket); outputs are "
                    "written to a temporary file and renamed over the target, which would "
                    "replace it",
                    w, given);
  if (access(o->path, W_OK) != 0)
    return tg_out_fail(err, errlen, "%s=%s: file is not writable: %s", w, given, strerror(errno));
  o->exists = 1;
  o->dev = st.st_dev;
  o->ino = st.st_ino;
  o->mode = st.st_mode & 07777;
  return 0;
}

int tg_outset_add(tg_outset *s, const char *what, const char *path, char *err,
                  size_t errlen) {
  if (s->n == TG_OUT_MAX)
    return tg_out_fail(err, errlen, "%s=%s: more than %d outputs", what, path, TG_OUT_MAX);
  tg_out *o = &s->o[s->n];
  memset(o, 0, sizeof *o);
  o->slot = -1;
  snprintf(o->what, sizeof o->what, "%s", what);
  if (resolve(o, path, err, errlen)) return -1;
  for (int j = 0; j < s->n; j++) {
    const tg_out *p = &s->o[j];
    if (!strcmp(p->path, o->path) || (o->exists && tg_out_is_file(p, o->dev, o->ino)))
      return tg_out_fail(err, errlen,
                      "%s=%s and %s name the same file (%s): one result would overwrite "
                      "the other",
                      what, path, p->what, o->path);
  }
  /* Prove the directory takes a new file (write permission, a read-only
   * mount, a full inode table): a temporary is created and removed at once,
   * so the failure comes now and not after the computation. */
  int slot;
  const int fd = make_temp(o, &slot);
  if (fd < 0) {
    const int e = errno;
    return tg_out_fail(err, errlen, "%s=%s: cannot create a file in %.*s: %s", what, path,
                    (int)o->dirlen, o->path, strerror(e));
  }
  close(fd);
  drop_temp(slot, 1);
  return s->n++;
}

FILE *tg_outset_open(tg_outset *s, int i, char *err, size_t errlen) {
  tg_out *o = &s->o[i];
  int slot;
  const int fd = make_temp(o, &slot);
  if (fd < 0) {
    const int e = errno;
    tg_out_fail(err, errlen, "%s=%s: cannot create a temporary file next to it: %s", o->what,
             o->path, strerror(e));
    return NULL;
  }
  o->slot = slot;
  /* mkstemp makes 0600; the result gets the old file's mode, or what fopen
   * would have given a new file (0666 less the umask). */
  mode_t mode = o->mode;
  if (!o->exists) {
    const mode_t mask = umask(0);
    umask(mask);
    mode = 0666 & ~mask;
  }
  fchmod(fd, mode);
  o->f = fdopen(fd, "wb");
  if (!o->f) {
    const int e = errno;
    close(fd);
    drop_temp(slot, 1);
    o->slot = -1;
    tg_out_fail(err, errlen, "%s=%s: %s", o->what, o->path, strerror(e));
    return NULL;
  }
  return o->f;
}

void tg_outset_discard(tg_outset *s) {
  for (int i = 0; i < s->n; i++) {
    tg_out *o = &s->o[i];
    if (o->f) fclose(o->f);
    o->f = NULL;
    drop_temp(o->slot, 1);
    o->slot = -1;
  }
}

/* Makes the renames durable; best effort (some file systems refuse fsync on
 * a directory, and the data itself is already synced). */
static void sync_dir(const tg_out *o) {
  char dir[TG_OUT_PATH];
  snprintf(dir, sizeof dir, "%.*s", (int)o->dirlen, o->path);
  const int fd = open(dir, O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

int tg_outset_commit(tg_outset *s, char *err, size_t errlen) {
  /* 1. every temporary complete and on disk, or nothing is renamed */
  for (int i = 0; i < s->n; i++) {
    tg_out *o = &s->o[i];
    if (!o->f) {
      tg_out_fail(err, errlen, "%s=%s: internal error: output was never written", o->what,
               o->path);
      tg_outset_discard(s);
      return -1;
    }
    int bad = fflush(o->f) != 0 || ferror(o->f);
    int e = errno;
    if (!bad && fsync(fileno(o->f)) != 0) bad = 1, e = errno;
    if (fclose(o->f) != 0 && !bad) bad = 1, e = errno;
    o->f = NULL;
    if (bad) {
      tg_out_fail(err, errlen, "%s=%s: write error: %s; no output was changed", o->what,
               o->path, strerror(e));
      tg_outset_discard(s);
      return -1;
    }
  }
  /* 2. the renames, with the cleanup signals held back so that a signal
   * cannot stop them half-way. A target that exists gets a second name
   * first, so that it can be put back if a later rename fails. */
  sigset_t old;
  hold_signals(1, &old);
  char backup[TG_OUT_MAX][TG_OUT_PATH + 8];
  int have_backup[TG_OUT_MAX] = {0};
  int failed = -1, e = 0;
  for (int i = 0; i < s->n && failed < 0; i++) {
    tg_out *o = &s->o[i];
    if (o->exists) {
      snprintf(backup[i], sizeof backup[i], "%s.old", g_tmp[o->slot]);
      have_backup[i] = link(o->path, backup[i]) == 0;
    }
    if (rename(g_tmp[o->slot], o->path) != 0) {
      failed = i, e = errno;
      break;
    }
    g_live[o->slot] = 0;
    o->slot = -1;
  }
  int lost = -1; /* a target replaced that could not be put back */
  if (failed >= 0) {
    for (int j = 0; j < failed; j++) {
      const tg_out *o = &s->o[j];
      if (have_backup[j]) {
        if (rename(backup[j], o->path) == 0) have_backup[j] = 0;
        else lost = j;
      } else if (!o->exists) {
        unlink(o->path); /* the file this run created */
      } else {
        lost = j;
      }
    }
  }
  for (int i = 0; i < s->n; i++)
    if (have_backup[i]) unlink(backup[i]); /* our name: the old file goes, as by rename */
  hold_signals(0, &old);
  if (failed >= 0) {
    const tg_out *o = &s->o[failed];
    if (lost >= 0)
      tg_out_fail(err, errlen, "%s=%s: cannot rename the result over it: %s; %s=%s was "
               "already replaced and could not be restored",
               o->what, o->path, strerror(e), s->o[lost].what, s->o[lost].path);
    else
      tg_out_fail(err, errlen, "%s=%s: cannot rename the result over it: %s; no output was "
               "changed", o->what, o->path, strerror(e));
    tg_outset_discard(s);
    return -1;
  }
  for (int i = 0; i < s->n; i++) sync_dir(&s->o[i]);
  return 0;
}
