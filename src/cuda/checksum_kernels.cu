/* SPDX-License-Identifier: Apache-2.0 */
/*
 * checksum_kernels.cu: BLAKE3 of a batch of blocks in device memory, on
 * the device (the integrity check of kvbm/cuda.h; driven by checksum.c).
 *
 * What: two launches. kvbm_digest_groups: one CUDA thread block of 256
 * threads per group of 256 chunks (256 KiB) of an input (a 1-D grid over
 * the groups of all inputs; a table names each group's input); each thread
 * compresses one 1 KiB chunk (16 message blocks read as 16-byte vectors,
 * the message words kept in registers), then the block reduces its 256
 * chaining values level by level in shared memory to the group's value (a
 * full group is a subtree of BLAKE3's tree; the last, partial group is the
 * subtree right of the last full one). An input of one group ends there
 * with the ROOT flag: its digest. kvbm_digest_top: one thread block per
 * input of several groups reduces the groups' values (at most
 * KVBM_HD_MAX_GROUPS, all in shared memory) to the root. A W4 block (2 MiB)
 * is 8 groups: 8 thread blocks, then one for the top.
 *
 * Why this shape: BLAKE3's chunks are independent, so a batch of 1024
 * blocks of 2 MiB is two million independent jobs of 1 KiB, enough to fill
 * any GPU; the tree above them is cheap (one parent per chunk in all,
 * about 1/16 of the compressions) and only its few top levels are narrow.
 * Reducing a group inside its thread block keeps all but 1/256 of the
 * chaining values out of global memory.
 *
 * Trade-offs: a thread per chunk reads 1 KiB sequentially, so a warp's
 * loads are 32 streams 1 KiB apart rather than one coalesced run; the L1
 * cache serves the four 16-byte loads of a 64-byte block from two sectors,
 * and the compression (about 12 integer operations a byte) rather than
 * memory is the limit on an H100. A warp-cooperative layout (one chunk per
 * 4 threads, the G functions split by column) would coalesce better but
 * needs shuffles in every round. Inputs not 16-byte aligned take byte
 * loads: correct, slower. An input in several spans (a LayerSeparate
 * block) costs each thread one binary search of its spans (cached).
 * Measured on an H100 (bench_gpu_checksum, W4): 1.57 TB/s of input, the
 * GB/s of a device-to-device copy of the same bytes times 1.05-1.07; the
 * compression (about 12 integer operations a byte) is the limit, not HBM. The code of every step is src/cuda/blake3_hd.h,
 * which tests/cuda/test_blake3_hd.c runs on the host.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/blake3_hd.h"

#define KVBM__DT 256u /* threads per block: one per chunk of a group */

static_assert(KVBM__DT == KVBM_HD_GROUP_CHUNKS, "one thread per chunk of a group");

__device__ static void put_cv(uint8_t *dst, const uint32_t *cv, unsigned t) {
  /* dst is 32-byte aligned (cudaMalloc'd, 32-byte slots); 8 threads write
   * one word each. The device is little-endian: the words are the bytes. */
  reinterpret_cast<uint32_t *>(dst)[t] = cv[t];
}

__global__ void __launch_bounds__(KVBM__DT) kvbm_digest_groups(const kvbm__dblock *d, const kvbm__dspan *sp,
                                                              const uint32_t *owner, uint8_t *scratch, uint8_t *out) {
  __shared__ uint32_t cvs[KVBM_HD_GROUP_CHUNKS][8];
  const uint32_t bi = owner[blockIdx.x];
  const kvbm__dblock b = d[bi];
  const uint64_t g = blockIdx.x - b.group0; /* this group's index in its input */
  const unsigned t = threadIdx.x;
  const uint64_t chunks = kvbm_hd_chunks(b.len), c0 = g * KVBM_HD_GROUP_CHUNKS;
  const uint32_t n = (uint32_t)(chunks - c0 < KVBM_HD_GROUP_CHUNKS ? chunks - c0 : KVBM_HD_GROUP_CHUNKS);
  if (t < n) {
    const uint64_t c = c0 + t, off = c * KVBM_HD_CHUNK_LEN;
    const uint32_t clen = (uint32_t)(b.len - off < KVBM_HD_CHUNK_LEN ? b.len - off : KVBM_HD_CHUNK_LEN);
    uint32_t cv[8];
    kvbm_hd_chunk_cv(kvbm_hd_span_ptr(sp + b.span0, b.nspans, off), clen, c, chunks == 1, cv);
#pragma unroll
    for (int k = 0; k < 8; k++) cvs[t][k] = cv[k];
  }
  __syncthreads();
  const int whole = b.groups == 1;
  for (uint32_t m = n; m > 1; m = (m + 1) / 2) {
    const uint32_t up = (m + 1) / 2;
    uint32_t cv[8];
    if (t < up) kvbm_hd_level_node(cvs, m, t, whole, cv);
    __syncthreads(); /* every read of this level before any write */
    if (t < up) {
#pragma unroll
      for (int k = 0; k < 8; k++) cvs[t][k] = cv[k];
    }
    __syncthreads();
  }
  if (t < 8) put_cv(whole ? out + 32ull * bi : scratch + 32u * (uint64_t)blockIdx.x, cvs[0], t);
}

__global__ void __launch_bounds__(KVBM__DT) kvbm_digest_top(const kvbm__dblock *d, const uint8_t *scratch,
                                                           uint8_t *out) {
  __shared__ uint32_t cvs[KVBM_HD_MAX_GROUPS][8];
  __shared__ uint32_t nxt[KVBM_HD_MAX_GROUPS / 2][8];
  const kvbm__dblock b = d[blockIdx.x];
  if (b.groups <= 1) return; /* finished by kvbm_digest_groups */
  const uint32_t groups = (uint32_t)b.groups;
  const uint32_t *src = reinterpret_cast<const uint32_t *>(scratch + 32u * b.group0);
  for (uint32_t i = threadIdx.x; i < groups * 8; i += blockDim.x) cvs[i / 8][i % 8] = src[i];
  __syncthreads();
  for (uint32_t m = groups; m > 1; m = (m + 1) / 2) {
    const uint32_t up = (m + 1) / 2;
    for (uint32_t i = threadIdx.x; i < up; i += blockDim.x) kvbm_hd_level_node(cvs, m, i, 1, nxt[i]);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < up * 8; i += blockDim.x) cvs[i / 8][i % 8] = nxt[i / 8][i % 8];
    __syncthreads();
  }
  if (threadIdx.x < 8) put_cv(out + 32u * blockIdx.x, cvs[0], threadIdx.x);
}

extern "C" int kvbm__digest_launch(const kvbm__dblock *d, const kvbm__dspan *sp, const uint32_t *owner, uint32_t n,
                                   uint64_t groups, uint32_t max_groups, uint8_t *scratch, uint8_t *out, void *stream) {
  if (n == 0 || groups == 0) return (int)cudaSuccess;
  if (max_groups > KVBM_HD_MAX_GROUPS || groups > 0x7fffffffu) return (int)cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  kvbm_digest_groups<<<(unsigned)groups, KVBM__DT, 0, s>>>(d, sp, owner, scratch, out);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || max_groups == 1) return (int)e;
  kvbm_digest_top<<<n, KVBM__DT, 0, s>>>(d, scratch, out);
  return (int)cudaGetLastError();
}
