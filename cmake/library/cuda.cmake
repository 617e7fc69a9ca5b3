# cuda.cmake: the optional CUDA runtime for pinned and device storage
# (src/storage/cuda.c) and the tier manager's device copies (src/tier/gpu.c).
#
# Only the C runtime API is used (cudaHostAlloc, cudaMalloc,
# cudaMemcpyAsync), so this needs the toolkit's headers and libcudart, not
# nvcc and not the CUDA language in CMake. Without the toolkit (a clean
# Debian CI machine) nothing changes: pinned and device memory report
# KVBM_EUNSUPPORTED. With it but without a GPU they report KVBM_EDEVICE.
# -DKVBM_CUDA=OFF forces the build without CUDA.
option(KVBM_CUDA "Use the CUDA runtime for pinned and device memory when the toolkit is found" ON)
set(KVBM_HAVE_CUDA OFF)
if(KVBM_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart)
    set(KVBM_HAVE_CUDA ON)
  endif()
endif()
if(KVBM_HAVE_CUDA)
  foreach(m kvbm_storage kvbm_tier)
    target_compile_definitions(${m} PRIVATE KVBM_HAVE_CUDA=1)
    target_link_libraries(${m} PRIVATE CUDA::cudart)
  endforeach()
  message(STATUS "kvbm: CUDA ${CUDAToolkit_VERSION} runtime found: pinned and device memory built")
else()
  message(STATUS "kvbm: no CUDA runtime: pinned and device memory report KVBM_EUNSUPPORTED")
endif()
