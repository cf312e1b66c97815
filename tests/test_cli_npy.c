/*
 * The CLI's .npy reader/writer (cli/npy.c, compiled into this test directly:
 * the CLI sources are not part of libtilegrad).
 *
 * Covers: round trips of every dtype and ndim 0..8 through streams and
 * files; header variants numpy or other writers produce (quote styles, key
 * order, "3L", v2/v3 headers, bf16 descr aliases); malformed headers; bad
 * magic/version; truncated and over-long data; fortran order; shapes whose
 * size overflows; negative int32 ids. Every error must name the file.
 */
#include "../cli/npy.c"
#include "../cli/outfile.c" /* npy_write writes through it */

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

/* --- helpers --------------------------------------------------------------- */

/* A tmpfile() holding magic, version, header length (2 or 4 bytes as the
 * version says), the header text as given, then payload; rewound. */
static FILE *raw_npy(int major, const char *header, const void *payload, size_t n) {
  FILE *f = tmpfile();
  assert_non_null(f);
  const size_t hl = strlen(header);
  unsigned char pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major, 0};
  const int lb = major == 1 ? 2 : 4;
  for (int i = 0; i < lb; i++) pre[8 + i] = (unsigned char)(hl >> (8 * i));
  assert_int_equal(fwrite(pre, 1, (size_t)(8 + lb), f), (size_t)(8 + lb));
  assert_int_equal(fwrite(header, 1, hl, f), hl);
  if (n) assert_int_equal(fwrite(payload, 1, n, f), n);
  rewind(f);
  return f;
}

/* Reads a stream expecting failure; the message must name the file and
 * contain `want`. */
static void expect_read_error(FILE *f, const char *want) {
  npy_array a;
  char err[NPY_ERR_LEN] = "";
  const int rc = npy_read_stream(f, "bad.npy", &a, err, sizeof err);
  fclose(f);
  if (rc == 0) {
    npy_free(&a);
    fail_msg("read succeeded; wanted an error containing '%s'", want);
  }
  assert_null(a.data);
  if (!strstr(err, "bad.npy")) fail_msg("error does not name the file: %s", err);
  if (!strstr(err, want)) fail_msg("error '%s' does not contain '%s'", err, want);
}

static void expect_header_error(const char *header, const char *want) {
  static const unsigned char payload[64] = {0};
  expect_read_error(raw_npy(1, header, payload, 0), want);
}

/* Reads a stream that must succeed. */
static npy_array read_ok(FILE *f) {
  npy_array a;
  char err[NPY_ERR_LEN] = "";
  const int rc = npy_read_stream(f, "good.npy", &a, err, sizeof err);
  fclose(f);
  if (rc) fail_msg("read failed: %s", err);
  return a;
}

static void fill_pattern(npy_array *a, tu_rng *r) {
  unsigned char *p = a->data;
  const size_t n = (size_t)a->count * npy_dtype_size(a->dtype);
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)tu_next(r);
  if (a->dtype == NPY_I32) /* keep int32 ids non-negative */
    for (int64_t i = 0; i < a->count; i++) ((int32_t *)a->data)[i] &= 0x7FFFFFFF;
}

/* --- round trips ------------------------------------------------------------ */

static void test_round_trip_all_dtypes_and_ndims(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed());
  const npy_dtype types[] = {NPY_F32, NPY_BF16, NPY_U32, NPY_I32};
  for (int ti = 0; ti < 4; ti++) {
    for (int nd = 0; nd <= NPY_MAX_DIMS; nd++) {
      int64_t shape[NPY_MAX_DIMS];
      for (int d = 0; d < nd; d++) shape[d] = nd > 5 ? tu_int(&r, 1, 2) : tu_int(&r, 1, 5);
      npy_array a, b;
      char err[NPY_ERR_LEN];
      assert_int_equal(npy_alloc(&a, types[ti], nd, shape, "a", err, sizeof err), 0);
      fill_pattern(&a, &r);
      FILE *f = tmpfile();
      assert_non_null(f);
      if (npy_write_stream(f, "rt.npy", &a, err, sizeof err)) fail_msg("%s", err);
      /* the data starts 64-byte aligned, after a '\n'-terminated header */
      const long data_off = ftell(f) - (long)(a.count * (int64_t)npy_dtype_size(a.dtype));
      assert_int_equal(data_off % 64, 0);
      rewind(f);
      b = read_ok(f);
      assert_int_equal(b.dtype, a.dtype);
      assert_int_equal(b.ndim, nd);
      assert_int_equal(b.count, a.count);
      for (int d = 0; d < nd; d++) assert_int_equal(b.shape[d], shape[d]);
      assert_memory_equal(a.data, b.data, (size_t)a.count * npy_dtype_size(a.dtype));
      assert_int_equal((uintptr_t)b.data % 64, 0);
      npy_free(&a);
      npy_free(&b);
    }
  }
}

static void test_round_trip_through_a_file(void **state) {
  (void)state;
  /* one file per process: ctest -j runs this suite once per ISA at once,
   * in the same directory */
  char path[64];
  snprintf(path, sizeof path, "test_cli_npy_roundtrip.%ld.npy", (long)getpid());
  const int64_t shape[2] = {3, 4};
  npy_array a, b;
  char err[NPY_ERR_LEN];
  assert_int_equal(npy_alloc(&a, NPY_F32, 2, shape, "a", err, sizeof err), 0);
  for (int i = 0; i < 12; i++) ((float *)a.data)[i] = (float)i * 0.5f - 1.0f;
  if (npy_write(path, &a, err, sizeof err)) fail_msg("%s", err);
  if (npy_read(path, &b, err, sizeof err)) fail_msg("%s", err);
  assert_memory_equal(a.data, b.data, 12 * sizeof(float));
  remove(path);
  npy_free(&a);
  npy_free(&b);
  /* a missing file names the path */
  assert_int_equal(npy_read("no/such/dir/x.npy", &b, err, sizeof err), -1);
  assert_non_null(strstr(err, "no/such/dir/x.npy"));
  assert_int_equal(npy_write("no/such/dir/x.npy", &a, err, sizeof err), -1);
  assert_non_null(strstr(err, "no/such/dir/x.npy"));
}

/* The writer produces exactly numpy's header layout. */
static void test_writer_header_matches_numpy(void **state) {
  (void)state;
  const int64_t shape[1] = {5};
  npy_array a;
  char err[NPY_ERR_LEN];
  assert_int_equal(npy_alloc(&a, NPY_BF16, 1, shape, "a", err, sizeof err), 0);
  FILE *f = tmpfile();
  assert_int_equal(npy_write_stream(f, "h.npy", &a, err, sizeof err), 0);
  rewind(f);
  /* numpy 1.24 writes exactly these 128 bytes before the data */
  unsigned char buf[128];
  assert_int_equal(fread(buf, 1, 128, f), 128);
  fclose(f);
  assert_memory_equal(buf, "\x93NUMPY\x01\x00", 8);
  assert_int_equal(buf[8] | buf[9] << 8, 128 - 10);
  const char *want = "{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }";
  assert_memory_equal(buf + 10, want, strlen(want));
  for (size_t i = 10 + strlen(want); i < 127; i++) assert_int_equal(buf[i], ' ');
  assert_int_equal(buf[127], '\n');
  npy_free(&a);
}

/* --- header variants that must be accepted ------------------------------------ */

static void test_header_variants(void **state) {
  (void)state;
  const float payload[6] = {1, 2, 3, 4, 5, 6};
  struct {
    int major;
    const char *header;
    npy_dtype dtype;
    int ndim;
    int64_t d0;
  } cases[] = {
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", NPY_F32, 2, 2},
      {1, "{\"shape\":(6,),\"descr\":\"<f4\",\"fortran_order\":False}", NPY_F32, 1, 6},
      {1, "  {'fortran_order' : False , 'shape' : ( 2L , 3L ) , 'descr' : '<f4' }   \n",
       NPY_F32, 2, 2},
      {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }\n", NPY_F32, 2, 3},
      {3, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 6), }\n", NPY_F32, 2, 1},
      {1, "{'descr': '<u2', 'fortran_order': False, 'shape': (12,), }\n", NPY_BF16, 1, 12},
      {1, "{'descr': '<V2', 'fortran_order': False, 'shape': (12,), }\n", NPY_BF16, 1, 12},
      {1, "{'descr': '|V2', 'fortran_order': False, 'shape': (12,), }\n", NPY_BF16, 1, 12},
      {1, "{'descr': 'bfloat16', 'fortran_order': False, 'shape': (3, 4), }\n", NPY_BF16, 2, 3},
      {1, "{'descr': '<u4', 'fortran_order': False, 'shape': (6,), }\n", NPY_U32, 1, 6},
      {1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1, 3), }\n", NPY_I32, 3, 2},
      {1, "{'descr': '<i4', 'fortran_order': False, 'shape': (6), }\n", NPY_I32, 1, 6},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    npy_array a = read_ok(raw_npy(cases[i].major, cases[i].header, payload, sizeof payload));
    assert_int_equal(a.dtype, cases[i].dtype);
    assert_int_equal(a.ndim, cases[i].ndim);
    assert_int_equal(a.shape[0], cases[i].d0);
    assert_int_equal(a.count * (int64_t)npy_dtype_size(a.dtype), (int64_t)sizeof payload);
    assert_memory_equal(a.data, payload, sizeof payload);
    npy_free(&a);
  }
  /* scalar (ndim 0) and a zero-size array */
  npy_array s = read_ok(raw_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
                                payload, 4));
  assert_int_equal(s.ndim, 0);
  assert_int_equal(s.count, 1);
  npy_free(&s);
  npy_array z = read_ok(
      raw_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", payload, 0));
  assert_int_equal(z.count, 0);
  npy_free(&z);
}

/* --- malformed headers ---------------------------------------------------------- */

static void test_malformed_headers(void **state) {
  (void)state;
  expect_header_error("{'descr': '<f4', 'fortran_order': False}", "shape");
  expect_header_error("{'descr': '<f4', 'shape': (2,)}", "fortran_order");
  expect_header_error("{'fortran_order': False, 'shape': (2,)}", "descr");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
                      "unexpected key");
  expect_header_error("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
                      "duplicate");
  expect_header_error("{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "malformed");
  expect_header_error("{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "malformed");
  expect_header_error("'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "malformed");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "malformed");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", "junk");
  expect_header_error("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "fortran_order");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "malformed");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}", "integer");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "malformed");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "negative");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}", "malformed");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, "
                      "'shape': (1,1,1,1,1,1,1,1,1)}",
                      "more than 8");
  expect_header_error("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}",
                      "structured");
  /* unsupported dtypes, with a hint where one helps */
  expect_header_error("{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}", "big-endian");
  expect_header_error("{'descr': '<f8', 'fortran_order': False, 'shape': (2,)}", "float64");
  expect_header_error("{'descr': '<i8', 'fortran_order': False, 'shape': (2,)}", "int32");
  expect_header_error("{'descr': '<f2', 'fortran_order': False, 'shape': (2,)}", "'<f2'");
  expect_header_error("{'descr': '|u1', 'fortran_order': False, 'shape': (2,)}", "'|u1'");
  expect_header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), \xc3\xa9}",
                      "non-ASCII");
}

static void test_bad_magic_version_and_lengths(void **state) {
  (void)state;
  FILE *f = tmpfile();
  fputs("PK\x03\x04 this is a zip, not npy", f);
  rewind(f);
  expect_read_error(f, "not a .npy file");

  f = tmpfile(); /* empty */
  expect_read_error(f, "too short");

  f = tmpfile();
  fwrite("\x93NUM", 1, 4, f);
  rewind(f);
  expect_read_error(f, "too short");

  static const char hdr[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  expect_read_error(raw_npy(4, hdr, NULL, 0), "version 4.0");
  expect_read_error(raw_npy(0, hdr, NULL, 0), "version 0.0");

  /* header length says more than the file holds */
  f = tmpfile();
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 200, 0};
  fwrite(pre, 1, 10, f);
  fputs(hdr, f);
  rewind(f);
  expect_read_error(f, "truncated .npy header");

  /* v2 header length beyond any sane header */
  f = tmpfile();
  const unsigned char pre2[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0, 0, 0, 0x40};
  fwrite(pre2, 1, 12, f);
  rewind(f);
  expect_read_error(f, "implausible");

  /* length field itself cut off */
  f = tmpfile();
  fwrite(pre, 1, 9, f);
  rewind(f);
  expect_read_error(f, "no header length");
}

/* --- data length ------------------------------------------------------------------ */

static void test_truncated_and_extra_data(void **state) {
  (void)state;
  static const char hdr[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }\n";
  float data[25] = {0};
  expect_read_error(raw_npy(1, hdr, data, 24 * 4 - 1), "truncated");
  expect_read_error(raw_npy(1, hdr, data, 0), "truncated");
  expect_read_error(raw_npy(1, hdr, data, 25 * 4), "extra bytes");
  expect_read_error(raw_npy(1, hdr, data, 24 * 4 + 1), "extra bytes");
  /* the message gives both sizes */
  FILE *f = raw_npy(1, hdr, data, 50);
  npy_array a;
  char err[NPY_ERR_LEN];
  assert_int_equal(npy_read_stream(f, "t.npy", &a, err, sizeof err), -1);
  fclose(f);
  assert_non_null(strstr(err, "96"));
  assert_non_null(strstr(err, "50"));
  assert_non_null(strstr(err, "(4, 6)"));
}

static void test_fortran_order_refused(void **state) {
  (void)state;
  const float d[6] = {0};
  expect_read_error(
      raw_npy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", d, sizeof d),
      "fortran_order is True");
}

static void test_overflowing_shapes(void **state) {
  (void)state;
  /* each dim fits int64, the element count does not */
  expect_header_error(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
      "too large");
  /* the count fits, the byte size does not */
  expect_header_error(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }",
      "too large");
  expect_header_error(
      "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2305843009213693952, 2), }",
      "too large");
  /* a dimension that overflows int64 while being parsed */
  expect_header_error(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
      "overflows");
  /* huge but representable: refused as truncated without allocating it */
  expect_header_error(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", "truncated");
  /* a zero dim makes the product 0 even after a huge one */
  npy_array a = read_ok(raw_npy(
      1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775807), }",
      NULL, 0));
  assert_int_equal(a.count, 0);
  npy_free(&a);
  /* npy_alloc refuses overflow and bad ndim too */
  char err[NPY_ERR_LEN];
  const int64_t big[2] = {INT64_MAX / 2, 3};
  assert_int_equal(npy_alloc(&a, NPY_F32, 2, big, "big", err, sizeof err), -1);
  assert_non_null(strstr(err, "big"));
  const int64_t neg[1] = {-1};
  assert_int_equal(npy_alloc(&a, NPY_F32, 1, neg, "neg", err, sizeof err), -1);
  assert_int_equal(npy_alloc(&a, NPY_F32, 9, big, "nine", err, sizeof err), -1);
  assert_null(a.data);
}

static void test_negative_int32_refused(void **state) {
  (void)state;
  const int32_t ids[4] = {0, 7, -3, 2};
  expect_read_error(
      raw_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", ids, sizeof ids),
      "element 2 is negative (-3)");
  /* the same bits as uint32 are just a big id */
  npy_array a = read_ok(
      raw_npy(1, "{'descr': '<u4', 'fortran_order': False, 'shape': (4,), }", ids, sizeof ids));
  assert_int_equal(((uint32_t *)a.data)[2], 0xFFFFFFFDu);
  npy_free(&a);
}

static void test_shape_str(void **state) {
  (void)state;
  npy_array a = {0};
  char b[64];
  assert_string_equal(npy_shape_str(&a, b, sizeof b), "()");
  a.ndim = 1;
  a.shape[0] = 5;
  assert_string_equal(npy_shape_str(&a, b, sizeof b), "(5,)");
  a.ndim = 3;
  a.shape[1] = 1;
  a.shape[2] = 12;
  assert_string_equal(npy_shape_str(&a, b, sizeof b), "(5, 1, 12)");
  assert_string_equal(npy_dtype_name(NPY_BF16), "bfloat16");
  assert_string_equal(npy_dtype_descr(NPY_I32), "<i4");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_all_dtypes_and_ndims),
      cmocka_unit_test(test_round_trip_through_a_file),
      cmocka_unit_test(test_writer_header_matches_numpy),
      cmocka_unit_test(test_header_variants),
      cmocka_unit_test(test_malformed_headers),
      cmocka_unit_test(test_bad_magic_version_and_lengths),
      cmocka_unit_test(test_truncated_and_extra_data),
      cmocka_unit_test(test_fortran_order_refused),
      cmocka_unit_test(test_overflowing_shapes),
      cmocka_unit_test(test_negative_int32_refused),
      cmocka_unit_test(test_shape_str),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
