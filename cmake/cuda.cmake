# cuda.cmake (layout/storage area): optional CUDA runtime for pinned and
# device storage (src/storage/cuda.c).
#
# Only the C runtime API is used (cudaHostAlloc, cudaMalloc), so this needs
# the toolkit's headers and libcudart, not nvcc and not the CUDA language in
# CMake. Without the toolkit (a clean Debian CI machine) nothing changes:
# pinned/device storage report KVBM_EUNSUPPORTED. With it but without a GPU
# they report KVBM_EDEVICE. -DKVBM_CUDA=OFF forces the no-CUDA build.
option(KVBM_CUDA "Use the CUDA runtime for pinned/device storage when the toolkit is found" ON)
if(TARGET kvbm_storage)
  if(KVBM_CUDA)
    find_package(CUDAToolkit QUIET)
  endif()
  if(KVBM_CUDA AND CUDAToolkit_FOUND AND TARGET CUDA::cudart)
    target_compile_definitions(kvbm_storage PRIVATE KVBM_HAVE_CUDA=1)
    target_link_libraries(kvbm_storage PRIVATE CUDA::cudart)
    message(STATUS "kvbm: CUDA ${CUDAToolkit_VERSION} runtime found: pinned and device storage built")
  else()
    message(STATUS "kvbm: no CUDA runtime: pinned and device storage report KVBM_EUNSUPPORTED")
  endif()
endif()
