/*
 * kvbm/cuda.h: kvbm on a GPU -- the copy engine between device G1 and host
 * G2, and the integrity check of blocks on the device.
 *
 * Every function here exists in every build. Without the CUDA toolkit at
 * build time they return KVBM_EUNSUPPORTED; with it but without a device,
 * KVBM_EDEVICE. kvbm_cuda_available() says which, at no cost beyond one
 * cudaGetDeviceCount().
 *
 * CUDA handles cross this interface as void pointers (a cudaStream_t or a
 * cudaEvent_t cast to void *), so that the header needs no CUDA header and
 * C, C++ and Python (ctypes, torch.cuda.Stream.cuda_stream) callers can
 * pass theirs.
 */
#ifndef KVBM_CUDA_H
#define KVBM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/layout.h"
#include "kvbm/status.h"
#include "kvbm/storage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- what this build and machine have (src/cuda/device.c) ---- */

/* KVBM_OK with *devices >= 1 when this is a CUDA build and a device
 * answers; KVBM_EUNSUPPORTED without the CUDA runtime at build time;
 * KVBM_EDEVICE when the runtime finds no device or no driver (the message
 * says CUDA's reason). *kernels (may be NULL) is 1 when the build also has
 * kvbm's CUDA kernels (nvcc was found), else 0. Any thread. */
KVBM_EXTERN int kvbm_cuda_available(int *devices, int *kernels, kvbm_error *err);

/* ---- the copy engine (src/cuda/copy.c) ---- */

/* ---- integrity on the device (src/cuda/checksum.c) ---- */

#ifdef __cplusplus
}
#endif

#endif
