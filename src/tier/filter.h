/* SPDX-License-Identifier: Apache-2.0 */
/*
 * filter.h (private): the frequency filter that decides which blocks earn a
 * copy in a tier (Dynamo's FrequencyFilter, made deterministic).
 *
 * A use of a sequence hash adds one to its count; the block qualifies when
 * the count reaches the threshold. Counts decay: every `decay_uses` uses
 * (and whenever the table is full) every count is halved and zeros are
 * forgotten, so a block used twice long ago has to earn its copy again.
 * Decay by use count rather than wall time keeps replays reproducible.
 * Open addressing with linear probing; rebuilt in place on decay.
 */
#ifndef KVBM_TIER_FILTER_H
#define KVBM_TIER_FILTER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvbm_freq_filter {
  uint64_t *keys;   /* 0 = empty; hash 0 is stored as 1 (a rare alias) */
  uint32_t *counts;
  uint64_t *spare_keys; /* the next table, filled by a decay */
  uint32_t *spare_counts;
  uint32_t mask;    /* table size - 1 (a power of two, >= 2 * max_entries) */
  uint32_t entries, max_entries;
  uint32_t threshold, decay_uses, since_decay;
} kvbm_freq_filter;

int kvbm__freq_filter_init(kvbm_freq_filter *f, uint32_t threshold, uint32_t decay_uses,
                          uint32_t max_entries);
void kvbm__freq_filter_destroy(kvbm_freq_filter *f);
/* Counts one use; returns whether the block qualifies now. */
bool kvbm__freq_filter_use(kvbm_freq_filter *f, uint64_t hash);

#endif
