# SPDX-License-Identifier: Apache-2.0
# worker: `kvbm worker` end to end starts real processes (and Redis, NATS)
# and waits on simulated requests (seconds): nosan, like the cluster's
# tests; 77 is a skip (a server not installed). Its body reader's unit
# test is quick and runs everywhere.
foreach(t worker_test_worker worker_test_worker_servers)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "worker;nosan" TIMEOUT 240 SKIP_RETURN_CODE 77)
  endif()
endforeach()
