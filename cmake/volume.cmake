# SPDX-License-Identifier: Apache-2.0
# volume.cmake (storage interface area): the vendor example of
# examples/volume/ is built with nothing but the public headers (include/,
# no src/) against libkvbm.so and run as a test; the threaded volume tests
# also run under ThreadSanitizer.
add_executable(volume_example_demo ${CMAKE_SOURCE_DIR}/examples/volume/demo.c
                                   ${CMAKE_SOURCE_DIR}/examples/volume/myvendor.c)
target_link_libraries(volume_example_demo PRIVATE kvbm_shared Threads::Threads)
add_test(NAME volume_example_demo COMMAND volume_example_demo)
# (not under TSan: libkvbm.so pulls in UCX, whose libucm madvise hook
# crashes TSan at thread start; the core's threads are covered by test_volume)
set_tests_properties(volume_example_demo PROPERTIES LABELS volume)
foreach(t volume_test_volume volume_test_disk volume_test_cluster)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES LABELS "volume;tsan")
  endif()
endforeach()
