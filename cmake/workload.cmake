# workload: W1 with the events module on runs under ThreadSanitizer too (the
# publisher's thread).
if(TEST workload_test_w1_events)
  set_tests_properties(workload_test_w1_events PROPERTIES LABELS "workload;tsan")
endif()
