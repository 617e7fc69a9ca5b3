# SPDX-License-Identifier: Apache-2.0
# Fabric (src/fabric): extra test settings.
if(TARGET fabric_test_inproc)
  # The in-process fabric test drives the two ends from two threads: run it
  # under ThreadSanitizer as well. It links UCX, whose memory hooks (libucm
  # patches mmap/madvise) fault under TSan's own interceptors; the test uses
  # none of them, so they are switched off for it.
  set_tests_properties(fabric_test_inproc PROPERTIES
    LABELS "fabric;tsan"
    ENVIRONMENT "UCX_MEM_MMAP_HOOK_MODE=none")
endif()
if(TARGET fabric_test_ucx)
  # Forks and runs two UCX workers per test; a generous limit for loaded CI.
  set_tests_properties(fabric_test_ucx PROPERTIES TIMEOUT 300)
endif()
if(TARGET fabric_test_gpu_cudaipc)
  # Two processes on one GPU (label gpu from gpu.cmake): about 5 s on an
  # H100; every wait inside has its own 15 s timeout.
  set_tests_properties(fabric_test_gpu_cudaipc PROPERTIES TIMEOUT 120)
endif()
if(TARGET fabric_test_cudaipc_wire)
  set_tests_properties(fabric_test_cudaipc_wire PROPERTIES TIMEOUT 60)
endif()
