/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the tier tests: a config over a temporary directory,
 * hash-derived block contents, and one request's full life. */
#ifndef KVBM_TIER_TESTUTIL_H
#define KVBM_TIER_TESTUTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvbm/hash.h"
#include "kvbm/manager.h"

static inline uint64_t tu_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Fills (or checks, returning 0 on a mismatch) layer l of a block whose
 * content is keyed by `key`. */
static inline int tu_layer(uint8_t *p, size_t n, uint64_t key, uint32_t l, int check) {
  uint64_t x = key ^ ((uint64_t)l << 48);
  for (size_t i = 0; i < n; i++) {
    if (i % 8 == 0) x = tu_mix(x);
    uint8_t v = (uint8_t)(x >> (8 * (i % 8)));
    if (check && p[i] != v) return 0;
    if (!check) p[i] = v;
  }
  return 1;
}

/* Writes (check = 0) or checks (check = 1) G1 block `id` as holding the KV
 * of the block with sequence hash `h`. */
static inline int tu_block(kvbm_manager *m, uint32_t id, uint64_t h, int check) {
  const kvbm_layout *L = kvbm_manager_layout(m, KVBM_TIER_G1);
  int ok = 1;
  /* Through kvbm_manager_block_write/read: G1 may be device memory. */
  uint8_t *buf = malloc(L->layer_stride);
  for (uint32_t l = 0; ok && buf && l < L->config.num_layers; l++) {
    void *p;
    size_t sz;
    if (kvbm_manager_block_layer(m, KVBM_TIER_G1, id, l, &p, &sz)) ok = 0;
    else if (check)
      ok = kvbm_manager_block_read(m, KVBM_TIER_G1, id, l, buf, sz, NULL) == KVBM_OK &&
           tu_layer(buf, sz, h, l, 1);
    else
      ok = tu_layer(buf, sz, h, l, 0) &&
           kvbm_manager_block_write(m, KVBM_TIER_G1, id, l, buf, sz, NULL) == KVBM_OK;
  }
  free(buf);
  return ok && buf;
}

/* Writes the KV of every full block from block `from` on. */
static inline void tu_compute(kvbm_manager *m, kvbm_mreq *r, size_t from) {
  const uint32_t *ids;
  size_t n;
  kvbm_mreq_blocks(r, &ids, &n);
  kvbm_mreq_info info;
  kvbm_mreq_poll(r, &info);
  size_t full = info.num_tokens / 4; /* the tests use block_size 4 */
  for (size_t k = from; k < full; k++) {
    if (!kvbm_mreq_must_compute(r, k)) continue;
    uint64_t h;
    kvbm_mreq_block_hash(r, k, &h);
    tu_block(m, ids[k], h, 0);
  }
}

/* Counts the first `n` blocks of r whose bytes are right. */
static inline size_t tu_verify(kvbm_manager *m, kvbm_mreq *r, size_t n) {
  const uint32_t *ids;
  size_t nb, good = 0;
  kvbm_mreq_blocks(r, &ids, &nb);
  for (size_t k = 0; k < n && k < nb; k++) {
    uint64_t h;
    kvbm_mreq_block_hash(r, k, &h);
    good += (size_t)tu_block(m, ids[k], h, 1);
  }
  return good;
}

/* Prompt of n tokens numbered from base. */
static inline uint32_t *tu_prompt(uint32_t base, size_t n) {
  uint32_t *t = malloc(n * sizeof *t);
  for (size_t i = 0; i < n; i++) t[i] = base + (uint32_t)i;
  return t;
}

/* A small config: block size 4, 3 layers x 2 x 4 tokens x 8 x 2 bytes
 * (128-byte layers, 384-byte blocks), alignment 256 (padding in both
 * kinds). */
static inline kvbm_manager_config tu_config(const char *dir, uint32_t g1, uint32_t g2, uint64_t g3) {
  kvbm_manager_config c = kvbm_manager_config_default();
  c.block_size = 4;
  c.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 3, .outer_dim = 2,
                                  .page_size = 4, .inner_dim = 8, .dtype_size = 2,
                                  .alignment = 256};
  c.g1_blocks = g1;
  c.g2_blocks = g2;
  c.g3_blocks = g3;
  c.g3_dir = dir;
  c.g3_policy = KVBM_OFFLOAD_ALL;
  return c;
}

/* kvbm_manager_create, printing why it failed (the tests then assert
 * non-NULL). */
static inline kvbm_manager *tu_create(const kvbm_manager_config *c) {
  kvbm_manager *m = NULL;
  kvbm_error e = {0};
  if (kvbm_manager_create(c, &m, &e)) {
    fprintf(stderr, "create: %s\n", e.msg);
    return NULL;
  }
  return m;
}

/* Tier ti's counters; a refusal (no manager, no such tier) fails the test
 * at once. */
static inline kvbm_tier_stats tu_stats(kvbm_manager *m, kvbm_tier ti) {
  kvbm_tier_stats s;
  if (kvbm_manager_stats_get(m, ti, &s)) {
    fprintf(stderr, "kvbm_manager_stats_get(%d) failed\n", (int)ti);
    abort();
  }
  return s;
}

/* A fresh directory under the build tree. */
static inline char *tu_tmpdir(const char *tag) {
  char *p = malloc(512);
  snprintf(p, 512, "%s/tier-%s-XXXXXX", KVBM_BINARY_DIR, tag);
  if (!mkdtemp(p)) {
    snprintf(p, 512, "/tmp/tier-%s-XXXXXX", tag);
    if (!mkdtemp(p)) abort();
  }
  return p;
}

static inline void tu_rmdir(char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  free(dir);
}

/* One request's whole life: prefill, wait, compute the misses, commit,
 * flush, and (unless keep) destroy. Returns the settled match in tokens. */
static inline size_t tu_run(kvbm_manager *m, const uint32_t *tok, size_t n, kvbm_mreq_info *info,
                            kvbm_mreq **keep) {
  kvbm_mreq *r = NULL;
  size_t opt;
  kvbm_mreq_info i;
  memset(&i, 0, sizeof i);
  if (info) *info = i;
  if (keep) *keep = NULL;
  if (kvbm_manager_prefill(m, 0, 0, tok, n, &r, &opt, NULL)) return SIZE_MAX;
  kvbm_mreq_wait(r, -1, &i);
  tu_compute(m, r, i.matched_tokens / 4);
  kvbm_mreq_commit(r);
  kvbm_manager_flush(m);
  if (info) *info = i;
  if (keep) *keep = r;
  else kvbm_mreq_destroy(r);
  return i.matched_tokens;
}

/* The sequence hashes of tok's first nfull blocks of bs tokens, in the
 * manager's scheme, unsalted. */
static inline void tu_hashes(kvbm_manager *m, const uint32_t *tok, size_t nfull, uint32_t bs,
                             uint64_t *h) {
  for (size_t k = 0; k < nfull; k++)
    h[k] = kvbm_hash_next(kvbm_manager_hash_scheme(m), 0, k ? h[k - 1] : 0, k > 0, tok + k * bs, bs);
}

/* The first TU_G1_LOG STORED events of G1, hash and group, in order:
 * zero it, then tu_g1_log_attach before creating the manager. Safe from
 * any thread (a peer's link thread registers blocks too). */
#define TU_G1_LOG 128
typedef struct tu_g1_log {
  pthread_mutex_t mu; /* zeroed: glibc's default mutex */
  uint64_t hash[TU_G1_LOG];
  uint32_t group[TU_G1_LOG];
  size_t n;
} tu_g1_log;

static inline void tu_g1_log_on(void *user, const kvbm_pool_event *ev) {
  tu_g1_log *l = user;
  if (ev->kind != KVBM_POOL_STORED) return;
  pthread_mutex_lock(&l->mu);
  if (l->n < TU_G1_LOG) {
    l->hash[l->n] = ev->seq_hash;
    l->group[l->n++] = ev->group;
  }
  pthread_mutex_unlock(&l->mu);
}

static inline void tu_g1_log_attach(kvbm_manager_config *c, tu_g1_log *l) {
  c->listener[KVBM_TIER_G1] = tu_g1_log_on;
  c->listener_user[KVBM_TIER_G1] = l;
}

/* Whether (hash, group) was stored. */
static inline bool tu_g1_logged(const tu_g1_log *l, uint64_t hash, uint32_t group) {
  for (size_t i = 0; i < l->n; i++)
    if (l->hash[i] == hash && l->group[i] == group) return true;
  return false;
}

#endif
