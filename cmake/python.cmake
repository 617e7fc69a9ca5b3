# SPDX-License-Identifier: Apache-2.0
# python: the package kvbm (python/kvbm/) and its C extension kvbm._kvbm,
# built against Debian's /usr/bin/python3 (python3-dev) with no Python
# build tools. The build tree gets build/python/kvbm/ (the extension next to
# copies of the .py, .pyi and py.typed files), so PYTHONPATH=build/python
# imports it; `cmake --install` puts the same folder in /usr/bin/python3's
# platlib under CMAKE_INSTALL_PREFIX.
option(KVBM_PYTHON "Build the Python package (needs python3-dev)" ON)
if(NOT KVBM_PYTHON)
  return()
endif()

set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python the package is built for")
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

file(GLOB KVBM_PY_C_SRCS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/kvbm/*.c)
Python3_add_library(kvbm_python MODULE WITH_SOABI ${KVBM_PY_C_SRCS})
set_target_properties(kvbm_python PROPERTIES
  OUTPUT_NAME _kvbm
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/python/kvbm
  C_VISIBILITY_PRESET hidden)
target_compile_definitions(kvbm_python PRIVATE KVBMPY_VERSION="${PROJECT_VERSION}")
# The public API only (no src/ include path), through libkvbm.so, which
# exports nothing else.
target_link_libraries(kvbm_python PRIVATE kvbm_shared)

# The pure-Python files, copied next to the extension on every build.
file(GLOB KVBM_PY_FILES CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/python/kvbm/*.py ${CMAKE_SOURCE_DIR}/python/kvbm/*.pyi
  ${CMAKE_SOURCE_DIR}/python/kvbm/py.typed)
add_custom_target(kvbm_python_files ALL
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/python/kvbm
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${KVBM_PY_FILES} ${CMAKE_BINARY_DIR}/python/kvbm/
  COMMENT "python: copying the kvbm package files"
  VERBATIM)
add_dependencies(kvbm_python kvbm_python_files)

# Install into the interpreter's platlib relative to the prefix: Debian's
# python reads <prefix>/lib/python3.X/dist-packages for /usr/local.
if(NOT KVBM_PYTHON_INSTALL_DIR)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import sysconfig,sys; p=sysconfig.get_paths()['platlib']; v='%d.%d'%sys.version_info[:2]; print('lib/python%s/dist-packages'%v if p.endswith('dist-packages') else sysconfig.get_path('platlib','posix_prefix',{'base':'','platbase':''}).lstrip('/'))"
    OUTPUT_VARIABLE kvbm_py_rel OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(KVBM_PYTHON_INSTALL_DIR "${kvbm_py_rel}" CACHE STRING
      "Where the kvbm package is installed, relative to CMAKE_INSTALL_PREFIX")
endif()
# Installed, the extension finds libkvbm.so relative to itself, so a prefix
# can be moved (as kvbm.pc allows).
file(RELATIVE_PATH kvbm_py_to_lib "/p/${KVBM_PYTHON_INSTALL_DIR}/kvbm" "/p/${CMAKE_INSTALL_LIBDIR}")
set_target_properties(kvbm_python PROPERTIES INSTALL_RPATH "$ORIGIN/${kvbm_py_to_lib}")
install(TARGETS kvbm_python LIBRARY DESTINATION ${KVBM_PYTHON_INSTALL_DIR}/kvbm)
install(FILES ${KVBM_PY_FILES} DESTINATION ${KVBM_PYTHON_INSTALL_DIR}/kvbm)

# tests/python/test_*.sh run pytest and the examples on the built package;
# they skip (77) where the extension cannot be loaded (ThreadSanitizer).
foreach(t python_test_pytest python_test_examples python_test_install)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endforeach()
# Two `cmake --install` runs of one build tree write the same
# install_manifest.txt: the package's install test and the library's take
# turns.
foreach(t python_test_install install_test_install)
  if(TEST ${t})
    set_property(TEST ${t} APPEND PROPERTY RESOURCE_LOCK kvbm_build_install)
  endif()
endforeach()
