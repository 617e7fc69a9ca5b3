/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_metrics.c: the tiered manager's metrics (kvbm_manager_metrics_collect)
 * served by the manager's own endpoint (kvbm_manager_config.metrics),
 * fetched over HTTP as Prometheus would: exact values for a scenario
 * worked out by hand, Dynamo's 1000-prefill hit-rate window, the endpoint
 * switched on by the environment, refusals, and scrapes while requests run
 * (ThreadSanitizer runs this file too).
 */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvbm/manager.h"
#include "kvbm/metrics.h"
#include "tier/metrics.h"
#include "tier/tier_testutil.h"

/* GET /metrics on 127.0.0.1:port; the body (malloc'd) or NULL. */
static char *scrape(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return NULL;
  }
  const char req[] = "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
  if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1)) abort();
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while ((r = recv(fd, buf + n, cap - n - 1, 0)) > 0) {
    n += (size_t)r;
    if (cap - n < 4096) buf = realloc(buf, cap *= 2);
  }
  close(fd);
  buf[n] = 0;
  char *body = strstr(buf, "\r\n\r\n");
  if (strncmp(buf, "HTTP/1.1 200 ", 13) || !body) {
    free(buf);
    return NULL;
  }
  memmove(buf, body + 4, strlen(body + 4) + 1);
  return buf;
}

/* The value of one series ("name{labels}" exactly as written), or NAN. */
static double val(const char *page, const char *series) {
  size_t n = strlen(series);
  for (const char *p = page; (p = strstr(p, series)); p++)
    if ((p == page || p[-1] == '\n') && p[n] == ' ') return strtod(p + n + 1, NULL);
  return NAN;
}

static kvbm_manager_config metrics_config(const char *dir, uint32_t g1, uint32_t g2) {
  kvbm_manager_config c = tu_config(dir, g1, g2, 0);
  c.metrics.enabled = true;
  c.metrics.host = "127.0.0.1";
  c.metrics.port = 0;
  return c;
}

/* G1 8 blocks, G2 16, block size 4. a (17 tokens: 4 matchable blocks) is
 * run, then b (29 tokens: 7 matchable, 8 blocks) pushes a out of G1, then
 * a again finds its 4 blocks in G2. */
static void test_scenario(void **st) {
  (void)st;
  char *dir = tu_tmpdir("metrics");
  kvbm_manager_config c = metrics_config(dir, 8, 16);
  kvbm_manager *m;
  kvbm_error err = {0};
  assert_int_equal(kvbm_manager_create(&c, &m, &err), KVBM_OK);
  uint16_t port = kvbm_manager_metrics_port(m);
  assert_true(port != 0);
  assert_non_null(kvbm_manager_metrics(m));
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq_info info;
  tu_run(m, a, 17, NULL, NULL);
  tu_run(m, b, 29, NULL, NULL);
  assert_int_equal(tu_run(m, a, 17, &info, NULL), 16);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G2], 4);
  char *p = scrape(port);
  assert_non_null(p);
  assert_true(val(p, "kvbm_prefill_requests_total") == 3);
  assert_true(val(p, "kvbm_requested_tokens_total") == 17 + 29 + 17);
  assert_true(val(p, "kvbm_requested_blocks_total") == 4 + 7 + 4);
  assert_true(val(p, "kvbm_lookup_blocks_below_device_total") == 15);
  assert_true(val(p, "kvbm_matched_tokens") == 16);
  assert_true(val(p, "kvbm_hit_tokens_total{tier=\"G1\"}") == 0);
  assert_true(val(p, "kvbm_hit_tokens_total{tier=\"G2\"}") == 16);
  assert_true(isnan(val(p, "kvbm_hit_tokens_total{tier=\"G3\"}"))); /* no G3 */
  /* Dynamo's names: a's 4 and b's 7 full blocks went G1 -> G2, a's 4 came back */
  assert_true(val(p, "kvbm_offload_blocks_d2h") == 11);
  assert_true(val(p, "kvbm_onboard_blocks_h2d") == 4);
  assert_true(val(p, "kvbm_offload_blocks_h2d") == 0);
  assert_true(val(p, "kvbm_onboard_blocks_d2d") == 0);
  /* the window: 4 of the 15 blocks looked for below G1 were in G2 */
  assert_true(fabs(val(p, "kvbm_host_cache_hit_rate") - 4.0 / 15) < 1e-12);
  assert_true(val(p, "kvbm_disk_cache_hit_rate") == 0);
  uint64_t bb = kvbm_manager_block_bytes(m);
  assert_true(val(p, "kvbm_copy_bytes_total{dst=\"G2\",op=\"offload\",src=\"G1\"}") == 11.0 * bb);
  assert_true(val(p, "kvbm_onboard_bytes_total{tier=\"G2\"}") == 4.0 * bb);
  /* every copy went through a timed transfer: the histograms' bytes add up */
  assert_true(val(p, "kvbm_copy_transfer_bytes_sum{dst=\"G2\",op=\"offload\",src=\"G1\"}") == 11.0 * bb);
  assert_true(val(p, "kvbm_copy_transfer_bytes_sum{dst=\"G1\",op=\"onboard\",src=\"G2\"}") == 4.0 * bb);
  assert_true(val(p, "kvbm_copy_seconds_count{dst=\"G1\",op=\"onboard\",src=\"G2\"}") >= 1);
  /* occupancy agrees with the stats */
  kvbm_tier_stats s1, s2;
  kvbm_manager_stats_get(m, KVBM_TIER_G1, &s1);
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_true(val(p, "kvbm_tier_blocks{state=\"cached\",tier=\"G1\"}") == s1.cached);
  assert_true(val(p, "kvbm_tier_blocks{state=\"free\",tier=\"G2\"}") == s2.free);
  assert_true(val(p, "kvbm_tier_capacity_blocks{tier=\"G2\"}") == 16);
  assert_true(val(p, "kvbm_tier_evictions_total{tier=\"G1\"}") == s1.evictions);
  assert_true(val(p, "kvbm_offload_skipped_total{cause=\"queue\",tier=\"G2\"}") == 0);
  assert_true(val(p, "kvbm_metrics_errors_total") == 0);
  free(p);

  /* 1000 more prefills of one new block each: the window forgets a's G2
   * hits, the counters keep them */
  for (uint32_t i = 0; i < KVBM__HIT_WINDOW; i++) {
    uint32_t t[5] = {900000 + 8 * i, 900001 + 8 * i, 900002 + 8 * i, 900003 + 8 * i, 7};
    tu_run(m, t, 5, NULL, NULL);
  }
  p = scrape(port);
  assert_non_null(p);
  assert_true(val(p, "kvbm_host_cache_hit_rate") == 0);
  assert_true(val(p, "kvbm_hit_tokens_total{tier=\"G2\"}") == 16);
  assert_true(val(p, "kvbm_prefill_requests_total") == 3 + KVBM__HIT_WINDOW);
  free(p);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  tu_rmdir(dir);
}

static void extra(void *user, kvbm_metrics_writer *w) {
  kvbm_metrics_counter(w, "engine_steps_total", "the engine's own", NULL, 0, *(uint64_t *)user);
}

static void test_env_and_registry(void **st) {
  (void)st;
  char *dir = tu_tmpdir("metricsenv");
  kvbm_manager_config c = tu_config(dir, 8, 0, 0);
  kvbm_error err = {0};
  const char *bad[] = {"DYN_KVBM_METRICS=maybe", NULL};
  assert_int_equal(kvbm_manager_config_env(&c, bad, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "DYN_KVBM_METRICS"));
  assert_false(c.metrics.enabled);
  /* off by default: no endpoint */
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, &err), KVBM_OK);
  assert_null(kvbm_manager_metrics(m));
  assert_int_equal(kvbm_manager_metrics_port(m), 0);
  kvbm_manager_destroy(m);
  /* on, as Dynamo switches it on */
  const char *on[] = {"DYN_KVBM_METRICS=true", "DYN_KVBM_METRICS_PORT=0",
                      "KVBM_METRICS_HOST=127.0.0.1", NULL};
  assert_int_equal(kvbm_manager_config_env(&c, on, &err), KVBM_OK);
  assert_true(c.metrics.enabled);
  assert_int_equal(kvbm_manager_create(&c, &m, &err), KVBM_OK);
  uint16_t port = kvbm_manager_metrics_port(m);
  assert_true(port != 0);
  /* the engine adds its own collector to the manager's page */
  uint64_t steps = 41, id;
  assert_int_equal(kvbm_metrics_register(kvbm_manager_metrics(m), extra, &steps, NULL, 0, &id, &err),
                   KVBM_OK);
  char *p = scrape(port);
  assert_non_null(p);
  assert_true(val(p, "engine_steps_total") == 41);
  assert_true(val(p, "kvbm_tier_capacity_blocks{tier=\"G1\"}") == 8);
  free(p);
  assert_int_equal(kvbm_metrics_unregister(kvbm_manager_metrics(m), id), KVBM_OK);
  /* a second manager on the same port: create fails, naming it */
  kvbm_manager_config c2 = c;
  c2.metrics.port = port;
  kvbm_manager *m2 = NULL;
  assert_int_equal(kvbm_manager_create(&c2, &m2, &err), KVBM_EIO);
  assert_non_null(strstr(err.msg, "cannot listen on 127.0.0.1"));
  assert_null(m2);
  kvbm_manager_destroy(m);
  tu_rmdir(dir);
}

/* Scrapes from another thread while requests run (TSan: the collector
 * reads under the manager lock only). */
typedef struct scraper_arg {
  uint16_t port;
  _Atomic int stop;
  _Atomic int pages;
} scraper_arg;

static void *scraper(void *p) {
  scraper_arg *a = p;
  while (!a->stop) {
    char *t = scrape(a->port);
    if (t) a->pages++;
    free(t);
  }
  return NULL;
}

/* Requests run until the scraper has read a few pages meanwhile (at least
 * 200 of them; a fast machine may finish 200 before the first scrape). */
static void test_scrape_while_running(void **st) {
  (void)st;
  char *dir = tu_tmpdir("metricsrun");
  kvbm_manager_config c = metrics_config(dir, 16, 32);
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  scraper_arg a = {.port = kvbm_manager_metrics_port(m)};
  pthread_t th;
  pthread_create(&th, NULL, scraper, &a);
  uint32_t n = 0;
  for (; n < 200 || (a.pages < 3 && n < 2000000); n++) {
    uint32_t *t = tu_prompt(1000 * (n % 7), 13);
    tu_run(m, t, 13, NULL, NULL);
    free(t);
  }
  a.stop = 1;
  pthread_join(th, NULL);
  assert_true(a.pages >= 3);
  char *p = scrape(a.port);
  assert_non_null(p);
  assert_true(val(p, "kvbm_prefill_requests_total") == n);
  free(p);
  kvbm_manager_destroy(m);
  tu_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scenario),
      cmocka_unit_test(test_env_and_registry),
      cmocka_unit_test(test_scrape_while_running),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
