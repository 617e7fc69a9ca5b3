/* SPDX-License-Identifier: Apache-2.0 */
/*
 * filter.c: the frequency filter (see filter.h).
 *
 * Why the decay is spread. A decay halves every count and forgets the
 * zeros. It was a pass over the whole table (2^21 slots, 24 MiB at the
 * manager's default max_entries, most of them empty: a decay every 65,536
 * uses leaves some 10^5 keys) and a clear of the spare one, inside
 * whichever use crossed decay_uses: on W2 one commit in about 70 took
 * 2.2-3 ms more than its neighbours, on the engine's thread
 * (docs/areas/tiers.md, "Engine-path latency"). Amortised O(1), but it is
 * the p99 an engine sees. So now:
 *
 *  - Only filled slots are visited. Each table keeps the list of its
 *    filled slots (a slot once filled stays filled until its table is
 *    cleared), so a decay's work is its entries, not its table.
 *  - That work is spread, as Redis's dict.c rehashes incrementally. A
 *    decay swaps the tables and the lists and shifts a histogram; the
 *    table that was live becomes the old one, its counts those before
 *    the decay. Draining (phase 1): each use moves `step` of the old
 *    table's filled slots into the live one, halved, zeros dropped, and
 *    marks each moved by setting its count to 0. A use whose key is not
 *    in the live table looks in the old one (its probe chains are
 *    intact: nothing there is emptied while it drains) and moves that one
 *    key first. So a key has a count in at most one table, and it is
 *    always what a decay done at once would have left. Clearing (phase
 *    2): the old table's filled slots are emptied `step` a use, so that
 *    the next decay finds an empty table to make live.
 *  - `step` is set at each decay so that both phases end within the
 *    decay_uses uses before the next one (a few slots a use). A decay the
 *    full table forces earlier (entries reach max_entries) first finishes
 *    what the last one left, at once.
 *
 * What stays exact. `entries` must change at a decay as if every count
 * were halved then (the full-table trigger reads it), without visiting
 * the keys. The filter keeps how many entries have a count of each bit
 * length (by_len): halving every count moves each length down by one and
 * forgets length 1, so a decay is entries -= by_len[1] and a shift of 32
 * words. A count that grows across a power of two moves up one length.
 * tests/tier/test_filter.c holds the whole filter against the one-pass
 * definition on random streams, answer by answer and entries by entries.
 */
#include "filter.h"

#include <stdlib.h>
#include <string.h>

#include "kvbm/status.h"

/* The slots each use drains or clears after a decay of `n` filled slots:
 * both phases (2n) within decay_uses - 1 uses, as thin as they can be
 * spread; at least 16, so that a small table is done in a few uses. */
static uint32_t step_for(uint32_t n, uint32_t decay_uses) {
  uint64_t uses = decay_uses > 1 ? decay_uses - 1 : 1;
  uint64_t s = (2ull * n + uses - 1) / uses;
  return s < 16 ? 16 : (uint32_t)s;
}

int kvbm__freq_filter_init(kvbm_freq_filter *f, uint32_t threshold, uint32_t decay_uses,
                          uint32_t max_entries) {
  memset(f, 0, sizeof *f);
  if (threshold == 0 || decay_uses == 0 || max_entries == 0 || max_entries > (1u << 28))
    return KVBM_EINVAL;
  uint32_t size = 16;
  while (size < 2 * max_entries) size *= 2;
  f->keys = calloc(size, sizeof *f->keys);
  f->counts = calloc(size, sizeof *f->counts);
  f->old_keys = calloc(size, sizeof *f->old_keys);
  f->old_counts = calloc(size, sizeof *f->old_counts);
  f->slots = malloc((size_t)max_entries * sizeof *f->slots);
  f->old_slots = malloc((size_t)max_entries * sizeof *f->old_slots);
  if (!f->keys || !f->counts || !f->old_keys || !f->old_counts || !f->slots || !f->old_slots) {
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
  free(f->old_keys);
  free(f->old_counts);
  free(f->slots);
  free(f->old_slots);
  f->keys = f->old_keys = NULL;
  f->counts = f->old_counts = NULL;
  f->slots = f->old_slots = NULL;
}

static uint32_t slot_of(const kvbm_freq_filter *f, uint64_t key) {
  return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & f->mask;
}

/* The bit length of a count >= 1 (1 for 1, 2 for 2..3, ...). */
static unsigned len_of(uint32_t c) { return 32u - (unsigned)__builtin_clz(c); }

/* Key's slot in table `keys`: where it is, or the empty slot that ends
 * its probe chain. */
static uint32_t probe(const kvbm_freq_filter *f, const uint64_t *keys, uint64_t key) {
  uint32_t j = slot_of(f, key);
  while (keys[j] && keys[j] != key) j = (j + 1) & f->mask;
  return j;
}

/* Fills the live table's slot j with key and count c (c >= 1). Live
 * slots never outnumber entries (each holds a count) and entries never
 * pass max_entries (kvbm__freq_filter_use), so the list has room. */
static void fill(kvbm_freq_filter *f, uint32_t j, uint64_t key, uint32_t c) {
  f->keys[j] = key;
  f->counts[j] = c;
  f->slots[f->nslots++] = j;
}

/* Old slot i moved to the live table, halved (forgotten at 0); the slot
 * is marked moved. */
static void drain_slot(kvbm_freq_filter *f, uint32_t i) {
  uint32_t c = f->old_counts[i] / 2;
  if (!f->old_counts[i]) return;
  f->old_counts[i] = 0;
  if (c) fill(f, probe(f, f->keys, f->old_keys[i]), f->old_keys[i], c);
}

/* Up to n of the phase's slots; the phase ends at the list's end. */
static void advance(kvbm_freq_filter *f, uint32_t n) {
  const uint32_t left = f->old_nslots - f->at, end = f->at + (left < n ? left : n);
  if (f->phase == 1) {
    for (uint32_t i = f->at; i < end; i++) drain_slot(f, f->old_slots[i]);
  } else {
    /* old_counts are 0 already: each was moved or forgotten */
    for (uint32_t i = f->at; i < end; i++) f->old_keys[f->old_slots[i]] = 0;
  }
  f->at = end;
  if (end == f->old_nslots) {
    f->at = 0;
    f->phase = f->phase == 1 ? 2 : 0;
  }
}

/* Halves every count and forgets the zeros, logically at once: the live
 * table becomes the old one, to be drained by the uses that follow. */
static void decay(kvbm_freq_filter *f) {
  while (f->phase) advance(f, UINT32_MAX); /* the last decay's work, if left */
  uint64_t *k = f->keys;
  uint32_t *c = f->counts, *sl = f->slots;
  f->keys = f->old_keys;
  f->counts = f->old_counts;
  f->slots = f->old_slots;
  f->old_keys = k;
  f->old_counts = c;
  f->old_slots = sl;
  f->old_nslots = f->nslots;
  f->nslots = 0;
  f->phase = f->old_nslots ? 1 : 0;
  f->at = 0;
  f->step = step_for(f->old_nslots, f->decay_uses);
  f->entries -= f->by_len[1];
  memmove(f->by_len + 1, f->by_len + 2, 31 * sizeof *f->by_len);
  f->by_len[32] = 0;
  f->since_decay = 0;
}

bool kvbm__freq_filter_use(kvbm_freq_filter *f, uint64_t hash) {
  const uint64_t key = hash ? hash : 1;
  if (f->phase) advance(f, f->step);
  if (++f->since_decay >= f->decay_uses) decay(f);
  uint32_t j = probe(f, f->keys, key);
  if (!f->keys[j] && f->phase == 1) {
    /* not moved yet: move it now (its halved count, if it has one left) */
    uint32_t o = probe(f, f->old_keys, key);
    if (f->old_keys[o] && f->old_counts[o]) {
      uint32_t c = f->old_counts[o] / 2;
      f->old_counts[o] = 0;
      if (c) fill(f, j, key, c);
    }
  }
  if (!f->keys[j]) {
    if (f->entries >= f->max_entries) {
      /* A decay that frees nothing (every count 2 or more) is followed by
       * another: entries never pass max_entries, so a stream that keeps
       * every key warm cannot fill the table (each decay halves every
       * count, so at most 32 in a row). */
      do decay(f);
      while (f->entries >= f->max_entries);
      j = probe(f, f->keys, key); /* absent still: a decay only forgets */
    }
    fill(f, j, key, 1);
    f->counts[j] = 0; /* counted up below */
    f->entries++;
  }
  uint32_t c = f->counts[j];
  if (c < UINT32_MAX) {
    if (c) f->by_len[len_of(c)]--;
    f->counts[j] = ++c;
    f->by_len[len_of(c)]++;
  }
  return c >= f->threshold;
}
