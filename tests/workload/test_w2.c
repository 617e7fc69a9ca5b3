/* SPDX-License-Identifier: Apache-2.0 */
/* W2 on the first requests of the Mooncake trace: without G2 and G3 every
 * count equals W1's; hits never drop when a tier grows; every onboarded
 * block verifies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "workload/w2.h"
#include "tier/tier_testutil.h"

#define TRACE KVBM_SOURCE_DIR "/data/mooncake_conversation_trace.jsonl.gz"

static kvsim_trace *load(size_t limit) {
  kvsim_trace *t;
  kvbm_error e = {0};
  if (kvsim_trace_load(TRACE, limit, &t, &e)) fail_msg("%s", e.msg);
  return t;
}

static void test_equals_w1_without_lower_tiers(void **st) {
  (void)st;
  kvsim_trace *t = load(300);
  uint32_t caps[] = {8192, 16384};
  uint32_t bss[] = {16, 32};
  for (int i = 0; i < 2; i++) {
    kvsim_w1_config o1 = kvsim_w1_config_default();
    o1.capacity = caps[i];
    o1.block_size = bss[i];
    kvsim_w1_result r1;
    assert_int_equal(kvsim_w1_run(t, &o1, &r1, NULL), KVBM_OK);
    kvsim_w2_config o2 = kvsim_w2_config_default();
    o2.w1 = o1;
    o2.block_bytes = 32;
    kvsim_w2_result r2;
    kvbm_error e = {0};
    assert_int_equal(kvsim_w2_run(t, &o2, &r2, &e), KVBM_OK);
    assert_int_equal(r2.w1.requests, r1.requests);
    assert_int_equal(r2.w1.prompt_tokens, r1.prompt_tokens);
    assert_int_equal(r2.w1.hit_tokens, r1.hit_tokens);
    assert_int_equal(r2.w1.blocks_allocated, r1.blocks_allocated);
    assert_int_equal(r2.tiers[KVBM_TIER_G1].hit_tokens, r1.hit_tokens);
    assert_int_equal(r2.tiers[KVBM_TIER_G2].hit_tokens + r2.tiers[KVBM_TIER_G3].hit_tokens, 0);
    assert_true(r1.hit_tokens > 0);
  }
  kvsim_trace_destroy(t);
}

static uint64_t w2(const kvsim_trace *t, const char *dir, uint32_t c1, uint32_t c2, uint64_t c3,
                   kvbm_offload_policy g3p, kvsim_w2_result *out) {
  kvsim_w2_config o = kvsim_w2_config_default();
  o.w1.capacity = c1;
  o.g2_blocks = c2;
  o.g3_blocks = c3;
  o.g3_dir = dir;
  o.g3_policy = g3p;
  o.g3_direct = false; /* semantics here; O_DIRECT speed is bench_tiers' */
  o.block_bytes = 32;
  kvbm_error e = {0};
  if (kvsim_w2_run(t, &o, out, &e)) fail_msg("%s", e.msg);
  uint64_t sum = 0;
  for (int i = 0; i < KVBM_TIER_COUNT; i++) sum += out->tiers[i].hit_tokens;
  assert_int_equal(sum, out->w1.hit_tokens);
  assert_int_equal(out->verify_failures, 0);
  for (int i = 0; i < KVBM_TIER_COUNT; i++) {
    assert_int_equal(out->tiers[i].checksum_failures, 0);
    assert_int_equal(out->tiers[i].skipped, 0);
  }
  /* Every hit below G1 is one verified onboard. */
  for (int i = 1; i < KVBM_TIER_COUNT; i++)
    assert_int_equal(out->tiers[i].onboarded_blocks * 16, out->tiers[i].hit_tokens);
  print_message("C1 %u C2 %u C3 %llu (%s): hits %llu (g1 %llu g2 %llu g3 %llu)\n", c1, c2,
                (unsigned long long)c3, kvbm_offload_policy_name(g3p),
                (unsigned long long)out->w1.hit_tokens,
                (unsigned long long)out->tiers[0].hit_tokens,
                (unsigned long long)out->tiers[1].hit_tokens,
                (unsigned long long)out->tiers[2].hit_tokens);
  return out->w1.hit_tokens;
}

/* Hits along one axis must not drop. */
static void axis(const kvsim_trace *t, const char *dir, const uint32_t *c1, const uint32_t *c2,
                 const uint64_t *c3, int n, kvbm_offload_policy p, int lower_tier_hits) {
  uint64_t prev = 0;
  kvsim_w2_result r;
  for (int i = 0; i < n; i++) {
    uint64_t h = w2(t, dir, c1[i], c2[i], c3[i], p, &r);
    assert_true(h >= prev);
    prev = h;
  }
  if (lower_tier_hits == KVBM_TIER_G2) assert_true(r.tiers[KVBM_TIER_G2].hit_tokens > 0);
  if (lower_tier_hits == KVBM_TIER_G3) assert_true(r.tiers[KVBM_TIER_G3].hit_tokens > 0);
}

/* Growing any one tier never lowers the total hits (first 500 requests;
 * the trace's reuse distances are long, hence the large lower tiers). */
static void test_monotone_in_every_tier(void **st) {
  (void)st;
  kvsim_trace *t = load(500);
  char *dir = tu_tmpdir("w2");
  {
    uint32_t c1[] = {8192, 16384, 32768}, c2[] = {65536, 65536, 65536};
    uint64_t c3[] = {0, 0, 0};
    axis(t, dir, c1, c2, c3, 3, KVBM_OFFLOAD_ALL, KVBM_TIER_G2);
  }
  {
    uint32_t c1[] = {8192, 8192, 8192, 8192}, c2[] = {0, 16384, 65536, 262144};
    uint64_t c3[] = {0, 0, 0, 0};
    axis(t, dir, c1, c2, c3, 4, KVBM_OFFLOAD_ALL, KVBM_TIER_G2);
  }
  {
    uint32_t c1[] = {8192, 8192, 8192}, c2[] = {16384, 16384, 16384};
    uint64_t c3[] = {0, 32768, 131072};
    axis(t, dir, c1, c2, c3, 3, KVBM_OFFLOAD_ALL, KVBM_TIER_G3);
  }
  {
    uint32_t c1[] = {8192, 16384}, c2[] = {16384, 16384};
    uint64_t c3[] = {131072, 131072};
    axis(t, dir, c1, c2, c3, 2, KVBM_OFFLOAD_ALL, KVBM_TIER_G3);
  }
  {
    uint32_t c1[] = {8192, 8192, 8192}, c2[] = {8192, 8192, 8192};
    uint64_t c3[] = {0, 4096, 262144};
    axis(t, dir, c1, c2, c3, 3, KVBM_OFFLOAD_FREQUENCY, -1);
  }
  kvsim_trace_destroy(t);
  tu_rmdir(dir);
}

/* Adding G4 (a fresh file:// store) never lowers the hits, every G4
 * onboard verifies, and a second run on the same store gains G4 hits from
 * what the first stored (first 100 requests). */
static void test_g4_never_fewer_hits(void **st) {
  (void)st;
  kvsim_trace *t = load(100);
  uint32_t c2s[] = {0, 16384};
  for (int i = 0; i < 2; i++) {
    char *dir = tu_tmpdir("w2g4"), url[600];
    snprintf(url, sizeof url, "file://%s", dir);
    kvsim_w2_config o = kvsim_w2_config_default();
    o.w1.capacity = 8192;
    o.g2_blocks = c2s[i];
    o.block_bytes = 32;
    kvsim_w2_result none, first, second;
    kvbm_error e = {0};
    if (kvsim_w2_run(t, &o, &none, &e)) fail_msg("%s", e.msg);
    o.g4_url = url;
    if (kvsim_w2_run(t, &o, &first, &e)) fail_msg("%s", e.msg);
    if (kvsim_w2_run(t, &o, &second, &e)) fail_msg("%s", e.msg);
    const kvsim_w2_tier *g1 = &first.tiers[KVBM_TIER_G4], *g2 = &second.tiers[KVBM_TIER_G4];
    print_message("C2 %u: hits %llu without G4, %llu (G4 %llu) first, %llu (G4 %llu) second\n",
                  c2s[i], (unsigned long long)none.w1.hit_tokens,
                  (unsigned long long)first.w1.hit_tokens, (unsigned long long)g1->hit_tokens,
                  (unsigned long long)second.w1.hit_tokens, (unsigned long long)g2->hit_tokens);
    assert_true(first.w1.hit_tokens >= none.w1.hit_tokens);
    assert_true(second.w1.hit_tokens >= first.w1.hit_tokens);
    assert_true(g2->hit_tokens > g1->hit_tokens);
    for (const kvsim_w2_result *r = &first; r; r = r == &first ? &second : NULL) {
      assert_int_equal(r->verify_failures, 0);
      const kvsim_w2_tier *x = &r->tiers[KVBM_TIER_G4];
      assert_int_equal(x->onboard_failures + x->checksum_failures + x->foreign + x->skipped, 0);
      assert_int_equal(x->onboarded_blocks * 16, x->hit_tokens);
    }
    tu_rmdir(dir);
  }
  kvsim_trace_destroy(t);
}

/* on_call (bench_engine_latency's hook): each call the driver makes for a
 * request is reported once, in order, with a duration, and the counts do
 * not change for being observed. */
typedef struct calls_seen {
  size_t n[KVSIM_W2_CALL_COUNT];
  int last;       /* the previous call, -1 before the first */
  bool in_order;  /* PREFILL, WAIT, [APPEND], [COMMIT], FLUSH, DESTROY */
  bool bad_time;
} calls_seen;

static void count_call(void *user, kvsim_w2_call call, double seconds) {
  calls_seen *c = user;
  c->n[call]++;
  if (!(seconds >= 0 && seconds < 60)) c->bad_time = true;
  bool ok = call == KVSIM_W2_CALL_PREFILL ? (c->last == -1 || c->last == KVSIM_W2_CALL_DESTROY)
                                         : (int)call > c->last;
  if (!ok) c->in_order = false;
  c->last = call;
}

static void test_on_call_reports_every_call(void **st) {
  (void)st;
  kvsim_trace *t = load(200);
  kvsim_w2_config o = kvsim_w2_config_default();
  o.block_bytes = 32;
  kvsim_w2_result plain, seen;
  assert_int_equal(kvsim_w2_run(t, &o, &plain, NULL), KVBM_OK);
  calls_seen c = {.last = -1, .in_order = true};
  o.on_call = count_call;
  o.observer_user = &c;
  assert_int_equal(kvsim_w2_run(t, &o, &seen, NULL), KVBM_OK);
  assert_true(c.in_order);
  assert_false(c.bad_time);
  assert_int_equal(seen.w1.hit_tokens, plain.w1.hit_tokens);
  assert_int_equal(seen.w1.blocks_allocated, plain.w1.blocks_allocated);
  size_t with_tokens = 0, with_output = 0;
  for (size_t i = 0; i < kvsim_trace_count(t); i++) {
    const kvsim_trace_request *q = kvsim_trace_get(t, i);
    with_tokens += q->input_length || q->output_length;
    with_output += q->input_length ? q->output_length > 0 : q->output_length > 1;
  }
  assert_true(with_tokens > 0);
  assert_int_equal(c.n[KVSIM_W2_CALL_PREFILL], with_tokens);
  assert_int_equal(c.n[KVSIM_W2_CALL_WAIT], with_tokens);
  assert_int_equal(c.n[KVSIM_W2_CALL_APPEND], with_output);
  assert_int_equal(c.n[KVSIM_W2_CALL_COMMIT], with_tokens);
  assert_int_equal(c.n[KVSIM_W2_CALL_FLUSH], with_tokens);
  assert_int_equal(c.n[KVSIM_W2_CALL_DESTROY], with_tokens);
  kvsim_trace_destroy(t);
}

static void test_bad_options(void **st) {
  (void)st;
  kvsim_trace *t = load(10);
  kvsim_w2_config o = kvsim_w2_config_default();
  kvsim_w2_result r;
  kvbm_error e = {0};
  o.block_bytes = 20;
  assert_int_equal(kvsim_w2_run(t, &o, &r, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "block-bytes"));
  o = kvsim_w2_config_default();
  o.w1.capacity = 4;
  assert_int_equal(kvsim_w2_run(t, &o, &r, &e), KVBM_ENOSPC);
  assert_non_null(strstr(e.msg, "does not fit"));
  assert_int_equal(kvsim_w2_run(NULL, &o, &r, &e), KVBM_EINVAL);
  kvsim_trace_destroy(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equals_w1_without_lower_tiers),
      cmocka_unit_test(test_monotone_in_every_tier),
      cmocka_unit_test(test_g4_never_fewer_hits),
      cmocka_unit_test(test_on_call_reports_every_call),
      cmocka_unit_test(test_bad_options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
