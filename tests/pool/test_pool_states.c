/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pool_states.c: the block state machine, one transition at a time.
 *
 * For every state a block can be in (free, held and empty, partial, partial
 * and full, complete, registered and held, cached) and every block operation
 * (init, append, commit, register, abort, release, retain, fill), the test
 * builds a fresh pool, brings a block to the state, applies the operation and
 * checks the result against a table: an allowed transition lands in the
 * documented state with the right reference count and counts; a refused one
 * returns its error code and leaves the whole pool as it was (stats, every
 * block's info and tokens, the registered set), without events. Bad ids, NULL
 * arguments and bad configurations are checked the same way.
 */
#include "pool_testutil.h"

#include <stdio.h>

#define NB 4
#define BS 4

enum st {
  S_FREE,       /* never allocated */
  S_FREED,      /* allocated, filled partly, released: empty again */
  S_HELD,       /* allocated, RESET */
  S_PARTIAL,    /* init + 2 tokens */
  S_FULL,       /* init + BS tokens, not committed */
  S_COMPLETE,   /* committed */
  S_REGISTERED, /* registered, held */
  S_CACHED,     /* registered, released */
  S_COUNT
};
static const char *st_name[] = {"free", "freed", "held", "partial", "full",
                                "complete", "registered", "cached"};

enum op {
  OP_INIT,
  OP_APPEND1,
  OP_APPEND_OVER, /* 3 tokens: more than room from 2 */
  OP_APPEND0,
  OP_COMMIT,
  OP_REGISTER,
  OP_ABORT,
  OP_RELEASE,
  OP_RETAIN,
  OP_FILL,
  OP_COUNT
};
static const char *op_name[] = {"init", "append1", "append_over", "append0", "commit",
                                "register", "abort", "release", "retain", "fill"};

#define ES KVBM_ESTATE
#define EO KVBM_EOVERFLOW
/* Expected status of op (row) on a block in state (column). */
static const int expect_rc[OP_COUNT][S_COUNT] = {
    /*               free freed held partial full complete registered cached */
    [OP_INIT]        = {ES, ES, 0, ES, ES, ES, ES, ES},
    [OP_APPEND1]     = {ES, ES, ES, 0, EO, ES, ES, ES},
    [OP_APPEND_OVER] = {ES, ES, ES, EO, EO, ES, ES, ES},
    [OP_APPEND0]     = {ES, ES, ES, 0, 0, ES, ES, ES},
    [OP_COMMIT]      = {ES, ES, ES, ES, 0, ES, ES, ES},
    [OP_REGISTER]    = {ES, ES, ES, ES, ES, 0, ES, ES},
    [OP_ABORT]       = {ES, ES, ES, 0, 0, 0, ES, ES},
    [OP_RELEASE]     = {ES, ES, 0, 0, 0, 0, 0, ES},
    [OP_RETAIN]      = {ES, ES, 0, 0, 0, 0, 0, 0},
    [OP_FILL]        = {ES, ES, 0, ES, ES, ES, ES, ES},
};

/* Brings a block of a fresh pool to state s; returns its id. */
static uint32_t setup(kvbm_pool *p, enum st s) {
  uint32_t t[BS];
  tu_tokens(t, BS, 77);
  if (s == S_FREE) return NB - 1; /* alloc hands out 0, 1, ... first */
  uint32_t id = tu_alloc1(p);
  if (s == S_HELD) return id;
  assert_int_equal(kvbm_block_init(p, id, 5, 9, true), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, id, t, 2), KVBM_OK);
  if (s == S_PARTIAL) return id;
  if (s == S_FREED) {
    assert_int_equal(kvbm_block_release(p, id, 0), KVBM_OK);
    return id;
  }
  assert_int_equal(kvbm_block_append(p, id, t + 2, BS - 2), KVBM_OK);
  if (s == S_FULL) return id;
  assert_int_equal(kvbm_block_commit(p, id), KVBM_OK);
  if (s == S_COMPLETE) return id;
  uint32_t out;
  assert_int_equal(kvbm_block_register(p, id, &out), KVBM_OK);
  assert_int_equal(out, id);
  if (s == S_REGISTERED) return id;
  assert_int_equal(kvbm_block_release(p, id, 3), KVBM_OK);
  return id;
}

static int apply(kvbm_pool *p, enum op op, uint32_t id, uint32_t *out_id) {
  uint32_t t[BS + 3];
  tu_tokens(t, BS + 3, 1234);
  switch (op) {
    case OP_INIT: return kvbm_block_init(p, id, 11, 0, false);
    case OP_APPEND1: return kvbm_block_append(p, id, t, 1);
    case OP_APPEND_OVER: return kvbm_block_append(p, id, t, 3);
    case OP_APPEND0: return kvbm_block_append(p, id, t, 0);
    case OP_COMMIT: return kvbm_block_commit(p, id);
    case OP_REGISTER: return kvbm_block_register(p, id, out_id);
    case OP_ABORT: return kvbm_block_abort(p, id);
    case OP_RELEASE: return kvbm_block_release(p, id, 7);
    case OP_RETAIN: return kvbm_block_retain(p, id);
    case OP_FILL: return kvbm_block_fill(p, id, 11, 0, false, t, 0xabcdefull, out_id);
    case OP_COUNT: break;
  }
  return KVBM_EINVAL;
}

/* The pool's counts agree with its blocks' infos. */
static void assert_consistent(const kvbm_pool *p) {
  kvbm_pool_stats st = tu_stats(p);
  uint32_t free_ = 0, cached = 0, reg = 0;
  for (uint32_t i = 0; i < st.num_blocks; i++) {
    kvbm_block_info bi;
    assert_int_equal(kvbm_block_info_get(p, i, &bi), KVBM_OK);
    if (bi.refcount == 0) {
      assert_true(bi.state == KVBM_BLOCK_RESET || bi.state == KVBM_BLOCK_REGISTERED);
      if (bi.state == KVBM_BLOCK_RESET) free_++;
      else cached++;
    }
    if (bi.state == KVBM_BLOCK_REGISTERED) {
      reg++;
      assert_true(kvbm_pool_contains(p, bi.seq_hash));
    }
  }
  assert_int_equal(st.free, free_);
  assert_int_equal(st.cached, cached);
  assert_int_equal(st.registered, reg);
  tu_assert_stats_sane(p);
}

/* What an allowed operation must have done. */
static void check_ok(kvbm_pool *p, enum st s, enum op op, uint32_t id, uint32_t out_id,
                     const tu_snap *before, const tu_log *log, size_t nev0) {
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
  const tu_binfo *b0 = &before->b[id];
  kvbm_pool_stats st = tu_stats(p);
  size_t nev = log->n - nev0;
  assert_consistent(p);
  switch (op) {
    case OP_INIT:
      assert_int_equal(bi.state, KVBM_BLOCK_PARTIAL);
      assert_int_equal(bi.refcount, 1);
      assert_int_equal(bi.num_tokens, 0);
      assert_int_equal(bi.salt_hash, 11);
      assert_false(bi.has_parent);
      break;
    case OP_APPEND1:
    case OP_APPEND0: {
      uint32_t add = op == OP_APPEND1 ? 1 : 0;
      assert_int_equal(bi.state, KVBM_BLOCK_PARTIAL);
      assert_int_equal(bi.num_tokens, b0->num_tokens + add);
      if (add) {
        uint32_t t[1];
        tu_tokens(t, 1, 1234);
        assert_int_equal(bi.tokens[b0->num_tokens], t[0]);
      }
      assert_memory_equal(bi.tokens, b0->tokens, b0->num_tokens * sizeof(uint32_t));
      break;
    }
    case OP_COMMIT:
      assert_int_equal(bi.state, KVBM_BLOCK_COMPLETE);
      assert_int_equal(bi.seq_hash, kvbm_hash_next(KVBM_HASH_NATIVE, 5, 9, true, bi.tokens, BS));
      assert_false(kvbm_pool_contains(p, bi.seq_hash)); /* not visible before register */
      break;
    case OP_REGISTER:
    case OP_FILL:
      assert_int_equal(out_id, id);
      assert_int_equal(bi.state, KVBM_BLOCK_REGISTERED);
      assert_int_equal(bi.refcount, 1);
      assert_true(kvbm_pool_contains(p, bi.seq_hash));
      assert_int_equal(st.registered, before->st.registered + 1);
      assert_int_equal(nev, 1);
      assert_int_equal(log->ev[nev0].kind, KVBM_POOL_STORED);
      if (op == OP_FILL) assert_int_equal(bi.seq_hash, 0xabcdefull);
      break;
    case OP_ABORT:
      assert_int_equal(bi.state, KVBM_BLOCK_RESET);
      assert_int_equal(bi.refcount, 1); /* the caller still holds it */
      assert_int_equal(bi.num_tokens, 0);
      assert_int_equal(st.free, before->st.free);
      /* and it can start again */
      assert_int_equal(kvbm_block_init(p, id, 0, 0, false), KVBM_OK);
      break;
    case OP_RELEASE:
      assert_int_equal(bi.refcount, 0);
      if (s == S_REGISTERED) {
        assert_int_equal(bi.state, KVBM_BLOCK_REGISTERED);
        assert_int_equal(bi.priority, 7);
        assert_int_equal(st.cached, before->st.cached + 1);
        assert_int_equal(st.free, before->st.free);
        assert_true(kvbm_pool_contains(p, bi.seq_hash));
      } else {
        assert_int_equal(bi.state, KVBM_BLOCK_RESET);
        assert_int_equal(bi.num_tokens, 0);
        assert_int_equal(st.free, before->st.free + 1);
      }
      assert_int_equal(st.active, before->st.active - 1);
      break;
    case OP_RETAIN:
      assert_int_equal(bi.state, b0->state);
      assert_int_equal(bi.refcount, b0->refcount + 1);
      if (s == S_CACHED) {
        assert_int_equal(st.cached, before->st.cached - 1);
        assert_int_equal(st.active, before->st.active + 1);
      }
      /* the new reference is a real one: two releases are accepted now */
      assert_int_equal(kvbm_block_release(p, id, 0), KVBM_OK);
      if (bi.refcount == 1) {
        assert_int_equal(kvbm_block_release(p, id, 0), KVBM_ESTATE);
      } else {
        assert_int_equal(kvbm_block_release(p, id, 0), KVBM_OK);
      }
      break;
    case OP_APPEND_OVER:
    case OP_COUNT:
      fail_msg("op %s cannot succeed", op_name[op]);
  }
  if (op != OP_REGISTER && op != OP_FILL) assert_int_equal(nev, 0);
}

static void run_state(enum st s) {
  for (int op = 0; op < OP_COUNT; op++) {
    tu_log *log = malloc(sizeof *log);
    assert_non_null(log);
    kvbm_pool *p = tu_pool(NB, BS, KVBM_HASH_NATIVE, false, log);
    uint32_t id = setup(p, s);
    tu_snap *before = tu_snap_new(p);
    size_t nev0 = log->n;
    uint32_t out_id = UINT32_MAX;
    int rc = apply(p, (enum op)op, id, &out_id);
    if (rc != expect_rc[op][s])
      fail_msg("%s on a %s block returned %s, expected %s", op_name[op], st_name[s],
               kvbm_status_name(rc), kvbm_status_name(expect_rc[op][s]));
    if (rc == KVBM_OK) {
      check_ok(p, s, (enum op)op, id, out_id, before, log, nev0);
    } else {
      tu_assert_unchanged(p, before);
      assert_int_equal(log->n, nev0);
      assert_int_equal(out_id, UINT32_MAX);
    }
    free(before);
    kvbm_pool_destroy(p);
    free(log);
  }
}

static void test_from_free(void **state) { (void)state; run_state(S_FREE); }
static void test_from_freed(void **state) { (void)state; run_state(S_FREED); }
static void test_from_held(void **state) { (void)state; run_state(S_HELD); }
static void test_from_partial(void **state) { (void)state; run_state(S_PARTIAL); }
static void test_from_full(void **state) { (void)state; run_state(S_FULL); }
static void test_from_complete(void **state) { (void)state; run_state(S_COMPLETE); }
static void test_from_registered(void **state) { (void)state; run_state(S_REGISTERED); }
static void test_from_cached(void **state) { (void)state; run_state(S_CACHED); }

/* The whole documented cycle: RESET -> PARTIAL -> COMPLETE -> REGISTERED ->
 * cached -> evicted (RESET, handed to a new holder). */
static void test_full_cycle(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(1, BS, KVBM_HASH_NATIVE, false, &log);
  uint64_t h;
  uint32_t id = tu_register_new(p, BS, 0, 0, false, 1, &h);
  assert_int_equal(id, 0);
  assert_int_equal(kvbm_block_release(p, id, 0), KVBM_OK);
  assert_int_equal(tu_state(p, id), KVBM_BLOCK_REGISTERED);
  assert_int_equal(kvbm_pool_available(p), 1);
  uint32_t again = tu_alloc1(p);
  assert_int_equal(again, id);
  assert_int_equal(tu_state(p, id), KVBM_BLOCK_RESET);
  assert_int_equal(tu_refcount(p, id), 1);
  assert_false(kvbm_pool_contains(p, h));
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
  assert_int_equal(bi.num_tokens, 0);
  assert_int_equal(bi.seq_hash, 0);
  assert_false(bi.has_parent);
  assert_int_equal(log.n, 2);
  assert_int_equal(log.ev[1].kind, KVBM_POOL_REMOVED);
  assert_int_equal(log.ev[1].seq_hash, h);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.evicted, 1);
  assert_int_equal(st.allocated, 2);
  assert_int_equal(st.registered, 0);
  /* and it goes round again */
  assert_int_equal(kvbm_block_init(p, id, 0, 0, false), KVBM_OK);
  kvbm_pool_destroy(p);
}

/* Abort after retain: the block stays held by both; each release drops one. */
static void test_abort_shared(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(2, BS, KVBM_HASH_NATIVE, false, NULL);
  uint32_t id = tu_alloc1(p);
  uint32_t t[BS];
  tu_tokens(t, BS, 3);
  assert_int_equal(kvbm_block_init(p, id, 0, 0, false), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, id, t, BS), KVBM_OK);
  assert_int_equal(kvbm_block_retain(p, id), KVBM_OK);
  assert_int_equal(kvbm_block_abort(p, id), KVBM_OK);
  assert_int_equal(tu_refcount(p, id), 2);
  assert_int_equal(kvbm_block_release(p, id, 0), KVBM_OK);
  assert_int_equal(tu_stats(p).free, 1);
  assert_int_equal(kvbm_block_release(p, id, 0), KVBM_OK);
  assert_int_equal(tu_stats(p).free, 2);
  assert_int_equal(kvbm_block_release(p, id, 0), KVBM_ESTATE);
  kvbm_pool_destroy(p);
}

/* Appends in several pieces, up to exactly full; one more token overflows. */
static void test_append_pieces(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(1, 16, KVBM_HASH_DYNAMO, false, NULL);
  uint32_t id = tu_alloc1(p), t[17];
  tu_tokens(t, 17, 8);
  assert_int_equal(kvbm_block_init(p, id, 0, 0, false), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, id, t, 5), KVBM_OK);
  assert_int_equal(kvbm_block_commit(p, id), KVBM_ESTATE);
  assert_int_equal(kvbm_block_append(p, id, t + 5, 10), KVBM_OK);
  tu_snap *s = tu_snap_new(p);
  assert_int_equal(kvbm_block_append(p, id, t + 15, 2), KVBM_EOVERFLOW);
  assert_int_equal(kvbm_block_append(p, id, t + 15, SIZE_MAX), KVBM_EOVERFLOW);
  tu_assert_unchanged(p, s);
  free(s);
  assert_int_equal(kvbm_block_append(p, id, t + 15, 1), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, id, t + 16, 1), KVBM_EOVERFLOW);
  assert_int_equal(kvbm_block_commit(p, id), KVBM_OK);
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
  assert_memory_equal(bi.tokens, t, 16 * sizeof *t);
  assert_int_equal(bi.seq_hash, kvbm_hash_next(KVBM_HASH_DYNAMO, 0, 0, false, t, 16));
  kvbm_pool_destroy(p);
}

/* Every block call with an id out of range: EINVAL, nothing changed. */
static void test_bad_ids(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(NB, BS, KVBM_HASH_NATIVE, false, &log);
  /* some content so that "unchanged" means something */
  uint64_t h;
  uint32_t a = tu_register_new(p, BS, 0, 0, false, 1, &h);
  assert_int_equal(kvbm_block_release(p, a, 2), KVBM_OK);
  uint32_t b = tu_alloc1(p);
  assert_int_equal(kvbm_block_init(p, b, 0, 0, false), KVBM_OK);
  tu_snap *s = tu_snap_new(p);
  size_t nev = log.n;
  uint32_t t[BS] = {1, 2, 3, 4};
  const uint32_t bad[] = {NB, NB + 1, 1000, UINT32_MAX - 1, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    uint32_t id = bad[i], out = 77;
    kvbm_block_info bi;
    assert_int_equal(kvbm_block_init(p, id, 0, 0, false), KVBM_EINVAL);
    assert_int_equal(kvbm_block_append(p, id, t, 1), KVBM_EINVAL);
    assert_int_equal(kvbm_block_commit(p, id), KVBM_EINVAL);
    assert_int_equal(kvbm_block_register(p, id, &out), KVBM_EINVAL);
    assert_int_equal(kvbm_block_abort(p, id), KVBM_EINVAL);
    assert_int_equal(kvbm_block_release(p, id, 0), KVBM_EINVAL);
    assert_int_equal(kvbm_block_retain(p, id), KVBM_EINVAL);
    assert_int_equal(kvbm_block_fill(p, id, 0, 0, false, t, 5, &out), KVBM_EINVAL);
    assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_EINVAL);
    assert_int_equal(out, 77);
  }
  tu_assert_unchanged(p, s);
  assert_int_equal(log.n, nev);
  free(s);
  kvbm_pool_destroy(p);
}

/* NULL where a pointer is needed: EINVAL, nothing changed. */
static void test_null_args(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(NB, BS, KVBM_HASH_NATIVE, false, &log);
  uint64_t h;
  uint32_t a = tu_register_new(p, BS, 0, 0, false, 1, &h);
  uint32_t b = tu_alloc1(p), c = tu_alloc1(p);
  assert_int_equal(kvbm_block_init(p, b, 0, 0, false), KVBM_OK);
  tu_snap *s = tu_snap_new(p);
  size_t nev = log.n;
  uint32_t ids[4];
  size_t matched = 99;
  assert_int_equal(kvbm_pool_alloc(p, 1, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_block_append(p, b, NULL, 1), KVBM_EINVAL);
  assert_int_equal(kvbm_block_fill(p, c, 0, 0, false, NULL, 5, ids), KVBM_EINVAL);
  assert_int_equal(kvbm_block_info_get(p, a, NULL), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_match_prefix(p, NULL, 1, ids, &matched), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_match_prefix(p, &h, 1, NULL, &matched), KVBM_EINVAL);
  assert_int_equal(kvbm_pool_match_prefix(p, &h, 1, ids, NULL), KVBM_EINVAL);
  assert_int_equal(matched, 99);
  tu_assert_unchanged(p, s);
  assert_int_equal(log.n, nev);

  /* Zero-length forms accept NULL and change nothing. */
  assert_int_equal(kvbm_pool_alloc(p, 0, NULL), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, b, NULL, 0), KVBM_OK);
  assert_int_equal(kvbm_pool_match_prefix(p, NULL, 0, NULL, &matched), KVBM_OK);
  assert_int_equal(matched, 0);
  tu_assert_unchanged(p, s);

  /* Optional outputs may be NULL and the call still does its work. */
  assert_int_equal(kvbm_pool_match(p, h, NULL), KVBM_OK);
  assert_int_equal(tu_refcount(p, a), 2);
  uint32_t d = tu_alloc1(p);
  uint32_t t[BS];
  tu_tokens(t, BS, 1); /* same content as a: dedups */
  assert_int_equal(kvbm_block_init(p, d, 0, 0, false), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, d, t, BS), KVBM_OK);
  assert_int_equal(kvbm_block_commit(p, d), KVBM_OK);
  assert_int_equal(kvbm_block_register(p, d, NULL), KVBM_OK);
  assert_int_equal(tu_refcount(p, a), 3);
  kvbm_pool_set_listener(p, NULL, NULL);
  assert_int_equal(kvbm_pool_clear_cache(p), KVBM_OK);
  kvbm_pool_destroy(NULL);
  free(s);
  kvbm_pool_destroy(p);
}

/* kvbm_pool_alloc of more than there is: ENOSPC, nothing changed. */
static void test_alloc_enospc(void **state) {
  (void)state;
  tu_log log;
  kvbm_pool *p = tu_pool(NB, BS, KVBM_HASH_NATIVE, false, &log);
  uint64_t h;
  uint32_t a = tu_register_new(p, BS, 0, 0, false, 1, &h);
  assert_int_equal(kvbm_block_release(p, a, 0), KVBM_OK);
  tu_alloc1(p);
  /* 2 free + 1 cached = 3 available */
  tu_snap *s = tu_snap_new(p);
  size_t nev = log.n;
  uint32_t ids[8];
  for (int i = 0; i < 8; i++) ids[i] = 1000 + (uint32_t)i;
  assert_int_equal(kvbm_pool_alloc(p, 4, ids), KVBM_ENOSPC);
  assert_int_equal(kvbm_pool_alloc(p, UINT32_MAX, ids), KVBM_ENOSPC);
  for (int i = 0; i < 8; i++) assert_int_equal(ids[i], 1000 + (uint32_t)i);
  tu_assert_unchanged(p, s);
  assert_int_equal(log.n, nev);
  assert_int_equal(kvbm_pool_alloc(p, 3, ids), KVBM_OK);
  assert_int_equal(kvbm_pool_alloc(p, 1, ids), KVBM_ENOSPC);
  free(s);
  kvbm_pool_destroy(p);
}

static void test_create_bad_config(void **state) {
  (void)state;
  kvbm_pool *p = (kvbm_pool *)0x1;
  kvbm_error err;
  kvbm_pool_config ok = kvbm_pool_config_default(8, 16);
  assert_int_equal(kvbm_pool_create(NULL, &p, &err), KVBM_EINVAL);
  assert_int_equal(err.code, KVBM_EINVAL);
  assert_true(strlen(err.msg) > 0);
  assert_int_equal(kvbm_pool_create(&ok, NULL, &err), KVBM_EINVAL);
  struct {
    uint32_t nb, bs;
    int scheme;
    const char *word;
  } bad[] = {
      {0, 16, KVBM_HASH_NATIVE, "num_blocks"},
      {KVBM_POOL_MAX_BLOCKS + 1, 16, KVBM_HASH_NATIVE, "num_blocks"},
      {1u << 31, 16, KVBM_HASH_NATIVE, "num_blocks"},
      {UINT32_MAX, 16, KVBM_HASH_NATIVE, "num_blocks"},
      {8, 0, KVBM_HASH_NATIVE, "block_size"},
      {8, KVBM_POOL_MAX_BLOCK_SIZE + 1, KVBM_HASH_NATIVE, "block_size"},
      {8, UINT32_MAX, KVBM_HASH_NATIVE, "block_size"},
      {8, 16, 2, "scheme"},
      {8, 16, -1, "scheme"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kvbm_pool_config c = ok;
    c.num_blocks = bad[i].nb;
    c.block_size = bad[i].bs;
    c.scheme = (kvbm_hash_scheme)bad[i].scheme;
    kvbm_error_clear(&err);
    assert_int_equal(kvbm_pool_create(&c, &p, &err), KVBM_EINVAL);
    assert_int_equal(err.code, KVBM_EINVAL);
    if (!strstr(err.msg, bad[i].word)) fail_msg("message '%s' does not name %s", err.msg, bad[i].word);
    assert_ptr_equal(p, (kvbm_pool *)0x1); /* *out untouched */
    assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_EINVAL);
  }
  /* The edges that are allowed. */
  kvbm_pool_config c = ok;
  c.num_blocks = 1;
  c.block_size = KVBM_POOL_MAX_BLOCK_SIZE;
  assert_int_equal(kvbm_pool_create(&c, &p, &err), KVBM_OK);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.num_blocks, 1);
  assert_int_equal(st.block_size, KVBM_POOL_MAX_BLOCK_SIZE);
  assert_int_equal(kvbm_pool_block_size(p), KVBM_POOL_MAX_BLOCK_SIZE);
  assert_int_equal(kvbm_pool_num_blocks(p), 1);
  assert_int_equal(kvbm_pool_scheme(p), KVBM_HASH_NATIVE);
  assert_int_equal(st.free, 1);
  kvbm_pool_destroy(p);
  c.block_size = 1;
  assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_OK);
  kvbm_pool_destroy(p);
}

static void test_fresh_pool(void **state) {
  (void)state;
  kvbm_pool *p = tu_pool(5, 3, KVBM_HASH_NATIVE, false, NULL);
  kvbm_pool_stats st = tu_stats(p);
  assert_int_equal(st.num_blocks, 5);
  assert_int_equal(st.block_size, 3);
  assert_int_equal(st.free, 5);
  assert_int_equal(st.cached + st.active + st.registered, 0);
  assert_int_equal(st.allocated + st.evicted + st.dedup + st.match_hits, 0);
  for (uint32_t i = 0; i < 5; i++) {
    assert_int_equal(tu_state(p, i), KVBM_BLOCK_RESET);
    assert_int_equal(tu_refcount(p, i), 0);
  }
  /* The first allocations are ids 0, 1, 2... and each has one reference. */
  uint32_t ids[5];
  assert_int_equal(kvbm_pool_alloc(p, 5, ids), KVBM_OK);
  for (uint32_t i = 0; i < 5; i++) {
    assert_int_equal(ids[i], i);
    assert_int_equal(tu_refcount(p, i), 1);
  }
  st = tu_stats(p);
  assert_int_equal(st.active, 5);
  assert_int_equal(st.allocated, 5);
  assert_string_equal(kvbm_block_state_name(KVBM_BLOCK_RESET), "reset");
  assert_string_equal(kvbm_block_state_name(KVBM_BLOCK_PARTIAL), "partial");
  assert_string_equal(kvbm_block_state_name(KVBM_BLOCK_COMPLETE), "complete");
  assert_string_equal(kvbm_block_state_name(KVBM_BLOCK_REGISTERED), "registered");
  assert_string_equal(kvbm_block_state_name((kvbm_block_state)42), "unknown");
  kvbm_pool_destroy(p);
}


/* A fill_only pool (a lower tier's index): blocks filled whole register
 * and dedup as usual and their events carry the caller's tokens, but no
 * token is kept, and building a block token by token is refused. */
static void test_fill_only(void **state) {
  (void)state;
  static tu_log log;
  kvbm_pool_config c = kvbm_pool_config_default(4, 4);
  c.keep_tokens = false;
  c.fill_only = true;
  c.listener = tu_listener;
  c.listener_user = &log;
  memset(&log, 0, sizeof log);
  kvbm_pool *p;
  assert_int_equal(kvbm_pool_create(&c, &p, NULL), KVBM_OK);
  uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, ids[2], got;
  uint64_t h[2] = {11, 12};
  assert_int_equal(kvbm_pool_alloc(p, 1, ids), KVBM_OK);
  assert_int_equal(kvbm_block_init(p, ids[0], 0, 0, false), KVBM_EUNSUPPORTED);
  assert_int_equal(kvbm_block_append(p, ids[0], tok, 1), KVBM_EUNSUPPORTED);
  assert_int_equal(kvbm_block_fill(p, ids[0], 0, 0, false, tok, h[0], &got), KVBM_OK);
  assert_int_equal(got, ids[0]);
  kvbm_block_info info;
  assert_int_equal(kvbm_block_info_get(p, got, &info), KVBM_OK);
  assert_null(info.tokens);
  assert_int_equal(log.n, 1);
  assert_int_equal(log.ev[0].num_tokens, 4);
  assert_memory_equal(log.ev[0].tokens, tok, 4 * sizeof *tok);
  uint32_t run[2];
  assert_int_equal(kvbm_pool_fill_run(p, 0, h[0], true, tok + 4, h + 1, 1, run), KVBM_OK);
  assert_true(kvbm_pool_contains(p, 12));
  /* a second fill of hash 11 dedups to the first block */
  assert_int_equal(kvbm_pool_alloc(p, 1, ids + 1), KVBM_OK);
  assert_int_equal(kvbm_block_fill(p, ids[1], 0, 0, false, tok, h[0], &got), KVBM_OK);
  assert_int_equal(got, ids[0]);
  kvbm_pool_destroy(p);
  /* keeping tokens needs slots */
  c.keep_tokens = true;
  kvbm_error err;
  assert_int_equal(kvbm_pool_create(&c, &p, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "fill_only"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fill_only),
      cmocka_unit_test(test_from_free),
      cmocka_unit_test(test_from_freed),
      cmocka_unit_test(test_from_held),
      cmocka_unit_test(test_from_partial),
      cmocka_unit_test(test_from_full),
      cmocka_unit_test(test_from_complete),
      cmocka_unit_test(test_from_registered),
      cmocka_unit_test(test_from_cached),
      cmocka_unit_test(test_full_cycle),
      cmocka_unit_test(test_abort_shared),
      cmocka_unit_test(test_append_pieces),
      cmocka_unit_test(test_bad_ids),
      cmocka_unit_test(test_null_args),
      cmocka_unit_test(test_alloc_enospc),
      cmocka_unit_test(test_create_bad_config),
      cmocka_unit_test(test_fresh_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
