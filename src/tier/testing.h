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
  /* (The bad link seam of the peers is peer/testing.h's.) */
} kvbm__manager_testing;

/* kvbm_manager_create with test seams on (t may be NULL: none). */
int kvbm__manager_create_testing(const kvbm_manager_config *cfg, const kvbm__manager_testing *t,
                                 kvbm_manager **out, kvbm_error *err);

#endif /* KVBM_TIER_TESTING_H */
