# SPDX-License-Identifier: Apache-2.0
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
#
# Two older tests have branches that run on a device when there is one
# (real pinned and device storage, the manager's CUDA copy path): they are
# labelled gpu too, so the device check runs them, but keep their own
# skip rules. Labels are added once every area's cmake file has set its
# own (deferred to the end of the top directory), so none overwrites them.
function(kvbm_gpu_label_tests)
  get_property(all DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY TESTS)
  foreach(t ${all})
    if(t MATCHES "^cuda_test_" OR t MATCHES "_test_gpu_")
      set_property(TEST ${t} APPEND PROPERTY LABELS gpu)
      set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
      if(TARGET ${t} AND KVBM_HAVE_CUDA)
        target_compile_definitions(${t} PRIVATE KVBM_HAVE_CUDA=1)
        target_link_libraries(${t} PRIVATE CUDA::cudart)
      endif()
    elseif(t STREQUAL "storage_test_storage" OR t STREQUAL "tier_test_manager")
      set_property(TEST ${t} APPEND PROPERTY LABELS gpu)
    endif()
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL kvbm_gpu_label_tests)

foreach(b ${KVBM_BENCH_SRCS})
  get_filename_component(bname ${b} NAME_WE)
  if(bname MATCHES "^bench_gpu_" AND KVBM_HAVE_CUDA)
    target_compile_definitions(${bname} PRIVATE KVBM_HAVE_CUDA=1)
    target_link_libraries(${bname} PRIVATE CUDA::cudart)
  endif()
endforeach()
