/* SPDX-License-Identifier: Apache-2.0 */
/* test_daemon_threads.c: the router daemon's threads together, in-process
 * (so that ThreadSanitizer sees them; the `kvbm` binary links UCX, which
 * TSan cannot run): a ZMQ source (kvbm's publisher with a replay socket),
 * a JetStream source and a NATS source (nats-server -js, when installed)
 * applying
 * batches, the snapshot thread writing every 20 ms, and HTTP clients
 * routing (with and without a cache salt) and reading /health, all at
 * once. Then the daemon is destroyed (the last snapshot), created again
 * from its file, and must hold the same blocks and go on applying. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvbm/events.h"
#include "kvbm/router.h"
#include "common/nats_testutil.h"

#define PROMPTS 200
#define BLOCKS 4

static nt_server srv;
static char dir[] = "/tmp/kvbm_rdt_XXXXXX";

/* nats-server -js when installed (the JetStream and NATS sources), else
 * none (the ZMQ source alone). */
static bool start_js(void) {
  if (!nt_installed()) return false;
  if (nt_start(&srv, true)) fail_msg("nats-server -js did not start");
  return true;
}

/* ------------------------------------------------------------- HTTP */

static uint16_t g_port;

/* One request on its own connection; the answer's body in out (NUL-ended). */
static int http(const char *method, const char *path, const char *body, char *out, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(g_port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  char req[4096];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                   "Content-Length: %zu\r\n\r\n%s", method, path, body ? strlen(body) : 0,
                   body ? body : "");
  assert_true(n > 0 && (size_t)n < sizeof req);
  assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
  size_t len = 0;
  for (ssize_t r; len + 1 < cap && (r = recv(fd, out + len, cap - 1 - len, 0)) > 0;) len += (size_t)r;
  out[len] = 0;
  close(fd);
  int status = 0;
  sscanf(out, "HTTP/1.1 %d", &status);
  char *b = strstr(out, "\r\n\r\n");
  if (b) memmove(out, b + 4, strlen(b + 4) + 1);
  return status;
}

static uint64_t health_u64(const char *key) {
  char buf[65536], k[64];
  assert_int_equal(http("GET", "/health", NULL, buf, sizeof buf), 200);
  snprintf(k, sizeof k, "\"%s\":", key);
  char *p = strstr(buf, k);
  assert_non_null(p);
  return strtoull(p + strlen(k), NULL, 10);
}

static _Atomic int clients_stop;

static void *client(void *arg) {
  int salted = (int)(intptr_t)arg;
  char buf[65536], body[512];
  for (unsigned k = 0; !atomic_load(&clients_stop); k++) {
    unsigned p = k % PROMPTS;
    snprintf(body, sizeof body, "{\"block_hashes\":[%u,%u,%u,%u]%s}", p * 100 + 1, p * 100 + 2,
             p * 100 + 3, p * 100 + 4, salted ? ",\"cache_salt\":\"t\"" : "");
    int st = http("POST", "/route", body, buf, sizeof buf);
    assert_true(st == 200 || st == 503); /* 503: no worker known yet */
    assert_int_equal(http("GET", "/health", NULL, buf, sizeof buf), 200);
  }
  return NULL;
}

/* ----------------------------------------------------------- daemon */

typedef struct run {
  kvbm_router_daemon *d;
  pthread_t th;
} run;

static void *serve(void *arg) {
  run *r = arg;
  kvbm_error err;
  assert_int_equal(kvbm_router_daemon_run(r->d, &err), KVBM_OK);
  return NULL;
}

static void start(run *r, const kvbm_router_daemon_config *c) {
  kvbm_error err = {0};
  if (kvbm_router_daemon_create(c, &r->d, &err)) fail_msg("%s", err.msg);
  g_port = kvbm_router_daemon_port(r->d);
  assert_int_equal(pthread_create(&r->th, NULL, serve, r), 0);
}

static void stop(run *r) {
  kvbm_router_daemon_stop(r->d);
  pthread_join(r->th, NULL);
  kvbm_router_daemon_destroy(r->d);
}

static void publish(kvbm_publisher *p, unsigned from, unsigned to) {
  kvbm_error err;
  for (unsigned k = from; k < to; k++) {
    uint64_t h[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) h[i] = k * 100 + 1 + (uint64_t)i;
    assert_int_equal(kvbm_publisher_publish_stored(p, h, BLOCKS, NULL, NULL, 0, 16, NULL,
                                                   KVBM_MEDIUM_GPU, NULL, &err), KVBM_OK);
  }
  assert_int_equal(kvbm_publisher_flush(p, 5000, &err), KVBM_OK);
}

static void wait_entries(uint64_t want) {
  for (int i = 0; i < 1000; i++) {
    if (health_u64("entries") == want) return;
    usleep(20000);
  }
  fail_msg("the index never held %llu blocks (%llu)", (unsigned long long)want,
           (unsigned long long)health_u64("entries"));
}

static void test_threads(void **state) {
  (void)state;
  assert_non_null(mkdtemp(dir));
  bool js = start_js();
  print_message("JetStream source: %s\n", js ? "yes (nats-server -js)" : "no (no nats-server)");
  kvbm_error err = {0};
  /* publishers: one over ZMQ (with replay), one into a stream */
  kvbm_publisher_config po = kvbm_publisher_config_default();
  po.max_batch_events = 8;
  po.max_batch_delay_us = 0;
  kvbm_publisher *pz, *pj = NULL, *pn = NULL;
  assert_int_equal(kvbm_publisher_create(&po, &pz, &err), KVBM_OK);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.replay_endpoint = "tcp://127.0.0.1:*";
  assert_int_equal(kvbm_publisher_add_zmq(pz, &zo, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(pz, &err), KVBM_OK);
  char ep[256], rep[256];
  kvbm_publisher_zmq_endpoint(pz, 0, false, ep, sizeof ep);
  kvbm_publisher_zmq_endpoint(pz, 0, true, rep, sizeof rep);
  if (js) {
    assert_int_equal(kvbm_publisher_create(&po, &pj, &err), KVBM_OK);
    kvbm_jetstream_config jc = kvbm_jetstream_config_default(srv.url, "KVT", "kv.2");
    if (kvbm_publisher_add_jetstream(pj, &jc, &err)) fail_msg("%s", err.msg);
    assert_int_equal(kvbm_publisher_start(pj, &err), KVBM_OK);
    assert_int_equal(kvbm_publisher_create(&po, &pn, &err), KVBM_OK);
    if (kvbm_publisher_add_nats(pn, srv.url, "kv.3", &err)) fail_msg("%s", err.msg);
    assert_int_equal(kvbm_publisher_start(pn, &err), KVBM_OK);
  }
  kvbm_router_source src[3] = {
      {.kind = KVBM_SOURCE_ZMQ, .worker_id = 1, .endpoint = ep, .replay_endpoint = rep},
      {.kind = KVBM_SOURCE_JETSTREAM, .worker_id = 2, .endpoint = srv.url, .stream = "KVT",
       .subject = "kv.2"},
      {.kind = KVBM_SOURCE_NATS, .worker_id = 3, .endpoint = srv.url, .subject = "kv.3",
       .replay_endpoint = NULL},
  };
  char snap[128];
  snprintf(snap, sizeof snap, "%s/router.snap", dir);
  kvbm_router_daemon_config c = kvbm_router_daemon_config_default();
  c.sources = src;
  c.num_sources = js ? 3 : 1;
  c.snapshot_path = snap;
  c.snapshot_every_s = 0.02;
  c.choice.load_weight = 0;
  run r;
  start(&r, &c);
  pthread_t cl[2];
  for (intptr_t i = 0; i < 2; i++) assert_int_equal(pthread_create(&cl[i], NULL, client, (void *)i), 0);
  /* the ZMQ subscription takes a moment: placeholder removals until the
   * router hears the worker */
  for (int i = 0; health_u64("events") == 0; i++) {
    uint64_t h = 999999;
    assert_int_equal(kvbm_publisher_publish_removed(pz, &h, 1, KVBM_MEDIUM_GPU, NULL, &err), KVBM_OK);
    assert_true(i < 500);
    usleep(20000);
  }
  publish(pz, 0, PROMPTS / 2);
  if (pj) publish(pj, PROMPTS / 2, PROMPTS);
  if (pn) publish(pn, 1000, 1000 + PROMPTS / 2); /* subscribed once the daemon is made */
  uint64_t want = (uint64_t)(js ? PROMPTS + PROMPTS / 2 : PROMPTS / 2) * BLOCKS;
  wait_entries(want);
  atomic_store(&clients_stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(cl[i], NULL);
  for (int i = 0; health_u64("snapshots") == 0; i++) { /* every 20 ms, when scheduled */
    assert_true(i < 500);
    usleep(20000);
  }
  stop(&r); /* the last snapshot */
  struct stat st;
  assert_int_equal(stat(snap, &st), 0);

  /* again from the file: the same blocks at once, then more */
  start(&r, &c);
  assert_int_equal(health_u64("entries"), want);
  atomic_store(&clients_stop, 0);
  for (intptr_t i = 0; i < 2; i++) assert_int_equal(pthread_create(&cl[i], NULL, client, (void *)i), 0);
  publish(pz, PROMPTS, PROMPTS + 20);
  if (pj) publish(pj, PROMPTS + 20, PROMPTS + 40);
  if (pn) publish(pn, 2000, 2020);
  wait_entries(want + (js ? 60 : 20) * BLOCKS);
  atomic_store(&clients_stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(cl[i], NULL);
  assert_int_equal(health_u64("degraded_routes"), 0);
  stop(&r);

  kvbm_publisher_destroy(pz);
  kvbm_publisher_destroy(pj);
  kvbm_publisher_destroy(pn);
  nt_stop(&srv);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  nats_Close();
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
