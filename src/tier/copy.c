/* SPDX-License-Identifier: Apache-2.0 */
/*
 * copy.c: moving one block's bytes between the manager's tiers.
 *
 * A tier's block is either one piece (FullyContiguous: all layers of a
 * block side by side) or one piece per layer (LayerSeparate: a region per
 * layer). Every copy here walks the two layouts' pieces, so any pair of
 * layouts works and the common pair (FC to FC) is one memcpy. The CUDA
 * forms queue the same pieces as cudaMemcpyAsync on a worker's stream
 * (gpu.c decides the direction from the pointers); gather and scatter then
 * wait for their stream, because their staging buffer is reused at once,
 * while copy_block leaves the wait to its caller (the host worker waits for
 * a whole batch by events).
 *
 * No lock is taken: callers pass blocks that their pool references keep
 * valid, and nobody else writes them meanwhile (indexing is synchronous,
 * bytes asynchronous: a block in flight is PENDING to everyone else).
 */
#include <string.h>

#include "tier/internal.h"

uint8_t *kvbm__layer_ptr(const kvbm__tier *t, uint32_t b, uint64_t l) {
  const kvbm_layout *L = &t->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    return t->region[0] + b * L->block_stride + l * L->layer_stride;
  return t->region[l] + b * L->block_stride;
}

static uint64_t block_len(const kvbm_layout *L) { return L->config.num_layers * L->layer_stride; }

void kvbm__copy_block(const kvbm__tier *dst, uint32_t db, const kvbm__tier *src, uint32_t sb) {
  const kvbm_layout *L = &src->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS && dst->layout.kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    memcpy(kvbm__layer_ptr(dst, db, 0), kvbm__layer_ptr(src, sb, 0), block_len(L));
    return;
  }
  for (uint64_t l = 0; l < L->config.num_layers; l++)
    memcpy(kvbm__layer_ptr(dst, db, l), kvbm__layer_ptr(src, sb, l), L->layer_stride);
}

void kvbm__gather(uint8_t *out, const kvbm__tier *src, uint32_t b) {
  const kvbm_layout *L = &src->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    memcpy(out, kvbm__layer_ptr(src, b, 0), block_len(L));
    return;
  }
  for (uint64_t l = 0; l < L->config.num_layers; l++)
    memcpy(out + l * L->layer_stride, kvbm__layer_ptr(src, b, l), L->layer_stride);
}

void kvbm__scatter(kvbm__tier *dst, uint32_t b, const uint8_t *in) {
  const kvbm_layout *L = &dst->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    memcpy(kvbm__layer_ptr(dst, b, 0), in, block_len(L));
    return;
  }
  for (uint64_t l = 0; l < L->config.num_layers; l++)
    memcpy(kvbm__layer_ptr(dst, b, l), in + l * L->layer_stride, L->layer_stride);
}

int kvbm__copy_block_gpu(kvbm_gpu_stream *s, const kvbm__tier *dst, uint32_t db,
                         const kvbm__tier *src, uint32_t sb) {
  const kvbm_layout *L = &src->layout;
  int rc = KVBM_OK;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS && dst->layout.kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    return kvbm__gpu_copy(s, kvbm__layer_ptr(dst, db, 0), kvbm__layer_ptr(src, sb, 0),
                          block_len(L));
  for (uint64_t l = 0; !rc && l < L->config.num_layers; l++)
    rc = kvbm__gpu_copy(s, kvbm__layer_ptr(dst, db, l), kvbm__layer_ptr(src, sb, l),
                        L->layer_stride);
  return rc;
}

int kvbm__gather_gpu(kvbm_gpu_stream *s, uint8_t *out, const kvbm__tier *src, uint32_t b) {
  const kvbm_layout *L = &src->layout;
  int rc = KVBM_OK;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    rc = kvbm__gpu_copy(s, out, kvbm__layer_ptr(src, b, 0), block_len(L));
  else
    for (uint64_t l = 0; !rc && l < L->config.num_layers; l++)
      rc = kvbm__gpu_copy(s, out + l * L->layer_stride, kvbm__layer_ptr(src, b, l),
                          L->layer_stride);
  return rc ? rc : kvbm__gpu_sync(s);
}

int kvbm__scatter_gpu(kvbm_gpu_stream *s, kvbm__tier *dst, uint32_t b, const uint8_t *in) {
  const kvbm_layout *L = &dst->layout;
  int rc = KVBM_OK;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    rc = kvbm__gpu_copy(s, kvbm__layer_ptr(dst, b, 0), in, block_len(L));
  else
    for (uint64_t l = 0; !rc && l < L->config.num_layers; l++)
      rc = kvbm__gpu_copy(s, kvbm__layer_ptr(dst, b, l), in + l * L->layer_stride,
                          L->layer_stride);
  return rc ? rc : kvbm__gpu_sync(s);
}

int kvbm__block_pieces(const kvbm__tier *t, uint32_t b, struct iovec *iov, int max) {
  const kvbm_layout *L = &t->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    if (max < 1) return 0;
    iov[0] = (struct iovec){kvbm__layer_ptr(t, b, 0), (size_t)block_len(L)};
    return 1;
  }
  if (L->config.num_layers > (uint64_t)max) return 0;
  int n = (int)L->config.num_layers;
  for (int l = 0; l < n; l++)
    iov[l] = (struct iovec){kvbm__layer_ptr(t, b, (uint64_t)l), (size_t)L->layer_stride};
  return n;
}

uint8_t *kvbm__block_contiguous(const kvbm__tier *t, uint32_t b) {
  if (t->device || t->layout.kind != KVBM_LAYOUT_FULLY_CONTIGUOUS) return NULL;
  return kvbm__layer_ptr(t, b, 0);
}
