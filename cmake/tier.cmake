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

# CUDA copies of the tier manager (src/tier/gpu.c), as cmake/cuda.cmake does
# for storage: only the C runtime API (no nvcc), compiled where the toolkit
# is found and KVBM_CUDA is ON; otherwise device/pinned tiers report
# KVBM_EUNSUPPORTED.
if(TARGET kvbm_tier AND KVBM_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart)
    target_compile_definitions(kvbm_tier PRIVATE KVBM_HAVE_CUDA=1)
    target_link_libraries(kvbm_tier PRIVATE CUDA::cudart)
    message(STATUS "kvbm: tier CUDA copies built (device G1, pinned G2)")
  endif()
endif()
