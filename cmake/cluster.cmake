# SPDX-License-Identifier: Apache-2.0
# cluster: W5, `kvbm cluster` (tools/kvbm/cmd_cluster.c execs
# scripts/cluster/cluster.py; docs/areas/cluster.md).
# The orchestrator is copied beside the build's kvbm binary
# (<build>/share/kvbm/cluster) and installed under <prefix>/share/kvbm/cluster,
# which is where `kvbm cluster` looks for it (bin dir, then bin dir/..).
file(GLOB KVBM_CLUSTER_PY CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/scripts/cluster/*.py)
add_custom_target(kvbm_cluster_files ALL
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/share/kvbm/cluster
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${KVBM_CLUSTER_PY} ${CMAKE_BINARY_DIR}/share/kvbm/cluster/
  COMMENT "cluster: copying the W5 orchestrator"
  VERBATIM)
add_dependencies(kvbm kvbm_cluster_files)
install(FILES ${KVBM_CLUSTER_PY} DESTINATION share/kvbm/cluster)

# The checkers against synthetic broken runs: quick. The orchestrator's own
# run (a stand-in worker) and W5 (the real kvbm worker, the full default
# fault schedule) start a dozen servers and run for a minute or two on two
# cores: not under sanitizers (the servers are not kvbm's; a sanitized
# kvbm router and worker run 5-20x slower and the timings of the schedule
# would no longer hold), hence the nosan label; 77 is a skip (a server or
# the worker missing).
foreach(t cluster_test_checks cluster_test_orchestrator cluster_test_w5)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endforeach()
if(TEST cluster_test_orchestrator)
  set_tests_properties(cluster_test_orchestrator PROPERTIES LABELS "cluster;nosan" TIMEOUT 240
    RUN_SERIAL TRUE)
endif()
if(TEST cluster_test_w5)
  set_tests_properties(cluster_test_w5 PROPERTIES LABELS "cluster;nosan" TIMEOUT 300 RUN_SERIAL TRUE)
endif()
