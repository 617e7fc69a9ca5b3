/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_g4_redis.c: G4 over real redis-server processes that the tests
 * start, stop, kill, fill, slow down and fail over (helpers shared with
 * the volume tests, tests/volume/volume_testutil.h).
 *
 * Each fault is checked at the manager: the engine is served (without G4
 * while it cannot be), the miss is counted for what it is, nothing wrong
 * reaches G1 (every matched block is verified), and G4 hits come back once
 * the store does. Waits for a server to come back are loops with a
 * generous bound, never a fixed sleep that a loaded machine could outrun.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvbm/manager.h"
#include "tier_testutil.h"
#include "volume/volume_testutil.h"

static char *redis_url(int port) {
  char *u = malloc(64);
  snprintf(u, 64, "redis://127.0.0.1:%d", port);
  return u;
}

static kvbm_manager *mgr(const char *url, int lookup_ms) {
  kvbm_manager_config c = tu_config(NULL, 8, 0, 0);
  c.g4_url = url;
  c.g4_lookup_timeout_ms = lookup_ms;
  c.g4_timeout_ms = 1000;
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

static kvbm_tier_stats g4(kvbm_manager *m) { return tu_stats(m, KVBM_TIER_G4); }

/* Prefill, wait, verify every matched byte; the G4 share of the match. */
static size_t g4_hits(kvbm_manager *m, const uint32_t *p, size_t n, size_t *matched) {
  kvbm_mreq *r;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, p, n, &r, NULL, NULL), KVBM_OK);
  kvbm_mreq_info info;
  assert_int_equal(kvbm_mreq_wait(r, -1, &info), KVBM_OK);
  size_t b = info.matched_tokens / 4;
  assert_int_equal(tu_verify(m, r, b), b);
  if (matched) *matched = b;
  kvbm_mreq_destroy(r);
  return info.hit_blocks[KVBM_TIER_G4];
}

/* Stores p through a fresh manager; returns the blocks it put. */
static uint64_t store(const char *url, const uint32_t *p, size_t n) {
  kvbm_manager *a = mgr(url, 5000);
  tu_run(a, p, n, NULL, NULL);
  kvbm_manager_flush(a);
  uint64_t put = g4(a).offloaded_blocks;
  kvbm_manager_destroy(a);
  return put;
}

/* Redis down when the manager starts: it serves without G4 and counts;
 * once a server listens on the port, the manager reconnects by itself and
 * both stores and serves. */
static void test_down_at_start(void **st) {
  (void)st;
  vt_redis r = {0};
  r.port = vt_free_port();
  char *url = redis_url(r.port);
  kvbm_manager *m = mgr(url, 5000);
  uint32_t *p = tu_prompt(100, 17);
  assert_int_equal(tu_run(m, p, 17, NULL, NULL), 0);
  kvbm_tier_stats s = g4(m);
  assert_true(s.present);
  assert_int_equal(s.offloaded_blocks, 0);
  assert_int_equal(s.skipped_io, 4);
  assert_int_equal(s.lookup_errors, 1);
  /* The server comes up; new blocks reach it once the volume reconnects. */
  char *d = vt_tmpdir("g4down");
  snprintf(r.dir, sizeof r.dir, "%s", d);
  free(d);
  assert_int_equal(vt_redis_restart(&r), 0);
  uint64_t put = 0;
  double t0 = vt_now();
  for (uint32_t i = 0; put == 0 && vt_now() - t0 < 30; i++) {
    uint32_t *q = tu_prompt(50000 + 100 * i, 17);
    tu_run(m, q, 17, NULL, NULL);
    put = g4(m).offloaded_blocks;
    free(q);
  }
  assert_true(put > 0);
  kvbm_manager_destroy(m);
  /* What went in is served to another manager as G4 hits. */
  assert_int_equal(store(url, p, 17), 4);
  kvbm_manager *b = mgr(url, 5000);
  size_t got;
  assert_int_equal(g4_hits(b, p, 17, &got), 4);
  kvbm_manager_destroy(b);
  vt_redis_destroy(&r);
  free(url);
  free(p);
}

/* Killed mid-run: misses while it is down (never an error to the engine),
 * hits again after it is back (empty: what is stored after). */
static void test_killed_and_restarted(void **st) {
  (void)st;
  vt_redis r = {0};
  assert_int_equal(vt_redis_start(&r), 0);
  char *url = redis_url(r.port);
  uint32_t *p = tu_prompt(200, 17), *q = tu_prompt(300, 17);
  assert_int_equal(store(url, p, 17), 4);
  kvbm_manager *m = mgr(url, 5000);
  size_t got;
  assert_int_equal(g4_hits(m, p, 17, &got), 4);
  vt_redis_stop(&r, SIGKILL);
  /* Down: q's lookup fails, nothing matched below G1, the run goes on. */
  assert_int_equal(g4_hits(m, q, 17, &got), 0);
  assert_int_equal(got, 0);
  tu_run(m, q, 17, NULL, NULL); /* its puts fail: counted */
  kvbm_tier_stats s = g4(m);
  assert_true(s.lookup_errors >= 1);
  assert_true(s.skipped_io >= 4);
  assert_int_equal(vt_redis_restart(&r), 0);
  /* Back, empty: a block stored now is a hit for another manager. */
  uint64_t put = 0;
  double t0 = vt_now();
  while (put < 4 && vt_now() - t0 < 30) put = store(url, q, 17);
  assert_int_equal(put, 4);
  kvbm_manager *b = mgr(url, 5000);
  assert_int_equal(g4_hits(b, q, 17, &got), 4);
  /* p was lost with the restart: a counted miss, not a hit, not an error. */
  assert_int_equal(g4_hits(b, p, 17, &got), 0);
  kvbm_manager_destroy(b);
  kvbm_manager_destroy(m);
  vt_redis_destroy(&r);
  free(url);
  free(p);
  free(q);
}

/* Full, without eviction: puts are refused (counted), blocks miss. With
 * LRU eviction: puts succeed, old blocks are gone (counted misses). */
static void test_full(void **st) {
  (void)st;
  for (int evict = 0; evict < 2; evict++) {
    vt_redis r = {0};
    const char *a[] = {"--maxmemory", "4mb", "--maxmemory-policy", evict ? "allkeys-lru" : "noeviction"};
    for (int i = 0; i < 4; i++) snprintf(r.extra[i], sizeof r.extra[i], "%s", a[i]);
    r.nextra = 4;
    assert_int_equal(vt_redis_start(&r), 0);
    char *url = redis_url(r.port);
    kvbm_manager_config c = tu_config(NULL, 64, 0, 0);
    c.g4_url = url;
    c.g4_lookup_timeout_ms = 5000;
    /* 16 KiB blocks: 320 of them (5 MiB) do not fit in 4 MB. */
    c.layout.inner_dim = 1024;
    kvbm_manager *m;
    assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
    for (uint32_t i = 0; i < 40; i++) {
      uint32_t *p = tu_prompt(1000 * i, 33);
      tu_run(m, p, 33, NULL, NULL);
      free(p);
    }
    kvbm_manager_flush(m);
    kvbm_tier_stats s = g4(m);
    if (!evict) {
      assert_true(s.skipped_io > 0); /* refused: full */
      assert_true(s.offloaded_blocks > 0);
    } else {
      assert_int_equal(s.skipped_io, 0);
    }
    kvbm_manager_destroy(m);
    /* A fresh manager: whatever is there verifies; the rest is a miss. */
    assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
    size_t hits = 0, matched;
    for (uint32_t i = 0; i < 40; i++) {
      uint32_t *p = tu_prompt(1000 * i, 33);
      kvbm_mreq *rq;
      assert_int_equal(kvbm_manager_prefill(m, 0, 0, p, 33, &rq, NULL, NULL), KVBM_OK);
      kvbm_mreq_info info;
      assert_int_equal(kvbm_mreq_wait(rq, -1, &info), KVBM_OK);
      matched = info.matched_tokens / 4;
      assert_int_equal(tu_verify(m, rq, matched), matched);
      hits += info.hit_blocks[KVBM_TIER_G4];
      kvbm_mreq_destroy(rq);
      free(p);
    }
    s = g4(m);
    print_message("evict %d: hits %zu found %llu failures %llu missing %llu\n", evict, hits,
                  (unsigned long long)s.lookup_found, (unsigned long long)s.onboard_failures,
                  (unsigned long long)s.missing);
    assert_true(hits > 0);
    assert_true(hits < 40 * 8); /* not everything fit */
    assert_int_equal(s.checksum_failures + s.foreign, 0);
    kvbm_manager_destroy(m);
    vt_redis_destroy(&r);
    free(url);
  }
}

typedef struct sleeper {
  int port;
} sleeper;

static void *debug_sleep(void *arg) {
  sleeper *s = arg;
  VT_CLI(s->port, NULL, 0, "DEBUG", "SLEEP", "3");
  return NULL;
}

/* A slow Redis (DEBUG SLEEP 3): a prefill whose lookup has a 100 ms
 * deadline returns well before the server answers, without G4 and with a
 * late lookup counted; once the server is back, G4 serves again. */
static void test_slow(void **st) {
  (void)st;
  vt_redis r = {0};
  snprintf(r.extra[0], sizeof r.extra[0], "--enable-debug-command");
  snprintf(r.extra[1], sizeof r.extra[1], "yes");
  r.nextra = 2;
  assert_int_equal(vt_redis_start(&r), 0);
  char *url = redis_url(r.port);
  uint32_t *p = tu_prompt(400, 17);
  assert_int_equal(store(url, p, 17), 4);
  kvbm_manager *m = mgr(url, 100);
  sleeper s = {r.port};
  pthread_t th;
  double t0 = vt_now();
  assert_int_equal(pthread_create(&th, NULL, debug_sleep, &s), 0);
  /* Let DEBUG SLEEP reach the server: PING stops answering. */
  bool asleep = false;
  while (vt_now() - t0 < 2 && !(asleep = !vt_ping(r.port))) usleep(10000);
  double t1 = vt_now();
  size_t got;
  size_t hits = g4_hits(m, p, 17, &got);
  double dt = vt_now() - t1;
  bool still_asleep = asleep && vt_now() - t0 < 2.5;
  if (still_asleep) { /* the usual case; a machine this slow proves nothing */
    assert_int_equal(hits, 0);
    assert_true(dt < 1.5); /* the store answers at t0 + 3 s */
    assert_int_equal(g4(m).lookup_timeouts, 1);
  }
  pthread_join(th, NULL);
  /* Awake again: G4 serves (a fresh manager: the one above registered p's
   * blocks in G1 for a request that never computed them, which shadows
   * the lower tiers until they are recomputed). */
  kvbm_manager_destroy(m);
  m = mgr(url, 5000);
  assert_int_equal(g4_hits(m, p, 17, &got), 4);
  kvbm_manager_destroy(m);
  vt_redis_destroy(&r);
  free(url);
  free(p);
}

/* The Redis key of block hash h (the manager's namespace, found with
 * SCAN: the test does not restate the namespace's format). */
static int key_of(int port, uint64_t h, char *out, size_t cap) {
  char pat[64], buf[1 << 14];
  snprintf(pat, sizeof pat, "*/%016llx", (unsigned long long)h);
  if (VT_CLI(port, buf, sizeof buf, "--scan", "--pattern", pat)) return -1;
  size_t n = strcspn(buf, "\r\n");
  if (!n || n >= cap) return -1;
  memcpy(out, buf, n);
  out[n] = 0;
  return 0;
}

/* Garbage under a block's key, and a valid value of another block under
 * it: counted misses (checksum, foreign), the match shortened. */
static void test_garbage(void **st) {
  (void)st;
  vt_redis r = {0};
  assert_int_equal(vt_redis_start(&r), 0);
  char *url = redis_url(r.port);
  for (int kind = 0; kind < 4; kind++) {
    uint32_t *p = tu_prompt(7000 + 1000 * (uint32_t)kind, 17);
    assert_int_equal(store(url, p, 17), 4);
    uint64_t h[4];
    kvbm_hash_chain(KVBM_HASH_NATIVE, 0, p, 16, 4, h, 4);
    char k1[512], k2[512], out[64];
    assert_int_equal(key_of(r.port, h[1], k1, sizeof k1), 0);
    assert_int_equal(key_of(r.port, h[2], k2, sizeof k2), 0);
    if (kind == 0) { /* as long as a value of ours: it fails the frame's check */
      char junk[32 + 64 + 384 + 1];
      memset(junk, 'x', sizeof junk - 1);
      junk[sizeof junk - 1] = 0;
      assert_int_equal(VT_CLI(r.port, out, sizeof out, "SET", k1, junk), 0);
    } else if (kind == 3) { /* shorter than a value of ours */
      assert_int_equal(VT_CLI(r.port, out, sizeof out, "SET", k1, "not a block"), 0);
    } else if (kind == 1) {
      assert_int_equal(VT_CLI(r.port, out, sizeof out, "COPY", k2, k1, "REPLACE"), 0);
    } else { /* a key of another type: a list */
      assert_int_equal(VT_CLI(r.port, out, sizeof out, "DEL", k1), 0);
      assert_int_equal(VT_CLI(r.port, out, sizeof out, "LPUSH", k1, "x"), 0);
    }
    kvbm_manager *m = mgr(url, 5000);
    size_t got;
    assert_int_equal(g4_hits(m, p, 17, &got), 1);
    assert_int_equal(got, 1);
    kvbm_tier_stats s = g4(m);
    if (kind == 2) { /* the store says no value is there: the walk stops */
      assert_int_equal(s.lookup_found, 3);
    } else {
      assert_int_equal(s.onboard_failures, 1);
      assert_int_equal(kind == 0 ? s.checksum_failures : s.foreign, 1);
    }
    kvbm_manager_destroy(m);
    free(p);
  }
  vt_redis_destroy(&r);
  free(url);
}

static bool replica_synced(int master, int replica) {
  char a[32], b[32];
  if (VT_CLI(master, a, sizeof a, "DBSIZE") || VT_CLI(replica, b, sizeof b, "DBSIZE")) return false;
  return atoi(a) > 0 && atoi(a) == atoi(b);
}

/* A three-master cluster: blocks spread over the masters are shared
 * between managers; the master holding one of them is killed after a
 * replica caught up: misses while the cluster fails over, then every block
 * is a G4 hit again once the client's slot map is refreshed. */
static void test_cluster_failover(void **st) {
  (void)st;
  vt_cluster cl;
  assert_int_equal(vt_cluster_start(&cl, 3), 0);
  char url[128];
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d,127.0.0.1:%d", cl.node[0].port,
           cl.node[1].port);
  uint32_t *p = tu_prompt(9000, 29);
  kvbm_manager *a = mgr(url, 5000);
  tu_run(a, p, 29, NULL, NULL);
  kvbm_manager_flush(a);
  assert_int_equal(g4(a).offloaded_blocks, 7);
  kvbm_manager_destroy(a);
  kvbm_manager *b = mgr(url, 5000);
  size_t got;
  assert_int_equal(g4_hits(b, p, 29, &got), 7);
  kvbm_manager_destroy(b);
  /* The master of block 3's key: give it a replica, let it sync, kill it. */
  uint64_t h[7];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, p, 28, 4, h, 7);
  char key[512] = "", out[64];
  for (int i = 0; i < 3 && !key[0]; i++)
    if (key_of(cl.node[i].port, h[3], key, sizeof key)) key[0] = 0;
  assert_true(key[0] != 0);
  assert_int_equal(VT_CLI(cl.node[0].port, out, sizeof out, "CLUSTER", "KEYSLOT", key), 0);
  int slot = atoi(out);
  int mport = vt_cluster_owner(cl.node[0].port, slot, NULL), mi = -1;
  for (int i = 0; i < cl.n; i++)
    if (cl.node[i].port == mport) mi = i;
  assert_true(mi >= 0);
  int ri = vt_cluster_add_replica(&cl, mi);
  assert_true(ri > 0);
  for (int t = 0; t < 300 && !replica_synced(mport, cl.node[ri].port); t++) usleep(100000);
  assert_true(replica_synced(mport, cl.node[ri].port));
  b = mgr(url, 5000);
  vt_redis_stop(&cl.node[mi], SIGKILL);
  /* Misses while the cluster fails over, then all seven again. */
  int misses = 0;
  bool whole = false;
  double t0 = vt_now();
  while (!whole && vt_now() - t0 < 60) {
    double asked = vt_now() - t0;
    size_t hits = g4_hits(b, p, 29, &got);
    /* Before the node timeout (1 s) no replica can have taken over: a
     * prefill that started then cannot have found block 3. */
    if (asked < 0.9) assert_true(hits < 7);
    if (hits == 7) whole = true;
    else {
      misses++;
      kvbm_manager_destroy(b); /* a fresh index: every block from the store */
      b = mgr(url, 5000);
      usleep(100000);
    }
  }
  assert_true(whole);
  print_message("failover: %d prefills missed before the map was refreshed\n", misses);
  kvbm_tier_stats s = g4(b);
  assert_int_equal(s.checksum_failures + s.foreign, 0);
  kvbm_manager_destroy(b);
  free(p);
  vt_cluster_destroy(&cl);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_down_at_start),   cmocka_unit_test(test_killed_and_restarted),
      cmocka_unit_test(test_full),            cmocka_unit_test(test_slow),
      cmocka_unit_test(test_garbage),         cmocka_unit_test(test_cluster_failover),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
