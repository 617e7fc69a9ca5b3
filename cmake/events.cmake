# SPDX-License-Identifier: Apache-2.0
# events: threaded tests also run under ThreadSanitizer (suppressions for
# the uninstrumented libzmq and libnats: scripts/tsan.supp).
foreach(t events_test_publisher events_test_stage events_test_publish_order events_test_python events_test_zmq events_test_nats
          events_test_nats_sub events_test_jetstream events_test_pool_link events_test_storage)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "events;tsan")
  endif()
endforeach()
