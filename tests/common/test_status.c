/* SPDX-License-Identifier: Apache-2.0 */
/* test_status.c: status names, texts and error reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/status.h"

static void every_code_has_a_distinct_name_and_text(void **state) {
  (void)state;
  for (int c = 0; c >= KVBM_EDISAGG; c--) {
    assert_string_not_equal(kvbm_strerror(c), "unknown status");
    for (int d = c - 1; d >= KVBM_EDISAGG; d--) {
      assert_string_not_equal(kvbm_status_name(c), kvbm_status_name(d));
      assert_string_not_equal(kvbm_strerror(c), kvbm_strerror(d));
    }
  }
  assert_string_equal(kvbm_strerror(KVBM_EDISAGG - 1), "unknown status");
  assert_string_equal(kvbm_strerror(7), "unknown status");
  assert_string_equal(kvbm_status_name(KVBM_EINVAL), "KVBM_EINVAL");
}

static void error_set_records_code_and_message(void **state) {
  (void)state;
  kvbm_error e;
  assert_int_equal(kvbm_error_set(&e, KVBM_EFORMAT, "line %d: %s", 7, "bad"), KVBM_EFORMAT);
  assert_int_equal(e.code, KVBM_EFORMAT);
  assert_string_equal(e.msg, "line 7: bad");
  assert_int_equal(kvbm_error_set(NULL, KVBM_EIO, "x"), KVBM_EIO);
  char big[600];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  kvbm_error_set(&e, KVBM_EINVAL, "%s", big);
  assert_int_equal(strlen(e.msg), KVBM_ERROR_MSG_MAX - 1);
  kvbm_error_clear(&e);
  assert_int_equal(e.code, KVBM_OK);
  assert_string_equal(e.msg, "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_code_has_a_distinct_name_and_text),
      cmocka_unit_test(error_set_records_code_and_message),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
