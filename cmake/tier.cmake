# SPDX-License-Identifier: Apache-2.0
# tier.cmake (memory tiers area): the threaded tier tests also run under
# ThreadSanitizer. The tier links the fabric (peers), so UCX's memory hooks
# (libucm patches mmap/madvise) are in every tier test and fault under
# TSan's own interceptors (a thread's exit calls madvise); no test here
# uses them, so they are switched off, as for the fabric's in-process test.
foreach(t tier_test_threads tier_test_manager tier_test_events tier_test_g4 tier_test_hints tier_test_hybrid
          tier_test_g4_hostile tier_test_hybrid_decode)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "tier;tsan" ENVIRONMENT "UCX_MEM_MMAP_HOOK_MODE=none")
  endif()
endforeach()
# The peers' tests moved with them to tests/peer/ (cmake/peer.cmake).
