# SPDX-License-Identifier: Apache-2.0
# advisor: the hint applier's test runs a NATS thread beside the manager's
# workers and the publishers' threads: ThreadSanitizer too.
foreach(t advisor_test_applier)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "advisor;tsan")
  endif()
endforeach()
