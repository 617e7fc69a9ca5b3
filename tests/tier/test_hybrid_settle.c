/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_hybrid_settle.c: a hybrid hit that settles short leaves every
 * group's table writable (issue 20; kvbm/manager.h, kvbm_hreq_wait;
 * docs/areas/hybrid.md, "A hit that settles short").
 *
 * The plan of a hybrid prefill is made for the hit found, H: a window,
 * chunked or Mamba group holds no block at the places it skips for H. When
 * onboards fail the hit settles at S < H and the engine computes from S on,
 * so each group needs a block at every place from first_needed(g, S) on
 * (vLLM's rule for a request whose computed tokens a load failure cut
 * back: allocate_slots again for what it now lacks). What the tests hold
 * the manager to:
 *   - G3's copies corrupted on disk (every read fails its checksum; the
 *     hit found is 12 blocks, the settled one 0), for full + sw:8, full +
 *     chunk:16, full + mamba and full + mamba-align: once kvbm_hreq_wait
 *     returns, every place each group's rule needs at the settled hit has
 *     a real G1 block and must_compute says the engine writes it; the
 *     engine writes them, commits, and a second request hits the whole
 *     prompt (13 blocks) with the bytes written;
 *   - no room in G1 for those places (another request holds it): the wait
 *     says KVBM_ENOSPC (onboards over, the settled hit in *info), the pool
 *     unchanged, commit and append refuse with KVBM_ENOSPC; once room is
 *     made the next wait takes the places and the request runs to the end;
 *     a request destroyed in that state leaves the pool as before its
 *     prefill (nothing leaked).
 * Each fails on the code before the fix (the places stay null, the wait
 * says KVBM_OK).
 *   - under sparse retention (cfg.hybrid_retention BOUNDARIES, full + sw:8):
 *     the places the short settle adds that the window does not keep are
 *     plain blocks (not registered in G1) and the engine's to write; the
 *     prompt's bytes then serve the whole prompt from the kept blocks.
 */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvbm/group.h"
#include "kvbm/manager.h"
#include "tier/internal.h"
#include "tier_testutil.h"

#define B 4

/* The bytes of group g's block k of tok (as test_hybrid.c): keyed by the
 * block's tokens and its group. */
static uint64_t content_key(const uint32_t *tok, size_t k, uint32_t g) {
  uint64_t x = (uint64_t)g << 56;
  for (size_t i = 0; i < (k + 1) * B; i++) x = tu_mix(x ^ tok[i]);
  return x;
}

/* Writes (check 0) or checks (check 1) G1 block id's first `bytes`. */
static int group_block(kvbm_manager *m, uint32_t id, uint64_t key, uint64_t bytes, int check) {
  const kvbm_layout *L = kvbm_manager_layout(m, KVBM_TIER_G1);
  int ok = 1;
  uint8_t buf[512];
  for (uint32_t l = 0; ok && bytes && l < L->config.num_layers; l++) {
    void *p;
    size_t sz;
    if (kvbm_manager_block_layer(m, KVBM_TIER_G1, id, l, &p, &sz)) return 0;
    size_t n = sz < bytes ? sz : (size_t)bytes;
    if (n > sizeof buf) return 0;
    if (check) {
      ok = kvbm_manager_block_read(m, KVBM_TIER_G1, id, l, buf, n, NULL) == KVBM_OK &&
           tu_layer(buf, n, key, l, 1);
    } else {
      tu_layer(buf, n, key, l, 0);
      ok = kvbm_manager_block_write(m, KVBM_TIER_G1, id, l, buf, n, NULL) == KVBM_OK;
    }
    bytes -= n;
  }
  return ok;
}

/* The engine's prompt step: writes every full block it must compute. */
static void compute(kvbm_manager *m, kvbm_hreq *r, const uint32_t *tok, size_t n) {
  for (uint32_t g = 0; g < kvbm_manager_num_groups(m); g++) {
    const uint32_t *ids;
    size_t nb;
    assert_int_equal(kvbm_hreq_table(r, g, &ids, &nb), KVBM_OK);
    for (size_t k = 0; k < n / B; k++)
      if (kvbm_hreq_must_compute(r, g, k))
        assert_true(group_block(m, ids[k], content_key(tok, k, g), kvbm_manager_group_bytes(m, g), 0));
  }
}

/* One request's life; returns the settled hit in tokens. */
static size_t hrun(kvbm_manager *m, const uint32_t *tok, size_t n) {
  kvbm_hreq *r = NULL;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, tok, n, &r, NULL, NULL), KVBM_OK);
  kvbm_hreq_info i;
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  compute(m, r, tok, n);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_hreq_destroy(r);
  return i.hit_tokens;
}

static kvbm_manager *g3_manager(const char *dir, const kvbm_group_spec *g, size_t ng, uint32_t g1) {
  kvbm_manager_config c = tu_config(dir, g1, 0, 400);
  c.groups = g;
  c.num_groups = ng;
  c.g3_persist = true; /* the slot file stays where the test can corrupt it */
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  return m;
}

/* Flips every 97th byte of the G3 slot file in place: every block's
 * checksum fails on read. */
static void corrupt_g3(const char *dir) {
  char path[600];
  snprintf(path, sizeof path, "%s/kvbm-g3.slots", dir);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  off_t size = lseek(fd, 0, SEEK_END);
  for (off_t off = 0; off < size; off += 97) {
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0xFF;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
  }
  close(fd);
}

/* A (48 tokens) computed, offloaded to G3, pushed out of G1 by three
 * other prompts, then G3's copies corrupted. */
static void setup_corrupt(kvbm_manager *m, const char *dir, const uint32_t *a) {
  assert_int_equal(hrun(m, a, 48), 0);
  for (uint32_t i = 0; i < 3; i++) {
    uint32_t *p = tu_prompt(1000 + i * 100000u, 48);
    assert_int_equal(hrun(m, p, 48), 0);
    free(p);
  }
  corrupt_g3(dir);
}

/* The first place group g needs for a hit of s blocks (vLLM's skipped
 * tokens at the hit, in blocks). */
static size_t needed_from(const kvbm_group_spec *g, size_t s) {
  return (size_t)(kvbm_group_skipped_tokens(g, (uint64_t)s * B) / B);
}

/* Every place each group's rule needs at the settled hit s has a G1
 * block; those at or past s are the engine's to write. */
static void check_writable(kvbm_hreq *r, const kvbm_group_spec *g, size_t ng, size_t s, size_t total) {
  for (uint32_t gi = 0; gi < ng; gi++) {
    const uint32_t *ids;
    size_t nb;
    assert_int_equal(kvbm_hreq_table(r, gi, &ids, &nb), KVBM_OK);
    assert_int_equal(nb, total);
    for (size_t k = needed_from(&g[gi], s); k < total; k++) {
      if (ids[k] == KVBM_HREQ_NULL) fail_msg("group %u (%s): place %zu is null at a settled hit of %zu blocks", gi,
                                             kvbm_group_kind_name(g[gi].kind), k, s);
      if (k >= s && !kvbm_hreq_must_compute(r, gi, k))
        fail_msg("group %u: place %zu past the settled hit is not the engine's to write", gi, k);
    }
  }
}

static size_t null_places(kvbm_hreq *r, uint32_t g, size_t below) {
  const uint32_t *ids;
  size_t nb, n = 0;
  assert_int_equal(kvbm_hreq_table(r, g, &ids, &nb), KVBM_OK);
  for (size_t k = 0; k < below && k < nb; k++) n += ids[k] == KVBM_HREQ_NULL;
  return n;
}

/* full + a group that skips places: corrupted G3, the hit settles at 0. */
static void settle_short(const kvbm_group_spec *g) {
  char *dir = tu_tmpdir("settle");
  kvbm_manager *m = g3_manager(dir, g, 2, 40);
  uint32_t *a = tu_prompt(1, 56);
  setup_corrupt(m, dir, a);
  uint64_t bad = tu_stats(m, KVBM_TIER_G3).checksum_failures;

  kvbm_hreq *r;
  size_t hit;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 56, &r, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 48);                /* found: 12 blocks in G3 */
  assert_true(null_places(r, 1, 12) > 0);   /* planned for 48: group 1 skips places */
  kvbm_hreq_info i;
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  assert_true(i.ready);
  assert_int_equal(i.hit_tokens, 0);        /* every read failed */
  assert_true(tu_stats(m, KVBM_TIER_G3).checksum_failures > bad);
  check_writable(r, g, 2, 0, 14);
  assert_int_equal(null_places(r, 1, 14), 0);

  compute(m, r, a, 56);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_hreq_destroy(r);

  /* The engine's bytes serve the whole prompt now. */
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 56, &r, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 52);                /* (56 - 1) / 4 blocks */
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  assert_int_equal(i.hit_tokens, 52);
  for (uint32_t gi = 0; gi < 2; gi++) {
    const uint32_t *ids;
    size_t nb, held = 0;
    assert_int_equal(kvbm_hreq_table(r, gi, &ids, &nb), KVBM_OK);
    for (size_t k = needed_from(&g[gi], 13); k < 13; k++) {
      assert_int_not_equal(ids[k], KVBM_HREQ_NULL);
      assert_true(group_block(m, ids[k], content_key(a, k, gi), kvbm_manager_group_bytes(m, gi), 1));
      held++;
    }
    assert_true(held > 0);
  }
  kvbm_hreq_destroy(r);
  free(a);
  kvbm_manager_destroy(m);
  tu_rmdir(dir);
}

/* Sparse retention: A (48 tokens) keeps window blocks 9 and 10 (ending at
 * 47 / 4 = 11), so A's 56-token prompt finds 44 tokens (11 blocks: the
 * window needs 9 and 10), and its own keeps are blocks 11, 12 (prompt end
 * 55 / 4 = 13) and 10, 11 (the junction: full attention's 48 tokens). The
 * reads fail, the hit settles at 0, and the window's places 0..8 come from
 * fill_short: none of them is kept, so none is registered. */
static void test_sparse_settles_short(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}};
  char *dir = tu_tmpdir("settle-sparse");
  kvbm_manager_config c = tu_config(dir, 40, 0, 400);
  c.groups = g;
  c.num_groups = 2;
  c.g3_persist = true;
  c.hybrid_retention = KVBM_HSEQ_RETAIN_BOUNDARIES;
  kvbm_manager *m = tu_create(&c);
  assert_non_null(m);
  uint32_t *a = tu_prompt(1, 56);
  setup_corrupt(m, dir, a);
  uint64_t h[14];
  for (size_t k = 0; k < 14; k++)
    h[k] = kvbm_hash_next(kvbm_manager_hash_scheme(m), 0, k ? h[k - 1] : 0, k > 0, a + k * B, B);

  kvbm_hreq *r;
  size_t hit;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 56, &r, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 44);
  assert_int_equal(null_places(r, 1, 11), 9); /* planned for 44: places 0..8 */
  kvbm_hreq_info i;
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  assert_int_equal(i.hit_tokens, 0);
  check_writable(r, g, 2, 0, 14);
  for (size_t k = 0; k < 9; k++) {
    pthread_mutex_lock(&m->mu);
    int rc = kvbm_pool_peek(m->t[KVBM_TIER_G1].pool, kvbm__group_key(h[k], 1), NULL, NULL);
    pthread_mutex_unlock(&m->mu);
    assert_int_equal(rc, KVBM_ENOTFOUND);
  }
  compute(m, r, a, 56);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_hreq_destroy(r);

  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 56, &r, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 52); /* the window's blocks 11, 12, kept at the prompt's end */
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  for (uint32_t gi = 0; gi < 2; gi++) {
    const uint32_t *ids;
    size_t nb;
    assert_int_equal(kvbm_hreq_table(r, gi, &ids, &nb), KVBM_OK);
    for (size_t k = needed_from(&g[gi], 13); k < 13; k++)
      assert_true(group_block(m, ids[k], content_key(a, k, gi), kvbm_manager_group_bytes(m, gi), 1));
  }
  kvbm_hreq_destroy(r);
  free(a);
  kvbm_manager_destroy(m);
  tu_rmdir(dir);
}

static void test_window_settles_short(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}};
  settle_short(g);
}

static void test_chunk_settles_short(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_CHUNKED_LOCAL, 16}};
  settle_short(g);
}

/* A failed state load: the state at the settled hit's boundary (here 0:
 * none) is needed, so the engine recomputes from the start and every
 * state place is its to write. */
static void test_mamba_settles_short(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_MAMBA, 0}};
  settle_short(g);
}

static void test_mamba_align_settles_short(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_MAMBA_ALIGN, 0}};
  settle_short(g);
}

static kvbm_pool_stats g1_stats(kvbm_manager *m) {
  kvbm_pool_stats s;
  kvbm_pool_stats_get(m->t[KVBM_TIER_G1].pool, &s);
  return s;
}

/* No room for the settled hit's places: KVBM_ENOSPC from the wait, the
 * request refused further steps, then served once room is made. */
static void test_no_room_then_room(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}};
  char *dir = tu_tmpdir("settle-room");
  kvbm_manager *m = g3_manager(dir, g, 2, 40);
  uint32_t *a = tu_prompt(1, 56), *c = tu_prompt(777777, 28);
  setup_corrupt(m, dir, a);
  kvbm_hreq *r, *rc;
  size_t hit;
  /* A's prompt: 14 + 4 blocks held (full: 12 onboards + 2; sw:8: blocks
   * 10, 11 + 2); C's 7 + 7 leave 40 - 32 = 8 available, and the settled
   * hit 0 needs sw:8's places 0..9: 10. */
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 56, &r, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 48);
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, c, 28, &rc, NULL, NULL), KVBM_OK);
  kvbm_manager_flush(m);
  assert_int_equal(kvbm_pool_available(m->t[KVBM_TIER_G1].pool), 8);
  kvbm_hreq_info i;
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_ENOSPC);
  assert_true(i.ready);
  assert_int_equal(i.hit_tokens, 0);
  kvbm_pool_stats s0 = g1_stats(m);
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_ENOSPC); /* again: still none, nothing taken */
  kvbm_pool_stats s1 = g1_stats(m);
  assert_memory_equal(&s0, &s1, sizeof s0);
  assert_int_equal(null_places(r, 1, 10), 10);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_ENOSPC);
  kvbm_error e = {0};
  uint32_t one = 5;
  assert_int_equal(kvbm_hreq_append(r, &one, 1, &e), KVBM_ENOSPC);
  assert_non_null(strstr(e.msg, "settled short"));
  s1 = g1_stats(m);
  assert_memory_equal(&s0, &s1, sizeof s0);

  /* Room made: the next wait takes the places, the request runs. */
  kvbm_hreq_destroy(rc);
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  assert_int_equal(i.hit_tokens, 0);
  check_writable(r, g, 2, 0, 14);
  compute(m, r, a, 56);
  assert_int_equal(kvbm_hreq_commit(r), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_hreq_destroy(r);
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 56, &r, &hit, NULL), KVBM_OK);
  assert_int_equal(hit, 52);
  assert_int_equal(kvbm_hreq_wait(r, -1, &i), KVBM_OK);
  const uint32_t *ids;
  size_t nb;
  assert_int_equal(kvbm_hreq_table(r, 0, &ids, &nb), KVBM_OK);
  for (size_t k = 0; k < 13; k++)
    assert_true(group_block(m, ids[k], content_key(a, k, 0), kvbm_manager_group_bytes(m, 0), 1));
  kvbm_hreq_destroy(r);
  free(a);
  free(c);
  kvbm_manager_destroy(m);
  tu_rmdir(dir);
}

/* A request destroyed while its places have no room leaks nothing. */
static void test_no_room_destroy_leaks_nothing(void **st) {
  (void)st;
  const kvbm_group_spec g[2] = {{KVBM_GROUP_FULL, 0}, {KVBM_GROUP_SLIDING_WINDOW, 8}};
  char *dir = tu_tmpdir("settle-leak");
  kvbm_manager *m = g3_manager(dir, g, 2, 40);
  uint32_t *a = tu_prompt(1, 56), *c = tu_prompt(777777, 28);
  setup_corrupt(m, dir, a);
  kvbm_pool_stats before = g1_stats(m);
  kvbm_hreq *r, *rc;
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, a, 56, &r, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_hprefill(m, 0, 0, c, 28, &rc, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_hreq_wait(r, -1, NULL), KVBM_ENOSPC);
  kvbm_hreq_destroy(r);
  kvbm_hreq_destroy(rc);
  kvbm_manager_flush(m);
  kvbm_pool_stats after = g1_stats(m);
  assert_int_equal(after.active, before.active);
  assert_int_equal(after.active, 0);
  assert_int_equal(after.free + after.cached, before.free + before.cached);
  assert_int_equal(kvbm_pool_available(m->t[KVBM_TIER_G1].pool), 40);
  free(a);
  free(c);
  kvbm_manager_destroy(m);
  tu_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window_settles_short),
      cmocka_unit_test(test_chunk_settles_short),
      cmocka_unit_test(test_mamba_settles_short),
      cmocka_unit_test(test_mamba_align_settles_short),
      cmocka_unit_test(test_no_room_then_room),
      cmocka_unit_test(test_no_room_destroy_leaks_nothing),
      cmocka_unit_test(test_sparse_settles_short),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
