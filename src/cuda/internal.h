/* SPDX-License-Identifier: Apache-2.0 */
/*
 * internal.h (private): what copy.c (C) and copy_kernels.cu (CUDA) share.
 *
 * The gather/scatter kernel takes its piece list by value as one kernel
 * parameter: up to KVBM__KMAX pieces, under the 32764 bytes of parameters
 * CUDA 12.1+ accepts on Volta and later (the kernels are built for sm_80
 * and sm_90; with 4 KiB of parameters, 160 pieces a launch, 16 KiB pieces
 * moved at 0.83-0.87 of the link on an H100, with 1280 at 0.88-0.92).
 * Passing it by value means no device buffer to
 * allocate, fill and keep alive per job: the launch copies the parameters,
 * so the list may be reused as soon as the launch call returns.
 */
#ifndef KVBM_CUDA_INTERNAL_H
#define KVBM_CUDA_INTERNAL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM__KMAX 1280             /* pieces per launch: 8 + 1280 * 24 < 32764 bytes */
#define KVBM__KCHUNK (64u << 10)    /* a piece longer than this is split */

typedef struct kvbm__kdesc {
  uint64_t src; /* device-visible addresses (mapped host memory included) */
  uint64_t dst;
  uint64_t size;
} kvbm__kdesc;

typedef struct kvbm__kbatch {
  uint32_t n;
  uint32_t pad;
  kvbm__kdesc d[KVBM__KMAX];
} kvbm__kbatch;

/* Launches the copy of b->d[0 .. b->n) on `stream` (a cudaStream_t), one
 * thread block of `threads` threads per piece. Returns the cudaError_t of
 * the launch (0 = cudaSuccess). Defined only when the kernels are built
 * (KVBM_HAVE_CUDA_KERNELS). */
int kvbm__copy_kernel_launch(const kvbm__kbatch *b, unsigned threads, void *stream);

#ifdef __cplusplus
}
#endif

#endif
