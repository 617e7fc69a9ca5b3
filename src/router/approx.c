/*
 * approx.c: approximate routing for engines that publish no events.
 *
 * Each decision is stored in the index as if the chosen worker had stored
 * the request's blocks on device, and removed again `ttl` seconds later.
 * Records sit in a FIFO in time order (times never go back), so expiry pops
 * from the head: O(1) per record. The index counts copies, so a prefix
 * routed twice to one worker stays until its second record expires.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/router.h"

typedef struct rec {
  double t;
  uint32_t slot;
  size_t n;
  uint64_t *hashes;
} rec;

struct kvbm_approx {
  kvbm_index *idx;
  double ttl, last;
  rec *q;
  size_t head, n, cap; /* ring buffer */
};

int kvbm_approx_create(kvbm_index *idx, double ttl_s, kvbm_approx **out, kvbm_error *err) {
  if (!idx || !out) return kvbm_error_set(err, KVBM_EINVAL, "router approx: NULL argument");
  if (!isfinite(ttl_s) || ttl_s <= 0)
    return kvbm_error_set(err, KVBM_EINVAL, "router approx: ttl %g s is not a finite number > 0",
                          ttl_s);
  kvbm_approx *a = calloc(1, sizeof *a);
  if (!a) return kvbm_error_set(err, KVBM_ENOMEM, "router approx: out of memory");
  a->idx = idx;
  a->ttl = ttl_s;
  a->last = -INFINITY;
  *out = a;
  return KVBM_OK;
}

void kvbm_approx_destroy(kvbm_approx *a) {
  if (!a) return;
  for (size_t i = 0; i < a->n; i++) free(a->q[(a->head + i) % a->cap].hashes);
  free(a->q);
  free(a);
}

size_t kvbm_approx_pending(const kvbm_approx *a) { return a->n; }

size_t kvbm_approx_expire(kvbm_approx *a, double now) {
  size_t gone = 0;
  while (a->n && a->q[a->head].t + a->ttl <= now) {
    rec *r = &a->q[a->head];
    /* the slot may have been dropped and reused meanwhile: removing then
     * only decrements copies this record added, or finds nothing */
    kvbm_index_remove(a->idx, r->slot, KVBM_TIER_G1, r->hashes, r->n);
    free(r->hashes);
    a->head = (a->head + 1) % a->cap;
    a->n--;
    gone++;
  }
  return gone;
}

static bool grow(kvbm_approx *a) {
  size_t cap = a->cap ? a->cap * 2 : 64;
  rec *q = malloc(cap * sizeof *q);
  if (!q) return false;
  for (size_t i = 0; i < a->n; i++) q[i] = a->q[(a->head + i) % a->cap];
  free(a->q);
  a->q = q;
  a->cap = cap;
  a->head = 0;
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
  if (a->n == a->cap && !grow(a))
    return kvbm_error_set(err, KVBM_ENOMEM, "router approx: out of memory");
  uint64_t *copy = malloc((n ? n : 1) * sizeof *copy);
  if (!copy) return kvbm_error_set(err, KVBM_ENOMEM, "router approx: out of memory");
  if (n) memcpy(copy, hashes, n * sizeof *copy);
  int rc = kvbm_index_store(a->idx, slot, KVBM_TIER_G1, copy, n);
  if (rc) {
    free(copy);
    return kvbm_error_set(err, rc, "router approx: index: %s", kvbm_strerror(rc));
  }
  a->q[(a->head + a->n) % a->cap] = (rec){.t = now, .slot = slot, .n = n, .hashes = copy};
  a->n++;
  return KVBM_OK;
}
