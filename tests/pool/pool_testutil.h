/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool_testutil.h: helpers shared by the block pool tests.
 *
 * - an event recorder for the pool listener (copies each event, tokens
 *   included, since the pointer is only valid during the call);
 * - a snapshot of everything observable about a pool (stats, every block's
 *   info and tokens, the registered set) so that a test can check that a
 *   refused call changed nothing;
 * - small helpers that bring a block to a given state.
 */
#ifndef KVBM_TESTS_POOL_TESTUTIL_H
#define KVBM_TESTS_POOL_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvbm/pool.h"

#define TU_MAX_BS 16
#define TU_MAX_EVENTS 8192
#define TU_MAX_BLOCKS 256

typedef struct tu_event {
  kvbm_pool_event_kind kind;
  uint32_t block_id;
  uint64_t seq_hash, parent_hash, salt_hash;
  bool has_parent;
  uint32_t num_tokens;
  uint32_t tokens[TU_MAX_BS];
} tu_event;

typedef struct tu_log {
  tu_event ev[TU_MAX_EVENTS];
  size_t n;
  bool overflow;
} tu_log;

static inline void tu_listener(void *user, const kvbm_pool_event *ev) {
  tu_log *log = user;
  if (log->n == TU_MAX_EVENTS) {
    log->overflow = true;
    return;
  }
  tu_event *e = &log->ev[log->n++];
  memset(e, 0, sizeof *e);
  e->kind = ev->kind;
  e->block_id = ev->block_id;
  e->seq_hash = ev->seq_hash;
  if (ev->kind == KVBM_POOL_STORED) {
    e->parent_hash = ev->parent_hash;
    e->has_parent = ev->has_parent;
    e->salt_hash = ev->salt_hash;
    e->num_tokens = ev->num_tokens;
    if (ev->tokens && ev->num_tokens <= TU_MAX_BS)
      memcpy(e->tokens, ev->tokens, ev->num_tokens * sizeof *ev->tokens);
  }
}

/* A pool with a recorder attached. */
static inline kvbm_pool *tu_pool(uint32_t num_blocks, uint32_t block_size,
                                 kvbm_hash_scheme scheme, bool allow_dup, tu_log *log) {
  kvbm_pool_config cfg = kvbm_pool_config_default(num_blocks, block_size);
  cfg.scheme = scheme;
  cfg.allow_duplicates = allow_dup;
  if (log) {
    memset(log, 0, sizeof *log);
    cfg.listener = tu_listener;
    cfg.listener_user = log;
  }
  kvbm_pool *p = NULL;
  kvbm_error err;
  assert_int_equal(kvbm_pool_create(&cfg, &p, &err), KVBM_OK);
  assert_non_null(p);
  return p;
}

/* ---- snapshots ------------------------------------------------------------ */

typedef struct tu_binfo {
  kvbm_block_state state;
  uint32_t refcount, num_tokens;
  uint64_t seq_hash, parent_hash, salt_hash;
  bool has_parent;
  uint8_t priority;
  bool has_tokens; /* info.tokens was not NULL */
  uint32_t tokens[TU_MAX_BS];
} tu_binfo;

typedef struct tu_snap {
  kvbm_pool_stats st;
  uint32_t available;
  tu_binfo b[TU_MAX_BLOCKS];
  uint32_t nreg;
  uint32_t reg_id[TU_MAX_BLOCKS];
  uint64_t reg_hash[TU_MAX_BLOCKS];
  bool reg_contained[TU_MAX_BLOCKS];
} tu_snap;

static inline void tu_collect_reg(void *user, uint32_t id, uint64_t h) {
  tu_snap *s = user;
  assert_true(s->nreg < TU_MAX_BLOCKS);
  s->reg_id[s->nreg] = id;
  s->reg_hash[s->nreg] = h;
  s->nreg++;
}

static inline void tu_binfo_get(const kvbm_pool *p, uint32_t id, uint32_t bs, tu_binfo *o) {
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
  memset(o, 0, sizeof *o);
  o->state = bi.state;
  o->refcount = bi.refcount;
  o->num_tokens = bi.num_tokens;
  o->seq_hash = bi.seq_hash;
  o->parent_hash = bi.parent_hash;
  o->salt_hash = bi.salt_hash;
  o->has_parent = bi.has_parent;
  o->priority = bi.priority;
  o->has_tokens = bi.tokens != NULL;
  if (bi.tokens) memcpy(o->tokens, bi.tokens, bs * sizeof *bi.tokens);
}

static inline void tu_snap_take(const kvbm_pool *p, tu_snap *s) {
  memset(s, 0, sizeof *s);
  kvbm_pool_stats_get(p, &s->st);
  assert_true(s->st.num_blocks <= TU_MAX_BLOCKS);
  assert_true(s->st.block_size <= TU_MAX_BS);
  s->available = kvbm_pool_available(p);
  for (uint32_t i = 0; i < s->st.num_blocks; i++) tu_binfo_get(p, i, s->st.block_size, &s->b[i]);
  kvbm_pool_foreach_registered(p, tu_collect_reg, s);
  for (uint32_t i = 0; i < s->nreg; i++) s->reg_contained[i] = kvbm_pool_contains(p, s->reg_hash[i]);
}

static inline void tu_assert_stats_equal(const kvbm_pool_stats *a, const kvbm_pool_stats *b) {
  assert_int_equal(a->num_blocks, b->num_blocks);
  assert_int_equal(a->block_size, b->block_size);
  assert_int_equal(a->free, b->free);
  assert_int_equal(a->cached, b->cached);
  assert_int_equal(a->active, b->active);
  assert_int_equal(a->registered, b->registered);
  assert_int_equal(a->allocated, b->allocated);
  assert_int_equal(a->evicted, b->evicted);
  assert_int_equal(a->dedup, b->dedup);
  assert_int_equal(a->match_hits, b->match_hits);
}

static inline void tu_assert_binfo_equal(const tu_binfo *a, const tu_binfo *b) {
  assert_int_equal(a->state, b->state);
  assert_int_equal(a->refcount, b->refcount);
  assert_int_equal(a->num_tokens, b->num_tokens);
  assert_int_equal(a->seq_hash, b->seq_hash);
  assert_int_equal(a->parent_hash, b->parent_hash);
  assert_int_equal(a->salt_hash, b->salt_hash);
  assert_int_equal(a->has_parent, b->has_parent);
  assert_int_equal(a->priority, b->priority);
  assert_int_equal(a->has_tokens, b->has_tokens);
  assert_memory_equal(a->tokens, b->tokens, sizeof a->tokens);
}

/* Asserts that the pool looks exactly as when `before` was taken. */
static inline void tu_assert_unchanged(const kvbm_pool *p, const tu_snap *before) {
  tu_snap *now = malloc(sizeof *now);
  assert_non_null(now);
  tu_snap_take(p, now);
  tu_assert_stats_equal(&now->st, &before->st);
  assert_int_equal(now->available, before->available);
  for (uint32_t i = 0; i < now->st.num_blocks; i++) tu_assert_binfo_equal(&now->b[i], &before->b[i]);
  assert_int_equal(now->nreg, before->nreg);
  for (uint32_t i = 0; i < now->nreg; i++) {
    assert_int_equal(now->reg_id[i], before->reg_id[i]);
    assert_int_equal(now->reg_hash[i], before->reg_hash[i]);
    assert_int_equal(now->reg_contained[i], before->reg_contained[i]);
  }
  free(now);
}

static inline tu_snap *tu_snap_new(const kvbm_pool *p) {
  tu_snap *s = malloc(sizeof *s);
  assert_non_null(s);
  tu_snap_take(p, s);
  return s;
}

/* Checks the stats' own invariant: free + cached + active == num_blocks. */
static inline void tu_assert_stats_sane(const kvbm_pool *p) {
  kvbm_pool_stats st;
  kvbm_pool_stats_get(p, &st);
  assert_int_equal(st.free + st.cached + st.active, st.num_blocks);
  assert_int_equal(kvbm_pool_available(p), st.free + st.cached);
  assert_true(st.cached <= st.registered);
}

/* ---- tokens and blocks ------------------------------------------------------ */

static inline void tu_tokens(uint32_t *t, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 0x9e3779b9u;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t[i] = x;
  }
}

static inline uint32_t tu_alloc1(kvbm_pool *p) {
  uint32_t id = UINT32_MAX;
  assert_int_equal(kvbm_pool_alloc(p, 1, &id), KVBM_OK);
  return id;
}

/* Allocates a block and takes it through init/append/commit/register with
 * tokens made from `seed`; returns the id that holds the content (the
 * registered one after a dedup). */
static inline uint32_t tu_register_new(kvbm_pool *p, uint32_t bs, uint64_t salt, uint64_t parent,
                                       bool has_parent, uint32_t seed, uint64_t *hash_out) {
  uint32_t t[TU_MAX_BS];
  tu_tokens(t, bs, seed);
  uint32_t id = tu_alloc1(p);
  assert_int_equal(kvbm_block_init(p, id, salt, parent, has_parent), KVBM_OK);
  assert_int_equal(kvbm_block_append(p, id, t, bs), KVBM_OK);
  assert_int_equal(kvbm_block_commit(p, id), KVBM_OK);
  uint32_t out = UINT32_MAX;
  assert_int_equal(kvbm_block_register(p, id, &out), KVBM_OK);
  if (hash_out) {
    kvbm_block_info bi;
    assert_int_equal(kvbm_block_info_get(p, out, &bi), KVBM_OK);
    *hash_out = bi.seq_hash;
  }
  return out;
}

/* Allocates a block and fills it under a caller-chosen sequence hash. */
static inline uint32_t tu_fill_new(kvbm_pool *p, uint32_t bs, uint64_t seq_hash, uint32_t seed) {
  uint32_t t[TU_MAX_BS];
  tu_tokens(t, bs, seed);
  uint32_t id = tu_alloc1(p);
  uint32_t out = UINT32_MAX;
  assert_int_equal(kvbm_block_fill(p, id, 0, 0, false, t, seq_hash, &out), KVBM_OK);
  return out;
}

static inline kvbm_block_state tu_state(const kvbm_pool *p, uint32_t id) {
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
  return bi.state;
}

static inline uint32_t tu_refcount(const kvbm_pool *p, uint32_t id) {
  kvbm_block_info bi;
  assert_int_equal(kvbm_block_info_get(p, id, &bi), KVBM_OK);
  return bi.refcount;
}

static inline kvbm_pool_stats tu_stats(const kvbm_pool *p) {
  kvbm_pool_stats st;
  kvbm_pool_stats_get(p, &st);
  return st;
}

/* Registry geometry, as src/pool/pool.c has it: the smallest power of two
 * >= 2 of 7-entry buckets with 2 * buckets >= num_blocks; a hash's 32-bit
 * fingerprint is (lo32 ^ hi32), its home bucket (fp * 0x9E3779B1) >> (32 -
 * log2(buckets)). The tests use this only to make hashes that collide on
 * purpose (more than 7 to a bucket overflow into the next ones); if the
 * pool's mapping changes, such hashes are still valid, merely no longer
 * colliding. "slot" below means home bucket. */
static inline unsigned tu_table_bits(uint32_t num_blocks) {
  unsigned bits = 1;
  uint64_t size = 2;
  while (size * 2 < num_blocks) size <<= 1, bits++;
  return bits;
}

static inline uint32_t tu_fingerprint(uint64_t hash) { return (uint32_t)(hash ^ (hash >> 32)); }

static inline uint32_t tu_home_of(uint32_t num_blocks, uint64_t hash) {
  return (uint32_t)(tu_fingerprint(hash) * 0x9E3779B1u) >> (32 - tu_table_bits(num_blocks));
}

static inline uint32_t tu_inverse32(uint32_t k) {
  uint32_t x = k; /* right to 3 bits for odd k; each step doubles that */
  for (int i = 0; i < 5; i++) x *= 2 - k * x;
  return x;
}

static inline uint64_t tu_mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* A hash whose home slot is `slot` in a pool of num_blocks (< 2^30).
 * Different `salt`s give different hashes; salts equal but for their two
 * low bits give hashes with the same fingerprint (so the pool must tell
 * them apart by the full hash). */
static inline uint64_t tu_hash_at_slot(uint32_t num_blocks, uint32_t slot, uint64_t salt) {
  unsigned bits = tu_table_bits(num_blocks);
  uint32_t low = (uint32_t)tu_mix64(salt >> 2) & ((1u << (32 - bits)) - 1);
  uint32_t fp = ((slot << (32 - bits)) | low) * tu_inverse32(0x9E3779B1u);
  uint32_t hi = (uint32_t)tu_mix64(salt * 2 + 1);
  return (uint64_t)hi << 32 | (fp ^ hi);
}

#endif
