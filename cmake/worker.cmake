# SPDX-License-Identifier: Apache-2.0
# worker: `kvbm worker` end to end starts real processes and waits on
# simulated requests (seconds); its body reader's unit test is quick.
if(TEST worker_test_worker)
  set_tests_properties(worker_test_worker PROPERTIES LABELS "worker;nosan" TIMEOUT 240)
endif()
