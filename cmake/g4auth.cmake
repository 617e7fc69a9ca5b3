# SPDX-License-Identifier: Apache-2.0
# g4auth.cmake (issue 23, authenticated G4 values): bench_g4_mac calls
# libsodium itself (its AEAD modes), beside the library's use of it for
# G4's encryption at rest (found in CMakeLists.txt).
if(TARGET bench_g4_mac)
  target_link_libraries(bench_g4_mac PRIVATE PkgConfig::SODIUM)
endif()
# The cross-process forgery test forges with the Python module: skipped
# (77, tests/python/pyenv.sh) where it cannot load (ThreadSanitizer).
if(TEST workload_test_w2_g4_forged)
  set_tests_properties(workload_test_w2_g4_forged PROPERTIES SKIP_RETURN_CODE 77)
endif()
