/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier/testing.h: test seams of the tiered manager. Not installed, not
 * exported from libkvbm.so: only the tier module's own tests reach them,
 * through the static module library.
 *
 * They stay out of kvbm_manager_config so that an engine cannot turn a
 * test seam on by accident (or by leaving a field of a copied struct set).
 */
#ifndef KVBM_TIER_TESTING_H
#define KVBM_TIER_TESTING_H

#include <stdbool.h>
#include <stdint.h>

#include "kvbm/manager.h"

typedef struct kvbm__manager_testing {
  /* With g1_memory DEVICE, emulate the device in host memory, in any
   * build: the manager's device path runs (CUDA-style streams whose copies
   * happen at their waits, staging for G3), and copy number
   * g1_fail_copy (from 1, over all workers; 0: none) fails as a CUDA copy
   * error would. */
  bool g1_emulate;
  uint32_t g1_fail_copy;
  /* kvbm__disk_config.test_refuse (volume/disk.h): pretend O_DIRECT or
   * io_uring is refused. */
  uint32_t g3_refuse;
  /* A bad link: bit i set corrupts the (i+1)-th block this manager
   * offloads to a peer (over all peers), one byte flipped in flight after
   * its frame was made (push: in the message; put: written over the
   * landing block after the block). */
  uint64_t corrupt_offloads;
} kvbm__manager_testing;

/* kvbm_manager_create with test seams on (t may be NULL: none). */
int kvbm__manager_create_testing(const kvbm_manager_config *cfg, const kvbm__manager_testing *t,
                                 kvbm_manager **out, kvbm_error *err);

/* Slots examined so far by peer `peer`'s two hash indexes (tier/hindex.h:
 * the blocks it acknowledged, those awaiting its acknowledgement), to
 * check that an acknowledgement costs O(1) probes. KVBM_ENOTFOUND. */
int kvbm__peer_index_probes(kvbm_manager *m, uint32_t peer, uint64_t *probes);
/* Moves peer `peer`'s lease clock (disagg.c) ms milliseconds ahead, so a
 * test can age the peer's word past its lease without sleeping. */
int kvbm__peer_skew_clock(kvbm_manager *m, uint32_t peer, int64_t ms);

#endif /* KVBM_TIER_TESTING_H */
