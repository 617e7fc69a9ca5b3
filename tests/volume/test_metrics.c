/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_metrics.c: a volume's collector (kvbm_volume_metrics_collect): the
 * page's operations, hits, misses and bytes equal the volume's stats after
 * real file:// traffic, labelled with the volume's name; every family is
 * in docs/areas/observability.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvbm/metrics.h"
#include "metrics/page_testutil.h"
#include "volume_testutil.h"

static void test_volume(void **st) {
  (void)st;
  char *dir = vt_tmpdir("metrics");
  char url[512];
  snprintf(url, sizeof url, "file://%s", dir);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  kvbm_volume *v;
  kvbm_error err;
  assert_int_equal(kvbm_volume_register(&c, &v, &err), KVBM_OK);
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  uint64_t id;
  assert_int_equal(kvbm_metrics_register(r, kvbm_volume_metrics_collect, v,
                                         (kvbm_metric_label[]){{"tier", "G4"}}, 1, &id, NULL),
                   KVBM_OK);
  uint8_t val[1000], out[1000];
  size_t sz;
  for (uint64_t k = 1; k <= 3; k++) {
    vt_pattern(val, sizeof val, k, 1, 0);
    assert_int_equal(kvbm_volume_put(v, k, val, sizeof val), KVBM_OK);
  }
  assert_int_equal(kvbm_volume_get(v, 2, out, sizeof out, &sz), KVBM_OK);
  assert_int_equal(kvbm_volume_get(v, 99, out, sizeof out, &sz), KVBM_ENOTFOUND);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  char *t = page_render(r);
  char series[600];
  const char *name = kvbm_volume_name(v);
#define AT(fmt, ...) (snprintf(series, sizeof series, fmt, __VA_ARGS__), page_value(t, series))
  assert_true(AT("kvbm_volume_ops_total{op=\"put\",tier=\"G4\",volume=\"%s\"}", name) == 3);
  assert_true(AT("kvbm_volume_ops_total{op=\"get\",tier=\"G4\",volume=\"%s\"}", name) == 2);
  assert_true(AT("kvbm_volume_gets_total{result=\"hit\",tier=\"G4\",volume=\"%s\"}", name) == 1);
  assert_true(AT("kvbm_volume_gets_total{result=\"miss\",tier=\"G4\",volume=\"%s\"}", name) == 1);
  assert_true(AT("kvbm_volume_bytes_total{op=\"put\",tier=\"G4\",volume=\"%s\"}", name) ==
              (double)s.bytes_put);
  assert_true(s.bytes_put == 3000);
  assert_true(AT("kvbm_volume_bytes_total{op=\"get\",tier=\"G4\",volume=\"%s\"}", name) == 1000);
  assert_true(AT("kvbm_volume_errors_total{kind=\"timeout\",tier=\"G4\",volume=\"%s\"}", name) == 0);
#undef AT
  char missing[256];
  if (page_undocumented(t, missing, sizeof missing)) fail_msg("%s is not documented", missing);
  kvbm_metrics_text_free(t);
  assert_int_equal(kvbm_metrics_unregister(r, id), KVBM_OK);
  kvbm_volume_unregister(v);
  kvbm_metrics_destroy(r);
  vt_rmrf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_volume)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
