/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/tier.h: the tiers of the memory hierarchy, one vocabulary for all of
 * kvbm.
 *
 *   G1  device (GPU) memory: the engine's own KV blocks
 *   G2  host memory
 *   G3  local disk
 *   G4  remote: another node, or a store shared across workers
 *
 * The manager (kvbm/manager.h), the router's index (kvbm/router.h) and the
 * MRDN frames (kvbm/frame.h) all speak of a block's place with this enum.
 * The KV events' `medium` (kvbm/events.h) is the wire's spelling of the same
 * thing; kvbm_medium_tier() maps one onto the other.
 */
#ifndef KVBM_TIER_H
#define KVBM_TIER_H

#include <stdbool.h>

#include "kvbm/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvbm_tier {
  KVBM_TIER_G1 = 0, /* device */
  KVBM_TIER_G2 = 1, /* host */
  KVBM_TIER_G3 = 2, /* local disk */
  KVBM_TIER_G4 = 3, /* remote */
} kvbm_tier;
#define KVBM_TIER_COUNT 4

/* "G1".."G4"; "?" for a value outside the enum. Never NULL, static. */
KVBM_EXTERN const char *kvbm_tier_name(int tier);

/* "G1".."G4" or "g1".."g4" to a tier; false (and *out untouched) for
 * anything else, NULL included. */
KVBM_EXTERN bool kvbm_tier_parse(const char *s, kvbm_tier *out);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_TIER_H */
