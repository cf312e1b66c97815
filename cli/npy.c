/* .npy v1/v2/v3 reader and writer; see npy.h for what is supported. */
/* POSIX + XSI (fileno, stat, realpath, mkstemp, fsync, link, sigaction);
 * the same in every CLI file, so tests can compile them into one unit. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "outfile.h"

/* Headers longer than this are refused before anything is allocated: a
 * well-formed header for ndim <= 8 is well under 1 KiB. */
#define NPY_MAX_HEADER_LEN (1u << 20)

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};


size_t npy_dtype_size(npy_dtype t) { return t == NPY_BF16 ? 2 : 4; }

const char *npy_dtype_name(npy_dtype t) {
  switch (t) {
    case NPY_F32: return "float32";
    case NPY_BF16: return "bfloat16";
    case NPY_U32: return "uint32";
    case NPY_I32: return "int32";
  }
  return "?";
}

const char *npy_dtype_descr(npy_dtype t) {
  switch (t) {
    case NPY_F32: return "<f4";
    case NPY_BF16: return "<u2"; /* bf16 bits travel as uint16 */
    case NPY_U32: return "<u4";
    case NPY_I32: return "<i4";
  }
  return "?";
}

const char *npy_shape_str(const npy_array *a, char *buf, size_t buflen) {
  size_t used = 0;
  if (!buflen) return buf;
  buf[0] = '\0';
  used += (size_t)snprintf(buf + used, buflen - used, "(");
  for (int i = 0; i < a->ndim && used < buflen; i++)
    used += (size_t)snprintf(buf + used, buflen - used, "%s%lld", i ? ", " : "",
                             (long long)a->shape[i]);
  if (used < buflen) snprintf(buf + used, buflen - used, a->ndim == 1 ? ",)" : ")");
  return buf;
}

/* Element count and byte size of a shape, refusing negative dims and sizes
 * that overflow int64 or size_t. */
static int npy_sizes(npy_dtype t, int ndim, const int64_t *shape, int64_t *count,
                     int64_t *bytes) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
    n *= shape[i];
  }
  const int64_t es = (int64_t)npy_dtype_size(t);
  if (n > INT64_MAX / es) return -1;
  if ((uint64_t)(n * es) > (uint64_t)SIZE_MAX - 64) return -1;
  *count = n;
  *bytes = n * es;
  return 0;
}

/* 64-byte aligned, zeroed, never NULL for a 0-byte request. */
static void *npy_aligned_zalloc(int64_t bytes) {
  size_t rounded = ((size_t)bytes + 63) & ~(size_t)63;
  if (rounded == 0) rounded = 64;
  void *p = aligned_alloc(64, rounded);
  if (p) memset(p, 0, rounded);
  return p;
}

int npy_alloc(npy_array *out, npy_dtype t, int ndim, const int64_t *shape,
              const char *what, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (ndim < 0 || ndim > NPY_MAX_DIMS)
    return tg_out_fail(err, errlen, "%s: %d dimensions (at most %d supported)", what, ndim,
                    NPY_MAX_DIMS);
  int64_t count, bytes;
  if (npy_sizes(t, ndim, shape, &count, &bytes))
    return tg_out_fail(err, errlen, "%s: shape has a negative dim or its size overflows",
                    what);
  void *p = npy_aligned_zalloc(bytes);
  if (!p)
    return tg_out_fail(err, errlen, "%s: cannot allocate %lld bytes", what,
                    (long long)bytes);
  out->dtype = t;
  out->ndim = ndim;
  for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
  out->count = count;
  out->data = p;
  return 0;
}

void npy_free(npy_array *a) {
  if (!a) return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

static int host_is_little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

static void byteswap_elements(void *data, int64_t count, size_t es) {
  unsigned char *p = data;
  for (int64_t i = 0; i < count; i++, p += es)
    for (size_t j = 0; j < es / 2; j++) {
      unsigned char t = p[j];
      p[j] = p[es - 1 - j];
      p[es - 1 - j] = t;
    }
}

/* --- header dict parser ----------------------------------------------------
 * The header is a Python literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * We accept any key order, either quote style, optional trailing commas,
 * Python 2 "3L" longs in the shape, and whitespace anywhere between tokens.
 * Exactly the three keys must be present. */
typedef struct {
  const char *s;
  size_t len, pos;
  const char *name; /* file name for messages */
  char *err;
  size_t errlen;
} hdr_parser;

static void hp_skip_ws(hdr_parser *p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
    p->pos++;
}

static int hp_peek(hdr_parser *p) {
  hp_skip_ws(p);
  return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1;
}

static int hp_expect(hdr_parser *p, char c, const char *where) {
  if (hp_peek(p) != c)
    return tg_out_fail(p->err, p->errlen, "%s: malformed .npy header: expected '%c' %s at byte %zu",
                    p->name, c, where, p->pos);
  p->pos++;
  return 0;
}

/* A quoted string (no escapes) copied into out (at most outlen-1 chars). */
static int hp_string(hdr_parser *p, char *out, size_t outlen, const char *what) {
  const int q = hp_peek(p);
  if (q != '\'' && q != '"')
    return tg_out_fail(p->err, p->errlen, "%s: malformed .npy header: expected a quoted %s at byte %zu",
                    p->name, what, p->pos);
  size_t start = ++p->pos, n = 0;
  while (p->pos < p->len && p->s[p->pos] != q) {
    if (p->s[p->pos] == '\\')
      return tg_out_fail(p->err, p->errlen, "%s: malformed .npy header: escape in %s",
                      p->name, what);
    p->pos++;
  }
  if (p->pos >= p->len)
    return tg_out_fail(p->err, p->errlen, "%s: malformed .npy header: unterminated %s",
                    p->name, what);
  n = p->pos - start;
  p->pos++; /* closing quote */
  if (n + 1 > outlen)
    return tg_out_fail(p->err, p->errlen, "%s: malformed .npy header: %s too long (%zu chars)",
                    p->name, what, n);
  memcpy(out, p->s + start, n);
  out[n] = '\0';
  return 0;
}

static int hp_word(hdr_parser *p, const char *w) {
  const size_t n = strlen(w);
  hp_skip_ws(p);
  if (p->len - p->pos >= n && memcmp(p->s + p->pos, w, n) == 0) {
    const char next = p->pos + n < p->len ? p->s[p->pos + n] : ' ';
    if (!(next == '_' || (next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') ||
          (next >= '0' && next <= '9'))) {
      p->pos += n;
      return 1;
    }
  }
  return 0;
}

/* A non-negative decimal integer, optionally followed by 'L'. */
static int hp_dim(hdr_parser *p, int64_t *out) {
  hp_skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == '-')
    return tg_out_fail(p->err, p->errlen, "%s: .npy header: negative dimension in shape", p->name);
  if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
    return tg_out_fail(p->err, p->errlen,
                    "%s: malformed .npy header: expected an integer in shape at byte %zu",
                    p->name, p->pos);
  int64_t v = 0;
  while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
    const int d = p->s[p->pos] - '0';
    if (v > (INT64_MAX - d) / 10)
      return tg_out_fail(p->err, p->errlen, "%s: .npy header: shape dimension overflows int64",
                      p->name);
    v = v * 10 + d;
    p->pos++;
  }
  if (p->pos < p->len && p->s[p->pos] == 'L') p->pos++;
  *out = v;
  return 0;
}

static int hp_shape(hdr_parser *p, npy_array *a) {
  if (hp_expect(p, '(', "to open the shape tuple")) return -1;
  a->ndim = 0;
  for (;;) {
    if (hp_peek(p) == ')') break;
    if (a->ndim == NPY_MAX_DIMS)
      return tg_out_fail(p->err, p->errlen, "%s: array has more than %d dimensions", p->name,
                      NPY_MAX_DIMS);
    if (hp_dim(p, &a->shape[a->ndim])) return -1;
    a->ndim++;
    const int c = hp_peek(p);
    if (c == ',') {
      p->pos++;
      continue;
    }
    if (c != ')')
      return tg_out_fail(p->err, p->errlen,
                      "%s: malformed .npy header: expected ',' or ')' in shape at byte %zu",
                      p->name, p->pos);
  }
  p->pos++; /* ')' */
  /* numpy never writes "(3)" (a bare int in Python); it is read as (3,). */
  return 0;
}

static int descr_to_dtype(const char *d, npy_dtype *t) {
  if (!strcmp(d, "<f4")) *t = NPY_F32;
  else if (!strcmp(d, "<u2") || !strcmp(d, "<V2") || !strcmp(d, "|V2") ||
           !strcmp(d, "bfloat16") || !strcmp(d, "<bfloat16"))
    *t = NPY_BF16;
  else if (!strcmp(d, "<u4")) *t = NPY_U32;
  else if (!strcmp(d, "<i4")) *t = NPY_I32;
  else return -1;
  return 0;
}

int npy_parse_header(const char *text, size_t len, const char *name, npy_array *out,
                     char *err, size_t errlen) {
  hdr_parser p = {text, len, 0, name, err, errlen};
  int have_descr = 0, have_fortran = 0, have_shape = 0, fortran = 0;
  char descr[64] = "";
  memset(out, 0, sizeof *out);

  if (hp_expect(&p, '{', "at the start of the header dict")) return -1;
  for (;;) {
    if (hp_peek(&p) == '}') break;
    char key[32];
    if (hp_string(&p, key, sizeof key, "key")) return -1;
    if (hp_expect(&p, ':', "after a key")) return -1;
    if (!strcmp(key, "descr")) {
      if (have_descr) return tg_out_fail(err, errlen, "%s: .npy header: duplicate 'descr'", name);
      if (hp_peek(&p) == '[')
        return tg_out_fail(err, errlen,
                        "%s: structured dtype (descr is a list) is not supported; "
                        "save a plain float32/bfloat16/uint32/int32 array",
                        name);
      if (hp_string(&p, descr, sizeof descr, "descr")) return -1;
      have_descr = 1;
    } else if (!strcmp(key, "fortran_order")) {
      if (have_fortran)
        return tg_out_fail(err, errlen, "%s: .npy header: duplicate 'fortran_order'", name);
      if (hp_word(&p, "True")) fortran = 1;
      else if (hp_word(&p, "False")) fortran = 0;
      else
        return tg_out_fail(err, errlen,
                        "%s: malformed .npy header: fortran_order is not True or False", name);
      have_fortran = 1;
    } else if (!strcmp(key, "shape")) {
      if (have_shape) return tg_out_fail(err, errlen, "%s: .npy header: duplicate 'shape'", name);
      if (hp_shape(&p, out)) return -1;
      have_shape = 1;
    } else {
      return tg_out_fail(err, errlen, "%s: .npy header: unexpected key '%s'", name, key);
    }
    const int c = hp_peek(&p);
    if (c == ',') {
      p.pos++;
      continue;
    }
    if (c != '}')
      return tg_out_fail(err, errlen,
                      "%s: malformed .npy header: expected ',' or '}' at byte %zu", name, p.pos);
  }
  p.pos++; /* '}' */
  hp_skip_ws(&p);
  if (p.pos != p.len)
    return tg_out_fail(err, errlen, "%s: malformed .npy header: junk after the dict at byte %zu",
                    name, p.pos);
  if (!have_descr || !have_fortran || !have_shape)
    return tg_out_fail(err, errlen, "%s: .npy header lacks the '%s' key", name,
                    !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");

  if (descr_to_dtype(descr, &out->dtype)) {
    const char *hint = "";
    if (descr[0] == '>') hint = " (big-endian data: use arr.astype(arr.dtype.newbyteorder('<')))";
    else if (!strcmp(descr, "<f8")) hint = " (float64: save arr.astype(np.float32))";
    else if (!strcmp(descr, "<i8") || !strcmp(descr, "<u8"))
      hint = " (64-bit ints: save arr.astype(np.int32) or np.uint32)";
    else if (!strcmp(descr, "<f2")) hint = " (float16 is not bfloat16)";
    return tg_out_fail(err, errlen,
                    "%s: unsupported dtype '%s'%s; supported: '<f4' float32, '<u2'/'<V2'/"
                    "'bfloat16' bfloat16 bits, '<u4' uint32, '<i4' int32",
                    name, descr, hint);
  }
  if (fortran)
    return tg_out_fail(err, errlen,
                    "%s: fortran_order is True; only C-order arrays are supported "
                    "(save np.ascontiguousarray(arr))",
                    name);
  int64_t bytes;
  if (npy_sizes(out->dtype, out->ndim, out->shape, &out->count, &bytes)) {
    char sb[256];
    return tg_out_fail(err, errlen, "%s: shape %s of %s is too large (byte size overflows)",
                    name, npy_shape_str(out, sb, sizeof sb), npy_dtype_name(out->dtype));
  }
  return 0;
}

/* --- reading ------------------------------------------------------------ */
static uint32_t le_u32(const unsigned char *b, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | b[i];
  return v;
}

int npy_read_stream(FILE *f, const char *name, npy_array *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  unsigned char pre[12];
  size_t got = fread(pre, 1, 8, f);
  if (got < 8 && ferror(f))
    return tg_out_fail(err, errlen, "%s: read error: %s", name, strerror(errno));
  if (got < 8 || memcmp(pre, npy_magic, 6) != 0) {
    if (got < 8 && (got == 0 || memcmp(pre, npy_magic, got < 6 ? got : 6) == 0))
      return tg_out_fail(err, errlen, "%s: too short to be a .npy file (%zu bytes)", name, got);
    return tg_out_fail(err, errlen, "%s: not a .npy file (bad magic string)", name);
  }
  const int major = pre[6], minor = pre[7];
  const int lenbytes = major == 1 ? 2 : (major == 2 || major == 3) ? 4 : 0;
  if (!lenbytes)
    return tg_out_fail(err, errlen, "%s: unsupported .npy format version %d.%d", name, major,
                    minor);
  if (fread(pre + 8, 1, (size_t)lenbytes, f) != (size_t)lenbytes)
    return tg_out_fail(err, errlen, "%s: truncated .npy header (no header length)", name);
  const uint32_t hlen = le_u32(pre + 8, lenbytes);
  if (hlen > NPY_MAX_HEADER_LEN)
    return tg_out_fail(err, errlen, "%s: .npy header length %u is implausible", name, hlen);
  char *text = malloc(hlen ? hlen : 1);
  if (!text) return tg_out_fail(err, errlen, "%s: out of memory reading the header", name);
  if (fread(text, 1, hlen, f) != hlen) {
    free(text);
    return tg_out_fail(err, errlen, "%s: truncated .npy header (expected %u bytes)", name, hlen);
  }
  for (uint32_t i = 0; i < hlen; i++)
    if (text[i] == '\0' || (unsigned char)text[i] >= 0x80) {
      free(text);
      return tg_out_fail(err, errlen, "%s: .npy header has a non-ASCII byte at offset %u", name,
                      i);
    }
  npy_array hdr;
  const int rc = npy_parse_header(text, hlen, name, &hdr, err, errlen);
  free(text);
  if (rc) return -1;

  const size_t es = npy_dtype_size(hdr.dtype);
  const int64_t need = hdr.count * (int64_t)es; /* checked by npy_parse_header */
  char sb[256];
  /* Compare with the file size before allocating, where the stream can
   * seek: a truncated file claiming a huge shape then costs nothing. */
  const long here = ftell(f);
  if (here >= 0 && fseek(f, 0, SEEK_END) == 0) {
    const long end = ftell(f);
    if (end >= 0 && fseek(f, here, SEEK_SET) == 0) {
      const int64_t have = (int64_t)end - (int64_t)here;
      if (have < need)
        return tg_out_fail(err, errlen,
                        "%s: truncated: shape %s of %s needs %lld data bytes, file has %lld",
                        name, npy_shape_str(&hdr, sb, sizeof sb), npy_dtype_name(hdr.dtype),
                        (long long)need, (long long)have);
      if (have > need)
        return tg_out_fail(err, errlen,
                        "%s: %lld extra bytes after the data of shape %s of %s "
                        "(header and data disagree)",
                        name, (long long)(have - need), npy_shape_str(&hdr, sb, sizeof sb),
                        npy_dtype_name(hdr.dtype));
    } else {
      clearerr(f);
    }
  } else {
    clearerr(f);
  }

  void *data = npy_aligned_zalloc(need);
  if (!data)
    return tg_out_fail(err, errlen, "%s: cannot allocate %lld bytes for the data", name,
                    (long long)need);
  const size_t n_read = fread(data, 1, (size_t)need, f);
  if (n_read != (size_t)need) {
    free(data);
    if (ferror(f))
      return tg_out_fail(err, errlen, "%s: read error: %s", name, strerror(errno));
    return tg_out_fail(err, errlen,
                    "%s: truncated: shape %s of %s needs %lld data bytes, file has %zu", name,
                    npy_shape_str(&hdr, sb, sizeof sb), npy_dtype_name(hdr.dtype),
                    (long long)need, n_read);
  }
  if (fgetc(f) != EOF) {
    free(data);
    return tg_out_fail(err, errlen, "%s: extra bytes after the data of shape %s (header and "
                    "data disagree)", name, npy_shape_str(&hdr, sb, sizeof sb));
  }
  if (!host_is_little_endian()) byteswap_elements(data, hdr.count, es);
  if (hdr.dtype == NPY_I32) {
    const int32_t *v = data;
    for (int64_t i = 0; i < hdr.count; i++)
      if (v[i] < 0) {
        const int bad = (int)v[i];
        free(data);
        return tg_out_fail(err, errlen,
                        "%s: int32 element %lld is negative (%d); ids/targets must be >= 0",
                        name, (long long)i, bad);
      }
  }
  *out = hdr;
  out->data = data;
  return 0;
}

int npy_read(const char *path, npy_array *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f) return tg_out_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
  /* fopen opens a directory for reading on Linux, and reading it then fails
   * with EISDIR, which would be reported as a file "too short". */
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    return tg_out_fail(err, errlen, "%s: is a directory, not a .npy file", path);
  }
  const int rc = npy_read_stream(f, path, out, err, errlen);
  fclose(f);
  return rc;
}

/* --- writing ------------------------------------------------------------ */
int npy_write_stream(FILE *f, const char *name, const npy_array *a, char *err,
                     size_t errlen) {
  if (a->ndim < 0 || a->ndim > NPY_MAX_DIMS)
    return tg_out_fail(err, errlen, "%s: cannot write %d dimensions", name, a->ndim);
  char shape[256];
  npy_shape_str(a, shape, sizeof shape);
  char dict[512];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                   npy_dtype_descr(a->dtype), shape);
  if (n < 0 || (size_t)n >= sizeof dict)
    return tg_out_fail(err, errlen, "%s: header too long", name);
  /* Pad with spaces and end with '\n' so the data starts 64-byte aligned. */
  size_t hlen = (size_t)n + 1;
  int major = 1;
  size_t prefix = 10;
  if (((prefix + hlen + 63) & ~(size_t)63) - prefix > 65535) {
    major = 2;
    prefix = 12;
  }
  const size_t total = (prefix + hlen + 63) & ~(size_t)63;
  hlen = total - prefix;
  unsigned char head[12 + 512 + 64];
  memcpy(head, npy_magic, 6);
  head[6] = (unsigned char)major;
  head[7] = 0;
  for (size_t i = 0; i < prefix - 8; i++) head[8 + i] = (unsigned char)(hlen >> (8 * i));
  memcpy(head + prefix, dict, (size_t)n);
  memset(head + prefix + n, ' ', hlen - (size_t)n - 1);
  head[total - 1] = '\n';
  if (fwrite(head, 1, total, f) != total)
    return tg_out_fail(err, errlen, "%s: write error: %s", name, strerror(errno));

  const size_t es = npy_dtype_size(a->dtype);
  if (host_is_little_endian()) {
    if (a->count && fwrite(a->data, es, (size_t)a->count, f) != (size_t)a->count)
      return tg_out_fail(err, errlen, "%s: write error: %s", name, strerror(errno));
  } else {
    const unsigned char *p = a->data;
    for (int64_t i = 0; i < a->count; i++, p += es) {
      unsigned char tmp[4];
      for (size_t j = 0; j < es; j++) tmp[j] = p[es - 1 - j];
      if (fwrite(tmp, 1, es, f) != es)
        return tg_out_fail(err, errlen, "%s: write error: %s", name, strerror(errno));
    }
  }
  return 0;
}

int npy_write(const char *path, const npy_array *a, char *err, size_t errlen) {
  tg_outset set;
  tg_outset_init(&set);
  if (tg_outset_add(&set, "output", path, err, errlen) < 0) return -1;
  FILE *f = tg_outset_open(&set, 0, err, errlen);
  if (!f) return -1;
  if (npy_write_stream(f, path, a, err, errlen)) {
    tg_outset_discard(&set);
    return -1;
  }
  return tg_outset_commit(&set, err, errlen);
}
