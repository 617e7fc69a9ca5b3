/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_group.c: group specs (parse, format, names), the skipped-token rule
 * and the prefix hit rule of kvbm/group.h: hand-derived cases of vLLM's
 * coordinator, and a brute-force check that the hit is the longest
 * block-aligned prefix every group can serve, on random cache contents.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kvbm/group.h"

/* ---- parsing ---- */

static void test_parse_mixes(void **state) {
  (void)state;
  kvbm_group_spec g[KVBM_GROUPS_MAX];
  size_t n = 99;
  kvbm_error err = {0};
  assert_int_equal(kvbm_groups_parse("full,sw:128", g, KVBM_GROUPS_MAX, &n, &err), KVBM_OK);
  assert_int_equal(n, 2);
  assert_int_equal(g[0].kind, KVBM_GROUP_FULL);
  assert_int_equal(g[1].kind, KVBM_GROUP_SLIDING_WINDOW);
  assert_int_equal(g[1].tokens, 128);
  assert_int_equal(kvbm_groups_parse("mamba,chunk:8192,full_attention,sliding_window:1024", g,
                                     KVBM_GROUPS_MAX, &n, &err), KVBM_OK);
  assert_int_equal(n, 4);
  assert_int_equal(g[0].kind, KVBM_GROUP_MAMBA);
  assert_int_equal(g[1].kind, KVBM_GROUP_CHUNKED_LOCAL);
  assert_int_equal(g[1].tokens, 8192);
  assert_int_equal(g[2].kind, KVBM_GROUP_FULL);
  assert_int_equal(g[3].tokens, 1024);
  assert_int_equal(kvbm_groups_parse("full,mamba-align", g, KVBM_GROUPS_MAX, &n, &err), KVBM_OK);
  assert_int_equal(g[1].kind, KVBM_GROUP_MAMBA_ALIGN);
  assert_string_equal(kvbm_group_kind_name(g[1].kind), "mamba"); /* one spec kind, two modes */
  assert_int_equal(kvbm_groups_format(g, n, NULL, 0), strlen("full,mamba-align"));
  assert_int_equal(kvbm_groups_parse("mamba,chunk:8192,full_attention,sliding_window:1024", g,
                                     KVBM_GROUPS_MAX, &n, &err), KVBM_OK);
  char buf[128];
  size_t len = kvbm_groups_format(g, n, buf, sizeof buf);
  assert_string_equal(buf, "mamba,chunk:8192,full,sw:1024");
  assert_int_equal(len, strlen(buf));
  /* truncated output still says how long it had to be */
  assert_int_equal(kvbm_groups_format(g, n, buf, 6), len);
  assert_string_equal(buf, "mamba");
}

static void expect_refused(const char *text, size_t max, const char *needle) {
  kvbm_group_spec g[KVBM_GROUPS_MAX];
  size_t n = 77;
  kvbm_error err = {0};
  assert_int_equal(kvbm_groups_parse(text, g, max, &n, &err), KVBM_EINVAL);
  assert_int_equal(n, 77); /* untouched */
  if (!strstr(err.msg, needle)) fail_msg("'%s': message '%s' lacks '%s'", text ? text : "(null)", err.msg, needle);
}

static void test_parse_hostile(void **state) {
  (void)state;
  expect_refused(NULL, 4, "NULL");
  expect_refused("", 4, "empty");
  expect_refused("full,", 4, "item 1 is empty");
  expect_refused(",full", 4, "item 0 is empty");
  expect_refused("full,,sw:4", 4, "item 1 is empty");
  expect_refused("lstm", 4, "unknown kind");
  expect_refused("Full", 4, "unknown kind");
  expect_refused("sw", 4, "window is missing");
  expect_refused("sw:0", 4, "window must be");
  expect_refused("chunk:0", 4, "chunk must be");
  expect_refused("sw:-3", 4, "window must be");
  expect_refused("sw:12x", 4, "window must be");
  expect_refused("sw:", 4, "window must be");
  expect_refused("sw:1073741825", 4, "window must be");
  expect_refused("sw:99999999999999999999", 4, "window must be");
  expect_refused("full:3", 4, "takes no parameter");
  expect_refused("mamba:1", 4, "takes no parameter");
  expect_refused("mamba-align:16", 4, "takes no parameter");
  expect_refused("mamba-all", 4, "unknown kind");
  expect_refused("full ", 4, "unknown kind");   /* trailing junk */
  expect_refused("full,sw:128 ", 4, "window must be");
  expect_refused("full,full,full", 2, "more than 2 groups");
  char many[256] = "full";
  for (int i = 0; i < KVBM_GROUPS_MAX; i++) strcat(many, ",full");
  expect_refused(many, 1000, "more than 16 groups");
}

static void test_names(void **state) {
  (void)state;
  assert_string_equal(kvbm_group_kind_name(KVBM_GROUP_FULL), "full_attention");
  assert_string_equal(kvbm_group_kind_name(KVBM_GROUP_SLIDING_WINDOW), "sliding_window");
  assert_string_equal(kvbm_group_kind_name(KVBM_GROUP_CHUNKED_LOCAL), "chunked_local_attention");
  assert_string_equal(kvbm_group_kind_name(KVBM_GROUP_MAMBA), "mamba");
  assert_string_equal(kvbm_group_kind_name((kvbm_group_kind)9), "unknown");
}

static void test_skipped(void **state) {
  (void)state;
  kvbm_group_spec full = {KVBM_GROUP_FULL, 0}, sw = {KVBM_GROUP_SLIDING_WINDOW, 4},
                  ch = {KVBM_GROUP_CHUNKED_LOCAL, 8}, mb = {KVBM_GROUP_MAMBA, 0};
  assert_int_equal(kvbm_group_skipped_tokens(&full, 1000), 0);
  /* vLLM's docstring examples */
  assert_int_equal(kvbm_group_skipped_tokens(&sw, 7), 4);
  assert_int_equal(kvbm_group_skipped_tokens(&sw, 2), 0);
  assert_int_equal(kvbm_group_skipped_tokens(&ch, 13), 8);
  assert_int_equal(kvbm_group_skipped_tokens(&ch, 8), 8);
  assert_int_equal(kvbm_group_skipped_tokens(&ch, 7), 0);
  assert_int_equal(kvbm_group_skipped_tokens(&mb, 10), 9);
  assert_int_equal(kvbm_group_skipped_tokens(&mb, 0), 0);
}

/* ---- the hit ---- */

/* cached[g] is a bitmap of the blocks cached in group g. */
typedef struct bits {
  uint64_t cached[KVBM_GROUPS_MAX];
  unsigned lookups;
} bits;

static bool lookup(void *user, uint32_t g, size_t block) {
  bits *b = user;
  b->lookups++;
  assert_true(block < 64);
  return (b->cached[g] >> block) & 1;
}

static uint64_t mask(const int *blocks) {
  uint64_t m = 0;
  for (; *blocks >= 0; blocks++) m |= 1ull << *blocks;
  return m;
}
#define M(...) mask((const int[]){__VA_ARGS__, -1})
#define NONE 0ull

static uint64_t hit(const char *groups, uint64_t max, bits *b) {
  kvbm_group_spec g[KVBM_GROUPS_MAX];
  size_t n;
  assert_int_equal(kvbm_groups_parse(groups, g, KVBM_GROUPS_MAX, &n, NULL), KVBM_OK);
  return kvbm_groups_hit(g, n, 4, max, lookup, b);
}

static void test_hit_single_kinds(void **state) {
  (void)state;
  bits b = {{M(0, 1, 2)}, 0};
  assert_int_equal(hit("full", 19, &b), 12);          /* to the first miss */
  b.cached[0] = M(0, 1, 2, 3, 4);
  assert_int_equal(hit("full", 19, &b), 16);          /* at most max, aligned down */
  /* sw:8 needs ceil(7 / 4) = 2 contiguous blocks ending at the hit */
  b.cached[0] = M(3, 4);
  assert_int_equal(hit("sw:8", 20, &b), 20);
  b.cached[0] = M(1, 2);
  assert_int_equal(hit("sw:8", 20, &b), 12);
  b.cached[0] = M(0, 3);                              /* only the run from block 0 */
  assert_int_equal(hit("sw:8", 20, &b), 4);
  b.cached[0] = M(1, 3);
  assert_int_equal(hit("sw:8", 20, &b), 0);
  /* chunk:8: blocks before the current chunk count as computed (vLLM's
   * docstring: max 16 -> 4 null blocks; max 15 -> looks at block 2) */
  b.cached[0] = NONE;
  b.lookups = 0;
  assert_int_equal(hit("chunk:8", 16, &b), 16);
  assert_int_equal(b.lookups, 0);
  assert_int_equal(hit("chunk:8", 15, &b), 8);
  b.cached[0] = M(2);
  assert_int_equal(hit("chunk:8", 15, &b), 12);
  /* mamba: the last block whose state is cached */
  b.cached[0] = M(1, 3);
  assert_int_equal(hit("mamba", 20, &b), 16);
  assert_int_equal(hit("mamba", 15, &b), 8);
  b.cached[0] = NONE;
  assert_int_equal(hit("mamba", 20, &b), 0);
}

/* The junction (vLLM's shared_prefix_boundary): where full attention's
 * own first-pass hit ends, when it is longer than the common hit. */
static void test_hit_junction(void **state) {
  (void)state;
  kvbm_group_spec g[KVBM_GROUPS_MAX];
  size_t n;
  uint64_t j = 99;
  assert_int_equal(kvbm_groups_parse("full,sw:8", g, KVBM_GROUPS_MAX, &n, NULL), KVBM_OK);
  bits b = {{M(0, 1, 2, 3), M(1, 2)}, 0};
  assert_int_equal(kvbm_groups_hit_junction(g, n, 4, 16, lookup, &b, &j), 12);
  assert_int_equal(j, 16); /* full alone reached 16 */
  b.cached[1] = M(2, 3);
  assert_int_equal(kvbm_groups_hit_junction(g, n, 4, 16, lookup, &b, &j), 16);
  assert_int_equal(j, 0); /* not longer than the hit: none */
  assert_int_equal(kvbm_groups_parse("full", g, KVBM_GROUPS_MAX, &n, NULL), KVBM_OK);
  assert_int_equal(kvbm_groups_hit_junction(g, n, 4, 16, lookup, &b, &j), 16);
  assert_int_equal(j, 0); /* one type: never */
  assert_int_equal(kvbm_groups_hit_junction(g, n, 4, 16, lookup, &b, NULL), 16);
  /* three types: the first pass of full attention, not a later one */
  assert_int_equal(kvbm_groups_parse("full,sw:8,mamba", g, KVBM_GROUPS_MAX, &n, NULL), KVBM_OK);
  bits d = {{M(0, 1, 2, 3, 4, 5, 6), M(1, 5, 6), M(1, 3)}, 0};
  assert_int_equal(kvbm_groups_hit_junction(g, n, 4, 28, lookup, &d, &j), 0);
  assert_int_equal(j, 28);
  assert_int_equal(kvbm_groups_hit_junction(NULL, 0, 4, 28, lookup, &d, &j), 0);
  assert_int_equal(j, 0);
}

/* kvbm_group_kept_ranges: vLLM's sparse retention, by hand (B 4). */
static void test_kept_ranges(void **state) {
  (void)state;
  size_t lo[2], hi[2];
  const kvbm_group_spec full = {KVBM_GROUP_FULL, 0}, chunk = {KVBM_GROUP_CHUNKED_LOCAL, 16},
                        sw8 = {KVBM_GROUP_SLIDING_WINDOW, 8}, mamba = {KVBM_GROUP_MAMBA, 0},
                        align = {KVBM_GROUP_MAMBA_ALIGN, 0};
  /* full and chunked local: every block */
  assert_int_equal(kvbm_group_kept_ranges(&full, 4, 40, 24, lo, hi), 1);
  assert_true(lo[0] == 0 && hi[0] == SIZE_MAX);
  assert_int_equal(kvbm_group_kept_ranges(&chunk, 4, 40, 0, lo, hi), 1);
  assert_true(lo[0] == 0 && hi[0] == SIZE_MAX);
  /* a 40-token prompt ends in block 9 (token 39): a window of 8 needs
   * cdiv(7, 4) = 2 blocks before it, 7 and 8 */
  assert_int_equal(kvbm_group_kept_ranges(&sw8, 4, 40, 0, lo, hi), 1);
  assert_true(lo[0] == 7 && hi[0] == 9);
  /* a junction at 24 adds blocks 4 and 5, given in position order */
  assert_int_equal(kvbm_group_kept_ranges(&sw8, 4, 40, 24, lo, hi), 2);
  assert_true(lo[0] == 4 && hi[0] == 6 && lo[1] == 7 && hi[1] == 9);
  /* one at 32 (blocks 6, 7) overlaps the end's: one range */
  assert_int_equal(kvbm_group_kept_ranges(&sw8, 4, 40, 32, lo, hi), 1);
  assert_true(lo[0] == 6 && hi[0] == 9);
  /* Mamba, both modes: the one state block ending at each boundary */
  assert_int_equal(kvbm_group_kept_ranges(&mamba, 4, 40, 24, lo, hi), 2);
  assert_true(lo[0] == 5 && hi[0] == 6 && lo[1] == 8 && hi[1] == 9);
  assert_int_equal(kvbm_group_kept_ranges(&align, 4, 40, 0, lo, hi), 1);
  assert_true(lo[0] == 8 && hi[0] == 9);
  /* a prompt inside its first block keeps nothing; no prompt, no block size */
  assert_int_equal(kvbm_group_kept_ranges(&sw8, 4, 3, 0, lo, hi), 0);
  assert_int_equal(kvbm_group_kept_ranges(&sw8, 4, 0, 0, lo, hi), 0);
  assert_int_equal(kvbm_group_kept_ranges(&mamba, 0, 40, 0, lo, hi), 0);
}

static void test_hit_hybrids(void **state) {
  (void)state;
  bits b = {{M(0, 1, 2, 3), M(2, 3)}, 0};
  assert_int_equal(hit("full,sw:8", 16, &b), 16);
  b.cached[1] = M(1, 2);
  assert_int_equal(hit("full,sw:8", 16, &b), 12);
  /* the window's blocks alone are no hit when full attention lacks them */
  b.cached[0] = M(0);
  b.cached[1] = M(0, 1, 2, 3);
  assert_int_equal(hit("full,sw:8", 16, &b), 4);
  /* order of the list does not matter: full attention goes first */
  b.cached[0] = M(0, 1, 2, 3);
  b.cached[1] = M(1, 2);
  bits c = {{M(1, 2), M(0, 1, 2, 3)}, 0};
  assert_int_equal(hit("sw:8,full", 16, &c), 12);
  /* mamba + full: the last state within the full prefix */
  b.cached[0] = M(0, 1, 2, 3, 4);
  b.cached[1] = M(1, 3);
  assert_int_equal(hit("full,mamba", 20, &b), 16);
  b.cached[0] = M(0, 1, 2);
  assert_int_equal(hit("full,mamba", 20, &b), 8);
  /* three types: the fixed point needs a second and a third pass (the
   * window's and mamba's hits at 28 are not hits at 16) */
  bits d = {{M(0, 1, 2, 3, 4, 5, 6), M(1, 5, 6), M(1, 3)}, 0};
  assert_int_equal(hit("full,sw:8,mamba", 28, &d), 0);
  bits e = {{M(0, 1, 2, 3, 4, 5, 6), M(0, 1, 2, 3, 5, 6), M(1, 3)}, 0};
  assert_int_equal(hit("full,sw:8,mamba", 28, &e), 16);
  /* equal specs form one type: a block counts only if both groups have it */
  bits f = {{M(0, 1, 2, 3), M(2, 3), M(3)}, 0};
  assert_int_equal(hit("full,sw:8,sw:8", 16, &f), 0);
  f.cached[2] = M(2, 3);
  assert_int_equal(hit("full,sw:8,sw:8", 16, &f), 16);
  /* degenerate input */
  kvbm_group_spec g = {KVBM_GROUP_FULL, 0};
  assert_int_equal(kvbm_groups_hit(&g, 0, 4, 16, lookup, &b), 0);
  assert_int_equal(kvbm_groups_hit(&g, 1, 0, 16, lookup, &b), 0);
  assert_int_equal(kvbm_groups_hit(NULL, 1, 4, 16, lookup, &b), 0);
}

/* What serving a prefix of h tokens needs, written from the rule's
 * statement (kvbm/group.h), not from the scans. */
static bool serves(const kvbm_group_spec *g, uint64_t gi, const bits *b, uint64_t h, uint32_t bs) {
  size_t nb = (size_t)(h / bs), first = 0;
  switch (g->kind) {
    case KVBM_GROUP_SLIDING_WINDOW: {
      size_t need = (g->tokens - 1 + bs - 1) / bs;
      if (need == 0) need = 1; /* vLLM: sw:1 still wants the hit's last block */
      first = nb > need ? nb - need : 0;
      break;
    }
    case KVBM_GROUP_CHUNKED_LOCAL: first = (size_t)(h / g->tokens * g->tokens / bs); break;
    case KVBM_GROUP_MAMBA: first = nb ? nb - 1 : 0; break;
    default: break;
  }
  for (size_t k = first; k < nb; k++)
    if (!((b->cached[gi] >> k) & 1)) return false;
  return true;
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void test_hit_is_longest_served(void **state) {
  (void)state;
  const char *mixes[] = {"full,sw:8", "full,sw:5,mamba", "sw:9,chunk:12", "full,chunk:8,sw:4",
                         "mamba,sw:13", "full,sw:8,sw:8,mamba", "sw:1,full", "chunk:4,mamba"};
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++) {
    kvbm_group_spec g[KVBM_GROUPS_MAX];
    size_t n;
    assert_int_equal(kvbm_groups_parse(mixes[m], g, KVBM_GROUPS_MAX, &n, NULL), KVBM_OK);
    for (int it = 0; it < 3000; it++) {
      bits b = {{0}, 0};
      /* dense caches, so that long hits happen */
      for (size_t gi = 0; gi < n; gi++) b.cached[gi] = rnd(&s) | rnd(&s) | (it & 1 ? rnd(&s) : 0);
      uint64_t max = rnd(&s) % 60;
      uint64_t h = kvbm_groups_hit(g, n, 4, max, lookup, &b);
      uint64_t want = 0;
      for (uint64_t x = 4; x <= max; x += 4) {
        bool all = true;
        for (size_t gi = 0; gi < n && all; gi++) all = serves(&g[gi], gi, &b, x, 4);
        if (all) want = x;
      }
      if (h != want) fail_msg("%s max %llu: hit %llu, longest served %llu", mixes[m],
                              (unsigned long long)max, (unsigned long long)h, (unsigned long long)want);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_mixes),      cmocka_unit_test(test_parse_hostile),
      cmocka_unit_test(test_names),            cmocka_unit_test(test_skipped),
      cmocka_unit_test(test_hit_single_kinds), cmocka_unit_test(test_hit_hybrids),
      cmocka_unit_test(test_hit_junction),     cmocka_unit_test(test_kept_ranges),
      cmocka_unit_test(test_hit_is_longest_served),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
