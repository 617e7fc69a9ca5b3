/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/tier.h: the tiers' lower-case names (private to src/ and tools/).
 *
 * kvbm/tier.h's kvbm_tier_name() gives "G1".."G4", the spelling people
 * read. Several outputs spell the tiers in lower case instead, because
 * that is their established key: the worker's metric label
 * tier="g1".."g4", replay-w2's JSON object keys, the policy simulator's
 * storage-event locations. Each wrote its own {"g1", "g2", ...} table;
 * this is the one table, next to the upper-case one in tier.c, so the two
 * spellings cannot drift apart (kvbm_tier_parse reads both).
 */
#ifndef KVBM_COMMON_TIER_H
#define KVBM_COMMON_TIER_H

/* "g1".."g4"; "?" for a value outside kvbm_tier. Never NULL, static,
 * 2 characters for every tier. */
const char *kvbm__tier_key(int tier);

#endif
