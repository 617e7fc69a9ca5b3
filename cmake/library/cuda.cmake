# SPDX-License-Identifier: Apache-2.0
# cuda.cmake: the optional CUDA parts of the library.
#
# Two levels, each found on its own:
#   KVBM_HAVE_CUDA          the toolkit's headers and libcudart. The storage
#                           (pinned and device memory, src/storage/cuda.c),
#                           the tier manager's device copies (src/tier/gpu.c),
#                           the copy engine and CUDA IPC (src/cuda/*.c, the
#                           fabric) are C against the runtime API.
#   KVBM_HAVE_CUDA_KERNELS  nvcc as well: the kernels of src/cuda/*.cu (the
#                           gather/scatter copy, the device checksum) are
#                           compiled into the same module, for
#                           KVBM_CUDA_ARCHITECTURES (Hopper and Ampere by
#                           default). Without nvcc the C code reports the
#                           kernels' paths as KVBM_EUNSUPPORTED.
#
# Without the toolkit (a clean Debian CI machine) nothing changes: pinned and
# device memory report KVBM_EUNSUPPORTED. With it but without a GPU they
# report KVBM_EDEVICE, and the GPU tests (label gpu) skip with code 77.
# -DKVBM_CUDA=OFF forces the build without CUDA.
option(KVBM_CUDA "Use the CUDA runtime for pinned and device memory when the toolkit is found" ON)
set(KVBM_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures the kernels are built for")
set(KVBM_HAVE_CUDA OFF)
set(KVBM_HAVE_CUDA_KERNELS OFF)
if(KVBM_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart)
    set(KVBM_HAVE_CUDA ON)
  endif()
endif()

file(GLOB KVBM_CUDA_KERNEL_SRCS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/cuda/*.cu)
# Kernels are not built under a sanitizer: nvcc's host compiler would not
# get the sanitizer flags, and the sanitizers cannot see device code anyway.
if(KVBM_HAVE_CUDA AND TARGET kvbm_cuda AND KVBM_CUDA_KERNEL_SRCS AND NOT KVBM_SANITIZE)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES ${KVBM_CUDA_ARCHITECTURES})
    enable_language(CUDA)
    set(KVBM_HAVE_CUDA_KERNELS ON)
  endif()
endif()

if(KVBM_HAVE_CUDA)
  foreach(m kvbm_storage kvbm_tier kvbm_cuda kvbm_fabric)
    if(TARGET ${m})
      target_compile_definitions(${m} PRIVATE KVBM_HAVE_CUDA=1)
      target_link_libraries(${m} PRIVATE CUDA::cudart)
    endif()
  endforeach()
  message(STATUS "kvbm: CUDA ${CUDAToolkit_VERSION} runtime found: pinned and device memory built")
else()
  message(STATUS "kvbm: no CUDA runtime: pinned and device memory report KVBM_EUNSUPPORTED")
endif()
if(KVBM_HAVE_CUDA_KERNELS)
  target_sources(kvbm_cuda PRIVATE ${KVBM_CUDA_KERNEL_SRCS})
  target_compile_definitions(kvbm_cuda PRIVATE KVBM_HAVE_CUDA_KERNELS=1)
  set_target_properties(kvbm_cuda PROPERTIES CUDA_ARCHITECTURES "${KVBM_CUDA_ARCHITECTURES}")
  # The modules made before CUDA was enabled (those above that link
  # kvbm_cuda: fabric, tier, advisor, workload) inherit its CUDA objects and
  # so a CUDA link step, which needs the architectures too; targets made
  # after this point take them from CMAKE_CUDA_ARCHITECTURES.
  foreach(m ${KVBM_MODULES})
    set_target_properties(${m} PROPERTIES CUDA_ARCHITECTURES "${KVBM_CUDA_ARCHITECTURES}")
  endforeach()
  target_compile_options(kvbm_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fvisibility=hidden,-Wall,-Wextra -lineinfo>)
  message(STATUS "kvbm: nvcc found: CUDA kernels built for ${KVBM_CUDA_ARCHITECTURES}")
endif()
