/* SPDX-License-Identifier: Apache-2.0 */
/*
 * filter.c: the frequency filter (see filter.h). Memory: two tables (one
 * spare for rehashing) of 12 bytes x twice max_entries, allocated once; a decay pass is O(table) and happens at most
 * every decay_uses uses or when the table fills, so it amortises to O(1).
 */
#include "filter.h"

#include <stdlib.h>
#include <string.h>

#include "kvbm/status.h"

int kvbm__freq_filter_init(kvbm_freq_filter *f, uint32_t threshold, uint32_t decay_uses,
                          uint32_t max_entries) {
  memset(f, 0, sizeof *f);
  if (threshold == 0 || decay_uses == 0 || max_entries == 0 || max_entries > (1u << 28))
    return KVBM_EINVAL;
  uint32_t size = 16;
  while (size < 2 * max_entries) size *= 2;
  f->keys = calloc(size, sizeof *f->keys);
  f->counts = calloc(size, sizeof *f->counts);
  f->spare_keys = calloc(size, sizeof *f->spare_keys);
  f->spare_counts = calloc(size, sizeof *f->spare_counts);
  if (!f->keys || !f->counts || !f->spare_keys || !f->spare_counts) {
    kvbm__freq_filter_destroy(f);
    return KVBM_ENOMEM;
  }
  f->mask = size - 1;
  f->max_entries = max_entries;
  f->threshold = threshold;
  f->decay_uses = decay_uses;
  return KVBM_OK;
}

void kvbm__freq_filter_destroy(kvbm_freq_filter *f) {
  free(f->keys);
  free(f->counts);
  free(f->spare_keys);
  free(f->spare_counts);
  f->keys = f->spare_keys = NULL;
  f->counts = f->spare_counts = NULL;
}

static uint32_t slot_of(const kvbm_freq_filter *f, uint64_t key) {
  return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & f->mask;
}

/* Halves every count and rehashes the survivors into the spare table
 * (linear probing cannot delete in place), then swaps the tables. */
static void decay(kvbm_freq_filter *f) {
  uint32_t size = f->mask + 1, kept = 0;
  memset(f->spare_keys, 0, size * sizeof *f->spare_keys);
  for (uint32_t i = 0; i < size; i++) {
    uint32_t c = f->counts[i] / 2;
    if (!f->keys[i] || !c) continue;
    uint32_t j = slot_of(f, f->keys[i]);
    while (f->spare_keys[j]) j = (j + 1) & f->mask;
    f->spare_keys[j] = f->keys[i];
    f->spare_counts[j] = c;
    kept++;
  }
  uint64_t *k = f->keys;
  uint32_t *cnt = f->counts;
  f->keys = f->spare_keys;
  f->counts = f->spare_counts;
  f->spare_keys = k;
  f->spare_counts = cnt;
  f->entries = kept;
  f->since_decay = 0;
}

bool kvbm__freq_filter_use(kvbm_freq_filter *f, uint64_t hash) {
  uint64_t key = hash ? hash : 1;
  if (++f->since_decay >= f->decay_uses) decay(f);
  uint32_t j = slot_of(f, key);
  while (f->keys[j] && f->keys[j] != key) j = (j + 1) & f->mask;
  if (!f->keys[j]) {
    if (f->entries >= f->max_entries) {
      decay(f);
      j = slot_of(f, key);
      while (f->keys[j]) j = (j + 1) & f->mask;
    }
    f->keys[j] = key;
    f->counts[j] = 0;
    f->entries++;
  }
  if (f->counts[j] < UINT32_MAX) f->counts[j]++;
  return f->counts[j] >= f->threshold;
}
