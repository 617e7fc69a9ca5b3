/* SPDX-License-Identifier: Apache-2.0 */
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

/* ---- the copy engine (src/cuda/copy.c) ----
 *
 * A copier moves KV blocks between two storages (kvbm/storage.h) described
 * by layouts (kvbm/layout.h): device G1 to pinned host G2 (offload), pinned
 * G2 to device G1 (onboard), or device to device, on CUDA streams of its
 * own (non-blocking: one for each direction, so that an offload and an
 * onboard share the PCIe link's two directions). One call queues a whole
 * batch of (src block, dst block) pairs, every layer of each: layer 0 of
 * every block first, then layer 1, ..., with one CUDA event recorded after
 * each layer. The engine's stream can then wait for layer L on the GPU
 * (kvbm_cuda_job_wait_layer, vLLM's wait_for_layer_load) while layers
 * L+1.. are still on the link; the CPU never blocks unless it asks to.
 *
 * How the bytes move is the copier's method (docs/areas/gpu.md):
 *   MEMCPY  one cudaMemcpyAsync per contiguous piece (adjacent pieces
 *           merged: consecutive ids in both src and dst, where both
 *           layouts hold them back to back).
 *   BATCH   cudaMemcpyBatchAsync (CUDA 12.8+) per layer: one call for all
 *           the pieces of a layer.
 *   KERNEL  kvbm's gather/scatter kernel, one launch per layer (or per 1280
 *           pieces of 64 KiB): each thread block copies a piece with
 *           16-byte loads, reading or writing pinned host memory over the
 *           link through its mapped device address.
 *   AUTO    pieces below `small_bytes` (64 KiB) by `small_method` (KERNEL
 *           when the build has kernels), the others by `large_method`
 *           (BATCH when the runtime has it), in one call per layer each.
 *           Measured on an H100 (PCIe 5 x16, docs/areas/gpu.md): 16 KiB
 *           pieces move at 0.88-0.92 of one large cudaMemcpyAsync by the
 *           kernel, 0.52-0.72 by BATCH, 0.10-0.12 by MEMCPY; 64 KiB pieces
 *           at 0.91-0.98 by BATCH, 0.91-0.94 by the kernel, 0.28-0.32 by
 *           MEMCPY.
 * A method the build or the runtime lacks is KVBM_EUNSUPPORTED at
 * kvbm_cuda_copier_create(), never a silent fallback.
 */

typedef enum kvbm_cuda_copy_method {
  KVBM_CUDA_COPY_AUTO = 0,
  KVBM_CUDA_COPY_MEMCPY = 1,
  KVBM_CUDA_COPY_BATCH = 2,
  KVBM_CUDA_COPY_KERNEL = 3,
} kvbm_cuda_copy_method;

/* Options of kvbm_cuda_copier_create(); NULL means the defaults. */
typedef struct kvbm_cuda_copier_config {
  kvbm_cuda_copy_method method;       /* AUTO */
  kvbm_cuda_copy_method small_method; /* AUTO's method for small pieces:
                                         AUTO = KERNEL if built, else BATCH
                                         if the runtime has it, else MEMCPY */
  kvbm_cuda_copy_method large_method; /* AUTO's method for the others:
                                         AUTO = BATCH if the runtime has it,
                                         else MEMCPY */
  uint64_t small_bytes;               /* AUTO: pieces below this are small;
                                         default 64 KiB */
  uint32_t kernel_threads;            /* threads per block of the kernel:
                                         a multiple of 32 in 64..1024;
                                         default 512 */
} kvbm_cuda_copier_config;

KVBM_EXTERN kvbm_cuda_copier_config kvbm_cuda_copier_config_default(void);

/* Which way a transfer goes; it fixes the memory types it accepts. */
typedef enum kvbm_cuda_direction {
  KVBM_CUDA_OFFLOAD = 1, /* DEVICE -> PINNED (G1 -> G2) */
  KVBM_CUDA_ONBOARD = 2, /* PINNED -> DEVICE (G2 -> G1) */
  KVBM_CUDA_D2D = 3,     /* DEVICE -> DEVICE, the same device */
} kvbm_cuda_direction;

/* Flags of a transfer. */
#define KVBM_CUDA_BLOCKWISE 1u /* move each block's layers together where
                                  both layouts hold them back to back
                                  (FullyContiguous to FullyContiguous):
                                  fewer, larger copies; every layer's event
                                  then completes with the whole batch.
                                  For offloads, where nobody waits on a
                                  layer. Ignored for other layouts. */

/* One batch: pairs (src_blocks[i] -> dst_blocks[i]), i < num_blocks, every
 * layer of each. The arrays and layouts are read during
 * kvbm_cuda_copy_start() only; the storages must stay alive until the job
 * has completed (kvbm_cuda_job_release() waits for it). */
typedef struct kvbm_cuda_transfer {
  const kvbm_storage *src;
  const kvbm_layout *src_layout;
  const kvbm_storage *dst;
  const kvbm_layout *dst_layout;
  kvbm_cuda_direction direction;
  const uint64_t *src_blocks;
  const uint64_t *dst_blocks;
  size_t num_blocks; /* 1 .. KVBM_CUDA_MAX_BATCH, and num_blocks x
                        num_layers at most 2^26 */
  uint32_t flags;    /* KVBM_CUDA_BLOCKWISE or 0 */
} kvbm_cuda_transfer;

#define KVBM_CUDA_MAX_BATCH (1u << 20)

typedef struct kvbm_cuda_copier kvbm_cuda_copier;
typedef struct kvbm_cuda_job kvbm_cuda_job;

/* Checks `t` as kvbm_cuda_copy_start() does, without a device or a copier:
 * each layout fits its storage; both layouts have the same num_layers,
 * outer_dim and layer bytes (page_size * inner_dim * dtype_size; the kinds
 * may differ); memory types match the direction (host memory must be
 * PINNED); DEVICE storages are on `device`; every id is below its layout's
 * num_blocks (KVBM_ERANGE naming the pair); no dst id appears twice (the
 * copies of a batch are unordered), and a D2D within one storage reads no
 * block it writes (KVBM_EINVAL). Pure; any thread; O(n log n). */
KVBM_EXTERN int kvbm_cuda_transfer_check(const kvbm_cuda_transfer *t, int32_t device,
                                         kvbm_error *err);

/* Creates a copier on CUDA device `device`: two non-blocking streams and a
 * pool of events. KVBM_EUNSUPPORTED without the CUDA runtime at build time,
 * or for a method this build or runtime lacks (KERNEL without nvcc, BATCH
 * before CUDA 12.8); KVBM_EDEVICE when there is no such device; KVBM_EINVAL
 * for a bad config. The current device of the calling thread is left as it
 * was. On success *out is the caller's: kvbm_cuda_copier_destroy() it.
 * A copier may be used from several threads at once (a mutex guards its
 * queueing); a job is used by one thread at a time. */
KVBM_EXTERN int kvbm_cuda_copier_create(int32_t device, const kvbm_cuda_copier_config *cfg,
                                        kvbm_cuda_copier **out, kvbm_error *err);

/* Waits for everything queued on the copier's streams, then frees it. Jobs
 * still held must have been released first (KVBM_ESTATE otherwise, and
 * nothing is freed). NULL: KVBM_OK. */
KVBM_EXTERN int kvbm_cuda_copier_destroy(kvbm_cuda_copier *c, kvbm_error *err);

/* Validates `t` (kvbm_cuda_transfer_check) and queues it, layer by layer,
 * on the copier's stream for its direction: nothing is queued when the
 * check fails. The copier's stream first waits for work already on the
 * caller's `after_stream` (a cudaStream_t; NULL: none), so that an offload
 * may follow the kernel that wrote the blocks. On success *out is a job the
 * caller releases. A CUDA error while queueing is KVBM_EDEVICE with CUDA's
 * message; layers queued before it still complete and the job is released
 * internally after waiting for them. Cost: O(n log n) planning on the CPU
 * plus, per layer, one call (BATCH, KERNEL) or one per piece (MEMCPY). */
KVBM_EXTERN int kvbm_cuda_copy_start(kvbm_cuda_copier *c, const kvbm_cuda_transfer *t,
                                     void *after_stream, kvbm_cuda_job **out,
                                     kvbm_error *err);

/* The number of layers of the job, and the number of copy calls it queued
 * (cudaMemcpyAsync, batch calls, kernel launches; for benchmarks). */
KVBM_EXTERN int kvbm_cuda_job_info(const kvbm_cuda_job *j, uint64_t *num_layers,
                                   uint64_t *num_calls, uint64_t *num_pieces);

/* Makes `engine_stream` (a cudaStream_t; NULL: the legacy default stream)
 * wait on the GPU until layer `layer` of the job has arrived; the CPU does
 * not block. Layers complete in order, so waiting for the last layer waits
 * for the job. KVBM_ERANGE for a layer past the job's; KVBM_EDEVICE with
 * CUDA's message if cudaStreamWaitEvent fails. */
KVBM_EXTERN int kvbm_cuda_job_wait_layer(kvbm_cuda_job *j, uint64_t layer,
                                         void *engine_stream, kvbm_error *err);

/* Blocks the calling thread until layer `layer` (or the whole job) has
 * arrived. KVBM_EDEVICE if a copy failed (CUDA's message). */
KVBM_EXTERN int kvbm_cuda_job_sync_layer(kvbm_cuda_job *j, uint64_t layer, kvbm_error *err);
KVBM_EXTERN int kvbm_cuda_job_sync(kvbm_cuda_job *j, kvbm_error *err);

/* KVBM_OK when every layer has arrived, KVBM_EAGAIN while copies are
 * pending, KVBM_EDEVICE if a copy failed. Never blocks. */
KVBM_EXTERN int kvbm_cuda_job_query(kvbm_cuda_job *j, kvbm_error *err);

/* Waits for the job's copies (so that the caller may free the storages
 * next), returns its events to the copier's pool and frees it. NULL: no-op.
 * Returns the wait's status (KVBM_EDEVICE if a copy failed). */
KVBM_EXTERN int kvbm_cuda_job_release(kvbm_cuda_job *j, kvbm_error *err);

/* "auto", "memcpy", "batch", "kernel" ("?" otherwise). */
KVBM_EXTERN const char *kvbm_cuda_copy_method_name(int method);

/* ---- integrity on the device (src/cuda/checksum.c) ---- */
/*
 * BLAKE3 (plain hash, kvbm/blake3.h) of blocks in device memory, computed
 * on the device: the same digest kvbm keeps for a block on the host (the
 * fabric's and the frames' BLAKE3-128 are its first 16 bytes), so a block
 * onboarded into G1 can be checked where it landed, against the digest
 * recorded when it was stored, without copying it back. Each block is one
 * contiguous range [ptrs[i], ptrs[i] + lens[i]) of device memory (a
 * FullyContiguous block; a LayerSeparate block, one range per layer, goes
 * to the span form below). The kernels are kvbm's own (src/cuda/
 * checksum_kernels.cu): one thread per 1 KiB chunk, the tree reduced in
 * shared memory.
 *
 * Both calls validate everything before touching the device, in this
 * order: KVBM_EINVAL for NULL arrays, n == 0 or n above
 * KVBM_CUDA_DIGEST_MAX_BATCH, a negative device, a NULL pointer with a
 * length, a digest_len outside 1..32; KVBM_ETOOLONG for a length above
 * KVBM_CUDA_DIGEST_MAX_LEN (the message names the block). Then
 * KVBM_EUNSUPPORTED without the CUDA runtime or without the kernels (no
 * nvcc at build time), KVBM_EDEVICE without device `device`, KVBM_EINVAL
 * for a pointer that is not device memory of `device` (host memory,
 * pinned or not, managed memory, another device: asked of
 * cudaPointerGetAttributes), and KVBM_ERANGE for a range that runs past
 * the end of its allocation (asked of the driver's cuMemGetAddressRange
 * through the runtime, CUDA 12.5+; with an older runtime that is the
 * caller's promise). A CUDA failure while running is KVBM_EDEVICE with the
 * call and CUDA's message.
 *
 * Streams: the work runs on `stream` (a cudaStream_t; NULL: the legacy
 * default stream), so it follows whatever the caller queued there before
 * (the onboard copy that wrote the blocks); the call returns when the
 * digests are on the host (it synchronizes that stream). The current
 * device of the calling thread is left as it was. Any thread; calls on
 * distinct streams may run at once. Memory: 64 bytes a block plus 36 per
 * 256 KiB of input, on the device (stream-ordered allocation) and the
 * host, for the call's duration. Cost: two CUDA calls per allocation the
 * blocks lie in (cudaPointerGetAttributes, cuMemGetAddressRange; blocks
 * in an allocation already seen cost none), then the kernels: about
 * 1.5 TB/s on an H100 for W4's 2 MiB blocks.
 */
#define KVBM_CUDA_DIGEST_MAX_LEN (256ull << 20) /* bytes in one block */
#define KVBM_CUDA_DIGEST_MAX_BATCH (1u << 20)   /* blocks in one call */

/* The 32-byte BLAKE3 digest of each block: out[i] = BLAKE3(ptrs[i],
 * lens[i]) for i < n (out is host memory the caller owns). Lengths may be
 * anything from 0 to KVBM_CUDA_DIGEST_MAX_LEN; unaligned pointers work
 * (16-byte aligned ones are faster). On a failure after the arguments
 * were accepted out is zeroed; refused arguments leave it untouched. */
KVBM_EXTERN int kvbm_cuda_digest_blocks(int32_t device, void *stream, const void *const *ptrs,
                                        const uint64_t *lens, uint32_t n, uint8_t (*out)[32],
                                        kvbm_error *err);

/* Checks each block against its expected digest: `expected` holds n
 * digests of `digest_len` bytes back to back (32: the whole BLAKE3 digest;
 * 16: the BLAKE3-128 kvbm's frames and fabric keep; any 1..32 compares
 * that prefix). KVBM_OK when every block matches; KVBM_ECHECKSUM when one
 * or more do not: *bad_index (may be NULL) is the first that does not,
 * *bad_count (may be NULL) how many; the message names the first. Both are
 * set to 0 on KVBM_OK and left as they were on other errors. A mismatch
 * means the block's bytes on the device are not the bytes that were
 * stored: the caller must not use them (drop the block, fetch it again). */
KVBM_EXTERN int kvbm_cuda_verify_blocks(int32_t device, void *stream, const void *const *ptrs,
                                        const uint64_t *lens, uint32_t n,
                                        const uint8_t *expected, uint32_t digest_len,
                                        uint32_t *bad_index, uint32_t *bad_count,
                                        kvbm_error *err);

/* Blocks in pieces: a LayerSeparate block is one range per layer (the
 * canonical bytes kvbm hashes are its layers in order, as the fabric does).
 * Block i is the concatenation of counts[i] >= 1 spans, taken in order
 * from `spans` (block 0's first, then block 1's, ...; the sum of counts at
 * most KVBM_CUDA_DIGEST_MAX_SPANS). Every span but a block's last must be
 * a multiple of 1024 bytes (BLAKE3's chunk, so that no chunk straddles two
 * ranges; KV layers are), KVBM_EINVAL naming the span otherwise; a block's
 * total is at most KVBM_CUDA_DIGEST_MAX_LEN. Everything else as
 * kvbm_cuda_digest_blocks / kvbm_cuda_verify_blocks (one span a block is
 * the same call); the pointer check costs two CUDA calls per allocation
 * the spans lie in (per span with a runtime before 12.5). */
typedef struct kvbm_cuda_span {
  const void *ptr; /* device memory */
  uint64_t len;
} kvbm_cuda_span;

#define KVBM_CUDA_DIGEST_MAX_SPANS (1u << 24)

KVBM_EXTERN int kvbm_cuda_digest_spans(int32_t device, void *stream, const kvbm_cuda_span *spans,
                                       const uint32_t *counts, uint32_t n, uint8_t (*out)[32],
                                       kvbm_error *err);
KVBM_EXTERN int kvbm_cuda_verify_spans(int32_t device, void *stream, const kvbm_cuda_span *spans,
                                       const uint32_t *counts, uint32_t n,
                                       const uint8_t *expected, uint32_t digest_len,
                                       uint32_t *bad_index, uint32_t *bad_count,
                                       kvbm_error *err);


#ifdef __cplusplus
}
#endif

#endif
