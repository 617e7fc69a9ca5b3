/* SPDX-License-Identifier: Apache-2.0 */
/*
 * copy_kernels.cu: the copy engine's gather/scatter kernel.
 *
 * What: one launch moves up to KVBM__KMAX pieces (src, dst, size), one
 * thread block per piece; each thread moves 16-byte vectors, four in
 * flight before it stores any, so that a block keeps many reads
 * outstanding. Either side may be pinned host memory reached through its
 * mapped (UVA) address: the kernel then reads or writes over PCIe itself.
 *
 * Why: a batch of many small pieces (a 16 KiB layer of one block, from
 * scattered block ids) costs one cudaMemcpyAsync each: a few microseconds
 * of CPU and DMA set-up per piece, which is as long as moving the piece.
 * One launch for a whole layer replaces hundreds of those calls.
 *
 * Trade-offs: the kernel occupies SMs (a few percent of an H100 for the
 * duration of the copy) where the copy engines would not, and a thread
 * block per piece is slow for one huge piece, so pieces are cut into
 * KVBM__KCHUNK pieces by the caller and large pieces go to
 * cudaMemcpyAsync under the AUTO method. Pieces not aligned to 16 bytes
 * (odd layer sizes) take a byte loop: correct, not fast.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/internal.h"

__global__ void kvbm_copy_gather(const kvbm__kbatch b) {
  for (unsigned i = blockIdx.x; i < b.n; i += gridDim.x) {
    const kvbm__kdesc d = b.d[i];
    if (((d.src | d.dst | d.size) & 15u) == 0) {
      const uint4 *s = reinterpret_cast<const uint4 *>(d.src);
      uint4 *t = reinterpret_cast<uint4 *>(d.dst);
      const uint64_t n = d.size / 16, step = blockDim.x;
      uint64_t k = threadIdx.x;
      for (; k + 3 * step < n; k += 4 * step) {
        uint4 a0 = s[k], a1 = s[k + step], a2 = s[k + 2 * step], a3 = s[k + 3 * step];
        t[k] = a0;
        t[k + step] = a1;
        t[k + 2 * step] = a2;
        t[k + 3 * step] = a3;
      }
      for (; k < n; k += step) t[k] = s[k];
    } else {
      const uint8_t *s = reinterpret_cast<const uint8_t *>(d.src);
      uint8_t *t = reinterpret_cast<uint8_t *>(d.dst);
      for (uint64_t k = threadIdx.x; k < d.size; k += blockDim.x) t[k] = s[k];
    }
  }
}

extern "C" int kvbm__copy_kernel_launch(const kvbm__kbatch *b, unsigned threads, void *stream) {
  if (b->n == 0) return (int)cudaSuccess;
  kvbm_copy_gather<<<b->n, threads, 0, static_cast<cudaStream_t>(stream)>>>(*b);
  return (int)cudaGetLastError();
}
