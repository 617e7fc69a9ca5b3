# events: threaded tests also run under ThreadSanitizer, with suppressions
# for the (uninstrumented) libzmq and libnats threads.
foreach(t events_test_publisher events_test_python events_test_zmq events_test_nats
          events_test_pool_link events_test_w1)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "events;tsan"
      ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1 second_deadlock_stack=1 suppressions=${CMAKE_SOURCE_DIR}/cmake/events-tsan.supp")
  endif()
endforeach()

# The W1 test drives the replay of module trace.
if(TARGET events_test_w1 AND TARGET kvbm_trace)
  target_link_libraries(events_test_w1 PRIVATE kvbm_trace)
endif()
