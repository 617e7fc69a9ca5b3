/* SPDX-License-Identifier: Apache-2.0 */
/* test_disk.c: the disk:///DIR backend over the slot file. Round trips
 * with and without bounce buffers, a full store (KVBM_ENOSPC, delete makes
 * room, a stored key is still rewritten), values above the block, batches
 * whose ops on one key keep their order while others are in flight, a
 * flipped byte on disk (a counted miss, never bytes), warm restart across
 * processes (and another namespace starting empty), one process per file,
 * and settings refused by name. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "volume/disk.h"
#include "volume_testutil.h"

static int open_disk(const char *dir, const char *ns, uint64_t slots, uint64_t block,
                     bool persist, kvbm_volume **v, kvbm_error *e) {
  char url[700];
  snprintf(url, sizeof url, "disk://%s", dir);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.key_namespace = ns;
  c.slots = slots;
  c.block_bytes = block;
  c.persist = persist;
  return kvbm_volume_register(&c, v, e);
}

static kvbm_volume *disk_volume(const char *dir, const char *ns, uint64_t slots, uint64_t block,
                                bool persist) {
  kvbm_volume *v = NULL;
  kvbm_error e;
  if (open_disk(dir, ns, slots, block, persist, &v, &e)) fail_msg("register: %s", e.msg);
  return v;
}

static void *aligned(size_t n) {
  void *p = NULL;
  assert_int_equal(posix_memalign(&p, 4096, n), 0);
  return p;
}

static void test_round_trip(void **state) {
  (void)state;
  char *dir = vt_tmpdir("disk");
  const size_t block = 64 * 1024;
  kvbm_volume *v = disk_volume(dir, "ns", 8, block, false);
  uint8_t *val = aligned(block + 1), *out = aligned(block + 1);
  /* zero-copy (aligned, whole block), bounce (short, or unaligned) */
  struct {
    size_t off, len;
  } cases[] = {{0, block}, {0, 100}, {1, block}, {0, 1}};
  for (int i = 0; i < 4; i++) {
    uint64_t key = 0xd15c000000000000ull + (uint64_t)i;
    vt_pattern(val + cases[i].off, cases[i].len, key, 1, 0);
    assert_int_equal(kvbm_volume_put(v, key, val + cases[i].off, cases[i].len), KVBM_OK);
    size_t sz = 0;
    memset(out, 0, block + 1);
    assert_int_equal(kvbm_volume_get(v, key, out + cases[i].off, block, &sz), KVBM_OK);
    assert_int_equal(sz, cases[i].len);
    assert_true(vt_pattern(out + cases[i].off, cases[i].len, key, 1, 1));
    assert_int_equal(kvbm_volume_exists(v, key, &sz), KVBM_OK);
    assert_int_equal(sz, cases[i].len);
  }
  size_t sz;
  assert_int_equal(kvbm_volume_get(v, 0xd15c000000000001ull, out, 99, &sz), KVBM_ENOSPC);
  assert_int_equal(sz, 100);
  assert_int_equal(kvbm_volume_put(v, 1, val, block + 1), KVBM_ETOOLONG);
  assert_int_equal(kvbm_volume_get(v, 1, out, block, &sz), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_delete(v, 0xd15c000000000001ull), KVBM_OK);
  assert_int_equal(kvbm_volume_delete(v, 0xd15c000000000001ull), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_exists(v, 0xd15c000000000001ull, &sz), KVBM_ENOTFOUND);
  kvbm_volume_unregister(v);
  free(val);
  free(out);
  vt_rmrf(dir);
  free(dir);
}

/* Full: a new key is refused, a stored one is rewritten in place, a delete
 * makes room. */
static void test_full(void **state) {
  (void)state;
  char *dir = vt_tmpdir("diskfull");
  kvbm_volume *v = disk_volume(dir, "", 4, 4096, false);
  uint8_t val[4096], out[4096];
  for (uint64_t k = 0; k < 4; k++) {
    vt_pattern(val, sizeof val, k, 1, 0);
    assert_int_equal(kvbm_volume_put(v, k, val, sizeof val), KVBM_OK);
  }
  assert_int_equal(kvbm_volume_put(v, 4, val, sizeof val), KVBM_ENOSPC);
  vt_pattern(val, sizeof val, 2, 2, 0);
  assert_int_equal(kvbm_volume_put(v, 2, val, sizeof val), KVBM_OK); /* in place */
  assert_int_equal(kvbm_volume_get(v, 2, out, sizeof out, NULL), KVBM_OK);
  assert_true(vt_pattern(out, sizeof out, 2, 2, 1));
  assert_int_equal(kvbm_volume_delete(v, 0), KVBM_OK);
  vt_pattern(val, sizeof val, 4, 1, 0);
  assert_int_equal(kvbm_volume_put(v, 4, val, sizeof val), KVBM_OK);
  for (uint64_t k = 1; k < 5; k++) {
    assert_int_equal(kvbm_volume_get(v, k, out, sizeof out, NULL), KVBM_OK);
    assert_true(vt_pattern(out, sizeof out, k, k == 2 ? 2 : 1, 1));
  }
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.full, 1);
  kvbm_volume_unregister(v);
  vt_rmrf(dir);
  free(dir);
}

/* One batch: many transfers in flight, and ops on one key in order. */
static void test_batch_order(void **state) {
  (void)state;
  char *dir = vt_tmpdir("diskbatch");
  const size_t block = 16384;
  kvbm_volume *v = disk_volume(dir, "b", 64, block, false);
  enum { N = 40 };
  uint8_t *vals = aligned(N * block), *outs = aligned(N * block), *v2 = aligned(block);
  uint8_t *o2 = aligned(block);
  kvbm_volume_op ops[2 * N + 3];
  for (int i = 0; i < N; i++) {
    vt_pattern(vals + i * block, block, (uint64_t)i, 1, 0);
    ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = (uint64_t)i,
                              .src = vals + i * block, .len = block};
    ops[N + i] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = (uint64_t)i,
                                  .dst = outs + i * block, .cap = block};
  }
  vt_pattern(v2, block, 5, 2, 0);
  ops[2 * N] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = 5, .src = v2, .len = block};
  ops[2 * N + 1] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = 5, .dst = o2, .cap = block};
  ops[2 * N + 2] = (kvbm_volume_op){.kind = KVBM_VOLUME_DELETE, .key = 6};
  assert_int_equal(kvbm_volume_run(v, ops, 2 * N + 3, NULL), KVBM_OK);
  for (int i = 0; i < 2 * N + 3; i++)
    if (ops[i].status) fail_msg("op %d: %s", i, kvbm_status_name(ops[i].status));
  for (int i = 0; i < N; i++) assert_true(vt_pattern(outs + i * block, block, (uint64_t)i, 1, 1));
  assert_true(vt_pattern(o2, block, 5, 2, 1));
  assert_int_equal(kvbm_volume_exists(v, 6, NULL), KVBM_ENOTFOUND);
  kvbm_volume_unregister(v);
  free(vals);
  free(outs);
  free(v2);
  free(o2);
  vt_rmrf(dir);
  free(dir);
}

typedef struct order_log {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int seen[64];
  int n;
} order_log;

typedef struct tagged {
  order_log *log;
  int id;
} tagged;

static void log_order(void *user, kvbm_volume_op *ops, size_t n) {
  tagged *t = user;
  (void)ops;
  (void)n;
  pthread_mutex_lock(&t->log->mu);
  t->log->seen[t->log->n++] = t->id;
  pthread_cond_signal(&t->log->cv);
  pthread_mutex_unlock(&t->log->mu);
}

/* Batches submitted back to back stream through the one I/O thread (the
 * next one's transfers start while the previous one's are in flight):
 * each is reported once, in submission order, and ops on one key take
 * effect in order across batches. */
static void test_streamed_batches(void **state) {
  (void)state;
  char *dir = vt_tmpdir("diskstream");
  const size_t block = 16384;
  kvbm_volume *v = disk_volume(dir, "s", 64, block, false);
  enum { B = 24, PER = 6 };
  uint8_t *vals = aligned((size_t)B * PER * block), *outs = aligned((size_t)B * PER * block);
  static kvbm_volume_op ops[B][PER];
  tagged tags[B];
  order_log log = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0};
  for (int b = 0; b < B; b++) {
    for (int k = 0; k < PER; k++) {
      uint8_t *p = vals + ((size_t)b * PER + (size_t)k) * block;
      uint8_t *o = outs + ((size_t)b * PER + (size_t)k) * block;
      /* even batches put keys 0..5 (version b), odd ones get them back */
      if (b % 2 == 0) {
        vt_pattern(p, block, (uint64_t)k, (uint64_t)b, 0);
        ops[b][k] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = (uint64_t)k, .src = p,
                                     .len = block};
      } else {
        ops[b][k] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = (uint64_t)k, .dst = o,
                                     .cap = block};
      }
    }
    tags[b] = (tagged){&log, b};
    assert_int_equal(kvbm_volume_submit(v, ops[b], PER, log_order, &tags[b]), KVBM_OK);
  }
  pthread_mutex_lock(&log.mu);
  while (log.n < B) pthread_cond_wait(&log.cv, &log.mu);
  pthread_mutex_unlock(&log.mu);
  for (int b = 0; b < B; b++) assert_int_equal(log.seen[b], b);
  for (int b = 1; b < B; b += 2)
    for (int k = 0; k < PER; k++) {
      assert_int_equal(ops[b][k].status, KVBM_OK);
      uint8_t *o = outs + ((size_t)b * PER + (size_t)k) * block;
      assert_true(vt_pattern(o, block, (uint64_t)k, (uint64_t)(b - 1), 1)); /* the put just before */
    }
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.puts, B / 2 * PER);
  assert_int_equal(s.hits, B / 2 * PER);
  kvbm_volume_unregister(v);
  free(vals);
  free(outs);
  vt_rmrf(dir);
  free(dir);
}

/* Flips one byte of the slot holding key in DIR's persistent file. */
static int flip(const char *dir, uint64_t key, uint64_t block, size_t at) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, KVBM_DISK_FILE_NAME);
  int fd = open(path, O_RDWR);
  if (fd < 0) return 0;
  uint64_t slot_size = (block + KVBM_DISK_HEADER + 4095) & ~4095ull;
  struct stat st;
  fstat(fd, &st);
  int found = 0;
  for (off_t off = 4096; off + (off_t)slot_size <= st.st_size && !found; off += (off_t)slot_size) {
    uint8_t h[16];
    if (pread(fd, h, 16, off + (off_t)block) != 16) break;
    uint64_t k = 0;
    for (int i = 7; i >= 0; i--) k = k << 8 | h[8 + i];
    if (memcmp(h, "KVBMSLT1", 8) || k != key) continue;
    uint8_t c;
    if (pread(fd, &c, 1, off + (off_t)at) != 1) break;
    c ^= 0x20;
    found = pwrite(fd, &c, 1, off + (off_t)at) == 1;
  }
  fsync(fd);
  close(fd);
  return found;
}

static void test_corruption(void **state) {
  (void)state;
  char *dir = vt_tmpdir("diskflip");
  const size_t block = 8192;
  kvbm_volume *v = disk_volume(dir, "c", 8, block, true);
  uint8_t *val = aligned(block), *out = aligned(block);
  for (uint64_t k = 1; k <= 3; k++) {
    vt_pattern(val, block, k, 1, 0);
    assert_int_equal(kvbm_volume_put(v, k, val, block), KVBM_OK);
  }
  assert_true(flip(dir, 1, block, 100));         /* data */
  assert_true(flip(dir, 2, block, block + 20));  /* header: the length field */
  for (uint64_t k = 1; k <= 3; k++) {
    memset(out, 0, block);
    int rc = kvbm_volume_get(v, k, out, block, NULL);
    assert_int_equal(rc, k == 3 ? KVBM_OK : KVBM_ECHECKSUM);
  }
  assert_int_equal(kvbm_volume_exists(v, 1, NULL), KVBM_ENOTFOUND); /* dropped */
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.corrupt, 2);
  assert_int_equal(s.misses, 2);
  kvbm_volume_unregister(v);
  free(val);
  free(out);
  vt_rmrf(dir);
  free(dir);
}

/* A child stores and exits; a new volume on the same directory serves its
 * blocks (warm restart); another namespace there starts empty; two live
 * volumes cannot share one file. */
static void test_warm_restart(void **state) {
  (void)state;
  char *dir = vt_tmpdir("diskwarm");
  const size_t block = 4096 * 3;
  pid_t pid = fork();
  if (pid == 0) {
    kvbm_volume *v;
    if (open_disk(dir, "w", 16, block, true, &v, NULL)) _exit(2);
    uint8_t *val = malloc(block);
    for (uint64_t k = 0; k < 10; k++) {
      vt_pattern(val, block - k, k, 1, 0);
      if (kvbm_volume_put(v, k, val, block - k)) _exit(3);
    }
    vt_pattern(val, 50, 3, 2, 0); /* a replaced value: the newer one wins */
    if (kvbm_volume_put(v, 3, val, 50)) _exit(4);
    kvbm_volume_unregister(v);
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  kvbm_volume *v = disk_volume(dir, "w", 16, block, true);
  uint8_t *out = malloc(block);
  for (uint64_t k = 0; k < 10; k++) {
    size_t sz;
    assert_int_equal(kvbm_volume_get(v, k, out, block, &sz), KVBM_OK);
    assert_int_equal(sz, k == 3 ? 50 : block - k);
    assert_true(vt_pattern(out, sz, k, k == 3 ? 2 : 1, 1));
  }
  /* 10 keys in use: 6 free slots left, not 5 (the old copy of key 3) */
  uint8_t *val = calloc(1, block);
  for (uint64_t k = 100; k < 106; k++) assert_int_equal(kvbm_volume_put(v, k, val, 10), KVBM_OK);
  assert_int_equal(kvbm_volume_put(v, 106, val, 10), KVBM_ENOSPC);
  /* one process at a time */
  kvbm_volume *w;
  kvbm_error e;
  assert_int_equal(open_disk(dir, "w", 16, block, true, &w, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "in use"));
  kvbm_volume_unregister(v);
  /* another namespace: the file starts empty */
  v = disk_volume(dir, "other", 16, block, true);
  assert_int_equal(kvbm_volume_get(v, 1, out, block, NULL), KVBM_ENOTFOUND);
  kvbm_volume_unregister(v);
  free(out);
  free(val);
  vt_rmrf(dir);
  free(dir);
}

typedef struct key_list {
  uint64_t keys[32];
  size_t sizes[32];
  int n;
} key_list;

static void collect(void *user, uint64_t key, size_t size) {
  key_list *l = user;
  if (l->n < 32) {
    l->keys[l->n] = key;
    l->sizes[l->n] = size;
  }
  l->n++;
}

/* kvbm_volume_keys after a warm restart: the keys, oldest write first, and
 * the broken slots skipped; kvbm_volume_mode; the URL's options. */
static void test_keys_and_modes(void **state) {
  (void)state;
  char *dir = vt_tmpdir("diskkeys");
  const size_t block = 4096;
  kvbm_volume *v = disk_volume(dir, "k", 8, block, true);
  assert_non_null(strstr(kvbm_volume_mode(v), "+"));
  uint8_t val[4096];
  uint64_t order[] = {50, 10, 40, 20};
  for (int i = 0; i < 4; i++) {
    vt_pattern(val, 100 + (size_t)i, order[i], 1, 0);
    assert_int_equal(kvbm_volume_put(v, order[i], val, 100 + (size_t)i), KVBM_OK);
  }
  assert_int_equal(kvbm_volume_put(v, 10, val, 7), KVBM_OK); /* 10 is now the newest */
  assert_int_equal(kvbm_volume_delete(v, 40), KVBM_OK);
  key_list l = {.n = 0};
  uint64_t skipped = 99;
  assert_int_equal(kvbm_volume_keys(v, collect, &l, &skipped, NULL), KVBM_OK);
  assert_int_equal(l.n, 3);
  assert_int_equal(l.keys[0], 50);
  assert_int_equal(l.keys[1], 20);
  assert_int_equal(l.keys[2], 10);
  assert_int_equal(l.sizes[2], 7);
  assert_int_equal(skipped, 0);
  kvbm_volume_unregister(v);
  assert_true(flip(dir, 20, block, block + 12)); /* a torn header */
  v = disk_volume(dir, "k", 8, block, true);
  l.n = 0;
  assert_int_equal(kvbm_volume_keys(v, collect, &l, &skipped, NULL), KVBM_OK);
  /* 20 is torn; 40 was deleted but its bytes were never wiped, so it comes
   * back (harmless for content-named blocks); 10's first copy is older */
  assert_int_equal(l.n, 3);
  assert_int_equal(l.keys[0], 50);
  assert_int_equal(l.keys[1], 40);
  assert_int_equal(l.keys[2], 10);
  assert_int_equal(l.sizes[2], 7);
  assert_int_equal(skipped, 1);
  kvbm_volume_unregister(v);
  /* options in the URL */
  char url[700];
  snprintf(url, sizeof url, "disk://%s?direct=0&uring=0&depth=4", dir);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.slots = 4;
  c.block_bytes = 4096;
  assert_int_equal(kvbm_volume_register(&c, &v, NULL), KVBM_OK);
  assert_string_equal(kvbm_volume_mode(v), "pread/pwrite+buffered");
  assert_int_equal(kvbm_volume_put(v, 1, val, 10), KVBM_OK);
  kvbm_volume_unregister(v);
  snprintf(url, sizeof url, "disk://%s?test_refuse=direct,uring", dir);
  c.url = url;
  assert_int_equal(kvbm_volume_register(&c, &v, NULL), KVBM_OK);
  assert_string_equal(kvbm_volume_mode(v), "pread/pwrite+buffered");
  kvbm_volume_unregister(v);
  kvbm_error e;
  const char *bad[] = {"?direct=2", "?depth=0", "?depth=257", "?nosuch=1", "?uring", "?a?b",
                       "?test_refuse=disk"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(url, sizeof url, "disk://%s%s", dir, bad[i]);
    c.url = url;
    assert_int_equal(kvbm_volume_register(&c, &v, &e), KVBM_EINVAL);
    assert_non_null(strstr(e.msg, "disk://"));
  }
  /* other backends cannot list */
  snprintf(url, sizeof url, "file://%s/files", dir);
  c = kvbm_volume_config_default(url);
  assert_int_equal(kvbm_volume_register(&c, &v, NULL), KVBM_OK);
  assert_int_equal(kvbm_volume_keys(v, collect, &l, NULL, &e), KVBM_EUNSUPPORTED);
  assert_string_equal(kvbm_volume_mode(v), "");
  kvbm_volume_unregister(v);
  vt_rmrf(dir);
  free(dir);
}

static int open_keyed(const char *dir, const char *secret, kvbm_volume **v, kvbm_error *e) {
  char url[700];
  snprintf(url, sizeof url, "disk://%s", dir);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.slots = 4;
  c.block_bytes = 4096;
  c.persist = true;
  c.disk_key = secret;
  c.disk_key_len = secret ? strlen(secret) : 0;
  return kvbm_volume_register(&c, v, e);
}

/* Keyed sums: a round trip, and a file written under another secret (or
 * none) starts empty instead of serving slots it cannot verify. */
static void test_keyed(void **state) {
  (void)state;
  char *dir = vt_tmpdir("diskkeyed");
  const char *secret = "a secret of the deployment, 32+ bytes long";
  kvbm_volume *v;
  kvbm_error e;
  assert_int_equal(open_keyed(dir, "short", &v, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "disk_key must be 16..4096 bytes"));
  assert_int_equal(open_keyed(dir, secret, &v, &e), KVBM_OK);
  uint8_t val[4096], out[4096];
  vt_pattern(val, sizeof val, 9, 1, 0);
  assert_int_equal(kvbm_volume_put(v, 9, val, sizeof val), KVBM_OK);
  assert_int_equal(kvbm_volume_get(v, 9, out, sizeof out, NULL), KVBM_OK);
  assert_memory_equal(out, val, sizeof val);
  kvbm_volume_unregister(v);
  assert_int_equal(open_keyed(dir, secret, &v, &e), KVBM_OK); /* same secret: warm */
  assert_int_equal(kvbm_volume_get(v, 9, out, sizeof out, NULL), KVBM_OK);
  kvbm_volume_unregister(v);
  assert_int_equal(open_keyed(dir, "another secret, 16+ bytes", &v, &e), KVBM_OK);
  assert_int_equal(kvbm_volume_get(v, 9, out, sizeof out, NULL), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_put(v, 9, val, sizeof val), KVBM_OK);
  kvbm_volume_unregister(v);
  assert_int_equal(open_keyed(dir, NULL, &v, &e), KVBM_OK); /* no key: cold too */
  assert_int_equal(kvbm_volume_get(v, 9, out, sizeof out, NULL), KVBM_ENOTFOUND);
  kvbm_volume_unregister(v);
  vt_rmrf(dir);
  free(dir);
}

static void test_refusals(void **state) {
  (void)state;
  char *dir = vt_tmpdir("diskbad");
  kvbm_volume *v;
  kvbm_error e;
  assert_int_equal(open_disk(dir, "", 0, 4096, false, &v, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "slots and block_bytes"));
  assert_int_equal(open_disk(dir, "", 4, 0, false, &v, &e), KVBM_EINVAL);
  assert_int_equal(open_disk(dir, "", 4, 128u << 20, false, &v, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "above max_value_bytes"));
  /* a bare disk:// is the slot file's private default directory */
  kvbm_volume_config c = kvbm_volume_config_default("disk://");
  c.slots = 2;
  c.block_bytes = 4096;
  assert_int_equal(kvbm_volume_register(&c, &v, &e), KVBM_OK);
  assert_int_equal(kvbm_volume_put(v, 1, "x", 1), KVBM_OK);
  assert_int_equal(kvbm_volume_exists(v, 1, NULL), KVBM_OK);
  kvbm_volume_unregister(v);
  char missing[600];
  snprintf(missing, sizeof missing, "%s/no/such", dir);
  assert_int_equal(open_disk(missing, "", 4, 4096, false, &v, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "no/such"));
  vt_rmrf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip), cmocka_unit_test(test_full),
      cmocka_unit_test(test_batch_order), cmocka_unit_test(test_streamed_batches),
      cmocka_unit_test(test_corruption),
      cmocka_unit_test(test_warm_restart), cmocka_unit_test(test_keys_and_modes),
      cmocka_unit_test(test_keyed),       cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
