/* SPDX-License-Identifier: Apache-2.0 */
/* test_volume.c: the storage interface's core, against a backend written
 * here (a gated in-memory store): hostile descriptors and namespaces, bad
 * settings and batches, the queue bound, deadlines counted from
 * submission, unregister's ECLOSED, statuses outside the contract, counters,
 * and one state per I/O thread. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "volume/internal.h"
#include "volume_testutil.h"

/* ---- the test backend: "mem://", a few keys, a gate ---- */

#define MEM_KEYS 64

typedef struct mem_shared {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool gate_closed;
  int waiting; /* runs blocked at the gate */
  int opens, closes, runs;
  int force_status; /* != 0: every op gets this status */
  bool lie_size;    /* a get claims more bytes than it had room for */
  uint64_t keys[MEM_KEYS];
  uint8_t *vals[MEM_KEYS];
  size_t lens[MEM_KEYS];
  int nkeys;
  size_t max_len_seen;
  int fail_open_at; /* the n-th open fails (1-based; 0: never) */
} mem_shared;

static int mem_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  mem_shared *m = user;
  assert_non_null(cfg->url);
  pthread_mutex_lock(&m->mu);
  int n = ++m->opens;
  pthread_mutex_unlock(&m->mu);
  if (m->fail_open_at && n == m->fail_open_at)
    return kvbm_error_set(err, KVBM_EIO, "mem: open %d refused", n);
  *state = m;
  return KVBM_OK;
}

static void mem_close(void *state) {
  mem_shared *m = state;
  pthread_mutex_lock(&m->mu);
  m->closes++;
  pthread_mutex_unlock(&m->mu);
}

static int mem_find(mem_shared *m, uint64_t key) {
  for (int i = 0; i < m->nkeys; i++)
    if (m->keys[i] == key) return i;
  return -1;
}

static void mem_run(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  (void)deadline_ns;
  mem_shared *m = state;
  pthread_mutex_lock(&m->mu);
  m->runs++;
  m->waiting++;
  pthread_cond_broadcast(&m->cv);
  while (m->gate_closed) pthread_cond_wait(&m->cv, &m->mu);
  m->waiting--;
  for (size_t i = 0; i < n; i++) {
    kvbm_volume_op *op = &ops[i];
    int k = mem_find(m, op->key);
    if (m->force_status) {
      op->status = m->force_status;
      continue;
    }
    switch (op->kind) {
    case KVBM_VOLUME_PUT:
      if (op->len > m->max_len_seen) m->max_len_seen = op->len;
      if (k < 0) {
        if (m->nkeys == MEM_KEYS) {
          op->status = KVBM_ENOSPC;
          break;
        }
        k = m->nkeys++;
        m->keys[k] = op->key;
        m->vals[k] = NULL;
      }
      free(m->vals[k]);
      m->vals[k] = malloc(op->len);
      memcpy(m->vals[k], op->src, op->len);
      m->lens[k] = op->len;
      op->status = KVBM_OK;
      break;
    case KVBM_VOLUME_GET:
      if (k < 0) {
        op->status = KVBM_ENOTFOUND;
        break;
      }
      op->size = m->lens[k];
      if (m->lie_size) {
        op->size = op->cap + 1;
        op->status = KVBM_OK;
        break;
      }
      if (op->size > op->cap) {
        op->status = KVBM_ENOSPC;
        break;
      }
      memcpy(op->dst, m->vals[k], m->lens[k]);
      op->status = KVBM_OK;
      break;
    case KVBM_VOLUME_EXISTS:
      op->status = k < 0 ? KVBM_ENOTFOUND : KVBM_OK;
      if (k >= 0) op->size = m->lens[k];
      break;
    case KVBM_VOLUME_DELETE:
      if (k < 0) {
        op->status = KVBM_ENOTFOUND;
        break;
      }
      free(m->vals[k]);
      m->keys[k] = m->keys[m->nkeys - 1];
      m->vals[k] = m->vals[m->nkeys - 1];
      m->lens[k] = m->lens[m->nkeys - 1];
      m->nkeys--;
      op->status = KVBM_OK;
      break;
    }
  }
  pthread_mutex_unlock(&m->mu);
}

static const kvbm_volume_backend mem_backend = {
    .scheme = "mem", .open = mem_open, .run = mem_run, .close = mem_close};

static mem_shared *mem_new(void) {
  mem_shared *m = calloc(1, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  return m;
}

static void mem_free(mem_shared *m) {
  for (int i = 0; i < m->nkeys; i++) free(m->vals[i]);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m);
}

static void gate(mem_shared *m, bool closed) {
  pthread_mutex_lock(&m->mu);
  m->gate_closed = closed;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* Waits until `n` runs sit at the gate. */
static void wait_waiting(mem_shared *m, int n) {
  pthread_mutex_lock(&m->mu);
  while (m->waiting < n) pthread_cond_wait(&m->cv, &m->mu);
  pthread_mutex_unlock(&m->mu);
}

static kvbm_volume *mem_volume(mem_shared *m, uint32_t threads, uint32_t queue, int timeout_ms) {
  kvbm_volume_config c = kvbm_volume_config_default("mem://anything/at/all");
  c.backend = &mem_backend;
  c.backend_user = m;
  c.threads = threads;
  c.queue_capacity = queue;
  c.timeout_ms = timeout_ms;
  c.max_value_bytes = 1000;
  kvbm_volume *v = NULL;
  kvbm_error e;
  int rc = kvbm_volume_register(&c, &v, &e);
  if (rc) fail_msg("register: %s", e.msg);
  return v;
}

/* ---- completion counting ---- */

typedef struct done_log {
  pthread_mutex_t mu;
  int calls;
  int status[16];
} done_log;

static void log_done(void *user, kvbm_volume_op *ops, size_t n) {
  done_log *d = user;
  pthread_mutex_lock(&d->mu);
  if (d->calls < 16) d->status[d->calls] = ops[0].status;
  d->calls++;
  pthread_mutex_unlock(&d->mu);
  (void)n;
}

/* ---- descriptors ---- */

static void expect_bad_url(const char *url, const char *needle) {
  kvbm__volume_url u;
  kvbm_error e;
  kvbm_error_clear(&e);
  int rc = kvbm__volume_url_parse(url, &u, &e);
  if (rc != KVBM_EINVAL || !strstr(e.msg, needle))
    fail_msg("url '%.80s': rc %d, message '%s' (wanted EINVAL naming '%s')", url, rc, e.msg,
             needle);
}

static void test_url_hostile(void **state) {
  (void)state;
  expect_bad_url("", "empty URL");
  expect_bad_url("redis", "scheme and '://'");
  expect_bad_url("://x", "scheme and '://'");
  expect_bad_url("1redis://h", "scheme and '://'");
  expect_bad_url("redis:/h:1", "scheme and '://'");
  expect_bad_url("redis://", "no host");
  expect_bad_url("redis://:pw@", "no host");
  expect_bad_url("redis://h:0", "port '0'");
  expect_bad_url("redis://h:65536", "port '65536'");
  expect_bad_url("redis://h:123456", "port '123456'");
  expect_bad_url("redis://h:-1", "port '-1'");
  expect_bad_url("redis://h:", "port ''");
  expect_bad_url("redis://h:6x", "port '6x'");
  expect_bad_url("redis://h/x", "not a database number");
  expect_bad_url("redis://h/1/2", "not a database number");
  expect_bad_url("redis://h/1234567890", "not a database number");
  expect_bad_url("redis://a,b", "one host");
  expect_bad_url("redis://h%41", "bad character '%'");
  expect_bad_url("redis://h!x:1", "bad character '!'");
  expect_bad_url("redis://[::1", "no closing ']'");
  expect_bad_url("redis://[::g]:1", "bad character 'g'");
  expect_bad_url("redis://[::1]x", "followed by 'x'");
  expect_bad_url("redis://[]:1", "empty host");
  expect_bad_url("redis://:1", "empty host");
  expect_bad_url("redis://h:1?db=2", "queries and fragments");
  expect_bad_url("redis://h:1#x", "queries and fragments");
  expect_bad_url("redis://h 1", "byte 0x20 at byte 9");
  expect_bad_url("redis://h\t1", "byte 0x09");
  expect_bad_url("redis://h\x7f", "byte 0x7f");
  expect_bad_url("redis://h\xc3\xa9", "byte 0xc3");
  expect_bad_url("redis://%zz@h", "bad %-escape");
  expect_bad_url("redis://%4@h", "bad %-escape");
  expect_bad_url("redis://pw%00x@h", "NUL byte");
  expect_bad_url("redis+cluster://a:1,,b:2", "empty host");
  expect_bad_url("redis+cluster://a:1,b:2/3", "only database 0");
  expect_bad_url("redis+cluster://a:1,", "empty host");
  expect_bad_url("file://", "needs a directory");
  expect_bad_url("file://host/dir", "takes no host");
  expect_bad_url("disk://h:1/d", "takes no host");
  expect_bad_url("file:///a%2", "bad %-escape");
  expect_bad_url("file:///a%00b", "NUL byte");
  char big[KVBM__VOLUME_URL_MAX + 64];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  memcpy(big, "redis://", 8);
  expect_bad_url(big, "longer than 4096");
  /* a long host, a long password, too many seeds */
  char h[400] = "redis://";
  memset(h + 8, 'h', 300);
  h[308] = 0;
  expect_bad_url(h, "host is longer than 255");
  char pw[400] = "redis://:";
  memset(pw + 9, 'p', 300);
  strcpy(pw + 309, "@h");
  expect_bad_url(pw, "password is longer than 255");
  char seeds[400] = "redis+cluster://";
  for (int i = 0; i < 17; i++) strcat(seeds, i ? ",h:1" : "h:1");
  expect_bad_url(seeds, "at most 16 seeds");
  char scheme[64];
  memset(scheme, 'a', 40);
  strcpy(scheme + 40, "://x");
  expect_bad_url(scheme, "scheme longer than 32");
  /* unterminated input never read past its NUL: strnlen-bounded (ASan) */
  char *exact = malloc(5);
  memcpy(exact, "x://", 5);
  kvbm__volume_url u;
  assert_int_equal(kvbm__volume_url_parse(exact, &u, NULL), KVBM_OK);
  assert_int_equal(u.kind, KVBM__VOLUME_OTHER);
  free(exact);
  assert_int_equal(kvbm__volume_url_parse(NULL, &u, NULL), KVBM_EINVAL);
}

static void test_url_good(void **state) {
  (void)state;
  kvbm__volume_url u;
  kvbm_error e;
  assert_int_equal(kvbm__volume_url_parse("redis://127.0.0.1:7000/3", &u, &e), KVBM_OK);
  assert_int_equal(u.kind, KVBM__VOLUME_REDIS);
  assert_int_equal(u.nhosts, 1);
  assert_string_equal(u.hosts[0].host, "127.0.0.1");
  assert_int_equal(u.hosts[0].port, 7000);
  assert_int_equal(u.db, 3);
  assert_false(u.has_password);
  assert_string_equal(u.display, "redis://127.0.0.1:7000/3");

  assert_int_equal(kvbm__volume_url_parse("REDIS://us%65r:p%40ss:w@cache.local", &u, &e), KVBM_OK);
  assert_string_equal(u.scheme, "redis");
  assert_string_equal(u.user, "user");
  assert_string_equal(u.password, "p@ss:w");
  assert_true(u.has_password);
  assert_int_equal(u.hosts[0].port, 6379);
  assert_string_equal(u.display, "redis://cache.local");

  assert_int_equal(kvbm__volume_url_parse("redis://secret@h:1/", &u, &e), KVBM_OK);
  assert_string_equal(u.password, "secret");
  assert_string_equal(u.user, "");
  assert_null(strstr(u.display, "secret"));

  assert_int_equal(kvbm__volume_url_parse("redis+cluster://:pw@a:1,[::1]:2,b", &u, &e), KVBM_OK);
  assert_int_equal(u.kind, KVBM__VOLUME_CLUSTER);
  assert_int_equal(u.nhosts, 3);
  assert_string_equal(u.hosts[1].host, "::1");
  assert_int_equal(u.hosts[1].port, 2);
  assert_int_equal(u.hosts[2].port, 6379);
  assert_string_equal(u.display, "redis+cluster://a:1,[::1]:2,b");

  assert_int_equal(kvbm__volume_url_parse("file:///tmp/a%20b/", &u, &e), KVBM_OK);
  assert_int_equal(u.kind, KVBM__VOLUME_FILE);
  assert_string_equal(u.path, "/tmp/a b/");
  assert_int_equal(kvbm__volume_url_parse("disk://", &u, &e), KVBM_OK); /* private default */
  assert_string_equal(u.path, "");
  assert_int_equal(kvbm__volume_url_parse("disk:///var/kvbm", &u, &e), KVBM_OK);
  assert_int_equal(u.kind, KVBM__VOLUME_DISK);
  assert_string_equal(u.path, "/var/kvbm");
  assert_int_equal(kvbm__volume_url_parse("my-vendor.v2://whatever:here@x/y", &u, &e), KVBM_OK);
  assert_int_equal(u.kind, KVBM__VOLUME_OTHER);
  assert_string_equal(u.display, "my-vendor.v2://x/y");
}

static void test_namespace(void **state) {
  (void)state;
  const char *good[] = {"", "a", "llama-3:8b.fp16_bs16:abcdef0123456789", "...", "-x"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    assert_int_equal(kvbm__volume_ns_check(good[i], NULL), KVBM_OK);
  assert_int_equal(kvbm__volume_ns_check(NULL, NULL), KVBM_OK);
  struct {
    const char *ns, *needle;
  } bad[] = {{"a/b", "'/' at byte 1"},  {"../x", "'/' at byte 2"}, {".", "names a directory"},
             {"..", "names a directory"}, {"a b", "0x20 at byte 1"}, {"a\nb", "0x0a"},
             {"\xc3\xa9", "0xc3 at byte 0"}, {"{tag}", "'{' at byte 0"}, {"a*", "'*'"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kvbm_error e;
    assert_int_equal(kvbm__volume_ns_check(bad[i].ns, &e), KVBM_EINVAL);
    if (!strstr(e.msg, bad[i].needle)) fail_msg("ns '%s': '%s'", bad[i].ns, e.msg);
  }
  char longns[300];
  memset(longns, 'n', 201);
  longns[201] = 0;
  kvbm_error e;
  assert_int_equal(kvbm__volume_ns_check(longns, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "longer than 200"));
  longns[200] = 0;
  assert_int_equal(kvbm__volume_ns_check(longns, NULL), KVBM_OK);
  char key[KVBM__VOLUME_KEY_MAX];
  assert_int_equal(kvbm__volume_key(longns, 0xfedcba9876543210ull, key), 217);
  assert_string_equal(key + 200, "/fedcba9876543210");
  assert_int_equal(kvbm__volume_key("", 0x1aull, key), 16);
  assert_string_equal(key, "000000000000001a");
}

/* Registration refuses bad settings by name, and an unknown scheme. */
static void test_register_refusals(void **state) {
  (void)state;
  mem_shared *m = mem_new();
  struct {
    const char *url;
    int field; /* which setting to spoil */
    int rc;
    const char *needle;
  } cases[] = {
      {"nosuch://x", 0, KVBM_EUNSUPPORTED, "no backend for 'nosuch://'"},
      {"mem://x", 1, KVBM_EINVAL, "timeout_ms -5"},
      {"mem://x", 2, KVBM_EINVAL, "threads 65"},
      {"mem://x", 3, KVBM_EINVAL, "queue_capacity"},
      {"mem://x", 4, KVBM_EINVAL, "key_namespace has '/'"},
      {"other://x", 5, KVBM_EINVAL, "serves 'mem://'"},
      {"mem://x", 6, KVBM_EINVAL, "needs scheme, open, run and close"},
      {"mem://x", 7, KVBM_EIO, "open 1 refused"},
      {"redis://h:99999", 0, KVBM_EINVAL, "port '99999'"},
  };
  kvbm_volume_backend norun = mem_backend;
  norun.run = NULL;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    kvbm_volume_config c = kvbm_volume_config_default(cases[i].url);
    c.backend = cases[i].field ? &mem_backend : NULL;
    c.backend_user = m;
    m->fail_open_at = 0;
    switch (cases[i].field) {
    case 1: c.timeout_ms = -5; break;
    case 2: c.threads = 65; break;
    case 3: c.queue_capacity = (1u << 20) + 1; break;
    case 4: c.key_namespace = "../etc"; break;
    case 6: c.backend = &norun; break;
    case 7: m->fail_open_at = 1; break;
    }
    kvbm_volume *v = (kvbm_volume *)&c; /* must be reset to NULL */
    kvbm_error e;
    int rc = kvbm_volume_register(&c, &v, &e);
    if (rc != cases[i].rc || !strstr(e.msg, cases[i].needle))
      fail_msg("case %zu: rc %d '%s'", i, rc, e.msg);
    assert_null(v);
  }
  /* the second of three opens fails: the first state is closed again */
  kvbm_volume_config c = kvbm_volume_config_default("mem://x");
  c.backend = &mem_backend;
  c.backend_user = m;
  c.threads = 3;
  m->opens = m->closes = 0;
  m->fail_open_at = 2;
  kvbm_volume *v;
  assert_int_equal(kvbm_volume_register(&c, &v, NULL), KVBM_EIO);
  assert_int_equal(m->opens, 2);
  assert_int_equal(m->closes, 1);
  assert_int_equal(kvbm_volume_register(NULL, &v, NULL), KVBM_EINVAL);
  c.url = NULL;
  assert_int_equal(kvbm_volume_register(&c, &v, NULL), KVBM_EINVAL);
  kvbm_volume_unregister(NULL);
  mem_free(m);
}

static void test_bad_batches(void **state) {
  (void)state;
  mem_shared *m = mem_new();
  kvbm_volume *v = mem_volume(m, 1, 4, 1000);
  uint8_t b[8] = {1};
  kvbm_volume_op ok = {.kind = KVBM_VOLUME_PUT, .key = 1, .src = b, .len = 8};
  kvbm_volume_op bad[] = {
      {.kind = (kvbm_volume_op_kind)7},
      {.kind = KVBM_VOLUME_PUT, .src = NULL, .len = 8},
      {.kind = KVBM_VOLUME_PUT, .src = b, .len = 0},
      {.kind = KVBM_VOLUME_GET, .dst = NULL, .cap = 8},
  };
  kvbm_error e;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kvbm_volume_op two[2] = {ok, bad[i]};
    assert_int_equal(kvbm_volume_run(v, two, 2, &e), KVBM_EINVAL);
    assert_non_null(strstr(e.msg, "bad batch"));
  }
  assert_int_equal(kvbm_volume_run(v, &ok, 0, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_volume_run(v, NULL, 1, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_volume_submit(v, &ok, 1, NULL, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_volume_run(v, &ok, 65537, NULL), KVBM_EINVAL);
  /* nothing of a refused batch reached the store */
  assert_int_equal(m->runs, 0);
  /* a get of size 0 with no buffer is fine: it reports the size */
  assert_int_equal(kvbm_volume_put(v, 9, b, 8), KVBM_OK);
  size_t sz;
  assert_int_equal(kvbm_volume_get(v, 9, NULL, 0, &sz), KVBM_ENOSPC);
  assert_int_equal(sz, 8);
  kvbm_volume_unregister(v);
  mem_free(m);
}

/* Round trips through the core, the ETOOLONG guard, a backend's corrupt
 * report (KVBM_ECHECKSUM for a get, absent for exists), statuses outside
 * the contract and the counters. */
static void test_statuses_and_stats(void **state) {
  (void)state;
  mem_shared *m = mem_new();
  kvbm_volume *v = mem_volume(m, 2, 8, 1000);
  assert_string_equal(kvbm_volume_url(v), "mem://anything/at/all");
  assert_string_equal(kvbm_volume_name(v), "mem://anything/at/all");
  uint8_t val[1001], out[1001];
  vt_pattern(val, sizeof val, 5, 1, 0);
  assert_int_equal(kvbm_volume_put(v, 5, val, 1000), KVBM_OK);
  assert_int_equal(kvbm_volume_put(v, 6, val, 1001), KVBM_ETOOLONG);
  assert_true(m->max_len_seen <= 1000); /* the backend never saw the long put */
  size_t sz = 0;
  assert_int_equal(kvbm_volume_get(v, 5, out, sizeof out, &sz), KVBM_OK);
  assert_int_equal(sz, 1000);
  assert_memory_equal(out, val, 1000);
  assert_int_equal(kvbm_volume_get(v, 5, out, 10, &sz), KVBM_ENOSPC);
  assert_int_equal(sz, 1000);
  assert_int_equal(kvbm_volume_get(v, 6, out, sizeof out, &sz), KVBM_ENOTFOUND);
  assert_int_equal(sz, 0);
  assert_int_equal(kvbm_volume_exists(v, 5, &sz), KVBM_OK);
  assert_int_equal(sz, 1000);
  assert_int_equal(kvbm_volume_delete(v, 5), KVBM_OK);
  assert_int_equal(kvbm_volume_delete(v, 5), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_exists(v, 5, &sz), KVBM_ENOTFOUND);

  /* a batch mixing a refused put between runnable ops */
  assert_int_equal(kvbm_volume_put(v, 7, val, 100), KVBM_OK);
  kvbm_volume_op ops[3] = {
      {.kind = KVBM_VOLUME_PUT, .key = 8, .src = val, .len = 10},
      {.kind = KVBM_VOLUME_PUT, .key = 9, .src = val, .len = 5000},
      {.kind = KVBM_VOLUME_GET, .key = 7, .dst = out, .cap = sizeof out},
  };
  assert_int_equal(kvbm_volume_run(v, ops, 3, NULL), KVBM_OK);
  assert_int_equal(ops[0].status, KVBM_OK);
  assert_int_equal(ops[1].status, KVBM_ETOOLONG);
  assert_int_equal(ops[2].status, KVBM_OK);
  assert_int_equal(ops[2].size, 100);

  /* corrupt -> a counted miss; a code outside the contract -> EIO */
  m->force_status = KVBM_ECHECKSUM;
  assert_int_equal(kvbm_volume_get(v, 7, out, sizeof out, &sz), KVBM_ECHECKSUM);
  assert_int_equal(kvbm_volume_exists(v, 7, &sz), KVBM_ENOTFOUND); /* not a get: absent */
  m->force_status = KVBM_EPROTO;
  assert_int_equal(kvbm_volume_get(v, 7, out, sizeof out, &sz), KVBM_EIO);
  m->force_status = 5; /* positive */
  assert_int_equal(kvbm_volume_put(v, 7, val, 3), KVBM_EIO);
  m->force_status = 0;
  m->lie_size = true;
  assert_int_equal(kvbm_volume_get(v, 7, out, 50, &sz), KVBM_EIO);
  m->lie_size = false;

  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.puts, 6);
  assert_int_equal(s.bytes_put, 1110);
  assert_int_equal(s.gets, 7);
  assert_int_equal(s.hits, 2);
  assert_int_equal(s.misses, 5);
  assert_int_equal(s.hits + s.misses, s.gets);
  assert_int_equal(s.bytes_got, 1100);
  assert_int_equal(s.exists, 3);
  assert_int_equal(s.deletes, 2);
  assert_int_equal(s.corrupt, 2);
  assert_int_equal(s.io_errors, 3);
  assert_int_equal(s.timeouts, 0);
  assert_int_equal(s.rejected, 0);
  assert_int_equal(s.queued, 0);
  kvbm_volume_unregister(v);
  assert_int_equal(m->opens, 2);
  assert_int_equal(m->closes, 2);
  mem_free(m);
}

/* A full queue refuses at once (EAGAIN, counted, done never called). */
static void test_queue_bound(void **state) {
  (void)state;
  mem_shared *m = mem_new();
  kvbm_volume *v = mem_volume(m, 1, 2, 60000);
  done_log d = {.calls = 0};
  pthread_mutex_init(&d.mu, NULL);
  kvbm_volume_op ops[4] = {{.kind = KVBM_VOLUME_EXISTS, .key = 1},
                           {.kind = KVBM_VOLUME_EXISTS, .key = 2},
                           {.kind = KVBM_VOLUME_EXISTS, .key = 3},
                           {.kind = KVBM_VOLUME_EXISTS, .key = 4}};
  gate(m, true);
  assert_int_equal(kvbm_volume_submit(v, &ops[0], 1, log_done, &d), KVBM_OK);
  wait_waiting(m, 1); /* the thread holds batch 0 */
  assert_int_equal(kvbm_volume_submit(v, &ops[1], 1, log_done, &d), KVBM_OK);
  assert_int_equal(kvbm_volume_submit(v, &ops[2], 1, log_done, &d), KVBM_OK);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.queued, 2);
  assert_int_equal(kvbm_volume_submit(v, &ops[3], 1, log_done, &d), KVBM_EAGAIN);
  kvbm_error e;
  assert_int_equal(kvbm_volume_run(v, &ops[3], 1, &e), KVBM_EAGAIN);
  assert_non_null(strstr(e.msg, "queue is full"));
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.rejected, 2);
  gate(m, false);
  kvbm_volume_unregister(v); /* waits for the three */
  assert_int_equal(d.calls, 3);
  assert_int_equal(ops[3].status, 0); /* never ran */
  pthread_mutex_destroy(&d.mu);
  mem_free(m);
}

/* A batch whose deadline passes while it waits in the queue ends
 * KVBM_ETIMEDOUT without reaching the store. */
static void test_deadline_from_submission(void **state) {
  (void)state;
  mem_shared *m = mem_new();
  kvbm_volume *v = mem_volume(m, 1, 4, 100);
  done_log d = {.calls = 0};
  pthread_mutex_init(&d.mu, NULL);
  kvbm_volume_op a = {.kind = KVBM_VOLUME_EXISTS, .key = 1};
  kvbm_volume_op b = {.kind = KVBM_VOLUME_EXISTS, .key = 2};
  gate(m, true);
  assert_int_equal(kvbm_volume_submit(v, &a, 1, log_done, &d), KVBM_OK);
  wait_waiting(m, 1);
  double t0 = vt_now();
  assert_int_equal(kvbm_volume_submit(v, &b, 1, log_done, &d), KVBM_OK);
  while (vt_now() - t0 < 0.3) usleep(10000); /* b's deadline (100 ms) passes */
  gate(m, false);
  for (;;) { /* both complete (unregistering now would close b instead) */
    pthread_mutex_lock(&d.mu);
    int calls = d.calls;
    pthread_mutex_unlock(&d.mu);
    if (calls == 2) break;
    usleep(1000);
  }
  kvbm_volume_unregister(v);
  assert_int_equal(d.calls, 2);
  assert_int_equal(a.status, KVBM_ENOTFOUND); /* a was already running */
  assert_int_equal(b.status, KVBM_ETIMEDOUT);
  assert_int_equal(m->runs, 1);
  pthread_mutex_destroy(&d.mu);
  mem_free(m);
}

typedef struct unreg_arg {
  kvbm_volume *v;
} unreg_arg;

static void *unreg_thread(void *p) {
  kvbm_volume_unregister(((unreg_arg *)p)->v);
  return NULL;
}

/* Unregister: the running batch finishes, the queued ones complete with
 * KVBM_ECLOSED (on an I/O thread), new submissions are refused. */
static void test_unregister_drains(void **state) {
  (void)state;
  mem_shared *m = mem_new();
  kvbm_volume *v = mem_volume(m, 1, 8, 60000);
  done_log d = {.calls = 0};
  pthread_mutex_init(&d.mu, NULL);
  uint8_t val[4] = {1, 2, 3, 4};
  kvbm_volume_op a = {.kind = KVBM_VOLUME_PUT, .key = 1, .src = val, .len = 4};
  kvbm_volume_op b = {.kind = KVBM_VOLUME_PUT, .key = 2, .src = val, .len = 4};
  kvbm_volume_op c = {.kind = KVBM_VOLUME_PUT, .key = 3, .src = val, .len = 4};
  gate(m, true);
  assert_int_equal(kvbm_volume_submit(v, &a, 1, log_done, &d), KVBM_OK);
  wait_waiting(m, 1);
  assert_int_equal(kvbm_volume_submit(v, &b, 1, log_done, &d), KVBM_OK);
  assert_int_equal(kvbm_volume_submit(v, &c, 1, log_done, &d), KVBM_OK);
  pthread_t t;
  unreg_arg ua = {v};
  pthread_create(&t, NULL, unreg_thread, &ua);
  /* once unregister has begun, submissions are refused; until then they
   * queue (and will be drained with ECLOSED too) or find the queue full */
  static kvbm_volume_op extra[64];
  int rc, accepted = 0;
  for (;;) {
    extra[accepted] = (kvbm_volume_op){.kind = KVBM_VOLUME_EXISTS, .key = 9};
    rc = kvbm_volume_submit(v, &extra[accepted], 1, log_done, &d);
    if (rc == KVBM_OK) accepted++;
    else if (rc != KVBM_EAGAIN) break;
    assert_true(accepted < 64);
    usleep(1000);
  }
  assert_int_equal(rc, KVBM_ECLOSED);
  gate(m, false);
  pthread_join(t, NULL);
  assert_int_equal(a.status, KVBM_OK);
  assert_int_equal(b.status, KVBM_ECLOSED);
  assert_int_equal(c.status, KVBM_ECLOSED);
  for (int i = 0; i < accepted; i++) assert_int_equal(extra[i].status, KVBM_ECLOSED);
  assert_int_equal(d.calls, 3 + accepted);
  assert_int_equal(m->runs, 1);
  assert_int_equal(m->closes, 1);
  pthread_mutex_destroy(&d.mu);
  mem_free(m);
}

/* One state per I/O thread, and many submitters at once. */
typedef struct hammer_arg {
  kvbm_volume *v;
  int id;
  int bad;
} hammer_arg;

static void *hammer(void *p) {
  hammer_arg *h = p;
  uint8_t val[64], out[64];
  for (int i = 0; i < 200; i++) {
    uint64_t key = (uint64_t)h->id * 1000 + (uint64_t)(i % 8);
    vt_pattern(val, sizeof val, key, (uint64_t)i, 0);
    kvbm_volume_op ops[2] = {
        {.kind = KVBM_VOLUME_PUT, .key = key, .src = val, .len = sizeof val},
        {.kind = KVBM_VOLUME_GET, .key = key, .dst = out, .cap = sizeof out},
    };
    int rc;
    while ((rc = kvbm_volume_run(h->v, ops, 2, NULL)) == KVBM_EAGAIN) usleep(100);
    if (rc || ops[0].status || ops[1].status || !vt_pattern(out, 64, key, (uint64_t)i, 1))
      h->bad++;
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  mem_shared *m = mem_new();
  kvbm_volume *v = mem_volume(m, 4, 4, 60000);
  assert_int_equal(m->opens, 4);
  pthread_t t[6];
  hammer_arg h[6];
  for (int i = 0; i < 6; i++) {
    h[i] = (hammer_arg){v, i, 0};
    pthread_create(&t[i], NULL, hammer, &h[i]);
  }
  for (int i = 0; i < 6; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(h[i].bad, 0);
  }
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.puts, 1200);
  assert_int_equal(s.hits, 1200);
  kvbm_volume_unregister(v);
  assert_int_equal(m->closes, 4);
  /* a backend limited to one thread gets one state */
  kvbm_volume_backend one = mem_backend;
  one.max_threads = 1;
  kvbm_volume_config c = kvbm_volume_config_default("mem://x");
  c.backend = &one;
  c.backend_user = m;
  c.threads = 8;
  m->opens = 0;
  assert_int_equal(kvbm_volume_register(&c, &v, NULL), KVBM_OK);
  assert_int_equal(m->opens, 1);
  kvbm_volume_unregister(v);
  mem_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_url_hostile),
      cmocka_unit_test(test_url_good),
      cmocka_unit_test(test_namespace),
      cmocka_unit_test(test_register_refusals),
      cmocka_unit_test(test_bad_batches),
      cmocka_unit_test(test_statuses_and_stats),
      cmocka_unit_test(test_queue_bound),
      cmocka_unit_test(test_deadline_from_submission),
      cmocka_unit_test(test_unregister_drains),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
