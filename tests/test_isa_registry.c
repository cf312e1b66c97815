/*
 * Every list of ISAs agrees with the registry (isa/registry.h): the
 * library's tg_isa_count / tg_isa_at, the public tg_isa values of
 * include/tilegrad.h, the names tg_isa_name and tg_isa_from_name trade, and
 * the CMake list TG_ISA_NAMES (isa/isa.cmake), which tests/CMakeLists.txt
 * passes in as TG_CMAKE_ISA_NAMES ("portable,avx2,...").
 */
#include <string.h>

#include "registry.h"
#include "testutil.h"

#ifndef TG_CMAKE_ISA_NAMES
#error "tests/CMakeLists.txt passes the CMake ISA list as TG_CMAKE_ISA_NAMES"
#endif

/* Every public tg_isa value but TG_ISA_AUTO (include/tilegrad.h). */
static const tg_isa public_isas[] = {TG_ISA_PORTABLE,    TG_ISA_AVX512, TG_ISA_AVX2,
                                     TG_ISA_AVX512_BF16, TG_ISA_AMX,    TG_ISA_NEON,
                                     TG_ISA_NEON_BF16};
enum { N_PUBLIC = sizeof public_isas / sizeof public_isas[0] };

/* The registry of the header this test was compiled with, in its order. */
#define TU_REGISTRY_ID_(name, id, cpu, pick) id,
#define TU_REGISTRY_NAME_(name, id, cpu, pick) #name,
static const tg_isa header_ids[] = {TG_ISA_LIST(TU_REGISTRY_ID_)};
static const char *const header_names[] = {TG_ISA_LIST(TU_REGISTRY_NAME_)};
enum { N_HEADER = sizeof header_ids / sizeof header_ids[0] };

/* The library's list is the header's, in the same order, and ends at its end. */
static void test_library_list_is_the_registry(void **state) {
  (void)state;
  assert_int_equal(tg_isa_count(), N_HEADER);
  for (int i = 0; i < N_HEADER; i++) {
    assert_int_equal(tg_isa_at(i), header_ids[i]);
    assert_string_equal(tg_isa_name(tg_isa_at(i)), header_names[i]);
  }
  assert_int_equal(tg_isa_at(-1), TG_ISA_AUTO);
  assert_int_equal(tg_isa_at(N_HEADER), TG_ISA_AUTO);
  assert_int_equal(tg_isa_at(tg_isa_count()), TG_ISA_AUTO);
}

/* Each entry: a public value other than AUTO, distinct from the others, its
 * name round-trips; portable is in every build and available. */
static void test_entries_round_trip(void **state) {
  (void)state;
  int has_portable = 0;
  for (int i = 0; i < tg_isa_count(); i++) {
    const tg_isa id = tg_isa_at(i);
    assert_int_not_equal(id, TG_ISA_AUTO);
    int public = 0;
    for (int p = 0; p < N_PUBLIC; p++) public |= public_isas[p] == id;
    assert_true(public);
    for (int j = 0; j < i; j++) assert_int_not_equal(tg_isa_at(j), id);
    const char *name = tg_isa_name(id);
    assert_string_not_equal(name, "unknown");
    assert_string_not_equal(name, "auto");
    tg_isa back = TG_ISA_AUTO;
    assert_int_equal(tg_isa_from_name(name, &back), TG_OK);
    assert_int_equal(back, id);
    has_portable |= id == TG_ISA_PORTABLE;
  }
  assert_true(has_portable);
  assert_true(tg_isa_available(TG_ISA_PORTABLE));
  tg_isa back = TG_ISA_PORTABLE;
  assert_string_equal(tg_isa_name(TG_ISA_AUTO), "auto");
  assert_int_equal(tg_isa_from_name("auto", &back), TG_OK);
  assert_int_equal(back, TG_ISA_AUTO);
  assert_int_equal(tg_isa_from_name("unknown", &back), TG_ERR_BAD_PARAMS);
}

/* A public value this architecture has no table for is "unknown" and has no
 * name to come back from. */
static void test_public_values_outside_the_registry(void **state) {
  (void)state;
  for (int p = 0; p < N_PUBLIC; p++) {
    int listed = 0;
    for (int i = 0; i < tg_isa_count(); i++) listed |= tg_isa_at(i) == public_isas[p];
    if (listed) continue;
    assert_string_equal(tg_isa_name(public_isas[p]), "unknown");
    assert_false(tg_isa_available(public_isas[p]));
  }
}

/* The CMake list (isa/isa.cmake's TG_ISA_NAMES for this target) is the
 * registry's names in order. */
static void test_cmake_list_is_the_registry(void **state) {
  (void)state;
  char names[256] = "";
  for (int i = 0; i < tg_isa_count(); i++) {
    if (i) strncat(names, ",", sizeof names - strlen(names) - 1);
    strncat(names, tg_isa_name(tg_isa_at(i)), sizeof names - strlen(names) - 1);
  }
  assert_string_equal(names, TG_CMAKE_ISA_NAMES);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_library_list_is_the_registry),
      cmocka_unit_test(test_entries_round_trip),
      cmocka_unit_test(test_public_values_outside_the_registry),
      cmocka_unit_test(test_cmake_list_is_the_registry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
