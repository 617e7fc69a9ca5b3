# gpu.cmake: the tests and benchmarks that need a GPU.
#
# A test is a GPU test when it lives in tests/cuda/ or its file is named
# test_gpu_*.c (in any area). It is labelled "gpu", links the CUDA runtime
# when the toolkit was found (KVBM_HAVE_CUDA is defined for it then), and
# exits 77 where there is no CUDA build or no device: ctest shows it as
# skipped, not passed. scripts/gpu-check.sh runs `ctest -L gpu` on a lent
# device machine with KVBM_REQUIRE_GPU=1, where a skip is a failure
# (tests/gpu_testutil.h). Benchmarks named bench_gpu_*.c link the runtime
# the same way.
get_property(kvbm_gpu_all_tests DIRECTORY PROPERTY TESTS)
foreach(t ${kvbm_gpu_all_tests})
  if(t MATCHES "^cuda_test_" OR t MATCHES "_test_gpu_")
    get_test_property(${t} LABELS kvbm_gpu_labels)
    set_tests_properties(${t} PROPERTIES LABELS "${kvbm_gpu_labels};gpu" SKIP_RETURN_CODE 77)
    if(TARGET ${t} AND KVBM_HAVE_CUDA)
      target_compile_definitions(${t} PRIVATE KVBM_HAVE_CUDA=1)
      target_link_libraries(${t} PRIVATE CUDA::cudart)
    endif()
  endif()
endforeach()
foreach(b ${KVBM_BENCH_SRCS})
  get_filename_component(bname ${b} NAME_WE)
  if(bname MATCHES "^bench_gpu_" AND KVBM_HAVE_CUDA)
    target_compile_definitions(${bname} PRIVATE KVBM_HAVE_CUDA=1)
    target_link_libraries(${bname} PRIVATE CUDA::cudart)
  endif()
endforeach()
