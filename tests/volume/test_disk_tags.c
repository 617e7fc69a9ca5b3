/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_disk_tags.c: the slot file's tags and label (volume/disk.h; the
 * manager keeps a block's KV cache group in the tag and its group list in
 * the label, docs/areas/tiers.md "The slot file").
 *
 *   - a put's tag comes back from kvbm_volume_keys_tagged after a warm
 *     restart; an untagged slot is written as record v1, byte for byte
 *     the old format, a tagged one as v2; a tag above 255 refuses the
 *     batch;
 *   - headers that check (a forger's XXH3 sums are right) but break the
 *     record's rules (v2 with tag 0, v2 or v1 with a flag bit they do not
 *     have) are skipped and counted at restart, never listed;
 *   - the label: a file under label A is refused to a writer of label B or
 *     of none (KVBM_EFORMAT naming both) and left whole; a file of no
 *     label (as before labels) is taken by a labelled writer; a damaged
 *     label area starts the file anew; a label too long is refused.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "volume/disk.h"
#include "volume_testutil.h"

#define BLOCK 4096u /* data_bytes: slot of 8192, header at 4096 */
#define SLOT 8192u

static int open_l(const char *dir, const char *label, kvbm_volume **v, kvbm_error *e) {
  char url[700];
  snprintf(url, sizeof url, "disk://%s", dir);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.key_namespace = "tags";
  c.slots = 8;
  c.block_bytes = BLOCK;
  c.persist = true;
  c.disk_label = label;
  return kvbm_volume_register(&c, v, e);
}

static kvbm_volume *vol(const char *dir, const char *label) {
  kvbm_volume *v = NULL;
  kvbm_error e = {0};
  if (open_l(dir, label, &v, &e)) fail_msg("register: %s", e.msg);
  return v;
}

static int put_tag(kvbm_volume *v, uint64_t key, uint32_t tag) {
  static uint8_t val[BLOCK];
  vt_pattern(val, sizeof val, key, 1, 0);
  kvbm_volume_op op = {.kind = KVBM_VOLUME_PUT, .key = key, .src = val, .len = sizeof val, .tag = tag};
  int rc = kvbm_volume_run(v, &op, 1, NULL);
  return rc ? rc : op.status;
}

typedef struct tagged {
  uint64_t key[16];
  uint32_t tag[16];
  int n;
} tagged;

static void collect(void *user, uint64_t key, size_t size, uint32_t tag) {
  (void)size;
  tagged *t = user;
  if (t->n < 16) {
    t->key[t->n] = key;
    t->tag[t->n] = tag;
  }
  t->n++;
}

static void list(kvbm_volume *v, tagged *t, uint64_t *skipped) {
  memset(t, 0, sizeof *t);
  assert_int_equal(kvbm_volume_keys_tagged(v, collect, t, skipped, NULL), KVBM_OK);
}

static char *file_of(const char *dir) {
  char *p = malloc(700);
  snprintf(p, 700, "%s/%s", dir, KVBM_DISK_FILE_NAME);
  return p;
}

/* Reads (write false) or writes n bytes at off of dir's slot file. */
static void raw(const char *dir, uint64_t off, void *buf, size_t n, bool write) {
  char *p = file_of(dir);
  int fd = open(p, O_RDWR);
  assert_true(fd >= 0);
  ssize_t r = write ? pwrite(fd, buf, n, (off_t)off) : pread(fd, buf, n, (off_t)off);
  assert_int_equal(r, (ssize_t)n);
  close(fd);
  free(p);
}

static uint64_t header_off(uint64_t slot) { return 4096 + slot * SLOT + BLOCK; }

static uint64_t le64(const uint8_t *p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; i--) x = x << 8 | p[i];
  return x;
}

static void put_le(uint8_t *p, uint64_t x, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(x >> (8 * i));
}

static void test_tags_round_trip(void **st) {
  (void)st;
  char *dir = vt_tmpdir("disktag");
  kvbm_volume *v = vol(dir, NULL);
  assert_int_equal(put_tag(v, 11, 0), KVBM_OK);
  assert_int_equal(put_tag(v, 12, 7), KVBM_OK);
  assert_int_equal(put_tag(v, 13, 255), KVBM_OK);
  assert_int_equal(put_tag(v, 14, 256), KVBM_EINVAL); /* the batch refused */
  assert_int_equal(kvbm_volume_exists(v, 14, NULL), KVBM_ENOTFOUND);
  kvbm_volume_unregister(v);

  /* On disk: untagged v1 (flags 1: the volume's length rides as parent),
   * tagged v2 with the tag in flags bits 8..15. */
  uint8_t h[64];
  raw(dir, header_off(0), h, 64, false);
  assert_memory_equal(h, "KVBMSLT1", 8);
  assert_int_equal(le64(h + 24) & 0xFFFFFFFFu, 1);
  raw(dir, header_off(1), h, 64, false);
  assert_memory_equal(h, "KVBMSLT2", 8);
  assert_int_equal(le64(h + 24) & 0xFFFFFFFFu, 1 | 7 << 8);

  v = vol(dir, NULL);
  tagged t;
  uint64_t skipped = 9;
  list(v, &t, &skipped);
  assert_int_equal(t.n, 3);
  assert_int_equal(skipped, 0);
  const uint64_t want_key[3] = {11, 12, 13};
  const uint32_t want_tag[3] = {0, 7, 255};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(t.key[i], want_key[i]);
    assert_int_equal(t.tag[i], want_tag[i]);
  }
  uint8_t out[BLOCK];
  assert_int_equal(kvbm_volume_get(v, 12, out, sizeof out, NULL), KVBM_OK);
  assert_true(vt_pattern(out, sizeof out, 12, 1, 1));
  kvbm_volume_unregister(v);
  vt_rmrf(dir);
  free(dir);
}

/* Rewrites slot s's header with magic and flags, its XXH3 header sum
 * made right (as anyone who can write the file can). */
static void forge(const char *dir, uint64_t s, const char *magic, uint32_t flags) {
  uint8_t h[64];
  raw(dir, header_off(s), h, 64, false);
  memcpy(h, magic, 8);
  put_le(h + 24, flags, 4);
  put_le(h + 56, XXH3_64bits(h, 56), 8);
  raw(dir, header_off(s), h, 64, true);
}

static void test_hostile_records(void **st) {
  (void)st;
  char *dir = vt_tmpdir("disktagbad");
  kvbm_volume *v = vol(dir, NULL);
  for (uint64_t k = 0; k < 5; k++) assert_int_equal(put_tag(v, 100 + k, 3), KVBM_OK);
  kvbm_volume_unregister(v);
  forge(dir, 0, "KVBMSLT2", 1);               /* v2 of tag 0: not one encoding */
  forge(dir, 1, "KVBMSLT2", 1 | 3 << 8 | 2);  /* a flag bit v2 does not have */
  forge(dir, 2, "KVBMSLT1", 1 | 3 << 8);      /* v1 has no tag */
  forge(dir, 3, "KVBMSLT3", 1 | 3 << 8);      /* no such record */
  v = vol(dir, NULL);
  tagged t;
  uint64_t skipped = 0;
  list(v, &t, &skipped);
  assert_int_equal(t.n, 1);
  assert_int_equal(t.key[0], 104);
  assert_int_equal(t.tag[0], 3);
  assert_int_equal(skipped, 4);
  kvbm_volume_unregister(v);
  vt_rmrf(dir);
  free(dir);
}

static void test_labels(void **st) {
  (void)st;
  char *dir = vt_tmpdir("disklabel");
  /* No label: the superblock's label area stays zero (as before labels). */
  kvbm_volume *v = vol(dir, NULL);
  assert_int_equal(put_tag(v, 1, 0), KVBM_OK);
  kvbm_volume_unregister(v);
  uint8_t sb[4096], zero[4096] = {0};
  raw(dir, 0, sb, sizeof sb, false);
  assert_memory_equal(sb + 64, zero, sizeof sb - 64);

  /* A labelled writer takes it, keeps its blocks and writes its label. */
  v = vol(dir, "groups A");
  assert_int_equal(put_tag(v, 2, 1), KVBM_OK);
  kvbm_volume_unregister(v);
  raw(dir, 0, sb, sizeof sb, false);
  assert_int_equal(sb[64], 8);
  assert_memory_equal(sb + 68, "groups A", 8);

  /* Another label, or none: refused, naming both; the file left whole. */
  const char *others[2] = {"groups B", NULL};
  for (int i = 0; i < 2; i++) {
    kvbm_error e = {0};
    kvbm_volume *w = NULL;
    assert_int_equal(open_l(dir, others[i], &w, &e), KVBM_EFORMAT);
    assert_null(w);
    assert_non_null(strstr(e.msg, "\"groups A\""));
    assert_non_null(strstr(e.msg, others[i] ? "\"groups B\"" : "no label"));
  }
  v = vol(dir, "groups A");
  tagged t;
  list(v, &t, NULL);
  assert_int_equal(t.n, 2);
  kvbm_volume_unregister(v);

  /* A damaged label area (its sum no longer right): the file starts
   * anew, as a damaged geometry does, under the writer's label. */
  sb[70] ^= 0x20;
  raw(dir, 0, sb, sizeof sb, true);
  v = vol(dir, "groups B");
  list(v, &t, NULL);
  assert_int_equal(t.n, 0);
  kvbm_volume_unregister(v);
  /* A length past the label's room is damage too, never read past. */
  raw(dir, 0, sb, sizeof sb, false);
  put_le(sb + 64, 100000, 4);
  put_le(sb + 324, XXH3_64bits(sb + 64, 260), 8);
  raw(dir, 0, sb, sizeof sb, true);
  v = vol(dir, "groups C");
  kvbm_volume_unregister(v);

  /* A label longer than the superblock's room is refused by name. */
  char longer[300];
  memset(longer, 'x', sizeof longer - 1);
  longer[sizeof longer - 1] = 0;
  kvbm_error e = {0};
  kvbm_volume *w = NULL;
  assert_int_equal(open_l(dir, longer, &w, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "disk_label"));
  vt_rmrf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tags_round_trip),
      cmocka_unit_test(test_hostile_records),
      cmocka_unit_test(test_labels),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
