# SPDX-License-Identifier: Apache-2.0
# workload: W1 with the events module on runs under ThreadSanitizer too (the
# publisher's thread). It links the tier, hence UCX: its memory hooks off
# under TSan (cmake/tier.cmake says why).
if(TEST workload_test_w1_events)
  set_tests_properties(workload_test_w1_events PROPERTIES LABELS "workload;tsan"
                       ENVIRONMENT "UCX_MEM_MMAP_HOOK_MODE=none")
endif()
