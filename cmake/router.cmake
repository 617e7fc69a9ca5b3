# SPDX-License-Identifier: Apache-2.0
# router: the KV-aware router (include/kvbm/router.h, src/router/).
# Tests that read and write the index from several threads also run under
# ThreadSanitizer.
foreach(t router_test_concurrent router_test_daemon_threads)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "router;tsan")
  endif()
endforeach()
