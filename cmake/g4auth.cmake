# SPDX-License-Identifier: Apache-2.0
# g4auth.cmake (issue 23, authenticated G4 values): bench_g4_mac measures
# the AEAD modes with libsodium (libsodium-dev, scripts/setup.sh); without
# it the bench is not built (the library does not need it).
pkg_check_modules(SODIUM IMPORTED_TARGET libsodium)
if(TARGET bench_g4_mac)
  if(SODIUM_FOUND)
    target_link_libraries(bench_g4_mac PRIVATE PkgConfig::SODIUM)
  else()
    set_target_properties(bench_g4_mac PROPERTIES EXCLUDE_FROM_ALL TRUE)
    message(STATUS "libsodium not found: bench_g4_mac is not built")
  endif()
endif()
