/* SPDX-License-Identifier: Apache-2.0 */
/*
 * approx.c: approximate routing for engines that publish no events.
 *
 * Each decision is stored in the index as if the chosen worker had stored
 * the request's blocks on device, and removed again `ttl` seconds later.
 * The index counts copies, so a prefix routed twice to one worker stays
 * until its second record expires.
 *
 * Bounded. Nothing from the engine ever removes these blocks, so what a
 * client sends is all that limits them: 40 requests of 390 k new hashes
 * each once took a router to 15.6 M entries and 2.2 GB. So every worker
 * has a budget of blocks (max_blocks_per_worker, copies counted, which
 * bounds its distinct entries too): a decision that would pass it first
 * evicts that worker's oldest decisions, early, and counts them. A single
 * decision longer than the budget keeps its first blocks (a prefix is what
 * routing reads; the tail is counted as truncated). Memory is then at most
 * workers x budget x (8 bytes here + the index's slot).
 *
 * Records sit in one FIFO per worker slot (times never go back, so each is
 * in time order): expiry and eviction both pop from a head, O(1) per
 * record; expiry looks at the head of each of the 64 slots.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/router.h"

typedef struct rec {
  double t;
  size_t n;
  uint64_t *hashes;
} rec;

typedef struct ring {
  rec *q;
  size_t head, n, cap;
  size_t blocks; /* sum of n over its records */
} ring;

struct kvbm_approx {
  kvbm_index *idx;
  kvbm_approx_config cfg;
  double last;
  ring r[KVBM_ROUTER_MAX_WORKERS];
  size_t records, blocks; /* over all slots */
  uint64_t recorded, expired, evicted_records, evicted_blocks, truncated_blocks;
};

kvbm_approx_config kvbm_approx_config_default(void) {
  return (kvbm_approx_config){.ttl_s = 120, .max_blocks_per_worker = 65536};
}

int kvbm_approx_create(kvbm_index *idx, const kvbm_approx_config *cfg, kvbm_approx **out,
                       kvbm_error *err) {
  if (!idx || !cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "router approx: NULL argument");
  if (!isfinite(cfg->ttl_s) || cfg->ttl_s <= 0)
    return kvbm_error_set(err, KVBM_EINVAL, "router approx: ttl %g s is not a finite number > 0",
                          cfg->ttl_s);
  if (cfg->max_blocks_per_worker < 1)
    return kvbm_error_set(err, KVBM_EINVAL, "router approx: max_blocks_per_worker must be >= 1");
  kvbm_approx *a = calloc(1, sizeof *a);
  if (!a) return kvbm_error_set(err, KVBM_ENOMEM, "router approx: out of memory");
  a->idx = idx;
  a->cfg = *cfg;
  a->last = -INFINITY;
  *out = a;
  return KVBM_OK;
}

void kvbm_approx_destroy(kvbm_approx *a) {
  if (!a) return;
  for (int s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++) {
    ring *r = &a->r[s];
    for (size_t i = 0; i < r->n; i++) free(r->q[(r->head + i) % r->cap].hashes);
    free(r->q);
  }
  free(a);
}

size_t kvbm_approx_pending(const kvbm_approx *a) { return a->records; }

/* A snapshot holds the engines' blocks only: the records' copies are taken
 * out of the index while it is written (writer lock held throughout), then
 * put back. Without this a restored router would keep decisions that no
 * record removes any more. */
void kvbm__approx_withdraw(kvbm_approx *a) {
  for (uint32_t s = 0; a && s < KVBM_ROUTER_MAX_WORKERS; s++)
    for (size_t i = 0; i < a->r[s].n; i++) {
      const rec *x = &a->r[s].q[(a->r[s].head + i) % a->r[s].cap];
      kvbm_index_remove(a->idx, s, KVBM_TIER_G1, x->hashes, x->n);
    }
}

void kvbm__approx_return(kvbm_approx *a) {
  for (uint32_t s = 0; a && s < KVBM_ROUTER_MAX_WORKERS; s++)
    for (size_t i = 0; i < a->r[s].n; i++) {
      const rec *x = &a->r[s].q[(a->r[s].head + i) % a->r[s].cap];
      /* the slot was live when they were taken out and nothing ran since:
       * storing them again can only fail for memory, and then the record
       * removes what it finds when it expires, as ever */
      kvbm_index_store(a->idx, s, KVBM_TIER_G1, x->hashes, x->n);
    }
}

/* The index forgot every block of slot s (AllBlocksCleared, a restarted
 * engine, a worker dropped): the copies the slot's records had added went
 * with them. Their records must go too, without touching the index: one
 * left behind would later remove (at its expiry, an eviction, or each time
 * /index or a snapshot withdraws the records) a copy that the engine's own
 * stores hold since, and the index would lack the worker's blocks (W5: a
 * router replica 32 blocks short after a NATS restart, docs/areas/cluster.md).
 * Records are kept for a worker whose events cannot be trusted; a clear or
 * a restart makes it whole again, so nothing they said is needed. */
void kvbm__approx_forget(kvbm_approx *a, uint32_t s) {
  if (!a || s >= KVBM_ROUTER_MAX_WORKERS) return;
  ring *r = &a->r[s];
  for (size_t i = 0; i < r->n; i++) free(r->q[(r->head + i) % r->cap].hashes);
  a->blocks -= r->blocks;
  a->records -= r->n;
  r->head = r->n = r->blocks = 0;
}

void kvbm_approx_stats_get(const kvbm_approx *a, kvbm_approx_stats *out) {
  memset(out, 0, sizeof *out);
  out->records = a->records;
  out->blocks = a->blocks;
  for (int s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++)
    if (a->r[s].blocks > out->max_worker_blocks) out->max_worker_blocks = a->r[s].blocks;
  out->recorded = a->recorded;
  out->expired = a->expired;
  out->evicted_records = a->evicted_records;
  out->evicted_blocks = a->evicted_blocks;
  out->truncated_blocks = a->truncated_blocks;
}

/* Forgets the oldest record of slot s: out of the index, out of memory. */
static void pop(kvbm_approx *a, uint32_t s) {
  ring *r = &a->r[s];
  rec *x = &r->q[r->head];
  /* the slot may have been dropped and reused meanwhile: removing then
   * only decrements copies this record added, or finds nothing */
  kvbm_index_remove(a->idx, s, KVBM_TIER_G1, x->hashes, x->n);
  free(x->hashes);
  r->blocks -= x->n;
  a->blocks -= x->n;
  a->records--;
  r->head = (r->head + 1) % r->cap;
  r->n--;
}

size_t kvbm_approx_expire(kvbm_approx *a, double now) {
  size_t gone = 0;
  for (uint32_t s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++) {
    ring *r = &a->r[s];
    while (r->n && r->q[r->head].t + a->cfg.ttl_s <= now) {
      pop(a, s);
      gone++;
    }
  }
  a->expired += gone;
  return gone;
}

static bool grow(ring *r) {
  size_t cap = r->cap ? r->cap * 2 : 16;
  rec *q = malloc(cap * sizeof *q);
  if (!q) return false;
  for (size_t i = 0; i < r->n; i++) q[i] = r->q[(r->head + i) % r->cap];
  free(r->q);
  r->q = q;
  r->cap = cap;
  r->head = 0;
  return true;
}

int kvbm_approx_record(kvbm_approx *a, uint32_t slot, const uint64_t *hashes, size_t n,
                       double now, kvbm_error *err) {
  if (!a || (n && !hashes)) return kvbm_error_set(err, KVBM_EINVAL, "router approx: NULL argument");
  if (!isfinite(now) || now < a->last)
    return kvbm_error_set(err, KVBM_EINVAL, "router approx: time %g goes back (last %g)", now,
                          a->last);
  a->last = now;
  kvbm_approx_expire(a, now);
  if (slot >= KVBM_ROUTER_MAX_WORKERS || !(kvbm_index_workers(a->idx) >> slot & 1))
    return kvbm_error_set(err, KVBM_EINVAL, "router approx: slot %u is not a live worker", slot);
  size_t max = a->cfg.max_blocks_per_worker;
  if (n > max) { /* the prefix is what routing reads */
    a->truncated_blocks += n - max;
    n = max;
  }
  ring *r = &a->r[slot];
  if (r->n == r->cap && !grow(r))
    return kvbm_error_set(err, KVBM_ENOMEM, "router approx: out of memory");
  uint64_t *copy = malloc((n ? n : 1) * sizeof *copy);
  if (!copy) return kvbm_error_set(err, KVBM_ENOMEM, "router approx: out of memory");
  if (n) memcpy(copy, hashes, n * sizeof *copy);
  while (r->n && r->blocks + n > max) { /* oldest first, and counted */
    a->evicted_records++;
    a->evicted_blocks += r->q[r->head].n;
    pop(a, slot);
  }
  int rc = kvbm_index_store(a->idx, slot, KVBM_TIER_G1, copy, n);
  if (rc) {
    /* a prefix of it may be stored (the index stops at the failure): take
     * it all back, so that nothing stays in the index that no record will
     * remove. Blocks past the failure point may lose a copy that an older
     * record holds: forgotten early, never kept forever. */
    kvbm_index_remove(a->idx, slot, KVBM_TIER_G1, copy, n);
    free(copy);
    return kvbm_error_set(err, rc, "router approx: index: %s", kvbm_strerror(rc));
  }
  r->q[(r->head + r->n) % r->cap] = (rec){.t = now, .n = n, .hashes = copy};
  r->n++;
  r->blocks += n;
  a->blocks += n;
  a->records++;
  a->recorded++;
  return KVBM_OK;
}
