# SPDX-License-Identifier: Apache-2.0
# library.cmake: libkvbm.so and libkvbm.a, and what `cmake --install` puts
# where.
#
# Both libraries are made of the library modules' objects (KVBM_LIBRARY_
# MODULES: every module but the workload simulators), compiled once with
# -fvisibility=hidden, so the shared library exports exactly the functions
# that include/kvbm/ marks KVBM_EXTERN. The modules stay static libraries of
# their own for the tests, the benchmarks and the `kvbm` command, which may
# reach kvbm__ internals.
#
# Installed (GNUInstallDirs under CMAKE_INSTALL_PREFIX):
#   include/kvbm/*.h              the public headers, each self-contained
#   lib/libkvbm.so.0 (+ .so)      SONAME libkvbm.so.<major>
#   lib/libkvbm.a
#   lib/pkgconfig/kvbm.pc         pkg-config --cflags --libs kvbm
#   lib/cmake/kvbm/               find_package(kvbm) -> kvbm::kvbm
#   bin/kvbm                      the command
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
include(${CMAKE_CURRENT_LIST_DIR}/cuda.cmake)

set(kvbm_objects "")
foreach(m ${KVBM_LIBRARY_MODULES})
  list(APPEND kvbm_objects $<TARGET_OBJECTS:${m}>)
endforeach()

# What the library's objects use from outside (the modules' DEPS, minus the
# modules themselves).
set(KVBM_LIBRARY_DEPS PkgConfig::XXHASH PkgConfig::UCX PkgConfig::MSGPACK
    PkgConfig::ZMQ PkgConfig::NATS PkgConfig::URING PkgConfig::HIREDIS PkgConfig::SODIUM Threads::Threads m)
if(KVBM_HAVE_CUDA)
  list(APPEND KVBM_LIBRARY_DEPS CUDA::cudart)
endif()

add_library(kvbm_shared SHARED ${kvbm_objects})
set_target_properties(kvbm_shared PROPERTIES
  OUTPUT_NAME kvbm
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
target_link_libraries(kvbm_shared PRIVATE ${KVBM_LIBRARY_DEPS})
target_link_options(kvbm_shared PRIVATE -Wl,--no-undefined -Wl,--as-needed)
target_include_directories(kvbm_shared INTERFACE
  $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_target_properties(kvbm_shared PROPERTIES EXPORT_NAME kvbm)
add_library(kvbm::kvbm ALIAS kvbm_shared)

add_library(kvbm_static STATIC ${kvbm_objects})
set_target_properties(kvbm_static PROPERTIES
  OUTPUT_NAME kvbm
  ARCHIVE_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)

# pkg-config: dynamic linking needs only -lkvbm; `--static` adds what the
# archive's objects use.
set(KVBM_PC_REQUIRES_PRIVATE "libxxhash msgpack libzmq libnats liburing ucx hiredis libsodium")
set(KVBM_PC_LIBS_PRIVATE "-lpthread -lm")
if(KVBM_HAVE_CUDA)
  string(APPEND KVBM_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
# The .pc file is relocatable: its prefix is found from where it lies
# (${pcfiledir}), so `cmake --install --prefix DIR` anywhere works.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(KVBM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH kvbm_pc_up "/r/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/r")
  set(KVBM_PC_PREFIX "\${pcfiledir}/${kvbm_pc_up}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/kvbm.pc.in ${CMAKE_BINARY_DIR}/kvbm.pc @ONLY)

install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/kvbm
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(TARGETS kvbm_shared EXPORT kvbmTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kvbm_static ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_BINARY_DIR}/kvbm.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(EXPORT kvbmTargets NAMESPACE kvbm::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvbm)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvbmConfig.cmake.in
  ${CMAKE_BINARY_DIR}/kvbmConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvbm)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kvbmConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kvbmConfig.cmake ${CMAKE_BINARY_DIR}/kvbmConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvbm)
