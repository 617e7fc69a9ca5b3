/* SPDX-License-Identifier: Apache-2.0 */
/*
 * filter.h (private): the frequency filter that decides which blocks earn a
 * copy in a tier (Dynamo's FrequencyFilter, made deterministic).
 *
 * A use of a sequence hash adds one to its count; the block qualifies when
 * the count reaches the threshold. Counts decay: every `decay_uses` uses
 * (and whenever the table is full: as many times as it takes to make
 * room, so that entries never pass max_entries) every count is halved and
 * zeros are forgotten, so a block used twice long ago has to earn its copy
 * again.
 * Decay by use count rather than wall time keeps replays reproducible.
 * Open addressing with linear probing. A decay is logically instant (the
 * counts, the entries and every answer after it are those of halving
 * every count at once) but its work is spread over the uses that follow
 * (filter.c), so no single use pays a pass over the table.
 *
 * Threads: none of its own; the caller serialises every call (the
 * manager's lock). Memory: two tables of 12 bytes x (a power of two >= 2 x
 * max_entries) slots and two lists of 4 x max_entries bytes, allocated at
 * init; a use allocates nothing.
 */
#ifndef KVBM_TIER_FILTER_H
#define KVBM_TIER_FILTER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvbm_freq_filter {
  uint64_t *keys;     /* the live table; 0 = empty (hash 0 is stored as 1, a rare alias) */
  uint32_t *counts;
  uint64_t *old_keys; /* the table the last decay is draining, then clearing */
  uint32_t *old_counts; /* its counts, not yet halved; 0: moved or forgotten */
  uint32_t *slots;    /* the live table's filled slots, in the order filled */
  uint32_t *old_slots; /* the old table's */
  uint32_t nslots, old_nslots;
  uint32_t mask;      /* table size - 1 (a power of two, >= 2 * max_entries) */
  uint32_t entries, max_entries; /* entries: keys with a count, in either table */
  uint32_t threshold, decay_uses, since_decay;
  uint32_t phase;     /* 0: old table empty; 1: draining it; 2: clearing it */
  uint32_t at;        /* the drain's or the clearing's next place in old_slots */
  uint32_t step;      /* slots drained or cleared a use, set at each decay */
  uint32_t by_len[33]; /* entries by their count's bit length (1: count 1) */
} kvbm_freq_filter;

/* KVBM_EINVAL for a threshold, decay_uses or max_entries of 0, or
 * max_entries above 2^28; KVBM_ENOMEM. */
int kvbm__freq_filter_init(kvbm_freq_filter *f, uint32_t threshold, uint32_t decay_uses,
                          uint32_t max_entries);
void kvbm__freq_filter_destroy(kvbm_freq_filter *f);
/* Counts one use; returns whether the block qualifies now. O(1) amortised
 * and in the worst case but for a decay the full table forces before the
 * last one's work is done (then that work is finished at once). */
bool kvbm__freq_filter_use(kvbm_freq_filter *f, uint64_t hash);

#endif
