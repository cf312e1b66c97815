/*
 * A small .npy reader and writer for the `tilegrad run` command.
 *
 * Format (numpy's NEP 1): the magic "\x93NUMPY", a major/minor version byte
 * pair, the header length (uint16 LE for v1, uint32 LE for v2/v3), an ASCII
 * Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...)}
 * padded with spaces and a newline, then the raw C-order data.
 *
 * Supported element types (little-endian on disk):
 *   NPY_F32   '<f4'                               float32
 *   NPY_BF16  '<u2', '<V2', '|V2', 'bfloat16'     raw bfloat16 bits (uint16)
 *   NPY_U32   '<u4'                               ids / targets
 *   NPY_I32   '<i4'                               ids / targets; a negative
 *                                                 value is refused on read
 * C order only, 0 <= ndim <= NPY_MAX_DIMS. Every error message starts with
 * the file name and says what is wrong.
 */
#ifndef TG_CLI_NPY_H
#define TG_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_DIMS 8
/* Room for a message naming up to three paths of PATH_MAX (4096) bytes, so
 * that the reason after a long path is never cut off. */
#define NPY_ERR_LEN (3 * 4096 + 1024)

typedef enum { NPY_F32 = 0, NPY_BF16 = 1, NPY_U32 = 2, NPY_I32 = 3 } npy_dtype;

typedef struct {
  npy_dtype dtype;
  int ndim;                       /* 0 = scalar (one element) */
  int64_t shape[NPY_MAX_DIMS];
  int64_t count;                  /* product of shape (1 for ndim 0) */
  void *data;                     /* count * npy_dtype_size(dtype) bytes, 64-byte
                                     aligned, host byte order; free with npy_free */
} npy_array;

/* Bytes per element (4, 2, 4, 4). */
size_t npy_dtype_size(npy_dtype t);
/* Human name: "float32", "bfloat16", "uint32", "int32". */
const char *npy_dtype_name(npy_dtype t);
/* The descr written to files: "<f4", "<u2", "<u4", "<i4". */
const char *npy_dtype_descr(npy_dtype t);

/* Allocates a zero-filled array of the given shape in *out (0 on success).
 * Refuses ndim outside [0, NPY_MAX_DIMS], a negative dim and a byte size that
 * overflows int64/size_t; `what` names the array in the message. */
int npy_alloc(npy_array *out, npy_dtype t, int ndim, const int64_t *shape,
              const char *what, char *err, size_t errlen);

/* Reads path into *out. Returns 0 on success; otherwise -1 with a message in
 * err (which names path) and *out left empty (data NULL). */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);

/* Same from an open stream; `name` is used in messages. Reads to EOF: bytes
 * after the data are an error (the shape would be wrong). */
int npy_read_stream(FILE *f, const char *name, npy_array *out, char *err, size_t errlen);

/* Parses the header dict text (the bytes between the length field and the
 * data, `len` bytes, not NUL-terminated) into dtype/ndim/shape/count of *out
 * (data untouched). Exposed for tests. */
int npy_parse_header(const char *text, size_t len, const char *name, npy_array *out,
                     char *err, size_t errlen);

/* Writes an array (v1 header, or v2 when the header needs more than 65535
 * bytes) to path through a temporary file renamed over it (outfile.h): on
 * failure path is unchanged. Returns 0 or -1 with a message naming path. */
int npy_write(const char *path, const npy_array *a, char *err, size_t errlen);
int npy_write_stream(FILE *f, const char *name, const npy_array *a, char *err,
                     size_t errlen);

/* Formats a shape as "(2, 3)" / "(5,)" / "()" into buf. */
const char *npy_shape_str(const npy_array *a, char *buf, size_t buflen);

void npy_free(npy_array *a); /* frees data, leaves an empty array; NULL ok */

#endif /* TG_CLI_NPY_H */
