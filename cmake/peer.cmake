# SPDX-License-Identifier: Apache-2.0
# peer.cmake (the peers, src/peer/): the in-process tests drive two
# managers' link threads, also under ThreadSanitizer; the peers link the
# fabric, so UCX's memory hooks (libucm patches mmap/madvise) are in every
# peer test and fault under TSan's own interceptors (a thread's exit calls
# madvise): switched off, as for the fabric's in-process test. The UCX
# test forks the decode worker.
foreach(t peer_test_disagg peer_test_kept_sums peer_test_keyed peer_test_control_mac peer_test_hindex)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES
      LABELS "peer;tsan"
      ENVIRONMENT "UCX_MEM_MMAP_HOOK_MODE=none")
  endif()
endforeach()
if(TEST peer_test_disagg_ucx)
  set_tests_properties(peer_test_disagg_ucx PROPERTIES TIMEOUT 300)
endif()
if(TEST peer_test_pull_ucx) # forks the holder of the pulled blocks
  set_tests_properties(peer_test_pull_ucx PROPERTIES TIMEOUT 300)
endif()
