# tier.cmake (memory tiers area): the threaded tier tests also run under
# ThreadSanitizer.
foreach(t tier_test_threads tier_test_manager tier_test_events tier_test_g4 tier_test_hints)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "tier;tsan")
  endif()
endforeach()
