# SPDX-License-Identifier: Apache-2.0
# metrics: the registry and the endpoint (include/kvbm/metrics.h,
# src/metrics/). Their threaded tests also run under ThreadSanitizer.
foreach(t metrics_test_metrics metrics_test_server)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "metrics;tsan")
  endif()
endforeach()
# The manager's metrics, scraped while requests run. The tier links the
# fabric, so UCX's memory hooks are switched off as for the other tier tests
# (cmake/tier.cmake says why: they fault under TSan when a thread exits).
if(TEST tier_test_metrics)
  set_tests_properties(tier_test_metrics PROPERTIES LABELS "tier;metrics;tsan"
                       ENVIRONMENT "UCX_MEM_MMAP_HOOK_MODE=none")
endif()
