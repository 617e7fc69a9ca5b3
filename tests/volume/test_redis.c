/* SPDX-License-Identifier: Apache-2.0 */
/* test_redis.c: the redis:// backend against real redis-server processes
 * started here (free loopback ports, temporary dirs, --save ''), and
 * against a fake server that speaks garbage. Round trips and the key
 * layout, databases and passwords, two processes sharing one Redis,
 * concurrent writers of one key, Redis down at register then started,
 * Redis killed mid-run and restarted, maxmemory (eviction: misses, never
 * wrong bytes; noeviction: KVBM_ENOSPC), a slow Redis (DEBUG SLEEP) under
 * a short deadline, and garbage under a key. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "volume_testutil.h"

static kvbm_volume *redis_volume(const char *url, const char *ns, int timeout_ms, uint64_t max) {
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.key_namespace = ns;
  if (timeout_ms) c.timeout_ms = timeout_ms;
  if (max) c.max_value_bytes = max;
  kvbm_volume *v = NULL;
  kvbm_error e;
  int rc = kvbm_volume_register(&c, &v, &e);
  if (rc) fail_msg("register %s: %s", url, e.msg);
  return v;
}

static void url_of(const vt_redis *r, char *url, size_t cap, const char *userinfo,
                   const char *path) {
  snprintf(url, cap, "redis://%s%s127.0.0.1:%d%s", userinfo ? userinfo : "",
           userinfo ? "@" : "", r->port, path ? path : "");
}

/* Retries an op while it fails with EIO (a server coming up), up to ~20 s. */
static int put_until_ok(kvbm_volume *v, uint64_t key, const void *p, size_t n) {
  int rc = KVBM_EIO;
  for (int i = 0; i < 400 && (rc = kvbm_volume_put(v, key, p, n)) != KVBM_OK; i++) usleep(50000);
  return rc;
}

static void test_round_trip(void **state) {
  (void)state;
  vt_redis r = {0};
  assert_int_equal(vt_redis_start(&r), 0);
  char url[256];
  url_of(&r, url, sizeof url, NULL, "/3");
  kvbm_volume *v = redis_volume(url, "m:fp16", 0, 0);
  const size_t big = 2u << 20;
  uint8_t *val = malloc(big), *out = malloc(big);
  size_t sizes[] = {1, 4096, big};
  for (int i = 0; i < 3; i++) {
    uint64_t key = 0x1234000000000000ull + (uint64_t)i;
    vt_pattern(val, sizes[i], key, 1, 0);
    assert_int_equal(kvbm_volume_put(v, key, val, sizes[i]), KVBM_OK);
    size_t sz = 0;
    assert_int_equal(kvbm_volume_get(v, key, out, big, &sz), KVBM_OK);
    assert_int_equal(sz, sizes[i]);
    assert_true(vt_pattern(out, sizes[i], key, 1, 1));
    assert_int_equal(kvbm_volume_exists(v, key, &sz), KVBM_OK);
    assert_int_equal(sz, sizes[i]);
  }
  /* the key layout, in database 3 */
  char out_cli[64];
  assert_int_equal(VT_CLI(r.port, out_cli, sizeof out_cli, "-n", "3", "STRLEN",
                          "m:fp16/1234000000000001"),
                   0);
  assert_int_equal(atoi(out_cli), 4096);
  assert_int_equal(VT_CLI(r.port, out_cli, sizeof out_cli, "-n", "0", "DBSIZE"), 0);
  assert_int_equal(atoi(out_cli), 0);
  /* small buffer, missing, delete, a batch */
  size_t sz;
  assert_int_equal(kvbm_volume_get(v, 0x1234000000000001ull, out, 100, &sz), KVBM_ENOSPC);
  assert_int_equal(sz, 4096);
  assert_int_equal(kvbm_volume_get(v, 77, out, big, &sz), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_delete(v, 0x1234000000000001ull), KVBM_OK);
  assert_int_equal(kvbm_volume_delete(v, 0x1234000000000001ull), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_exists(v, 0x1234000000000001ull, &sz), KVBM_ENOTFOUND);
  kvbm_volume_op ops[64];
  uint8_t *outs = malloc(64 * 1000);
  for (int i = 0; i < 32; i++) {
    vt_pattern(val + i * 1000, 1000, (uint64_t)i, 9, 0);
    ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = (uint64_t)i, .src = val + i * 1000,
                              .len = 1000};
    ops[32 + i] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = (uint64_t)i,
                                   .dst = outs + i * 1000, .cap = 1000};
  }
  assert_int_equal(kvbm_volume_run(v, ops, 64, NULL), KVBM_OK);
  for (int i = 0; i < 64; i++) assert_int_equal(ops[i].status, KVBM_OK);
  for (int i = 0; i < 32; i++) assert_true(vt_pattern(outs + i * 1000, 1000, (uint64_t)i, 9, 1));
  /* namespaces apart */
  kvbm_volume *w = redis_volume(url, "other", 0, 0);
  assert_int_equal(kvbm_volume_get(w, 0, out, big, &sz), KVBM_ENOTFOUND);
  kvbm_volume_unregister(w);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.io_errors, 0);
  assert_int_equal(s.reconnects, 0);
  kvbm_volume_unregister(v);
  free(outs);
  free(val);
  free(out);
  vt_redis_destroy(&r);
}

static void test_password(void **state) {
  (void)state;
  vt_redis r = {.nextra = 2, .extra = {"--requirepass", "s3cr@t"}};
  assert_int_equal(vt_redis_start(&r), 0);
  char url[256];
  url_of(&r, url, sizeof url, ":s3cr%40t", NULL);
  kvbm_volume *v = redis_volume(url, "", 0, 0);
  assert_null(strstr(kvbm_volume_url(v), "s3cr"));
  assert_null(strstr(kvbm_volume_name(v), "s3cr"));
  assert_int_equal(kvbm_volume_put(v, 1, "abc", 3), KVBM_OK);
  kvbm_volume_unregister(v);
  url_of(&r, url, sizeof url, "default:s3cr%40t", NULL); /* ACL form */
  v = redis_volume(url, "", 0, 0);
  assert_int_equal(kvbm_volume_exists(v, 1, NULL), KVBM_OK);
  kvbm_volume_unregister(v);
  url_of(&r, url, sizeof url, ":wrong", NULL);
  v = redis_volume(url, "", 0, 0);
  assert_int_equal(kvbm_volume_put(v, 2, "abc", 3), KVBM_EIO);
  kvbm_volume_unregister(v);
  url_of(&r, url, sizeof url, NULL, NULL);
  v = redis_volume(url, "", 0, 0);
  assert_int_equal(kvbm_volume_get(v, 1, url, sizeof url, NULL), KVBM_EIO); /* NOAUTH */
  kvbm_volume_unregister(v);
  vt_redis_destroy(&r);
}

/* Two processes against one Redis: a child stores, the parent serves;
 * then three children write one key at once while the parent reads whole
 * values only. */
static void test_sharing_and_racing(void **state) {
  (void)state;
  vt_redis r = {0};
  assert_int_equal(vt_redis_start(&r), 0);
  char url[256];
  url_of(&r, url, sizeof url, NULL, NULL);
  pid_t pid = fork();
  if (pid == 0) {
    kvbm_volume_config c = kvbm_volume_config_default(url);
    c.key_namespace = "shared";
    kvbm_volume *v;
    if (kvbm_volume_register(&c, &v, NULL)) _exit(2);
    uint8_t val[3000];
    for (uint64_t k = 0; k < 20; k++) {
      vt_pattern(val, sizeof val, k, 100, 0);
      if (kvbm_volume_put(v, k, val, sizeof val)) _exit(3);
    }
    kvbm_volume_unregister(v);
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  kvbm_volume *v = redis_volume(url, "shared", 0, 0);
  uint8_t out[3000];
  for (uint64_t k = 0; k < 20; k++) {
    assert_int_equal(kvbm_volume_get(v, k, out, sizeof out, NULL), KVBM_OK);
    assert_true(vt_pattern(out, sizeof out, k, 100, 1));
  }
  const size_t len = 512 * 1024;
  pid_t kids[3];
  for (int w = 0; w < 3; w++) {
    kids[w] = fork();
    if (kids[w] == 0) {
      kvbm_volume_config c = kvbm_volume_config_default(url);
      c.key_namespace = "shared";
      kvbm_volume *wv;
      if (kvbm_volume_register(&c, &wv, NULL)) _exit(2);
      uint8_t *val = malloc(len);
      for (uint64_t i = 0; i < 40; i++) {
        vt_pattern(val, len, 99, (uint64_t)(w + 1) << 32 | i, 0);
        if (kvbm_volume_put(wv, 99, val, len)) _exit(3);
      }
      kvbm_volume_unregister(wv);
      free(val);
      _exit(0);
    }
  }
  uint8_t *big = malloc(len);
  int alive = 3;
  while (alive) {
    int rc = kvbm_volume_get(v, 99, big, len, NULL);
    if (rc == KVBM_OK) assert_true(vt_pattern(big, len, 99, vt_version(big), 1));
    else assert_int_equal(rc, KVBM_ENOTFOUND);
    alive = 0;
    for (int w = 0; w < 3; w++) {
      if (kids[w] > 0 && waitpid(kids[w], &st, WNOHANG) == kids[w]) {
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        kids[w] = 0;
      }
      alive += kids[w] > 0;
    }
  }
  assert_int_equal(kvbm_volume_get(v, 99, big, len, NULL), KVBM_OK);
  assert_int_equal(vt_version(big) & 0xffffffffu, 39);
  free(big);
  kvbm_volume_unregister(v);
  vt_redis_destroy(&r);
}

/* Nothing listens at register: not an error; ops fail fast (EIO); once a
 * server comes up on that port the volume connects (counted). */
static void test_down_at_start(void **state) {
  (void)state;
  vt_redis r = {0};
  char *d = vt_tmpdir("redis");
  snprintf(r.dir, sizeof r.dir, "%s", d);
  free(d);
  r.port = vt_free_port();
  char url[256];
  url_of(&r, url, sizeof url, NULL, NULL);
  kvbm_volume *v = redis_volume(url, "x", 0, 0);
  uint8_t val[100];
  vt_pattern(val, sizeof val, 1, 1, 0);
  double t0 = vt_now();
  assert_int_equal(kvbm_volume_put(v, 1, val, sizeof val), KVBM_EIO);
  assert_int_equal(kvbm_volume_get(v, 1, val, sizeof val, NULL), KVBM_EIO);
  assert_true(vt_now() - t0 < 0.9); /* refused, not waited for (deadline 1 s) */
  assert_int_equal(vt_redis_restart(&r), 0);
  assert_int_equal(put_until_ok(v, 1, val, sizeof val), KVBM_OK);
  uint8_t out[100];
  assert_int_equal(kvbm_volume_get(v, 1, out, sizeof out, NULL), KVBM_OK);
  assert_memory_equal(out, val, sizeof val);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.reconnects, 1);
  assert_true(s.io_errors >= 2);
  kvbm_volume_unregister(v);
  vt_redis_destroy(&r);
}

/* Killed mid-run: misses (EIO) while it is down, never wrong bytes; after
 * the restart (empty: no persistence) misses, then hits once stored again. */
static void test_killed_and_restarted(void **state) {
  (void)state;
  vt_redis r = {0};
  assert_int_equal(vt_redis_start(&r), 0);
  char url[256];
  url_of(&r, url, sizeof url, NULL, NULL);
  kvbm_volume *v = redis_volume(url, "k", 0, 0);
  uint8_t val[4096], out[4096];
  for (uint64_t k = 0; k < 10; k++) {
    vt_pattern(val, sizeof val, k, 1, 0);
    assert_int_equal(kvbm_volume_put(v, k, val, sizeof val), KVBM_OK);
  }
  assert_int_equal(kvbm_volume_get(v, 3, out, sizeof out, NULL), KVBM_OK);
  vt_redis_stop(&r, SIGKILL);
  for (uint64_t k = 0; k < 10; k++) {
    memset(out, 0, sizeof out);
    int rc = kvbm_volume_get(v, k, out, sizeof out, NULL);
    assert_int_equal(rc, KVBM_EIO);
  }
  assert_int_equal(vt_redis_restart(&r), 0);
  int rc = KVBM_EIO;
  for (int i = 0; i < 400 && (rc = kvbm_volume_get(v, 3, out, sizeof out, NULL)) == KVBM_EIO; i++)
    usleep(50000);
  assert_int_equal(rc, KVBM_ENOTFOUND); /* the new server is empty */
  for (uint64_t k = 0; k < 10; k++) {
    vt_pattern(val, sizeof val, k, 2, 0);
    assert_int_equal(kvbm_volume_put(v, k, val, sizeof val), KVBM_OK);
  }
  for (uint64_t k = 0; k < 10; k++) {
    assert_int_equal(kvbm_volume_get(v, k, out, sizeof out, NULL), KVBM_OK);
    assert_true(vt_pattern(out, sizeof out, k, 2, 1));
  }
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_true(s.reconnects >= 1);
  assert_int_equal(s.hits, 11);
  /* a restart while idle costs no op: the dead connection is retried */
  vt_redis_stop(&r, SIGTERM);
  assert_int_equal(vt_redis_restart(&r), 0);
  assert_int_equal(kvbm_volume_put(v, 1, val, sizeof val), KVBM_OK);
  kvbm_volume_unregister(v);
  vt_redis_destroy(&r);
}

/* maxmemory: with LRU eviction some gets miss and every hit is exact; with
 * noeviction a put is KVBM_ENOSPC (counted full). */
static void test_maxmemory(void **state) {
  (void)state;
  vt_redis r = {.nextra = 4, .extra = {"--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"}};
  assert_int_equal(vt_redis_start(&r), 0);
  char url[256];
  url_of(&r, url, sizeof url, NULL, NULL);
  kvbm_volume *v = redis_volume(url, "mm", 5000, 0);
  const size_t len = 512 * 1024;
  uint8_t *val = malloc(len), *out = malloc(len);
  for (uint64_t k = 0; k < 48; k++) {
    vt_pattern(val, len, k, 3, 0);
    assert_int_equal(kvbm_volume_put(v, k, val, len), KVBM_OK);
  }
  int hits = 0, misses = 0;
  for (uint64_t k = 0; k < 48; k++) {
    int rc = kvbm_volume_get(v, k, out, len, NULL);
    if (rc == KVBM_OK) {
      assert_true(vt_pattern(out, len, k, 3, 1));
      hits++;
    } else {
      assert_int_equal(rc, KVBM_ENOTFOUND);
      misses++;
    }
  }
  assert_true(misses > 0);
  assert_true(hits > 0);
  kvbm_volume_unregister(v);
  vt_redis_destroy(&r);

  vt_redis n = {.nextra = 4, .extra = {"--maxmemory", "4mb", "--maxmemory-policy", "noeviction"}};
  assert_int_equal(vt_redis_start(&n), 0);
  url_of(&n, url, sizeof url, NULL, NULL);
  v = redis_volume(url, "mm", 5000, 0);
  vt_pattern(val, len, 0, 3, 0);
  int rc = KVBM_OK;
  uint64_t k = 0;
  for (; k < 64 && rc == KVBM_OK; k++) rc = kvbm_volume_put(v, k, val, len);
  assert_int_equal(rc, KVBM_ENOSPC);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.full, 1);
  /* what was stored before is still whole */
  assert_int_equal(kvbm_volume_get(v, 0, out, len, NULL), KVBM_OK);
  assert_memory_equal(out, val, len);
  kvbm_volume_unregister(v);
  vt_redis_destroy(&n);
  free(val);
  free(out);
}

/* A slow Redis (DEBUG SLEEP 5) and a 200 ms deadline: the get ends
 * KVBM_ETIMEDOUT long before the server wakes up; afterwards the volume
 * works again (reconnected). */
static void test_slow(void **state) {
  (void)state;
  vt_redis r = {.nextra = 2, .extra = {"--enable-debug-command", "yes"}};
  assert_int_equal(vt_redis_start(&r), 0);
  char url[256];
  url_of(&r, url, sizeof url, NULL, NULL);
  kvbm_volume *v = redis_volume(url, "slow", 200, 0);
  assert_int_equal(kvbm_volume_put(v, 1, "abc", 3), KVBM_OK);
  pid_t sleeper = fork();
  if (sleeper == 0) {
    char out[64];
    _exit(VT_CLI(r.port, out, sizeof out, "DEBUG", "SLEEP", "5"));
  }
  double t0 = vt_now(), took = 0;
  int rc = KVBM_OK;
  char out[8];
  /* gets answer at once until the sleep begins; the first that does not
   * must give up at its deadline */
  while (vt_now() - t0 < 15.0) { /* redis-cli may start late on a loaded machine */
    double t = vt_now();
    rc = kvbm_volume_get(v, 1, out, sizeof out, NULL);
    took = vt_now() - t;
    if (rc != KVBM_OK) break;
    usleep(5000);
  }
  assert_int_equal(rc, KVBM_ETIMEDOUT);
  assert_true(took < 2.5); /* 0.2 s deadline plus slack; the sleep is 5 s */
  int st;
  waitpid(sleeper, &st, 0);
  assert_int_equal(put_until_ok(v, 2, "def", 3), KVBM_OK);
  assert_int_equal(kvbm_volume_get(v, 1, out, sizeof out, NULL), KVBM_OK);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_true(s.timeouts >= 1);
  assert_true(s.reconnects >= 1);
  kvbm_volume_unregister(v);
  vt_redis_destroy(&r);
}

/* Garbage under a key: bytes are returned as they are (framing is the
 * tier's); a value above max_value_bytes is refused and the volume goes on;
 * a key of another type is a counted miss. */
static void test_garbage(void **state) {
  (void)state;
  vt_redis r = {0};
  assert_int_equal(vt_redis_start(&r), 0);
  char url[256];
  url_of(&r, url, sizeof url, NULL, NULL);
  kvbm_volume *v = redis_volume(url, "g", 0, 1000);
  char cli[64];
  assert_int_equal(VT_CLI(r.port, cli, sizeof cli, "SET", "g/0000000000000001", "not a frame"), 0);
  uint8_t out[2000];
  size_t sz;
  assert_int_equal(kvbm_volume_get(v, 1, out, sizeof out, &sz), KVBM_OK);
  assert_int_equal(sz, 11);
  assert_memory_equal(out, "not a frame", 11);
  static char big[100000]; /* one argv string: under 128 KiB */
  memset(big, 'x', sizeof big - 1);
  assert_int_equal(VT_CLI(r.port, cli, sizeof cli, "SET", "g/0000000000000002", big), 0);
  assert_int_equal(kvbm_volume_get(v, 2, out, sizeof out, &sz), KVBM_ETOOLONG);
  assert_int_equal(kvbm_volume_exists(v, 2, &sz), KVBM_OK); /* it is there, only too big */
  assert_int_equal(sz, sizeof big - 1);
  assert_int_equal(kvbm_volume_get(v, 1, out, sizeof out, &sz), KVBM_OK);
  assert_int_equal(VT_CLI(r.port, cli, sizeof cli, "RPUSH", "g/0000000000000003", "a"), 0);
  assert_int_equal(kvbm_volume_get(v, 3, out, sizeof out, &sz), KVBM_ECHECKSUM);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.corrupt, 1);
  assert_int_equal(s.hits, 2);
  kvbm_volume_unregister(v);
  vt_redis_destroy(&r);
}

/* ---- a fake server that answers every command with canned bytes ---- */

typedef struct fake {
  int lfd, port;
  const char *reply;
  size_t reply_len;
  size_t stream; /* then this many more 'x' bytes (0: none) */
  pthread_t t;
} fake;

static void *fake_main(void *p) {
  fake *f = p;
  for (;;) {
    int c = accept(f->lfd, NULL, NULL);
    if (c < 0) return NULL;
    char buf[4096];
    if (read(c, buf, sizeof buf) > 0) {
      if (write(c, f->reply, f->reply_len) < 0) {
      }
      static char xs[65536];
      memset(xs, 'x', sizeof xs);
      for (size_t sent = 0; sent < f->stream;) {
        ssize_t w = write(c, xs, sizeof xs);
        if (w <= 0) break;
        sent += (size_t)w;
      }
    }
    close(c);
  }
}

static void fake_start(fake *f) {
  f->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t l = sizeof a;
  getsockname(f->lfd, (struct sockaddr *)&a, &l);
  f->port = ntohs(a.sin_port);
  assert_int_equal(listen(f->lfd, 8), 0);
  pthread_create(&f->t, NULL, fake_main, f);
}

static void fake_stop(fake *f) {
  shutdown(f->lfd, SHUT_RDWR);
  close(f->lfd);
  pthread_join(f->t, NULL);
}

static void test_hostile_server(void **state) {
  (void)state;
  struct {
    const char *reply;
    size_t stream;
    int want;
  } cases[] = {
      {"*2147483647\r\n", 0, KVBM_EIO}, /* would be a 16 GiB allocation */
      {"*3\r\n*1000000000\r\n", 0, KVBM_EIO},
      {"$-5\r\n", 0, KVBM_EIO},
      {"@what\r\n", 0, KVBM_EIO},         /* not RESP */
      {"$99999999999\r\n", 3 << 20, KVBM_ETOOLONG}, /* streams past max_value */
      {"+OK\r\n", 0, KVBM_EIO},           /* a status where a string belongs */
      {"", 0, KVBM_EIO},                  /* closed without a word */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    fake f = {.reply = cases[i].reply, .reply_len = strlen(cases[i].reply),
              .stream = cases[i].stream};
    fake_start(&f);
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", f.port);
    kvbm_volume *v = redis_volume(url, "", 3000, 1u << 20);
    uint8_t out[64];
    int rc = kvbm_volume_get(v, 1, out, sizeof out, NULL);
    if (rc != cases[i].want)
      fail_msg("case %zu (%s): %s", i, cases[i].reply, kvbm_status_name(rc));
    kvbm_volume_unregister(v);
    fake_stop(&f);
  }
}

int main(void) {
  /* SIGPIPE stays fatal: the volume must never raise it */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),     cmocka_unit_test(test_password),
      cmocka_unit_test(test_sharing_and_racing), cmocka_unit_test(test_down_at_start),
      cmocka_unit_test(test_killed_and_restarted), cmocka_unit_test(test_maxmemory),
      cmocka_unit_test(test_slow),           cmocka_unit_test(test_garbage),
      cmocka_unit_test(test_hostile_server),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
