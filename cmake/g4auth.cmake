# SPDX-License-Identifier: Apache-2.0
# g4auth.cmake (issue 23, authenticated G4 values): bench_g4_mac calls
# libsodium itself (its AEAD modes), beside the library's use of it for
# G4's encryption at rest (found in CMakeLists.txt).
if(TARGET bench_g4_mac)
  target_link_libraries(bench_g4_mac PRIVATE PkgConfig::SODIUM)
endif()
