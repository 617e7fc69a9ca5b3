/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_g4_auth.c: forged G4 values (issue 23), against a live redis-server
 * the test starts on loopback.
 *
 * The attacker is someone who can write the shared Redis and knows the
 * format, not the cluster key: they read each value a manager stored,
 * put other bytes in the block (another block's KV), and frame the result
 * again the way the library does (kvbm_frame_encode: a valid plain
 * BLAKE3-128 over the substituted body), under the same Redis key.
 *
 *  - Without a cluster key, a fresh manager onboards the forgeries: they
 *    check, and the bytes in G1 are wrong (test_unkeyed_onboards_forgery
 *    says so; this is the finding, and the reason for the key).
 *  - With one (g4_key), the same forgery, and one that also claims to be
 *    keyed (version 2 over a plain sum), are counted misses
 *    (auth_failures), nothing from G4 reaches G1, and every matched block
 *    holds the right bytes; honest keyed values are hits.
 *  - A reader with a key refuses unkeyed values, a reader without one
 *    keyed values, one with another key the first one's values: counted,
 *    never bytes.
 *  - Sealed values (g4_encrypt): the store holds no byte of the KV in the
 *    clear; a manager with the key and g4_encrypt is served them, one
 *    that only MACs refuses them (and the other way round), and a flipped
 *    ciphertext byte is a counted miss.
 *  - The key's configuration: a file only its owner can read (not a link,
 *    not readable by others), 16..4096 bytes, not with g4_key too; the
 *    environment's KVBM_G4_KEY_FILE and DYN_KVBM_G4_KEY.
 */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "kvbm/frame.h"
#include "kvbm/manager.h"
#include "kvbm/metrics.h"
#include "kvbm/volume.h"
#include "tier_testutil.h"
#include "volume/volume_testutil.h"

#define NTOK 17 /* 4 full blocks of 4 tokens */
#define NBLK 4

static const char KEY_A[] = "cluster secret A, 32 bytes long!";
static const char KEY_B[] = "cluster secret B, 32 bytes long!";

static char url[64];

static bool encrypt; /* mgr()'s managers seal their values (g4_encrypt) */

static kvbm_manager *mgr(const char *key) {
  kvbm_manager_config c = tu_config(NULL, 64, 0, 0);
  c.g4_encrypt = encrypt && key;
  c.g4_url = url;
  c.g4_lookup_timeout_ms = 5000;
  c.g4_timeout_ms = 2000;
  c.g4_backoff_ms = 0; /* every prefill asks the store */
  if (key) {
    c.g4_key = key;
    c.g4_key_len = strlen(key);
  }
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

/* Stores p through a fresh manager holding `key` (NULL: none). */
static void store(const char *key, const uint32_t *p) {
  kvbm_manager *a = mgr(key);
  tu_run(a, p, NTOK, NULL, NULL);
  kvbm_manager_flush(a);
  assert_int_equal(tu_stats(a, KVBM_TIER_G4).offloaded_blocks, NBLK);
  kvbm_manager_destroy(a);
}

typedef struct served {
  size_t matched, good, from_g4;
  kvbm_tier_stats g4;
} served;

/* A fresh manager holding `key` prefills p: what it matched, how many of
 * the matched blocks hold the right bytes, how many came from G4. */
static served serve(const char *key, const uint32_t *p) {
  kvbm_manager *m = mgr(key);
  kvbm_mreq *r;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, p, NTOK, &r, NULL, NULL), KVBM_OK);
  kvbm_mreq_info info;
  assert_int_equal(kvbm_mreq_wait(r, -1, &info), KVBM_OK);
  served s = {.matched = info.matched_tokens / 4, .from_g4 = info.hit_blocks[KVBM_TIER_G4]};
  s.good = tu_verify(m, r, s.matched);
  kvbm_mreq_destroy(r);
  kvbm_manager_flush(m);
  s.g4 = tu_stats(m, KVBM_TIER_G4);
  /* the refusals are on the metrics endpoint too */
  kvbm_metrics *reg;
  assert_int_equal(kvbm_metrics_create(&reg, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(reg, kvbm_manager_metrics_collect, m, NULL, 0, NULL, NULL),
                   KVBM_OK);
  char *text, line[128];
  size_t tl;
  assert_int_equal(kvbm_metrics_render(reg, &text, &tl, NULL), KVBM_OK);
  snprintf(line, sizeof line, "kvbm_verify_failures_total{cause=\"auth\",tier=\"G4\"} %llu\n",
           (unsigned long long)s.g4.auth_failures);
  assert_non_null(strstr(text, line));
  kvbm_metrics_text_free(text);
  kvbm_metrics_destroy(reg);
  kvbm_manager_destroy(m);
  return s;
}

/* The attacker: every value in the store gets another block's bytes
 * (those of the next key listed), framed again with a valid plain
 * BLAKE3-128; claim_keyed also writes version 2 in the header, as if the
 * frame were keyed. Returns the values rewritten. */
static int forge_all(int port, bool claim_keyed) {
  char out[8192];
  assert_int_equal(VT_CLI(port, out, sizeof out, "--raw", "KEYS", "*"), 0);
  char *names[64];
  int n = 0;
  for (char *save = NULL, *k = strtok_r(out, "\n", &save); k && n < 64;
       k = strtok_r(NULL, "\n", &save))
    names[n++] = k;
  assert_true(n >= 2);
  uint8_t *val[64];
  size_t len[64];
  uint64_t key[64];
  kvbm_volume *v = NULL;
  for (int i = 0; i < n; i++) {
    char *slash = strrchr(names[i], '/');
    assert_non_null(slash);
    *slash = 0;
    key[i] = strtoull(slash + 1, NULL, 16);
    if (!v) {
      kvbm_volume_config vc = kvbm_volume_config_default(url);
      vc.key_namespace = names[i];
      assert_int_equal(kvbm_volume_register(&vc, &v, NULL), KVBM_OK);
    }
    val[i] = malloc(65536);
    assert_int_equal(kvbm_volume_get(v, key[i], val[i], 65536, &len[i]), KVBM_OK);
  }
  const size_t data_off = KVBM_FRAME_HEADER_LEN + 64; /* frame header, body header */
  for (int i = 0; i < n; i++) {
    uint8_t *f = malloc(len[i]);
    memcpy(f, val[i], len[i]);
    /* another block's bytes, under this block's identity */
    memcpy(f + data_off, val[(i + 1) % n] + data_off, len[i] - data_off);
    size_t fl;
    assert_int_equal(kvbm_frame_encode(KVBM_PHASE_THINK_ACTIVE, f + KVBM_FRAME_HEADER_LEN,
                                       len[i] - KVBM_FRAME_HEADER_LEN, f, len[i], &fl, NULL),
                     KVBM_OK);
    if (claim_keyed) f[4] = KVBM_FRAME_VERSION_KEYED;
    assert_int_equal(kvbm_volume_put(v, key[i], f, fl), KVBM_OK);
    free(f);
  }
  for (int i = 0; i < n; i++) free(val[i]);
  kvbm_volume_unregister(v);
  return n;
}

static vt_redis redis;

static int setup(void **st) {
  (void)st;
  memset(&redis, 0, sizeof redis);
  if (vt_redis_start(&redis)) return -1;
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", redis.port);
  return 0;
}

static int teardown(void **st) {
  (void)st;
  vt_redis_destroy(&redis);
  return 0;
}

static void flush_store(void) {
  char out[64];
  assert_int_equal(VT_CLI(redis.port, out, sizeof out, "FLUSHALL"), 0);
}

/* The finding: an unkeyed G4 serves forged bytes. */
static void test_unkeyed_onboards_forgery(void **st) {
  (void)st;
  flush_store();
  uint32_t *p = tu_prompt(1000, NTOK);
  store(NULL, p);
  assert_int_equal(forge_all(redis.port, false), NBLK);
  served s = serve(NULL, p);
  assert_int_equal(s.from_g4, NBLK);
  assert_int_equal(s.g4.onboarded_blocks, NBLK);
  assert_int_equal(s.g4.checksum_failures, 0);
  assert_int_equal(s.good, 0); /* every onboarded block holds another's KV */
  free(p);
}

/* With the key: honest values are hits, forgeries counted misses. */
static void test_keyed_refuses_forgery(void **st) {
  (void)st;
  for (int claim = 0; claim < 2; claim++) {
    flush_store();
    uint32_t *p = tu_prompt(2000 + 100 * (uint32_t)claim, NTOK);
    store(KEY_A, p);
    served h = serve(KEY_A, p); /* honest: served, right bytes */
    assert_int_equal(h.from_g4, NBLK);
    assert_int_equal(h.good, NBLK);
    assert_int_equal(h.g4.auth_failures, 0);
    assert_int_equal(forge_all(redis.port, claim != 0), NBLK);
    served s = serve(KEY_A, p);
    assert_int_equal(s.g4.onboarded_blocks, 0);
    assert_true(s.g4.auth_failures >= 1);
    assert_int_equal(s.g4.checksum_failures, 0);
    assert_true(s.g4.onboard_failures >= s.g4.auth_failures);
    assert_int_equal(s.from_g4, 0);
    assert_int_equal(s.good, s.matched);
    free(p);
  }
}

/* Each reader accepts its own kind of value only. */
static void test_kinds(void **st) {
  (void)st;
  static const struct {
    const char *writer, *reader;
  } cases[] = {{NULL, KEY_A}, {KEY_A, NULL}, {KEY_A, KEY_B}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    flush_store();
    uint32_t *p = tu_prompt(3000 + 100 * (uint32_t)i, NTOK);
    store(cases[i].writer, p);
    served s = serve(cases[i].reader, p);
    assert_int_equal(s.from_g4, 0);
    assert_int_equal(s.g4.onboarded_blocks, 0);
    assert_true(s.g4.auth_failures >= 1);
    assert_int_equal(s.good, s.matched);
    free(p);
  }
}

/* Every value in the store, read raw (what anyone with access sees). */
typedef struct rawset {
  int n;
  uint64_t key[64];
  uint8_t *val[64];
  size_t len[64];
  kvbm_volume *v;
} rawset;

static void raw_read(int port, rawset *r) {
  char out[8192];
  memset(r, 0, sizeof *r);
  assert_int_equal(VT_CLI(port, out, sizeof out, "--raw", "KEYS", "*"), 0);
  for (char *save = NULL, *k = strtok_r(out, "\n", &save); k && r->n < 64;
       k = strtok_r(NULL, "\n", &save)) {
    char *slash = strrchr(k, '/');
    assert_non_null(slash);
    *slash = 0;
    if (!r->v) {
      kvbm_volume_config vc = kvbm_volume_config_default(url);
      vc.key_namespace = k;
      assert_int_equal(kvbm_volume_register(&vc, &r->v, NULL), KVBM_OK);
    }
    r->key[r->n] = strtoull(slash + 1, NULL, 16);
    r->val[r->n] = malloc(65536);
    assert_int_equal(kvbm_volume_get(r->v, r->key[r->n], r->val[r->n], 65536, &r->len[r->n]), KVBM_OK);
    r->n++;
  }
}

static void raw_free(rawset *r) {
  for (int i = 0; i < r->n; i++) free(r->val[i]);
  kvbm_volume_unregister(r->v);
}

static void test_sealed(void **st) {
  (void)st;
  uint32_t *p = tu_prompt(5000, NTOK);
  /* the KV in the clear, as an unkeyed manager stores it */
  flush_store();
  store(NULL, p);
  rawset clear;
  raw_read(redis.port, &clear);
  assert_int_equal(clear.n, NBLK);
  flush_store();
  encrypt = true;
  store(KEY_A, p);
  rawset sealed;
  raw_read(redis.port, &sealed);
  assert_int_equal(sealed.n, NBLK);
  for (int i = 0; i < NBLK; i++) {
    assert_int_equal(sealed.len[i], clear.len[i] + 24); /* the nonce */
    assert_int_equal(sealed.val[i][4], KVBM_FRAME_VERSION_SEALED);
    for (int j = 0; j < NBLK; j++) /* no 16 bytes of any block's KV */
      for (size_t off = 32 + 64; off + 16 <= clear.len[j]; off += 16)
        assert_null(memmem(sealed.val[i], sealed.len[i], clear.val[j] + off, 16));
  }
  served h = serve(KEY_A, p);
  assert_int_equal(h.from_g4, NBLK);
  assert_int_equal(h.good, NBLK);
  encrypt = false; /* a manager that only MACs refuses them */
  served mac_only = serve(KEY_A, p);
  assert_int_equal(mac_only.from_g4, 0);
  /* 24 bytes longer than its own values: the answer overflows its buffer
   * (foreign) before any frame is read */
  assert_true(mac_only.g4.auth_failures + mac_only.g4.foreign >= 1);
  assert_int_equal(mac_only.g4.onboarded_blocks, 0);
  assert_int_equal(mac_only.good, mac_only.matched);
  /* a flipped ciphertext byte in every value */
  for (int i = 0; i < NBLK; i++) {
    sealed.val[i][sealed.len[i] - 100] ^= 1;
    assert_int_equal(kvbm_volume_put(sealed.v, sealed.key[i], sealed.val[i], sealed.len[i]), KVBM_OK);
  }
  encrypt = true;
  served s = serve(KEY_A, p);
  assert_int_equal(s.from_g4, 0);
  assert_int_equal(s.g4.onboarded_blocks, 0);
  assert_true(s.g4.auth_failures >= 1);
  assert_int_equal(s.good, s.matched);
  /* the other way round: MACed values to a sealing reader */
  flush_store();
  encrypt = false;
  store(KEY_A, p);
  encrypt = true;
  served other = serve(KEY_A, p);
  assert_int_equal(other.from_g4, 0);
  assert_true(other.g4.auth_failures >= 1);
  encrypt = false;
  raw_free(&clear);
  raw_free(&sealed);
  free(p);
}

static char *key_file(const char *content, mode_t mode) {
  char *d = tu_tmpdir("g4key");
  char *path = malloc(strlen(d) + 8);
  sprintf(path, "%s/key", d);
  free(d);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
  close(fd);
  assert_int_equal(chmod(path, mode), 0);
  return path;
}

static int create_with(const char *key, const char *file, kvbm_error *e) {
  kvbm_manager_config c = tu_config(NULL, 64, 0, 0);
  c.g4_url = url;
  c.g4_key = key;
  c.g4_key_len = key ? strlen(key) : 0;
  c.g4_key_file = file;
  kvbm_manager *m = NULL;
  int rc = kvbm_manager_create(&c, &m, e);
  kvbm_manager_destroy(m);
  return rc;
}

/* The key file is the key: a manager reading it is served what a manager
 * given the same bytes stored; bad files and keys refused, with why. */
static void test_key_config(void **st) {
  (void)st;
  kvbm_error e = {0};
  char *good = key_file("cluster secret A, 32 bytes long!\n", 0600);
  char *open_to_all = key_file("cluster secret A, 32 bytes long!\n", 0644);
  char *short_key = key_file("too short\n", 0600);
  assert_int_equal(create_with("0123456789abcde", NULL, &e), KVBM_EINVAL); /* 15 bytes */
  assert_non_null(strstr(e.msg, "g4_key"));
  kvbm_manager_config enc = tu_config(NULL, 64, 0, 0);
  enc.g4_url = url;
  enc.g4_encrypt = true;
  kvbm_manager *none = NULL;
  assert_int_equal(kvbm_manager_create(&enc, &none, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "g4_encrypt needs"));
  assert_int_equal(create_with(KEY_A, good, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "both"));
  assert_int_equal(create_with(NULL, open_to_all, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "chmod 600"));
  assert_int_equal(create_with(NULL, short_key, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "must be 16..4096"));
  char link[300];
  snprintf(link, sizeof link, "%s.link", good);
  assert_int_equal(symlink(good, link), 0);
  assert_int_equal(create_with(NULL, link, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "symbolic link"));
  /* The environment: the file's path, or the secret itself. */
  kvbm_manager_config c = tu_config(NULL, 64, 0, 0);
  char fenv[320];
  snprintf(fenv, sizeof fenv, "KVBM_G4_KEY_FILE=%s", good);
  const char *env1[] = {fenv, NULL};
  assert_int_equal(kvbm_manager_config_env(&c, env1, &e), KVBM_OK);
  assert_string_equal(c.g4_key_file, good);
  c = tu_config(NULL, 64, 0, 0);
  const char *env2[] = {"DYN_KVBM_G4_KEY=cluster secret A, 32 bytes long!", NULL};
  assert_int_equal(kvbm_manager_config_env(&c, env2, &e), KVBM_OK);
  assert_int_equal(c.g4_key_len, strlen(KEY_A));
  assert_memory_equal(c.g4_key, KEY_A, strlen(KEY_A));
  /* What a manager keyed by the file stores, one given the bytes serves. */
  flush_store();
  uint32_t *p = tu_prompt(4000, NTOK);
  c = tu_config(NULL, 64, 0, 0);
  c.g4_url = url;
  c.g4_key_file = good;
  c.g4_lookup_timeout_ms = 5000;
  kvbm_manager *a = tu_create(&c);
  assert_non_null(a);
  tu_run(a, p, NTOK, NULL, NULL);
  kvbm_manager_flush(a);
  kvbm_manager_destroy(a);
  served s = serve(KEY_A, p);
  assert_int_equal(s.from_g4, NBLK);
  assert_int_equal(s.good, NBLK);
  unlink(link);
  unlink(good);
  unlink(open_to_all);
  unlink(short_key);
  free(good);
  free(open_to_all);
  free(short_key);
  free(p);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unkeyed_onboards_forgery),
      cmocka_unit_test(test_keyed_refuses_forgery),
      cmocka_unit_test(test_kinds),
      cmocka_unit_test(test_sealed),
      cmocka_unit_test(test_key_config),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
