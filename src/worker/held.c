/* SPDX-License-Identifier: Apache-2.0 */
/*
 * held.c: the per-tier set of held block hashes (held.h says what it is
 * for and why it never allocates after init). Block hashes are already
 * well mixed, but a chained hash of a fixed prefix could be anything, so
 * the slot is taken from a multiply-shift of the key, not its low bits.
 */
#include "worker/held.h"

#include <stdlib.h>
#include <string.h>

static size_t table_cap(size_t max) {
  size_t cap = 16;
  while (cap < 2 * max + 2) cap *= 2;
  return cap;
}

size_t kvsim_held_bytes(size_t max) { return table_cap(max) * (2 * sizeof(uint64_t) + 1); }

bool kvsim_held_init(kvsim_held *h, size_t max) {
  memset(h, 0, sizeof *h);
  h->cap = table_cap(max);
  h->max = max;
  h->key = malloc(h->cap * sizeof *h->key);
  h->parent = malloc(h->cap * sizeof *h->parent);
  h->used = calloc(h->cap, 1);
  if (h->key && h->parent && h->used) return true;
  kvsim_held_free(h);
  return false;
}

void kvsim_held_free(kvsim_held *h) {
  free(h->key);
  free(h->parent);
  free(h->used);
  memset(h, 0, sizeof *h);
}

static size_t home(const kvsim_held *h, uint64_t key) {
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (h->cap - 1);
}

/* The slot of key, or of the empty slot where it would go. */
static size_t find(const kvsim_held *h, uint64_t key) {
  size_t i = home(h, key);
  while (h->used[i] && h->key[i] != key) i = (i + 1) & (h->cap - 1);
  return i;
}

bool kvsim_held_add(kvsim_held *h, uint64_t key, const uint64_t *parent) {
  size_t i = find(h, key);
  if (!h->used[i]) {
    if (h->n >= h->cap / 2) return false;
    h->n++;
    h->key[i] = key;
  }
  h->used[i] = parent ? 2 : 1;
  h->parent[i] = parent ? *parent : 0;
  return true;
}

void kvsim_held_remove(kvsim_held *h, uint64_t key) {
  size_t i = find(h, key), mask = h->cap - 1;
  if (!h->used[i]) return;
  h->used[i] = 0;
  h->n--;
  /* backward shift: pull later entries of the run into the hole when
   * their home does not lie cyclically in (hole, j] */
  for (size_t j = (i + 1) & mask; h->used[j]; j = (j + 1) & mask) {
    size_t k = home(h, h->key[j]);
    bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    h->key[i] = h->key[j];
    h->parent[i] = h->parent[j];
    h->used[i] = h->used[j];
    h->used[j] = 0;
    i = j;
  }
}

void kvsim_held_clear(kvsim_held *h) {
  if (h->used) memset(h->used, 0, h->cap);
  h->n = 0;
}

bool kvsim_held_has(const kvsim_held *h, uint64_t key) { return h->used[find(h, key)] != 0; }

bool kvsim_held_slot(const kvsim_held *h, size_t i, uint64_t *key, uint64_t *parent,
                     bool *has_parent) {
  if (i >= h->cap || !h->used[i]) return false;
  *key = h->key[i];
  *parent = h->parent[i];
  *has_parent = h->used[i] == 2;
  return true;
}
