# SPDX-License-Identifier: Apache-2.0
# advisor: the hint applier's test runs a NATS thread beside the manager's
# workers and the publishers' threads: ThreadSanitizer too. It links the
# tier, hence UCX, whose memory hooks (libucm patches madvise) fault under
# ThreadSanitizer at thread start: off, as for the tier's tests.
foreach(t advisor_test_applier)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "advisor;tsan"
      ENVIRONMENT "UCX_MEM_MMAP_HOOK_MODE=none")
  endif()
endforeach()
