/* SPDX-License-Identifier: Apache-2.0 */
/* test_seq.c: the stream's sequence rules (kvbm_seqno_check) and the replay
 * client's rules (kvbm__replay_check), as pure functions: restarts (one
 * after a stream of the single batch 0, which repeats its number), gaps,
 * repeats after a replay, numbers too far ahead held until confirmed or
 * voided, vLLM's end marker never a position; replies only in the range
 * asked for, in order, within the deadline and the byte budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "events/replay.h"
#include "kvbm/events.h"

static kvbm_seqno_verdict chk(kvbm_seqno_tracker *t, uint64_t seq, bool live, uint32_t *voided) {
  uint32_t v = 0;
  kvbm_seqno_verdict r = kvbm_seqno_check(t, seq, live, &v);
  if (voided) *voided = v;
  return r;
}

/* Checks and, when the verdict says so, takes; returns the lost count. */
static uint64_t feed(kvbm_seqno_tracker *t, uint64_t seq, kvbm_seqno_verdict want) {
  kvbm_seqno_verdict v = chk(t, seq, true, NULL);
  if (v != want)
    fail_msg("seq %llu: %s, expected %s", (unsigned long long)seq, kvbm_seqno_verdict_name(v),
             kvbm_seqno_verdict_name(want));
  if (v == KVBM_SEQNO_DUPLICATE || v == KVBM_SEQNO_HOLD) return 0;
  return kvbm_seqno_take(t, seq);
}

static void test_in_order_and_gaps(void **st) {
  (void)st;
  kvbm_seqno_tracker t;
  kvbm_seqno_init(&t, NULL);
  assert_int_equal(feed(&t, 7, KVBM_SEQNO_NEXT), 0); /* the first number: any */
  assert_int_equal(feed(&t, 8, KVBM_SEQNO_NEXT), 0);
  assert_int_equal(kvbm_seqno_next(&t), 9);
  assert_int_equal(feed(&t, 12, KVBM_SEQNO_GAP), 3); /* 9, 10, 11 lost */
  assert_int_equal(feed(&t, 12, KVBM_SEQNO_DUPLICATE), 0);
  assert_int_equal(feed(&t, 13, KVBM_SEQNO_NEXT), 0);
}

/* A restarted engine begins again at 0: a new stream at once, however small
 * the step back (the old rule ignored it until it passed the old mark). */
static void test_restart(void **st) {
  (void)st;
  kvbm_seqno_tracker t;
  kvbm_seqno_init(&t, NULL);
  for (uint64_t s = 0; s < 50; s++) feed(&t, s, KVBM_SEQNO_NEXT);
  assert_int_equal(feed(&t, 0, KVBM_SEQNO_RESTART), 0);
  assert_int_equal(feed(&t, 1, KVBM_SEQNO_NEXT), 0);
  assert_int_equal(kvbm_seqno_next(&t), 2);
  /* the same far from 0 */
  for (uint64_t s = 2; s < 5000; s++) feed(&t, s, KVBM_SEQNO_NEXT);
  assert_int_equal(feed(&t, 3, KVBM_SEQNO_RESTART), 0);
}

/* An engine whose stream ended at batch 0 restarts and sends batch 0 again:
 * a new stream, delivered (the old rule dropped it as a repeat of 0, so a
 * consumer kept the dead engine's blocks and missed the new first batch).
 * A repeat further into a stream is still a repeat. */
static void test_restart_after_one_batch(void **st) {
  (void)st;
  kvbm_seqno_tracker t;
  kvbm_seqno_init(&t, NULL);
  feed(&t, 0, KVBM_SEQNO_NEXT);
  feed(&t, 0, KVBM_SEQNO_RESTART); /* restarted before its second batch */
  feed(&t, 0, KVBM_SEQNO_RESTART); /* and once more */
  feed(&t, 1, KVBM_SEQNO_NEXT);
  feed(&t, 1, KVBM_SEQNO_DUPLICATE); /* the stream holds 0 and 1: a repeat */
  feed(&t, 0, KVBM_SEQNO_RESTART);
  assert_int_equal(kvbm_seqno_next(&t), 1);
  /* a reader that joined mid-stream (its first batch 57) alike */
  kvbm_seqno_init(&t, NULL);
  feed(&t, 57, KVBM_SEQNO_NEXT);
  feed(&t, 57, KVBM_SEQNO_RESTART);
  feed(&t, 58, KVBM_SEQNO_NEXT);
  feed(&t, 58, KVBM_SEQNO_DUPLICATE);
  /* a late joiner that replayed 0..4: the live 0 is a repeat of the
   * replay (not a new stream), and then 0 again is the restart */
  kvbm_seqno_init(&t, NULL);
  kvbm_seqno_start(&t, 0);
  for (uint64_t s = 0; s < 5; s++) assert_int_equal(kvbm_seqno_take(&t, s), 0);
  feed(&t, 0, KVBM_SEQNO_DUPLICATE);
  feed(&t, 5, KVBM_SEQNO_NEXT);
  feed(&t, 0, KVBM_SEQNO_RESTART);
  /* input mixing live and replayed batches keeps its rule: a repeat */
  kvbm_seqno_init(&t, NULL);
  assert_int_equal(chk(&t, 0, false, NULL), KVBM_SEQNO_NEXT);
  kvbm_seqno_take(&t, 0);
  assert_int_equal(chk(&t, 0, false, NULL), KVBM_SEQNO_DUPLICATE);
}

/* Live batches that a replay already delivered are repeats, not restarts. */
static void test_live_after_replay(void **st) {
  (void)st;
  kvbm_seqno_tracker t;
  kvbm_seqno_init(&t, NULL);
  kvbm_seqno_start(&t, 100); /* a late joiner asked from 100 */
  for (uint64_t s = 100; s < 110; s++) assert_int_equal(kvbm_seqno_take(&t, s), 0); /* replayed */
  feed(&t, 105, KVBM_SEQNO_DUPLICATE); /* the live stream catches up */
  feed(&t, 109, KVBM_SEQNO_DUPLICATE);
  feed(&t, 110, KVBM_SEQNO_NEXT);
  feed(&t, 108, KVBM_SEQNO_RESTART); /* but live going back is a restart */
  /* a late joiner whose engine restarted below where it asked */
  kvbm_seqno_init(&t, NULL);
  kvbm_seqno_start(&t, 1000);
  feed(&t, 3, KVBM_SEQNO_RESTART);
}

/* One number near 2^63 (or 2^64 - 1, the replay end marker) is held, not
 * believed; the stream goes on where it was and the stray is voided. */
static void test_stray_number(void **st) {
  (void)st;
  kvbm_seqno_tracker t;
  kvbm_seqno_init(&t, NULL);
  for (uint64_t s = 0; s < 5; s++) feed(&t, s, KVBM_SEQNO_NEXT);
  feed(&t, (uint64_t)1 << 63, KVBM_SEQNO_HOLD);
  uint32_t voided;
  assert_int_equal(chk(&t, 5, true, &voided), KVBM_SEQNO_NEXT);
  assert_int_equal(voided, 1);
  assert_int_equal(kvbm_seqno_take(&t, 5), 0);
  feed(&t, UINT64_MAX, KVBM_SEQNO_HOLD);
  feed(&t, UINT64_MAX, KVBM_SEQNO_HOLD); /* repeats do not confirm it */
  feed(&t, UINT64_MAX, KVBM_SEQNO_HOLD);
  assert_int_equal(chk(&t, 6, true, &voided), KVBM_SEQNO_NEXT);
  assert_int_equal(voided, 1);
  assert_int_equal(kvbm_seqno_take(&t, 6), 0);
  assert_int_equal(kvbm_seqno_next(&t), 7);
  /* the very first number may be a stray: the real stream then steps back */
  kvbm_seqno_init(&t, NULL);
  feed(&t, (uint64_t)1 << 63, KVBM_SEQNO_NEXT);
  feed(&t, 10, KVBM_SEQNO_RESTART);
  feed(&t, 11, KVBM_SEQNO_NEXT);
}

/* A real jump (a long outage) is believed once `confirm` batches in a row
 * continue it: a new stream from the first of them. */
static void test_confirmed_jump(void **st) {
  (void)st;
  kvbm_seqno_rules r = kvbm_seqno_rules_default();
  assert_int_equal(r.confirm, 3);
  kvbm_seqno_tracker t;
  kvbm_seqno_init(&t, &r);
  for (uint64_t s = 0; s < 5; s++) feed(&t, s, KVBM_SEQNO_NEXT);
  uint64_t j = 5 + r.max_gap + 1;
  feed(&t, j, KVBM_SEQNO_HOLD);
  feed(&t, j + 1, KVBM_SEQNO_HOLD);
  assert_int_equal(chk(&t, j + 2, true, NULL), KVBM_SEQNO_RESYNC);
  assert_int_equal(kvbm_seqno_next(&t), j); /* the held ones are taken first */
  assert_int_equal(kvbm_seqno_take(&t, j), 0);
  assert_int_equal(kvbm_seqno_take(&t, j + 1), 0);
  assert_int_equal(kvbm_seqno_take(&t, j + 2), 0);
  feed(&t, j + 3, KVBM_SEQNO_NEXT);
  /* within max_gap it is an ordinary gap */
  feed(&t, j + 4 + r.max_gap, KVBM_SEQNO_GAP);
  /* confirm = 1 believes at once */
  r.confirm = 1;
  kvbm_seqno_init(&t, &r);
  feed(&t, 0, KVBM_SEQNO_NEXT);
  assert_int_equal(chk(&t, (uint64_t)1 << 40, true, NULL), KVBM_SEQNO_RESYNC);
}

/* For input mixing live and replayed batches (the index), a step back is a
 * repeat unless it goes further back than max_gap. */
static void test_mixed_input(void **st) {
  (void)st;
  kvbm_seqno_rules r = {.max_gap = 100, .confirm = 2};
  kvbm_seqno_tracker t;
  kvbm_seqno_init(&t, &r);
  for (uint64_t s = 0; s < 300; s++) {
    assert_int_equal(chk(&t, s, false, NULL), KVBM_SEQNO_NEXT);
    kvbm_seqno_take(&t, s);
  }
  assert_int_equal(chk(&t, 250, false, NULL), KVBM_SEQNO_DUPLICATE);
  assert_int_equal(chk(&t, 299, false, NULL), KVBM_SEQNO_DUPLICATE);
  assert_int_equal(chk(&t, 150, false, NULL), KVBM_SEQNO_RESTART);
}

static void test_replay_rules(void **st) {
  (void)st;
  kvbm__replay_window w;
  kvbm__replay_window_init(&w, 10, 20, 1000, 100, 40, 0);
  assert_int_equal(kvbm__replay_check(&w, 9, 1, 0), KVBM__REPLAY_SKIP);   /* below */
  assert_int_equal(kvbm__replay_check(&w, 20, 1, 0), KVBM__REPLAY_SKIP);  /* at `to` */
  assert_int_equal(kvbm__replay_check(&w, (uint64_t)1 << 63, 1, 0), KVBM__REPLAY_SKIP);
  assert_int_equal(kvbm__replay_check(&w, 12, 30, 0), KVBM__REPLAY_TAKE);
  assert_int_equal(kvbm__replay_check(&w, 12, 1, 0), KVBM__REPLAY_SKIP);  /* repeat */
  assert_int_equal(kvbm__replay_check(&w, 11, 1, 0), KVBM__REPLAY_SKIP);  /* back */
  assert_int_equal(kvbm__replay_check(&w, 13, 41, 0), KVBM__REPLAY_TOO_LARGE);
  assert_int_equal(kvbm__replay_check(&w, 13, 40, 0), KVBM__REPLAY_TAKE);
  assert_int_equal(kvbm__replay_check(&w, 14, 31, 0), KVBM__REPLAY_FULL); /* 70 + 31 > 100 */
  assert_int_equal(kvbm__replay_check(&w, 14, 30, 0), KVBM__REPLAY_TAKE);
  assert_int_equal(kvbm__replay_check(&w, UINT64_MAX, 0, 0), KVBM__REPLAY_END);
  /* one deadline for the whole replay, however the replies are spaced */
  assert_int_equal(kvbm__replay_wait_ms(&w, 400u * 1000000u), 600);
  assert_int_equal(kvbm__replay_check(&w, 15, 0, 999u * 1000000u), KVBM__REPLAY_TAKE);
  assert_int_equal(kvbm__replay_check(&w, 16, 0, 1000u * 1000000u), KVBM__REPLAY_LATE);
  assert_int_equal(kvbm__replay_wait_ms(&w, 1000u * 1000000u), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_in_order_and_gaps), cmocka_unit_test(test_restart),
      cmocka_unit_test(test_restart_after_one_batch),
      cmocka_unit_test(test_live_after_replay), cmocka_unit_test(test_stray_number),
      cmocka_unit_test(test_confirmed_jump),    cmocka_unit_test(test_mixed_input),
      cmocka_unit_test(test_replay_rules),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
