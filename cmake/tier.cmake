# tier.cmake (memory tiers area): the threaded tier tests also run under
# ThreadSanitizer.
foreach(t tier_test_threads tier_test_manager tier_test_events)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "tier;tsan")
  endif()
endforeach()

# The W2 replay (src/tier/replay_w2.c) reads traces and runs W1 for
# comparison: the tier module also uses the trace module.
if(TARGET kvbm_tier AND TARGET kvbm_trace)
  target_link_libraries(kvbm_tier PUBLIC kvbm_trace)
endif()
