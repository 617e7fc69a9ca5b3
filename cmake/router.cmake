# router: the KV-aware router (include/kvbm/router.h, src/router/).
# The W3 simulation in the library drives W1 caches, so the module also
# needs the trace and sequence modules.
if(TARGET kvbm_router)
  target_link_libraries(kvbm_router PUBLIC kvbm_trace kvbm_sequence m)
endif()
# Tests that read and write the index from several threads also run under
# ThreadSanitizer.
foreach(t router_test_concurrent)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "router;tsan")
  endif()
endforeach()
