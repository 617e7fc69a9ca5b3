/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier.c: names of the tiers (kvbm/tier.h), upper case for people and
 * lower case for keys (common/tier.h), side by side.
 */
#include "kvbm/tier.h"

#include "common/tier.h"

#include <stddef.h>

static const char *const kTierNames[KVBM_TIER_COUNT] = {"G1", "G2", "G3", "G4"};
static const char *const kTierKeys[KVBM_TIER_COUNT] = {"g1", "g2", "g3", "g4"};

const char *kvbm_tier_name(int tier) {
  return tier >= 0 && tier < KVBM_TIER_COUNT ? kTierNames[tier] : "?";
}

const char *kvbm__tier_key(int tier) {
  return tier >= 0 && tier < KVBM_TIER_COUNT ? kTierKeys[tier] : "?";
}

bool kvbm_tier_parse(const char *s, kvbm_tier *out) {
  if (!s || (s[0] != 'G' && s[0] != 'g') || s[1] < '1' || s[1] > '4' || s[2] != '\0')
    return false;
  if (out) *out = (kvbm_tier)(s[1] - '1');
  return true;
}
