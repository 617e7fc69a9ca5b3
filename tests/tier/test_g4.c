/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_g4.c: the volume tiers (G3 over any URL, G4 shared) through the
 * manager, with stores that need no server: file:// directories and small
 * vendor backends written here against kvbm/volume.h alone. The Redis
 * faults live in test_g4_redis.c.
 *
 * What the G4 tier promises and each test checks:
 *   - a second manager on the same store serves, as G4 hits, the blocks a
 *     first one stored, and every byte is right;
 *   - two models or two layouts on one store never see each other's blocks;
 *   - a value that fails its check, belongs to another namespace or key,
 *     is truncated, garbage or gone is a counted miss that shortens the
 *     match, never bytes;
 *   - two managers storing the same blocks at once leave values a third
 *     reads back whole;
 *   - a store slower than the lookup deadline does not hold a prefill up
 *     for longer than the deadline (and the prefill goes on without G4);
 *   - G3 over file:// is an exclusive store: the index's evictions delete.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>

#include "kvbm/manager.h"
#include "tier_testutil.h"

static char *url_of(const char *dir) {
  char *u = malloc(600);
  snprintf(u, 600, "file://%s", dir);
  return u;
}

/* G1 8 blocks, no G2/G3, G4 over url. */
static kvbm_manager *g4_manager(const char *url, const char *model) {
  kvbm_manager_config c = tu_config(NULL, 8, 0, 0);
  c.g4_url = url;
  c.model_id = model;
  c.g4_lookup_timeout_ms = 5000; /* a loaded machine must not turn hits into misses */
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

static kvbm_tier_stats g4_stats(kvbm_manager *m) { return tu_stats(m, KVBM_TIER_G4); }

/* Prefills p (n tokens), waits, returns the settled match in blocks and
 * the G4 share of it; keeps the request in *keep (or destroys it). */
static size_t prefill_wait_tier(kvbm_manager *m, const uint32_t *p, size_t n, kvbm_tier tier,
                                size_t *from, kvbm_mreq **keep) {
  kvbm_mreq *r;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, p, n, &r, NULL, NULL), KVBM_OK);
  kvbm_mreq_info info;
  assert_int_equal(kvbm_mreq_wait(r, -1, &info), KVBM_OK);
  size_t blocks = info.matched_tokens / 4;
  if (from) *from = info.hit_blocks[tier];
  assert_int_equal(tu_verify(m, r, blocks), blocks); /* every matched byte is right */
  if (keep) *keep = r;
  else kvbm_mreq_destroy(r);
  return blocks;
}

static size_t prefill_wait(kvbm_manager *m, const uint32_t *p, size_t n, size_t *from_g4,
                           kvbm_mreq **keep) {
  return prefill_wait_tier(m, p, n, KVBM_TIER_G4, from_g4, keep);
}

/* Stores prompt p through a fresh manager on url, then destroys it. */
static void store_prompt(const char *url, const uint32_t *p, size_t n) {
  kvbm_manager *a = g4_manager(url, NULL);
  assert_int_equal(tu_run(a, p, n, NULL, NULL), 0);
  kvbm_manager_flush(a);
  assert_int_equal(g4_stats(a).offloaded_blocks, n / 4);
  kvbm_manager_destroy(a);
}

static void test_shared_across_managers(void **st) {
  (void)st;
  char *dir = tu_tmpdir("g4share"), *url = url_of(dir);
  uint32_t *p = tu_prompt(100, 17);
  store_prompt(url, p, 16);
  kvbm_manager *b = g4_manager(url, NULL);
  size_t g4;
  assert_int_equal(prefill_wait(b, p, 17, &g4, NULL), 4);
  assert_int_equal(g4, 4);
  kvbm_tier_stats s = g4_stats(b);
  assert_int_equal(s.lookups, 1);
  assert_int_equal(s.lookup_found, 4);
  assert_int_equal(s.hit_blocks, 4);
  assert_int_equal(s.onboarded_blocks, 4);
  assert_int_equal(s.onboard_failures, 0);
  /* Onboarded blocks are indexed: no second put of what the store has. */
  assert_int_equal(tu_run(b, p, 17, NULL, NULL), 16);
  assert_int_equal(g4_stats(b).offloaded_blocks, 0);
  kvbm_manager_destroy(b);
  free(p);
  free(url);
  tu_rmdir(dir);
}

static void test_namespaces_apart(void **st) {
  (void)st;
  char *dir = tu_tmpdir("g4ns"), *url = url_of(dir);
  uint32_t *p = tu_prompt(300, 17);
  store_prompt(url, p, 16);
  /* Another model. */
  kvbm_manager *o = g4_manager(url, "other-model");
  size_t g4;
  assert_int_equal(prefill_wait(o, p, 17, &g4, NULL), 0);
  assert_int_equal(g4_stats(o).lookup_found, 0);
  kvbm_manager_destroy(o);
  /* Another layout (a different inner dimension). */
  kvbm_manager_config c = tu_config(NULL, 8, 0, 0);
  c.g4_url = url;
  c.layout.inner_dim = 16;
  c.g4_lookup_timeout_ms = 5000;
  assert_int_equal(kvbm_manager_create(&c, &o, NULL), KVBM_OK);
  assert_int_equal(prefill_wait(o, p, 17, &g4, NULL), 0);
  assert_int_equal(g4_stats(o).lookup_found, 0);
  kvbm_manager_destroy(o);
  /* Another hash scheme. */
  c = tu_config(NULL, 8, 0, 0);
  c.g4_url = url;
  c.scheme = KVBM_HASH_DYNAMO;
  c.g4_lookup_timeout_ms = 5000;
  assert_int_equal(kvbm_manager_create(&c, &o, NULL), KVBM_OK);
  assert_int_equal(prefill_wait(o, p, 17, &g4, NULL), 0);
  kvbm_manager_destroy(o);
  free(p);
  free(url);
  tu_rmdir(dir);
}

/* The one namespace folder under dir (the manager's keys live there). */
static void ns_folder(const char *dir, char *out, size_t cap) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  out[0] = 0;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') snprintf(out, cap, "%s/%s", dir, e->d_name);
  closedir(d);
  assert_true(out[0] != 0);
}

static void key_path(const char *ns, uint64_t key, char *out, size_t cap) {
  snprintf(out, cap, "%s/%016llx", ns, (unsigned long long)key);
}

/* The sequence hashes of p's full blocks. */
static void hashes_of(const uint32_t *p, size_t n, uint64_t *h) {
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, p, n, 4, h, n / 4);
}

enum { F_FLIP, F_TRUNCATE, F_OTHER_KEY, F_GARBAGE, F_LONGER, F_NFAULTS };

static void damage(const char *path, const char *other, int fault) {
  FILE *f;
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  switch (fault) {
  case F_FLIP: /* one bit of the block's bytes */
    f = fopen(path, "r+b");
    fseek(f, sb.st_size - 7, SEEK_SET);
    int c = fgetc(f);
    fseek(f, sb.st_size - 7, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    break;
  case F_TRUNCATE:
    assert_int_equal(truncate(path, sb.st_size - 100), 0);
    break;
  case F_OTHER_KEY: { /* a whole valid value of another block */
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", other, path);
    assert_int_equal(system(cmd), 0);
    break;
  }
  case F_GARBAGE: /* what a person with redis-cli might leave */
    f = fopen(path, "wb");
    for (off_t i = 0; i < sb.st_size; i++) fputc((int)(i * 131 % 251), f);
    fclose(f);
    break;
  case F_LONGER:
    f = fopen(path, "ab");
    fputs("trailing", f);
    fclose(f);
    break;
  }
}

/* Each fault on block 1 of a stored prompt: the match ends after block 0,
 * the right counter says why, and nothing wrong reaches G1. */
static void test_bad_values_are_counted_misses(void **st) {
  (void)st;
  for (int fault = 0; fault < F_NFAULTS; fault++) {
    char *dir = tu_tmpdir("g4bad"), *url = url_of(dir);
    uint32_t *p = tu_prompt(1000 + 100 * (uint32_t)fault, 17);
    store_prompt(url, p, 16);
    uint64_t h[4];
    hashes_of(p, 16, h);
    char ns[600], path[700], other[700];
    ns_folder(dir, ns, sizeof ns);
    key_path(ns, h[1], path, sizeof path);
    key_path(ns, h[2], other, sizeof other);
    damage(path, other, fault);
    kvbm_manager *b = g4_manager(url, NULL);
    size_t g4;
    assert_int_equal(prefill_wait(b, p, 17, &g4, NULL), 1);
    kvbm_tier_stats s = g4_stats(b);
    assert_int_equal(s.onboard_failures, 1);
    switch (fault) {
    case F_FLIP:
    case F_GARBAGE: assert_int_equal(s.checksum_failures, 1); break;
    default: assert_int_equal(s.foreign, 1); break;
    }
    /* The engine recomputes block 1 on (the request above registered but
     * never committed 1..3: they are recomputed too); the commit rewrites
     * block 1 in the store. */
    assert_int_equal(tu_run(b, p, 17, NULL, NULL), 4);
    kvbm_manager_destroy(b);
    kvbm_manager *c = g4_manager(url, NULL);
    assert_int_equal(prefill_wait(c, p, 17, &g4, NULL), 4);
    assert_int_equal(g4, 4);
    kvbm_manager_destroy(c);
    free(p);
    free(url);
    tu_rmdir(dir);
  }
}

/* A block the index knows but the store lost: a get finds nothing, a
 * counted "missing", the match shortened; the next commit puts it back. */
static void test_stale_index_is_a_miss(void **st) {
  (void)st;
  char *dir = tu_tmpdir("g4stale"), *url = url_of(dir);
  uint32_t *p = tu_prompt(5000, 17), *f = tu_prompt(90000, 29);
  kvbm_manager *a = g4_manager(url, NULL);
  assert_int_equal(tu_run(a, p, 17, NULL, NULL), 0);
  assert_int_equal(tu_run(a, f, 29, NULL, NULL), 0); /* 8 blocks: pushes p out of G1 */
  uint64_t h[4];
  hashes_of(p, 16, h);
  char ns[600], path[700];
  ns_folder(dir, ns, sizeof ns);
  key_path(ns, h[2], path, sizeof path);
  assert_int_equal(unlink(path), 0);
  uint64_t lookups = g4_stats(a).lookups;
  size_t g4;
  assert_int_equal(prefill_wait(a, p, 17, &g4, NULL), 2);
  kvbm_tier_stats s = g4_stats(a);
  assert_int_equal(s.missing, 1);
  assert_int_equal(s.onboard_failures, 1);
  assert_int_equal(s.lookups, lookups); /* the index answered: no lookup */
  kvbm_manager_destroy(a);
  free(p);
  free(f);
  free(url);
  tu_rmdir(dir);
}

typedef struct writer_arg {
  const char *url;
  int seed;
} writer_arg;

static void *writer(void *arg) {
  writer_arg *w = arg;
  kvbm_manager *m = g4_manager(w->url, NULL);
  for (int round = 0; round < 3; round++)
    for (uint32_t i = 0; i < 12; i++) {
      uint32_t *p = tu_prompt(20000 + 1000 * i, 29);
      tu_run(m, p, 29, NULL, NULL);
      free(p);
    }
  kvbm_manager_flush(m);
  kvbm_manager_destroy(m);
  (void)w->seed;
  return NULL;
}

/* Two managers store the same blocks at the same time; a third finds
 * every one whole. */
static void test_concurrent_writers(void **st) {
  (void)st;
  char *dir = tu_tmpdir("g4conc"), *url = url_of(dir);
  pthread_t th[2];
  writer_arg a[2] = {{url, 1}, {url, 2}};
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, writer, &a[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  kvbm_manager *c = g4_manager(url, NULL);
  for (uint32_t i = 0; i < 12; i++) {
    uint32_t *p = tu_prompt(20000 + 1000 * i, 29);
    size_t g4;
    assert_int_equal(prefill_wait(c, p, 29, &g4, NULL), 7);
    assert_int_equal(g4, 7);
    free(p);
  }
  kvbm_tier_stats s = g4_stats(c);
  assert_int_equal(s.onboard_failures, 0);
  assert_int_equal(s.checksum_failures + s.foreign, 0);
  kvbm_manager_destroy(c);
  free(url);
  tu_rmdir(dir);
}

/* ---- a vendor backend: a store that answers late ---- */

typedef struct slow_store {
  pthread_mutex_t mu;
  int delay_ms;        /* every batch takes this long */
  uint64_t keys[64];
  size_t n;
} slow_store;

static int slow_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  (void)cfg;
  (void)err;
  *state = user;
  return KVBM_OK;
}

static void slow_run(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  (void)deadline_ns;
  slow_store *s = state;
  pthread_mutex_lock(&s->mu);
  int d = s->delay_ms;
  pthread_mutex_unlock(&s->mu);
  struct timespec ts = {d / 1000, (long)(d % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  for (size_t i = 0; i < n; i++) ops[i].status = ops[i].kind == KVBM_VOLUME_PUT ? KVBM_OK : KVBM_ENOTFOUND;
}

static void slow_close(void *state) { (void)state; }

static const kvbm_volume_backend slow_backend = {
    .scheme = "slow", .open = slow_open, .run = slow_run, .close = slow_close};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A store that takes 1.5 s per batch: a prefill with a 50 ms lookup
 * deadline returns long before the store answers, counts a timed-out
 * lookup and matches nothing from G4. (The bound asserted is generous; the
 * point is that the prefill does not wait for the store's 1.5 s.) */
static void test_lookup_deadline(void **st) {
  (void)st;
  slow_store s = {.delay_ms = 1500};
  pthread_mutex_init(&s.mu, NULL);
  kvbm_manager_config c = tu_config(NULL, 8, 0, 0);
  c.g4_url = "slow://store";
  c.g4_backend = &slow_backend;
  c.g4_backend_user = &s;
  c.g4_lookup_timeout_ms = 50;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *p = tu_prompt(700, 17);
  double t0 = now_s();
  kvbm_mreq *r;
  size_t opt = 99;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, p, 17, &r, &opt, NULL), KVBM_OK);
  double dt = now_s() - t0;
  assert_int_equal(opt, 0);
  assert_true(dt < 1.0);
  kvbm_tier_stats g = g4_stats(m);
  assert_int_equal(g.lookups, 1);
  assert_int_equal(g.lookup_timeouts, 1);
  kvbm_mreq_destroy(r);
  kvbm_manager_destroy(m); /* waits for the abandoned lookup: no leak */
  pthread_mutex_destroy(&s.mu);
  free(p);
}

/* ---- G3 over file:// ---- */

static size_t count_files(const char *dir) {
  char ns[600];
  ns_folder(dir, ns, sizeof ns);
  DIR *d = opendir(ns);
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* G3 over a file:// store: blocks round-trip G1 -> G3 -> G1 verified,
 * and the index's evictions delete values (the store stays bounded). */
static void test_g3_over_file(void **st) {
  (void)st;
  char *dir = tu_tmpdir("g3file"), *url = url_of(dir);
  kvbm_manager_config c = tu_config(NULL, 8, 0, 12);
  c.g3_url = url;
  kvbm_manager *m;
  kvbm_error e = {0};
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_OK);
  assert_string_equal(kvbm_manager_tier_mode(m, KVBM_TIER_G3), url);
  uint32_t *y = tu_prompt(40, 29), *w = tu_prompt(60000, 21), *v = tu_prompt(70000, 21);
  assert_int_equal(tu_run(m, y, 29, NULL, NULL), 0); /* 7 blocks to G3 */
  assert_int_equal(tu_run(m, w, 21, NULL, NULL), 0); /* 5 more; y's tail leaves G1 */
  size_t g3;
  assert_int_equal(prefill_wait_tier(m, y, 29, KVBM_TIER_G3, &g3, NULL), 7);
  assert_int_equal(g3, 5);
  assert_int_equal(tu_run(m, v, 21, NULL, NULL), 0); /* 5 more: G3 evicts 5 */
  kvbm_manager_flush(m);
  kvbm_tier_stats s;
  assert_int_equal(kvbm_manager_stats_get(m, KVBM_TIER_G3, &s), KVBM_OK);
  assert_int_equal(s.offloaded_blocks, 17);
  assert_int_equal(s.onboarded_blocks, 5);
  assert_int_equal(s.evictions, 5);
  assert_int_equal(count_files(dir), 12);
  kvbm_manager_destroy(m);
  free(y);
  free(w);
  free(v);
  free(url);
  tu_rmdir(dir);
}

static void test_config(void **st) {
  (void)st;
  kvbm_manager_config c = tu_config(NULL, 8, 0, 0);
  kvbm_manager *m;
  kvbm_error e = {0};
  c.g4_url = "nosuch://x";
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "g4_url"));
  c.g4_url = "redis://host:99999";
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  c.g4_url = "file:///dev/null/not-a-dir";
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_OK); /* serves without G4 */
  assert_true(kvbm_manager_tier_error(m, KVBM_TIER_G4)[0] != 0);
  kvbm_tier_stats s;
  kvbm_manager_stats_get(m, KVBM_TIER_G4, &s);
  assert_false(s.present);
  uint32_t *p = tu_prompt(1, 17);
  assert_int_equal(tu_run(m, p, 17, NULL, NULL), 0);
  kvbm_manager_stats_get(m, KVBM_TIER_G4, &s);
  assert_int_equal(s.skipped_unavailable, 4);
  kvbm_manager_destroy(m);
  free(p);
  c = tu_config(NULL, 8, 0, 0);
  c.model_id = "bad/model";
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "model_id"));
  c.model_id = NULL;
  c.g4_url = "file:///tmp";
  c.g4_blocks = 0;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  c.g4_blocks = 10;
  c.g4_lookup_timeout_ms = -1;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shared_across_managers),
      cmocka_unit_test(test_namespaces_apart),
      cmocka_unit_test(test_bad_values_are_counted_misses),
      cmocka_unit_test(test_stale_index_is_a_miss),
      cmocka_unit_test(test_concurrent_writers),
      cmocka_unit_test(test_lookup_deadline),
      cmocka_unit_test(test_g3_over_file),
      cmocka_unit_test(test_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
