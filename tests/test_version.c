/*
 * The version: tg_version() (the loaded library) equals TG_VERSION (this
 * header), and both are "MAJOR.MINOR.PATCH" of the three macros, which
 * CMakeLists.txt reads for project(VERSION) and the installed package.
 */
#include <stdio.h>
#include <string.h>

#include "testutil.h"

static void test_version_string(void **state) {
  (void)state;
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", TG_VERSION_MAJOR, TG_VERSION_MINOR,
           TG_VERSION_PATCH);
  assert_non_null(tg_version());
  assert_string_equal(tg_version(), want);
  assert_string_equal(TG_VERSION, want);
  assert_ptr_equal(tg_version(), tg_version());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version_string),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
