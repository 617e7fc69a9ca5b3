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
 *
 * Kept checksums (issue 22). A block sent to a peer travels with the
 * BLAKE3-128 of its bytes (an MRDN frame's checksum), and the receiver
 * hashes the bytes it got to check it. That sum need not be computed
 * again at each send: a committed block's bytes do not change while it is
 * registered, so each memory tier keeps one sum per block (G1, G2: the
 * `sums` array, 17 bytes a block), computed at most once per registration
 * and then only read:
 *   - a copy between tiers carries the source's sum to the destination
 *     (the same bytes), so a block offloaded to G2 and brought back keeps
 *     it without hashing;
 *   - a host copy into G2 (the offload at commit) hashes a block that has
 *     none yet, once a peer is attached (hash_copies): the block's sum is
 *     then computed when it is first offloaded, by the host worker, off
 *     the send path, and kept on both copies;
 *   - the sender (src/peer/, through kvbm_manager_block_sum_keep) hashes
 *     a block that still has none (a G1 block not yet offloaded, a
 *     manager without G2) and keeps the result; a receiver keeps the sum
 *     it checked a block's bytes against (kvbm_manager_block_put).
 * On a keyed link the sum is the keyed BLAKE3-128 under the cluster key
 * (the frame's MAC, kvbm_manager_keep_sums), so it is still one hash.
 * A sum is forgotten when its block's registration begins or ends (the
 * pool's STORED, REMOVED and CLEARED events, manager.c): the bytes to come
 * are another block's. Nothing here trusts a kept sum for the bytes it
 * names: the receiver always hashes what it got and refuses a block whose
 * bytes do not match (a sum made stale by bytes changed behind the
 * manager's back costs that block, never a wrong one).
 *
 * Each sum is written by one writer: a state byte goes NONE -> BUSY (the
 * one compare-and-swap that wins) -> KEPT (release) after the 16 bytes;
 * a reader acquires KEPT before reading them. Readers and writers hold a
 * pin on the block, so its sum is not cleared under them; clears run
 * under the manager lock on unpinned blocks. A copy's destination is
 * PENDING (nobody else reads or writes it) and is set outright.
 */
#include <stdlib.h>
#include <string.h>

#include "kvbm/blake3.h"
#include "tier/internal.h"

uint8_t *kvbm__layer_ptr(const kvbm__tier *t, uint32_t b, uint64_t l) {
  const kvbm_layout *L = &t->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    return t->region[0] + b * L->block_stride + l * L->layer_stride;
  return t->region[l] + b * L->block_stride;
}

static uint64_t block_len(const kvbm_layout *L) { return L->config.num_layers * L->layer_stride; }

/* ---- kept checksums ---- */

int kvbm__sums_create(kvbm__tier *t, uint64_t n) {
  t->sums = calloc(n ? n : 1, sizeof *t->sums);
  t->nsums = t->sums ? n : 0;
  return t->sums ? KVBM_OK : KVBM_ENOMEM;
}

void kvbm__sums_destroy(kvbm__tier *t) {
  free(t->sums);
  t->sums = NULL;
  t->nsums = 0;
}

bool kvbm__sum_get(const kvbm__tier *t, uint32_t b, uint8_t out[16]) {
  if (!t->sums || b >= t->nsums) return false;
  if (atomic_load_explicit(&t->sums[b].state, memory_order_acquire) != KVBM__SUM_KEPT) return false;
  memcpy(out, t->sums[b].sum, 16);
  return true;
}

void kvbm__sum_keep(const kvbm__tier *t, uint32_t b, const uint8_t sum[16]) {
  if (!t->sums || b >= t->nsums) return;
  uint8_t none = KVBM__SUM_NONE;
  if (!atomic_compare_exchange_strong(&t->sums[b].state, &none, KVBM__SUM_BUSY)) return;
  memcpy(t->sums[b].sum, sum, 16);
  atomic_store_explicit(&t->sums[b].state, KVBM__SUM_KEPT, memory_order_release);
}

/* Only a kept sum is forgotten: one being written belongs to a writer
 * holding a pin on the block, whose bytes therefore stay what it hashed
 * (a pool reset clears every block, pinned ones included), and clearing
 * it under that writer would let a second one write beside it. */
void kvbm__sum_clear(const kvbm__tier *t, uint32_t b) {
  if (!t->sums || b >= t->nsums) return;
  uint8_t kept = KVBM__SUM_KEPT;
  atomic_compare_exchange_strong(&t->sums[b].state, &kept, KVBM__SUM_NONE);
}

void kvbm__sums_clear_all(const kvbm__tier *t) {
  for (uint64_t b = 0; b < t->nsums; b++) kvbm__sum_clear(t, (uint32_t)b);
}

/* Keyed under the peers' cluster key when the manager's sums are keyed
 * (peer_hooks.c, kvbm_manager_keep_sums): a keyed link's frame MAC, the
 * same one hash. sum_key was written before hash_copies was published. */
void kvbm__block_hash(const kvbm__tier *t, uint32_t b, uint8_t sum[16]) {
  kvbm_blake3_hasher h;
  if (t->sum_key) (void)kvbm_blake3_hasher_init_keyed(&h, t->sum_key);
  else kvbm_blake3_hasher_init(&h);
  if (t->layout.kind == KVBM_LAYOUT_FULLY_CONTIGUOUS)
    kvbm_blake3_hasher_update(&h, kvbm__layer_ptr(t, b, 0), block_len(&t->layout));
  else
    for (uint64_t l = 0; l < t->layout.config.num_layers; l++)
      kvbm_blake3_hasher_update(&h, kvbm__layer_ptr(t, b, l), t->layout.layer_stride);
  kvbm_blake3_hasher_finalize(&h, sum, 16);
}

/* A copy's destination (PENDING, the caller's alone) gets the source's
 * sum, or none. */
static void carry_sum(const kvbm__tier *dst, uint32_t db, const kvbm__tier *src, uint32_t sb) {
  uint8_t sum[16];
  kvbm__sum_clear(dst, db);
  if (kvbm__sum_get(src, sb, sum)) kvbm__sum_keep(dst, db, sum);
}

void kvbm__copy_block(const kvbm__tier *dst, uint32_t db, const kvbm__tier *src, uint32_t sb) {
  const kvbm_layout *L = &src->layout;
  if (L->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS && dst->layout.kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    memcpy(kvbm__layer_ptr(dst, db, 0), kvbm__layer_ptr(src, sb, 0), block_len(L));
  } else {
    for (uint64_t l = 0; l < L->config.num_layers; l++)
      memcpy(kvbm__layer_ptr(dst, db, l), kvbm__layer_ptr(src, sb, l), L->layer_stride);
  }
  carry_sum(dst, db, src, sb);
  /* The block's first offload with a peer attached: its sum is computed
   * now, from the copy just written (still warm in cache), and kept on
   * both copies, so that no send of it hashes. */
  uint8_t sum[16];
  if (atomic_load_explicit(&dst->hash_copies, memory_order_acquire) && dst->sums && !kvbm__sum_get(dst, db, sum)) {
    kvbm__block_hash(dst, db, sum);
    kvbm__sum_keep(dst, db, sum);
    kvbm__sum_keep(src, sb, sum);
  }
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
  kvbm__sum_clear(dst, b); /* bytes from a store: no sum known */
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
  carry_sum(dst, db, src, sb); /* a failed copy leaves dst FAILED, never sent */
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
  kvbm__sum_clear(dst, b);
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
