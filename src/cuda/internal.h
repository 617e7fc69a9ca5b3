/*
 * internal.h (private): what copy.c (C) and copy_kernels.cu (CUDA) share.
 *
 * The gather/scatter kernel takes its piece list by value as one kernel
 * parameter: up to KVBM__KMAX pieces, under the 4 KiB every CUDA version
 * and architecture accepts. Passing it by value means no device buffer to
 * allocate, fill and keep alive per job: the launch copies the parameters,
 * so the list may be reused as soon as the launch call returns.
 */
#ifndef KVBM_CUDA_INTERNAL_H
#define KVBM_CUDA_INTERNAL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM__KMAX 160              /* pieces per launch: 8 + 160 * 24 < 4096 bytes */
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
