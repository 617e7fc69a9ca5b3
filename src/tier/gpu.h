/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu.h (private): the CUDA copies of the tier manager, when G1 is device
 * memory (see gpu.c). Every function exists in every build; without CUDA
 * (KVBM_HAVE_CUDA undefined) they report KVBM_EUNSUPPORTED and
 * kvbm__gpu_compiled() is 0, so the manager's code has no #ifdefs.
 */
#ifndef KVBM_TIER_GPU_H
#define KVBM_TIER_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

/* One worker's CUDA stream and its completion events (one per job slot). */
typedef struct kvbm_gpu_stream kvbm_gpu_stream;

/* Whether this build has the CUDA copy path. */
int kvbm__gpu_compiled(void);

/* A non-blocking stream on `device` with `nevents` events. KVBM_EUNSUPPORTED
 * without CUDA, KVBM_EDEVICE when CUDA fails (no GPU, no driver). *out is
 * freed with kvbm__gpu_stream_destroy(). */
int kvbm__gpu_stream_create(int32_t device, uint32_t nevents, kvbm_gpu_stream **out,
                           kvbm_error *err);
void kvbm__gpu_stream_destroy(kvbm_gpu_stream *s); /* NULL: no-op */

/* Tests only, every build: a stream that emulates the device in host
 * memory (see gpu.c). Copies are counted in *counter (shared by a
 * manager's streams); copy number fail_at (from 1; 0: none) fails. */
int kvbm__gpu_stream_emulated(uint32_t nevents, _Atomic uint64_t *counter, uint64_t fail_at,
                             kvbm_gpu_stream **out, kvbm_error *err);

/* Makes the stream's device current on the calling thread (each worker
 * calls it once: the current device is per thread in CUDA). */
int kvbm__gpu_bind(kvbm_gpu_stream *s);

/* Queues a copy of n bytes on the stream (cudaMemcpyAsync, direction from
 * the pointers). KVBM_EDEVICE if CUDA refuses it. */
int kvbm__gpu_copy(kvbm_gpu_stream *s, void *dst, const void *src, size_t n);

/* Records event i (< nevents) after what is queued so far. */
int kvbm__gpu_mark(kvbm_gpu_stream *s, uint32_t i);

/* Waits for event i: KVBM_OK when every copy queued before it finished,
 * KVBM_EDEVICE if one failed (the stream's error is cleared). */
int kvbm__gpu_wait(kvbm_gpu_stream *s, uint32_t i);

/* Waits for everything queued (cudaStreamSynchronize); errors as above. */
int kvbm__gpu_sync(kvbm_gpu_stream *s);

/* Synchronous copy between host and device memory of `device` (for the
 * engine-facing block read/write; any thread). */
int kvbm__gpu_copy_now(int32_t device, void *dst, const void *src, size_t n, kvbm_error *err);

#endif
